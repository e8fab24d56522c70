"""The one Jinja2 environment of every page: templates are files under ``templates/``, with
autoescaping, so every value from a record (names, reasons, errors, token ids) is text,
never markup, without an ``escape`` call at each site."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from harness.report.style import CSS

ENV = Environment(
    loader=PackageLoader("harness.report", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["g3"] = lambda value: f"{value:.3g}"


def render(template: str, **context: Any) -> str:
    """A page from ``templates/<template>``, with the shared stylesheet as ``css``."""
    return ENV.get_template(template).render(css=Markup(CSS), **context)
