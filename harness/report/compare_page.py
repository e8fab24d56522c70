"""The comparison report of two builds: index.html (self-contained, Jinja2 with autoescape),
summary.md (a PR comment), comparison.json and tidy CSVs. From a ``BuildComparison`` only."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path

from markupsafe import Markup, escape

from harness.judge.crossbuild import NO_DIFFERENCE, BuildComparison
from harness.report.render import render
from harness.report.style import ICON, REPORT_SCHEMA_VERSION
from harness.run_dir import COMPARE_TABLES, INDEX_HTML, RunDir
from harness.store import to_jsonable


def write_comparison(
    cmp: BuildComparison, out: Path, provenance: dict[str, dict[str, str]] | None = None
) -> dict[str, Path]:
    """``provenance``: base's and pr's (``harness.report.provenance``), for the pages' first lines."""
    out.mkdir(parents=True, exist_ok=True)
    d = RunDir(out)
    files: dict[str, Path] = {}
    tables = (
        cmp.verdicts,
        cmp.tokens,
        cmp.status_changes,
        cmp.values,
        cmp.hooks,
        cmp.timings,
        cmp.throughput,
        cmp.accuracy,
        cmp.builds,
    )
    for name, rows in zip(COMPARE_TABLES, tables, strict=True):
        files[name] = _csv(d.table(name), rows)
    files[d.expectations_csv.name] = d.expectations_csv
    with open(d.expectations_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["schema_version", "build", "cells", "expected", "path", "actual", "met"])
        for e in cmp.expectations:
            for path, actual in e.actual or (("", ""),):
                w.writerow(
                    [
                        REPORT_SCHEMA_VERSION,
                        e.expectation.build,
                        e.expectation.cells,
                        e.expectation.verdict,
                        path,
                        actual,
                        e.met,
                    ]
                )
    files[d.comparison.name] = d.comparison
    d.comparison.write_text(
        json.dumps({"schema_version": REPORT_SCHEMA_VERSION, "exit_code": cmp.exit_code, **to_jsonable(cmp)}, indent=1)
    )
    files[d.summary_md.name] = d.summary_md
    shared = shared_provenance(provenance or {})
    d.summary_md.write_text(render_markdown(cmp, shared))
    files[d.index_html.name] = d.index_html
    d.index_html.write_text(render_html(cmp, shared))
    return files


def shared_provenance(per_build: dict[str, dict[str, str]]) -> dict[str, str]:
    """One provenance for both builds: a fact they share once, one that differs per build."""
    labels = list(per_build)
    keys = list(dict.fromkeys(k for p in per_build.values() for k in p))
    out = {}
    for k in keys:
        values = {label: per_build[label].get(k, "—") for label in labels}
        same = len(set(values.values())) == 1
        out[k] = next(iter(values.values())) if same else "; ".join(f"{label}: {v}" for label, v in values.items())
    return out


def write_group_index(out: Path, groups: list[tuple[str, int]]) -> Path:
    """The top page of a comparison of two scenario directories: one comparison per cell group."""
    from harness.cache import write_atomic

    lines = ["## refit-harness: two scenario runs, group by group", ""]
    lines += [f"- [{g}]({g}/{INDEX_HTML}): expectations {'met' if code == 0 else '**NOT met**'}" for g, code in groups]
    write_atomic(RunDir(out).summary_md, "\n".join(lines) + "\n")
    page = render("groups.html.j2", groups=groups)
    return write_atomic(RunDir(out).index_html, page)


def _csv(path: Path, rows) -> Path:
    rows = list(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if not rows:
            f.write("schema_version\n")
            return path
        names = [x.name for x in fields(rows[0])]
        w.writerow(["schema_version", *names])
        for r in rows:
            d = asdict(r)
            w.writerow([REPORT_SCHEMA_VERSION, *(_cell(d[n]) for n in names)])
    return path


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (tuple, list)):
        return " ".join(map(str, v))
    return str(v)


# --- summary.md ----------------------------------------------------------------------------


