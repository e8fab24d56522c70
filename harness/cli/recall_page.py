"""``refit-harness recall-page RUN_DIR...``: the "Recall on real bugs" page from ``run -s regressions``
records, one run per vLLM version (a column each). It copies the runs' ``regressions.json`` into
``docs/recall.json`` (a list, in the order given) and renders ``docs/recall.md`` from it, so the
committed page can always be checked against its records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "recall-page", help="write docs/recall.md (and its record docs/recall.json) from a regressions run"
    )
    p.set_defaults(handler=cmd_recall_page)
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="output directories of 'refit-harness run -s regressions', one per vLLM version (a column each)",
    )
    p.add_argument("--docs", default="docs", help="where recall.md and recall.json go (default: docs)")
    p.add_argument(
        "--update",
        action="store_true",
        help="re-measure some entries: put each run's entries into the committed record of its vLLM version "
        "(DOCS/recall.json), replacing those it ran and adding new ones, instead of starting the page anew; a run "
        "on a vLLM version the record lacks becomes that version's column",
    )


def cmd_recall_page(args: argparse.Namespace) -> int:
    from harness.report.recall import headline, load_page_records, load_record, page, updated_record
    from harness.run_dir import RunDir

    runs = [load_record(RunDir(Path(run)).regressions_record) for run in args.runs]
    docs = Path(args.docs)
    records = runs
    if args.update:
        records = load_page_records(docs / "recall.json")
        for run in runs:
            version = run["stock"].get("vllm")
            at = next((i for i, r in enumerate(records) if r["stock"].get("vllm") == version), None)
            if at is None:
                records.append(run)  # a version the page has no column for yet: its first
            else:
                records[at] = updated_record(records[at], run)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "recall.json").write_text(json.dumps(records, indent=2) + "\n")
    (docs / "recall.md").write_text(page(records))
    for record in records:
        print(f"{docs / 'recall.md'}: {headline(record)}")
    return 0
