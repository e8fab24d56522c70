"""index.html: one self-contained page (inline CSS, no scripts, no network), rendered from a
Jinja2 template with autoescaping: every value from a record (names, reasons, errors, token
ids) is text, never markup, without an ``escape`` call at each site."""

from __future__ import annotations

from typing import Any

import pandas as pd
from jinja2 import Environment, select_autoescape
from markupsafe import Markup

from harness.judge.evaluation import Evaluation
from harness.judge.verdict import FAILING_STATUSES
from harness.report.style import CSS

_ENV = Environment(
    autoescape=select_autoescape(default=True, default_for_string=True), trim_blocks=True, lstrip_blocks=True
)
_ENV.filters["g3"] = lambda value: f"{value:.3g}"

# Single-quoted attributes, as the page has always had them (tests and tools look for id='...').
TEMPLATE = """\
{% macro badge(status) %}<span class='badge {{ status }}'>{{ status }}</span>{% endmacro %}
{% macro head(headers) %}<table><thead><tr>{% for h in headers %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>{% endmacro %}
{# A completion decoded by the checkpoint's own tokenizer (text prompts), under its token ids. #}
{% macro decoded(text) %}{% if text is string %}<div class='decoded'>“{{ text }}”</div>{% endif %}{% endmacro %}
{% macro code_lines(items) %}{% for x in items %}<code>{{ x }}</code>{% if not loop.last %}<br>{% endif %}{% endfor %}{% endmacro %}
<!doctype html><html lang='en'><head><meta charset='utf-8'><title>refit-harness report</title><style>{{ css }}</style></head><body>
<h1>refit-harness report</h1><p class='muted'>Oracle: warm A→B through each path vs a cold start on B, with cold A as witness. Started {{ started }}.</p>
<section id='verdicts'><h2>Verdicts</h2>{{ head(["path", "verdict", "positive control", "reasons"]) }}
{% for name, p in paths.items() %}
<tr class=''><td><code>{{ name }}</code></td><td>{{ badge(p.verdict) }}</td><td>
{%- if p.positive_control is none %}—{% elif p.positive_control.detected %}detected{% else %}<b>missed</b>{% endif %}</td><td>
{%- for r in p.reasons %}{{ r }}{% if not loop.last %}<br>{% endif %}{% else %}—{% endfor %}</td></tr>
{% endfor %}
</tbody></table></section>
<section id='first-divergence'><h2>First divergence</h2>
{% for name, p in divergent %}
<div class='first'><b>{{ name }}</b>: {% if p.first_divergent_kernel_input %}first divergent kernel input: <code>{{ p.first_divergent_kernel_input }}</code>{% endif %}
{% if p.first_divergent_kernel_input and p.first_divergent_tensor %}<br>{% endif %}
{% if p.first_divergent_tensor %}first divergent tensor: <code>{{ p.first_divergent_tensor }}</code>{% endif %}</div>
{% else %}
<p>No tensor differs after any refit.</p>
{% endfor %}
</section>
<section id='positive-control'><h2>Positive control</h2><p class='muted'>B′ = B with one checkpoint tensor scaled. Warm B′ vs warm B must differ at the module that tensor loads into; otherwise the verdict is INCONCLUSIVE.</p>
<p>Scaled tensor: <code>{{ checkpoints.control_tensor }}</code>, {{ checkpoints.control_reason or 'given' }}.</p>
{{ head(["path", "detected", "scaled tensor", "expected modules", "seen at", "outputs moved", "max logprob shift"]) }}
{% for name, p in paths.items() if p.positive_control is not none %}
{% set ctl = p.positive_control %}
<tr class=''><td><code>{{ name }}</code></td><td>{{ badge("OK" if ctl.detected else "FAIL") }}</td><td><code>{{ ctl.checkpoint_tensor }}</code></td><td>{{ code_lines(ctl.expected_modules) }}</td><td>{{ code_lines(ctl.localized_to) if ctl.localized_to else "—" }}</td><td>{% if ctl.tokens_moved %}yes{% else %}<b>no</b>{% endif %}</td><td>{{ ctl.max_logprob_shift|g3 }}</td></tr>
{% endfor %}
</tbody></table></section>
<section id='sabotage'><h2>Sabotage controls</h2>
{% if sabotaged %}
<p class='muted'>Each path's sabotaged twin skips or breaks the one step the path exists for, in the same engine. It must FAIL with what it planted; otherwise the path's PASS is INCONCLUSIVE.</p>
{{ head(["path", "caught", "sabotage", "twin verdict", "evidence"]) }}
{% for name, so in sabotaged %}
<tr class=''><td><code>{{ name }}</code></td><td>{{ badge("OK" if so.caught else "FAIL") }}</td><td>{{ so.sabotage }}</td><td>{{ badge(so.twin_verdict) }}</td><td>{{ so.detail }}</td></tr>
{% endfor %}
</tbody></table>
{% else %}
<p class='muted'>Not run (use --sabotage): no path has shown here that it could fail.</p>
{% endif %}
</section>
{% if accuracy %}
<section id='accuracy'><h2>Accuracy (--accuracy)</h2><p class='muted'>Exact match of the completion's first line over {{ accuracy['items'] }} item(s) of <code>{{ accuracy.file }}</code>; invalid: an empty first line. Tokenizer: {{ accuracy.tokenizer|join(', ') or '?' }}. Full list in accuracy.csv.</p>
<p>Outcome: <b>{{ accuracy.outcome }}</b></p>
{% if not accuracy.discriminating_power %}
<p class='first'><b>No discriminating power:</b> the damaged copy of B scores no lower than cold B, so this eval cannot tell a broken model from a good one. No accuracy result here is a pass.</p>
{% endif %}
{{ head(["point", "arm", "correct", "invalid", "status"]) }}
{% for p in accuracy.points %}
<tr class='{{ "FAIL" if p.status == "differs from cold B" else "" }}'><td><code>{{ p.point }}</code></td><td>{{ p.arm }}</td><td>{{ p.correct }}/{{ p.total }}</td><td>{{ p.invalid }}/{{ p.total }}</td><td>{{ p.status or "—" }}</td></tr>
{% endfor %}
</tbody></table></section>
{% endif %}
<section id='noise-floor'><h2>Noise floor (cold B vs cold B)</h2>
<p>Tensors that differ between two cold starts (not judged): {% for t in noise.differing_tensors %}<code>{{ t }}</code>{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}</p>
{{ head(["prompt", "first divergence", "max logprob diff"]) }}
{% for k, v in noise.tokens.items() %}
<tr class=''><td>{{ k }}</td><td>{{ "identical" if v.first_divergence is none else v.first_divergence }}</td><td>{{ v.max_logprob_diff|g3 }}</td></tr>
{% endfor %}
</tbody></table></section>
{% if unobserved.count %}
<section id='unobserved'><h2>Unobserved ({{ unobserved.count }})</h2><p class='muted'>Reached by the census but impossible to observe here, so never judged; the rest of each observation went on.</p>
{{ head(["name", "kind", "reason", "arms"]) }}
{% for i in unobserved['items'] %}
<tr class=''><td><code>{{ i.name }}</code></td><td>{{ i.kind }}</td><td>{{ i.reason }}</td><td>{{ i.arms|join(', ') }}</td></tr>
{% endfor %}
</tbody></table></section>
{% endif %}
{% macro tensor_rows(rows) %}
{{ head(tensor_headers) }}
{% for r in rows %}
<tr class=''><td><code>{{ r.path }}</code></td><td>{{ r.check }}</td><td><code>{{ r.tensor }}</code></td><td>{{ r.kind }}</td><td>{{ badge(r.status) }}</td><td>{{ "yes" if r.address_moved else "no" }}</td></tr>
{% endfor %}
</tbody></table>
{% endmacro %}
<section id='tensors'><h2>Non-OK tensors</h2><p class='muted'>{{ tensors.compared }} tensor(s) compared after refit over all paths, {{ tensors.unjudgeable }} of them UNJUDGEABLE (equal before and after the refit, so they could not show a refit that missed them); full list in tensors.csv.</p>
{% if tensors.deciding %}{{ tensor_rows(tensors.deciding) }}{% else %}<p>No tensor decides a verdict: all OK.</p>{% endif %}
{% if tensors.rest %}
<details><summary>{{ tensors.rest|length }} tensor(s) not judged or only reported ({{ tensors.rest_statuses|join(', ') }})</summary>{{ tensor_rows(tensors.rest) }}</details>
{% endif %}
</section>
<section id='consumed'><h2>Kernel inputs (recorded forward)</h2><p class='muted'>Persistent tensors the ops read during one prefill, warm vs cold B; {{ consumed.recorded }} recorded, {{ consumed.noisy }} noisy (differ between two cold starts, e.g. opaque kernel handles). Full list in consumed.csv.</p>
{% if consumed.rows %}
{{ head(["path", "op #", "op", "arg", "module", "kernel input", "status"]) }}
{% for r in consumed.rows %}
<tr class=''><td><code>{{ r.path }}</code></td><td>{{ r.op_index }}</td><td><code>{{ r.op }}</code></td><td>{{ r.arg }}</td><td><code>{{ r.module }}</code></td><td><code>{{ r.tensor }}</code></td><td>{{ badge(r.status) }}</td></tr>
{% endfor %}
</tbody></table>
{% else %}
<p>Every recorded kernel input matches cold B.</p>
{% endif %}
</section>
<section id='hooks'><h2>Post-load hooks per path</h2><p class='muted'>Hooks found on the live model; whether the path's refit ran them (observed by wrapping them in the worker), and derived tensors under each that the refit left stale.</p>
{{ head(["path", "module", "hook", "runs on refit", "stale derived tensors"]) }}
{% for r in hooks %}
<tr class=''><td><code>{{ r.path }}</code></td><td><code>{{ r.module }}</code></td><td>{{ r.kind }}</td><td>{% if r.runs_on_refit %}yes{% else %}<b>no</b>{% endif %}</td><td>{% for t in r.stale_derived %}<code>{{ t }}</code>{% if not loop.last %} {% endif %}{% else %}—{% endfor %}</td></tr>
{% endfor %}
</tbody></table></section>
<section id='tokens'><h2>Greedy tokens</h2>{{ head(["path", "check", "prompt", "first divergence", "max logprob diff", "subject", "reference"]) }}
{% for r in tokens %}
<tr class='{{ "FAIL" if r.diverged else "" }}'><td><code>{{ r.path }}</code></td><td>{{ r.check }}</td><td>{{ r.prompt }}</td><td>{{ r.first_divergence if r.diverged else "identical" }}</td><td>{{ r.max_logprob_diff|g3 }}</td><td><span class='mono'>{{ r.subject_tokens }}</span>{{ decoded(r.subject_text) }}</td><td><span class='mono'>{{ r.reference_tokens }}</span>{{ decoded(r.reference_text) }}</td></tr>
{% endfor %}
</tbody></table></section>
<section id='arms'><h2>Arms</h2>
{% if reference.reused %}
<p>reused reference <code>{{ reference.key }}</code>: the cold-B reference and noise arms were not run again. Engine cold starts in this run: {{ cold_starts }}.</p>
{% else %}
<p class='muted'>Engine cold starts in this run: {{ cold_starts }}.</p>
{% endif %}
{{ head(["arm", "role", "paths", "status", "time", "observed", "error"]) }}
{% for a in arms %}
<tr class=''><td>{{ a.arm }}</td><td>{{ a.role }}</td><td>{{ a.paths|join(', ') or '—' }}</td><td>{{ badge("OK" if a.status == "ok" else "ERROR") }}</td><td>{{ "%.0f"|format(a.seconds) }} s{{ " (reused)" if a.reused }}</td><td>{{ a.observations|join(', ') }}</td><td>{{ a.error or "" }}</td></tr>
{% endfor %}
</tbody></table></section>
<section id='environment'><h2>Environment</h2>{{ head(["", ""]) }}
{% for k, v in environment.items() %}
<tr class=''><td>{{ k }}</td><td><code>{{ v }}</code></td></tr>
{% endfor %}
</tbody></table></section>
</body></html>
"""


