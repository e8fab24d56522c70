"""The report of a scenario: a grid of cells (× builds), linking each cell group's own report
and, with several builds, each group's comparison."""

from __future__ import annotations

import json
from pathlib import Path

from jinja2 import Environment, select_autoescape
from markupsafe import Markup

from harness.pipeline import Evaluation
from harness.report.compare_page import CSS
from harness.scenario import CellGroup
from harness.store import SCHEMA_VERSION

Results = list[tuple[CellGroup, Evaluation]]


def matrix_summary(scenario: str, results: Results | dict[str, Results],
                   comparisons: dict[str, tuple[str, int]] | None = None) -> dict:
    """``results``: one list of (group, evaluation), or one per build name (run order);
    ``comparisons``: group id -> (link to its comparison page, its exit code)."""
    per_build = results if isinstance(results, dict) else {"": results}
    builds = [b for b in per_build if b]
    cells: dict[str, dict] = {}
    groups: dict[str, str] = {}
    codes = []
    for build, runs in per_build.items():
        for group, ev in runs:
            groups.setdefault(group.id, f"{build}/{group.id}/index.html" if build else f"{group.id}/index.html")
            codes.append(ev.exit_code)
            for v in ev.verdicts:
                cell = cells.setdefault(f"{v.path}[{group.id}]", {"group": group.id, "builds": {}, "links": {}})
                cell["builds"][build] = v.status.value
                cell["links"][build] = f"{build}/{group.id}/index.html" if build else f"{group.id}/index.html"
                # one build: its verdict; several: the build under review (the last one) decides
                cell["verdict"] = v.status.value
                cell["reasons"] = list(v.reasons[:3])
    if comparisons:
        # With builds, expectations decide; an engine that could not run (2) still wins.
        exit_code = 2 if 2 in codes else max((code for _, code in comparisons.values()), default=0)
    else:
        exit_code = 2 if 2 in codes else max(codes, default=0)
    return {"schema_version": SCHEMA_VERSION, "scenario": scenario, "exit_code": exit_code, "builds": builds,
            "cells": cells, "groups": groups,
            "comparisons": {g: {"link": link, "expectations_met": code == 0}
                            for g, (link, code) in (comparisons or {}).items()}}


_ENV = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
TEMPLATE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>refit-harness: {{ s.scenario }}</title><style>{{ css }}</style></head><body>
<h1>Scenario <code>{{ s.scenario }}</code></h1>
<p class="muted">{{ s.cells|length }} cell(s){% if s.builds %} on builds {{ s.builds|join(', ') }}{% endif %};
exit code {{ s.exit_code }}.</p>
{% if s.comparisons %}<ul>{% for g, c in s.comparisons.items() %}<li>comparison <a href="{{ c.link }}">{{ g }}</a>:
<span class="{{ 'met' if c.expectations_met else 'unmet' }}">expectations {{ 'met' if c.expectations_met else 'NOT met' }}
</span></li>{% endfor %}</ul>{% endif %}
<table id="cells" class="grid"><thead><tr><th>cell</th>
{% for b in columns %}<th>{{ b or 'verdict' }}</th>{% endfor %}<th>reasons</th></tr></thead><tbody>
{% for cell, c in s.cells.items() %}<tr><td><code>{{ cell }}</code></td>
{% for b in columns %}{% set v = c.builds.get(b) %}<td class="v {{ v or '' }}">{% if v %}<a href="{{ c.links[b] }}">{{ v }}</a>
{% else %}—{% endif %}</td>{% endfor %}
<td>{% for r in c.reasons %}<div>{{ r }}</div>{% endfor %}</td></tr>{% endfor %}</tbody></table>
</body></html>
"""


def write_matrix(out: Path, summary: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    columns = summary.get("builds") or [""]
    page = _ENV.from_string(TEMPLATE).render(s=summary, columns=columns, css=Markup(CSS))
    (out / "index.html").write_text(page)
    head = " | ".join(columns) if summary.get("builds") else "verdict"
    lines = [f"## refit-harness scenario `{summary['scenario']}`", "", f"| cell | {head} |",
             "|---|" + "---|" * len(columns)]
    lines += [f"| `{cell}` | " + " | ".join(c["builds"].get(b, "—") for b in columns) + " |"
              for cell, c in summary["cells"].items()]
    for g, c in summary.get("comparisons", {}).items():
        lines.append(f"\nComparison `{g}`: expectations {'met' if c['expectations_met'] else '**NOT met**'} "
                     f"({c['link']})")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return out / "index.html"
