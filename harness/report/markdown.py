"""Untrusted text (tensor names, engine errors, labels) made safe for GitHub markdown, for every
Markdown page the reports write."""

from __future__ import annotations

import html

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]()!|#~"})


def md_text(text) -> str:
    """Untrusted text (tensor names, engine errors, labels) for GitHub markdown: HTML is
    escaped (GitHub passes raw HTML through), and markdown syntax that could make a link,
    an image or break a table row is backslash-escaped."""
    return html.escape(str(text).replace("\r", " ").replace("\n", " ").translate(_MD_SPECIAL), quote=True)


def md_code(text) -> str:
    """Untrusted text as inline code: nothing inside a code span is rendered, so only a
    backtick (which would end it) and a table pipe need care."""
    body = str(text).replace("\r", " ").replace("\n", " ").replace("`", "'").replace("|", "\\|")
    return f"`{body}`"