def render_html(
    ev: Evaluation,
    summary: dict[str, Any],
    tensors: pd.DataFrame,
    tokens: pd.DataFrame,
    consumed: pd.DataFrame,
    hooks: pd.DataFrame,
) -> str:
    # A path that never ran has no positive-control entry at all.
    paths = {name: {"positive_control": None, **p} for name, p in summary["paths"].items()}
    return _ENV.from_string(TEMPLATE).render(
        css=Markup(CSS),
        started=ev.record.started,
        paths=paths,
        divergent=[
            (name, p)
            for name, p in paths.items()
            if p.get("first_divergent_kernel_input") or p.get("first_divergent_tensor")
        ],
        checkpoints=summary["checkpoints"],
        sabotaged=[(name, p["sabotage"]) for name, p in paths.items() if p.get("sabotage") is not None],
        accuracy=summary.get("accuracy"),
        noise=summary["noise_floor"],
        unobserved=summary.get("unobserved") or {"count": 0, "items": []},
        tensors=_non_ok(tensors),
        tensor_headers=["path", "check", "tensor", "kind", "status", "address moved"],
        consumed=_consumed(consumed),
        hooks=_hooks(hooks),
        tokens=_tokens(tokens),
        reference=summary.get("reference") or {},
        cold_starts=summary.get("cold_starts", "?"),
        arms=summary["arms"],
        environment={**summary["environment"], **{f"checkpoint {k}": v for k, v in summary["checkpoints"].items()}},
    )