def render_markdown(cmp: BuildComparison, provenance: dict[str, str] | None = None) -> str:
    from harness.report.provenance import provenance_markdown

    b, p, b2 = cmp.build("base"), cmp.build("pr"), cmp.build("base2")
    lines = ["## refit-harness: two builds side by side", "", *provenance_markdown(provenance or {})]
    for f in (b, b2, p):
        if f:
            sha = f" `{f.vllm_git_sha[:12]}`" if f.vllm_git_sha else ""
            lines.append(
                f"- **{f.label}** (`{f.build}`): vLLM `{f.vllm}`{sha} · torch `{f.torch}` · {f.device} · CPU {f.cpu}"
            )
    ok = all(e.met for e in cmp.expectations)
    lines += ["", f"**Expectations: {'met' if ok else 'NOT met'}**", ""]
    for e in cmp.expectations:
        got = ", ".join(f"`{path}` {v}" for path, v in e.actual) or ("no cell regressed" if e.implied else "no cell")
        lines.append(
            f"- {'✅' if e.met else '❌'} {e.expectation.build}: {e.expectation.verdict} "
            f"(cells `{e.expectation.cells}`) — {got}"
        )
    lines += [
        "",
        "| cell | base | " + ("base2 | " if b2 else "") + "pr | outcome |",
        "|---|---|" + ("---|" if b2 else "") + "---|---|",
    ]
    for r in cmp.verdicts:
        cells = [_md_verdict(r.base)] + ([_md_verdict(r.base2)] if b2 else []) + [_md_verdict(r.pr)]
        lines.append(f"| `{r.path}` | " + " | ".join(cells) + f" | {r.outcome} |")
    diff_tokens = [t for t in cmp.tokens if t.outcome == "differs"]
    lines += [
        "",
        f"Greedy tokens on cold B (pr vs base, floor: {cmp.tokens[0].floor_source if cmp.tokens else '-'}): "
        + (
            f"{len(diff_tokens)} of {len(cmp.tokens)} prompt(s) differ, first at token "
            f"{min(t.first_divergence for t in diff_tokens if t.first_divergence is not None) if any(t.first_divergence is not None for t in diff_tokens) else '-'}"
            if diff_tokens
            else f"{_token_words(cmp.tokens)} over {len(cmp.tokens)} prompt(s)"
        ),
    ]
    deciding = [c for c in cmp.status_changes if c.decides]
    if deciding:
        lines.append(f"Tensor status changes that decide a verdict ({len(deciding)}):")
        for c in deciding[:8]:
            lines.append(f"- `{c.path}` {c.check}: `{c.tensor}` {c.base} → {c.pr}")
    values = [v for v in cmp.values if v.outcome != NO_DIFFERENCE]
    lines.append(
        f"Cold-B tensor values that differ between builds beyond the floor: {len(values)}"
        + (f" (first: `{values[0].tensor}`, {values[0].outcome})" if values else "")
    )
    for t in cmp.throughput:
        lines.append(
            f"Throughput `{t.point}`: base {t.base_median or 0:.1f}, pr {t.pr_median or 0:.1f} tokens/s — "
            f"{t.outcome}" + (f"; refit slower than cold B on {t.slower_than_cold}" if t.slower_than_cold else "")
        )
    for a in cmp.accuracy:
        lines.append(
            f"Accuracy `{a.point}`: base {pct(a.base_accuracy)}, pr {pct(a.pr_accuracy)} — {a.outcome}"
            + (f"; refit differs from cold B on {a.differs_from_cold}" if a.differs_from_cold else "")
        )
    hooks = [h for h in cmp.hooks if h.outcome == "changed"]
    lines.append(
        f"Post-load hook classes that changed: {len(hooks)}"
        + (" — " + ", ".join(f"`{h.owner}` ({h.kind}) {h.base}→{h.pr}" for h in hooks[:5]) if hooks else "")
    )
    for n in cmp.notes:
        lines.append(f"> {n}")
    return "\n".join(lines) + "\n"


def _token_words(tokens) -> str:
    return "identical" if all(t.outcome == "identical" for t in tokens) else NO_DIFFERENCE


def _md_verdict(v: str | None) -> str:
    return "—" if v is None else f"{ICON.get(v, '')} {v}"


# --- SVG plots -----------------------------------------------------------------------------


