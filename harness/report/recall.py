"""The recall table of the ``regressions`` scenario, from its record (``regressions.json``) only:
``regressions.md`` and ``regressions.csv`` beside it, and the documentation page
``docs/recall.md`` (``refit-harness recall-page``), which is this same rendering of committed
copies of the records (one run per vLLM version, in ``docs/recall.json``), so a test can check
that the page is what the records say."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from harness.run_dir import RunDir


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _verdicts(pairs) -> str:
    return ", ".join(f"{p} {v}" for p, v in pairs) or "not run"


def _outcome(e: dict) -> str:
    status = e.get("status") or ("caught" if e["caught"] else "missed")
    if status == "caught":
        return "**" + ", ".join(e["evidence"]) + "**: " + e["detail"]
    return f"{'SKIPPED' if status == 'skipped' else status}: {e['detail']}"


def _fidelity(e: dict) -> str:
    f = e.get("fidelity", "")
    return f"**{f}**: {e.get('fidelity_note', '')}" if f == "stand-in" else f or "not recorded"


def table(record: dict) -> str:
    """The per-bug table as markdown."""
    rows = [
        "| bug | fidelity | mechanism | model · path | caught by | patched | stock | expected | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in record["entries"]:
        fix = e["fix"].rstrip("/").rsplit("/", 1)[-1]
        issue = e["issue"].rstrip("/").rsplit("/", 1)[-1] if e["issue"] else ""
        bug = f"[{e['id']}]({e['fix']})" + (f" (report [#{issue}]({e['issue']}))" if issue and issue != fix else "")
        caught = _outcome(e)
        expected = ("caught" if e["expected_caught"] else "miss") + (
            "" if e["met"] else " — NOT MET: " + "; ".join(e["unmet"])
        )
        where = (
            f"`{e['model']}` · {', '.join(e['paths'])}"
            if e["ran"]
            else f"`{e['model']}` · {', '.join(e['paths'])} (not run{'' if e.get('executable', True) else ' on a CPU'})"
        )
        rows.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    bug,
                    _fidelity(e),
                    e["title"],
                    where,
                    caught,
                    _verdicts(e["patched"]),
                    _verdicts(e["stock"]),
                    expected,
                    f"{e['seconds']:.0f} s",
                )
            )
            + " |"
        )
    return "\n".join(rows) + "\n"


def _recall(record: dict) -> tuple[dict, dict]:
    """(over every counted entry, over the entries that execute here); a schema-1 record has
    only the first, and every entry of it executed or was a miss that could not."""
    r = record["recall"]
    if "executable" in r:
        return r, r["executable"]
    ran = [e for e in record["entries"] if e["ran"]]
    caught = sum(e["caught"] for e in ran)
    return r, {"caught": caught, "total": len(ran), "value": round(caught / len(ran), 3) if ran else 0.0}


def headline(record: dict) -> str:
    r, x = _recall(record)
    version = record["stock"].get("vllm", "?")
    extra = [f"{r[k]} {k.upper() if k == 'skipped' else k}" for k in ("skipped", "masked") if r.get(k)]
    return (
        f"vLLM {version}: recall **{x['caught']} of {x['total']}** on the entries that execute on this "
        f"device ({x['value']:.0%}), **{r['caught']} of {r['total']}** over all ({r['value']:.0%})"
        + (f" ({', '.join(extra)})" if extra else "")
        + f"; every expectation {'held' if record['all_met'] else 'did NOT hold'}."
    )


def by_version(records: list[dict]) -> str:
    """One row per entry, one column per record's vLLM version: caught (by what), missed, SKIPPED, masked."""
    ids: list[str] = []
    cells: dict[tuple[str, int], str] = {}
    for i, record in enumerate(records):
        for e in record["entries"]:
            if e["id"] not in ids:
                ids.append(e["id"])
            status = e.get("status") or ("caught" if e["caught"] else "missed")
            if status == "caught":
                text = "caught (" + ", ".join(e["evidence"]) + ")"
            elif status == "missed":
                text = "missed" + ("" if e["ran"] else " (not run)")
            else:
                text = f"{'SKIPPED' if status == 'skipped' else status}: {e['detail']}"
            cells[e["id"], i] = text + ("" if e["met"] else " — NOT MET")
    head = ["entry"] + [f"vLLM {r['stock'].get('vllm', '?')}" for r in records]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry_id in ids:
        row = [entry_id] + [cells.get((entry_id, i), "not in this run") for i in range(len(records))]
        rows.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(rows) + "\n"


def page(records: list[dict]) -> str:
    """``docs/recall.md``: the headlines, how it was measured, the corpus by version, and the full
    table of each run."""
    sections = []
    for record in records:
        m, s = record["machine"], record["stock"]
        sections.append(
            f"""## vLLM {s.get("vllm", "?")} ({s.get("vllm_distribution", "vllm")})

{headline(record)}

Measured by `refit-harness run -s regressions` on {m.get("cpu", "?")} ({m.get("cpus", "?")} CPUs,
{m.get("isa", "")}), {_measured_by(record)}

{table(record)}"""
        )
    heads = "\n".join(f"- {headline(r)}" for r in records)
    body = "\n".join(sections)
    return f"""# Recall on vLLM's own refit bugs

<!-- generated by `refit-harness recall-page RUN_DIR...` from docs/recall.json; do not edit -->

{heads}

Each row is a refit bug vLLM fixed upstream (or still has), re-injected into an installed vLLM as
a patch (`regressions/<id>/`): the patched build is an overlay of the stock environment
(`refit-harness build NAME --base-env ENV --patch FILE.diff`), and it runs the entry's model and
reload path(s) beside stock vLLM. *Caught* means the patched build FAILs on the evidence the entry
names (a census tensor, a recorded kernel input, greedy tokens, logprobs; for a loud bug, the
refit's error in vLLM's own words) while stock gets the verdict it expects. A live bug (no patch:
stock vLLM still has it) is judged on its stock run, where the path's known issue naming it makes
it XFAIL. A miss is kept with the verdict it actually gets and the detector it needs.
*Fidelity* says whether the patch takes out what the fix put in (`faithful`) or brings the symptom
back by other code (`stand-in`, with why). An entry declares the vLLM versions each patch applies
to: one without a patch for a version, or whose patch does not apply, is SKIPPED there with the
reason; one that a version's own code hides is *masked* there and left out of recall. Recall is
stated over the entries whose patched code executes on the measuring device, and over all
entries (a SKIPPED or not-run entry counts as not caught).

## By version

{by_version(records)}
{body}"""