def _non_ok(tensors: pd.DataFrame) -> dict[str, Any]:
    """Rows that decide a verdict first; not-judged (NOISY, UNJUDGEABLE) and reported-only
    (REBOUND) rows folded away. Sabotaged twins have their own section."""
    own = tensors[~tensors["path"].str.contains("~", regex=False)]
    bad = own[(own["status"] != "OK") & (own["check"] != "noise")]
    deciding = bad["status"].isin([s.value for s in FAILING_STATUSES])
    refit = own[own["check"] == "refit"]
    rest = bad[~deciding]
    return {
        "deciding": bad[deciding].to_dict("records"),
        "rest": rest.to_dict("records"),
        "rest_statuses": sorted(set(rest["status"])),
        "compared": len(refit),
        "unjudgeable": int((refit["status"] == "UNJUDGEABLE").sum()),
    }


def _consumed(consumed: pd.DataFrame) -> dict[str, Any]:
    bad = consumed[
        ~consumed["status"].isin(["OK", "NOISY", "UNJUDGEABLE"]) & ~consumed["path"].str.contains("~", regex=False)
    ]
    return {
        "rows": bad.to_dict("records"),
        "recorded": len(consumed),
        "noisy": int((consumed["status"] == "NOISY").sum()),
    }


def _hooks(hooks: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {**r, "stale_derived": [t for t in str(r["stale_derived"]).split() if t != "nan"]}
        for r in hooks.to_dict("records")
    ]


def _tokens(tokens: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "diverged": not pd.isna(r["first_divergence"]),
            **{k: None if pd.isna(r.get(k)) else r[k] for k in ("subject_text", "reference_text")},
        }
        for r in tokens[tokens["check"] != "noise"].to_dict("records")
    ]