def svg_layer_bars(rows: tuple[tuple[str, float, float | None], ...]) -> Markup:
    """Largest relative change of a tensor's |max| per layer, pr vs base (and base2 vs base)."""
    if not rows:
        return Markup("<p class='muted'>No cold-B census in both runs.</p>")
    w, h, left, bottom = 640, 200, 50, 40
    top = max([r[1] for r in rows] + [r[2] or 0.0 for r in rows] + [1e-12])
    flat = all(r[1] == 0 and not r[2] for r in rows)
    slot = (w - left - 10) / len(rows)
    parts = [
        f"<svg id=\"plot-layers\" class=\"plot\" viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img'>",
        f"<line x1='{left}' y1='{h - bottom}' x2='{w - 5}' y2='{h - bottom}' stroke='#888'/>",
        f"<text x='4' y='14' font-size='10'>{top:.3g}</text><text x='4' y='{h - bottom}' font-size='10'>0</text>",
    ]
    for i, (layer, main, floor) in enumerate(rows):
        x = left + i * slot
        for j, (value, cls) in enumerate(((main, "bar-pr"), (floor, "bar-floor"))):
            if value is None:
                continue
            bh = (h - bottom - 20) * value / top
            parts.append(
                f"<rect class='{cls}' x='{x + 4 + j * slot / 2.5:.1f}' y='{h - bottom - bh:.1f}' "
                f"width='{max(slot / 2.5 - 4, 2):.1f}' height='{bh:.1f}'><title>{escape(layer)}: "
                f"{value:.3g}</title></rect>"
            )
        parts.append(
            f"<text x='{x + slot / 2:.1f}' y='{h - bottom + 14}' font-size='10' text-anchor='middle'>"
            f"{escape(layer)}</text>"
        )
    if flat:
        parts.append(
            f"<text x='{w / 2:.0f}' y='{h / 2 - 10:.0f}' font-size='12' text-anchor='middle'>no tensor value "
            "differs in any layer (every bar is 0)</text>"
        )
    parts.append(
        f"<text x='{left}' y='{h - 6}' font-size='10'><tspan class='lg-pr'>■</tspan> pr vs base  "
        "<tspan class='lg-floor'>■</tspan> base2 vs base (floor)</text></svg>"
    )
    return Markup("".join(parts))


def svg_divergence(tokens) -> Markup:
    """First divergent token per prompt, pr vs base, with the floor's position."""
    if not tokens:
        return Markup("<p class='muted'>No cold-B outputs in both runs.</p>")
    horizon = max(max(len(t.base_tokens), len(t.pr_tokens)) for t in tokens) or 1
    w, row, left = 640, 22, 70
    h = row * len(tokens) + 40
    scale = (w - left - 20) / horizon
    parts = [f"<svg id=\"plot-divergence\" class=\"plot\" viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img'>"]
    for i, t in enumerate(tokens):
        y = 16 + i * row
        parts.append(
            f"<text x='4' y='{y + 4}' font-size='11'>prompt {t.prompt}</text>"
            f"<line x1='{left}' y1='{y}' x2='{left + horizon * scale:.1f}' y2='{y}' stroke='#ccd'/>"
        )
        if t.floor_first_divergence is not None:
            x = left + t.floor_first_divergence * scale
            parts.append(
                f"<rect class='mark-floor' x='{x - 3:.1f}' y='{y - 7}' width='6' height='14'>"
                f"<title>floor diverges at {t.floor_first_divergence}</title></rect>"
            )
        if t.first_divergence is None:
            parts.append(f"<text x='{left + horizon * scale + 4:.1f}' y='{y + 4}' font-size='10'>✓</text>")
        else:
            x = left + t.first_divergence * scale
            parts.append(
                f"<circle class='mark-pr' cx='{x:.1f}' cy='{y}' r='5'><title>pr diverges from base at "
                f"token {t.first_divergence}</title></circle>"
            )
    parts.append(
        f"<text x='{left}' y='{h - 6}' font-size='10'>token position 0..{horizon} · "
        "<tspan class='lg-pr'>●</tspan> pr vs base · <tspan class='lg-floor'>■</tspan> floor · ✓ identical"
        "</text></svg>"
    )
    return Markup("".join(parts))


def _band_chart(
    svg_id: str,
    label_width: int,
    rows: list[tuple[str, tuple[float, float, str] | None, tuple]],
    unit: str,
    band_legend: str,
) -> Markup:
    """One line per row: its label, an optional shaded band (low, high, tooltip) and a dot per
    build (value, css class), on one shared axis from 0."""
    w, row, left = 640, 26, label_width
    h = row * len(rows) + 36
    top = max(x for _, band, marks in rows for x in (*(band[:2] if band else ()), *(v for v, _ in marks))) * 1.1
    scale = (w - left - 20) / top
    parts = [f"<svg id=\"{svg_id}\" class=\"plot\" viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img'>"]
    for i, (label, band, marks) in enumerate(rows):
        y = 16 + i * row
        parts.append(f"<text x='4' y='{y + 4}' font-size='11'>{escape(label)}</text>")
        if band is not None:
            lo, hi, title = band
            parts.append(
                f"<rect class='band' x='{left + lo * scale:.1f}' y='{y - 8}' "
                f"width='{max((hi - lo) * scale, 1):.1f}' height='16'><title>{escape(title)}</title></rect>"
            )
        for value, cls in marks:
            parts.append(
                f"<circle class='{cls}' cx='{left + value * scale:.1f}' cy='{y}' r='4'>"
                f"<title>{value:.1f} {unit}</title></circle>"
            )
    parts.append(
        f"<text x='{left}' y='{h - 6}' font-size='10'>{unit} (0..{top:.0f}) · base <tspan class='mark-base'>●</tspan> "
        f"base2 <tspan class='mark-floor'>●</tspan> pr <tspan class='mark-pr'>●</tspan> · band: {band_legend}"
        "</text></svg>"
    )
    return Markup("".join(parts))