def write_recall(record: dict, out: Path) -> dict[str, Path]:
    d = RunDir(out)
    files = {d.regressions_md.name: d.regressions_md, d.regressions_csv.name: d.regressions_csv}
    d.regressions_md.write_text(headline(record) + "\n\n" + table(record))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        (
            "schema_version",
            "id",
            "fix",
            "model",
            "paths",
            "fidelity",
            "status",
            "ran",
            "caught",
            "expected_caught",
            "met",
            "evidence",
            "patched",
            "stock",
            "detail",
            "seconds",
        )
    )
    for e in record["entries"]:
        w.writerow(
            (
                record["schema_version"],
                e["id"],
                e["fix"],
                e["model"],
                " ".join(e["paths"]),
                e["fidelity"],
                e["status"],
                e["ran"],
                e["caught"],
                e["expected_caught"],
                e["met"],
                " ".join(e["evidence"]),
                _verdicts(e["patched"]),
                _verdicts(e["stock"]),
                e["detail"],
                e["seconds"],
            )
        )
    d.regressions_csv.write_text(buf.getvalue())
    return files


def _check(record: object, where: Path) -> dict:
    from harness.errors import UsageError

    if not isinstance(record, dict) or record.get("schema_version") not in (1, 2) or "entries" not in record:
        raise UsageError(f"{where}: not a regressions record of schema 1 or 2")
    return record


def _share(caught: int, total: int) -> dict:
    return {"caught": caught, "total": total, "value": round(caught / total, 3) if total else 0.0}


def updated_record(record: dict, rerun: dict) -> dict:
    """``record`` with the entries of ``rerun`` (a later run of some entries, on the same vLLM and
    CPU) put in place of its own by id, and new ones appended; recall and ``all_met`` recomputed
    from the entries, and each contributing run kept in ``runs`` (when, which commit, which
    entries), so the page says which rows were measured by which run."""
    from harness.errors import UsageError

    for key, what in (("stock", "vllm"), ("machine", "cpu")):
        if record[key].get(what) != rerun[key].get(what):
            raise UsageError(
                f"cannot update a record of {key} {what} {record[key].get(what)!r} with a run on "
                f"{rerun[key].get(what)!r}: give that run as a page of its own"
            )
    fresh = {e["id"]: e for e in rerun["entries"]}
    entries = [fresh.pop(e["id"], e) for e in record["entries"]] + list(fresh.values())

    def run_of(r: dict) -> list[dict]:
        return r.get("runs") or [
            {k: r.get(k) for k in ("started", "seconds", "harness_commit")}
            | {"entries": [e["id"] for e in r["entries"]]}
        ]

    redone = {e["id"] for e in rerun["entries"]}
    runs = [run | {"entries": [i for i in run["entries"] if i not in redone]} for run in run_of(record)] + run_of(rerun)
    counted = [e for e in entries if e.get("status") != "masked"]
    executable = [e for e in counted if e.get("executable", e["ran"])]
    return record | {
        "entries": entries,
        "runs": [run for run in runs if run["entries"]],
        "seconds": sum(run["seconds"] for run in runs if run["entries"]),
        "all_met": all(e["met"] for e in entries),
        "recall": {
            **_share(sum(e["caught"] for e in counted), len(counted)),
            "executable": _share(sum(e["caught"] for e in executable), len(executable)),
            "skipped": sum(e.get("status") == "skipped" for e in entries),
            "masked": sum(e.get("status") == "masked" for e in entries),
        },
    }


def _measured_by(record: dict) -> str:
    runs = record.get("runs")
    if not runs or len(runs) == 1:
        return (
            f"harness commit `{record.get('harness_commit', '')}`, started\n{record['started']}, "
            f"{record['seconds']:.0f} s in all."
        )
    return f"{len(runs)} runs, {record['seconds']:.0f} s in all:\n\n" + "\n".join(
        f"- started {run['started']}, harness commit `{run['harness_commit']}`, {run['seconds']:.0f} s: "
        + ", ".join(run["entries"])
        for run in runs
    )


def load_record(path: Path) -> dict:
    """One run's record (``regressions.json``)."""
    from harness.errors import UsageError

    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the regressions record ({exc})") from None
    return _check(record, path)


def load_page_records(path: Path) -> list[dict]:
    """The records behind ``docs/recall.md`` (``docs/recall.json``: a list, one run per vLLM
    version; a single record is read as a list of one)."""
    from harness.errors import UsageError

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the regressions records ({exc})") from None
    return [_check(r, path) for r in (data if isinstance(data, list) else [data])]
