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


def verdict_class(shown: str | None) -> str:
    """The CSS class of a verdict as shown: ``PASS (no twin)`` is not a PASS."""
    from harness.judge.verdict import UNEARNED_PASS

    return "UNEARNED" if shown == UNEARNED_PASS else (shown or "")


def breakable(name: str) -> Markup:
    """A path or cell name that a narrow column header may wrap after an underscore, never
    inside a word (``reload_weigh ts``)."""
    from markupsafe import escape

    return Markup("_<wbr>".join(escape(part) for part in str(name).split("_")))


ENV.filters["vclass"] = verdict_class
ENV.filters["breakable"] = breakable


def render(template: str, **context: Any) -> str:
    """A page from ``templates/<template>``, with the shared stylesheet as ``css``."""
    return ENV.get_template(template).render(css=Markup(CSS), **context)