def _dots(*values: tuple[float | None, str]) -> tuple:
    return tuple((v, cls) for v, cls in values if v is not None)


def svg_timings(rows) -> Markup:
    """Arm wall time per build, the base..base2 band shaded."""
    rows = [r for r in rows if r.base_seconds is not None or r.pr_seconds is not None]
    if not rows:
        return Markup("<p class='muted'>No timings.</p>")
    lines = []
    for r in rows:
        band = None
        if r.base_seconds is not None and r.base2_seconds is not None:
            lo, hi = sorted((r.base_seconds, r.base2_seconds))
            band = (lo, hi, f"base..base2: {lo:.1f}-{hi:.1f} s")
        lines.append(
            (
                r.arm[:28],
                band,
                _dots((r.base_seconds, "mark-base"), (r.base2_seconds, "mark-floor"), (r.pr_seconds, "mark-pr")),
            )
        )
    return _band_chart("plot-timings", 190, lines, "seconds", "base..base2")


def svg_throughput(rows) -> Markup:
    """tokens/s per point: the base..base2 band shaded, each build's median marked."""
    rows = [r for r in rows if r.base_median is not None or r.pr_median is not None]
    if not rows:
        return Markup("")
    lines = [
        (
            r.point[:22],
            None
            if r.band_low is None
            else (r.band_low, r.band_high, f"base/base2 samples: {r.band_low:.1f}-{r.band_high:.1f} tokens/s"),
            _dots((r.base_median, "mark-base"), (r.base2_median, "mark-floor"), (r.pr_median, "mark-pr")),
        )
        for r in rows
    ]
    return _band_chart("plot-throughput", 150, lines, "tokens/s", "base and base2 samples")


# --- index.html ----------------------------------------------------------------------------


JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){th.classList.add('sort');th.addEventListener('click',function(){
    var body=t.tBodies[0],rows=Array.from(body.rows),asc=th.dataset.dir!=='asc';th.dataset.dir=asc?'asc':'desc';
    rows.sort(function(a,b){var x=a.cells[i].textContent.trim(),y=b.cells[i].textContent.trim();
      var nx=parseFloat(x),ny=parseFloat(y);var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:x.localeCompare(y);return asc?c:-c;});
    rows.forEach(function(r){body.appendChild(r);});});});});
document.querySelectorAll('input.filter').forEach(function(inp){inp.addEventListener('input',function(){
  var q=inp.value.toLowerCase(),t=document.getElementById(inp.dataset.table);
  Array.from(t.tBodies[0].rows).forEach(function(r){r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':'';});
});});
"""


def pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def render_html(cmp: BuildComparison, provenance: dict[str, str] | None = None) -> str:
    def num(v) -> str:
        return "—" if v is None else f"{v:.3g}"

    def cls(outcome: str) -> str:
        return {NO_DIFFERENCE: "nmd"}.get(outcome, outcome.replace(" ", "-"))

    builds = {b.label: asdict(b) for b in cmp.builds}
    deciding = [c for c in cmp.status_changes if c.decides]
    return render(
        "compare.html.j2",
        cmp=_view(cmp, builds),
        provenance=provenance or {},
        base=builds["base"],
        pr=builds["pr"],
        base2=builds.get("base2"),
        met=cmp.exit_code == 0,
        nmd=NO_DIFFERENCE,
        deciding=deciding,
        reported=[c for c in cmp.status_changes if not c.decides],
        measured=[v for v in cmp.values if v.outcome != NO_DIFFERENCE],
        floor_values=[v for v in cmp.values if v.outcome == NO_DIFFERENCE],
        plot_layers=svg_layer_bars(cmp.layer_change),
        plot_divergence=svg_divergence(cmp.tokens),
        plot_timings=svg_timings(cmp.timings),
        plot_throughput=svg_throughput(cmp.throughput),
        js=Markup(JS),
        num=num,
        cls=cls,
        pct=pct,
    )


def _view(cmp: BuildComparison, builds: dict):
    """The comparison with builds as dicts (Jinja indexes provenance rows by key)."""
    from types import SimpleNamespace

    view = {f.name: getattr(cmp, f.name) for f in fields(cmp)}
    view["builds"] = [builds[b.label] for b in cmp.builds]
    return SimpleNamespace(**view)
