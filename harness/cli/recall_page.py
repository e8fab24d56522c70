"""``refit-harness recall-page RUN_DIR``: the "Recall on real bugs" page from a ``run -s regressions``
record. It copies the run's ``regressions.json`` to ``docs/recall.json`` and renders
``docs/recall.md`` from it, so the committed page can always be checked against its record."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "recall-page", help="write docs/recall.md (and its record docs/recall.json) from a regressions run"
    )
    p.set_defaults(handler=cmd_recall_page)
    p.add_argument("run", help="the output directory of 'refit-harness run -s regressions'")
    p.add_argument("--docs", default="docs", help="where recall.md and recall.json go (default: docs)")


def cmd_recall_page(args: argparse.Namespace) -> int:
    from harness.orchestrate.regressions import RECORD
    from harness.report.recall import load_record, page

    source = Path(args.run) / RECORD
    record = load_record(source)
    docs = Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, docs / "recall.json")
    (docs / "recall.md").write_text(page(record))
    print(f"{docs / 'recall.md'}: {record['recall']['caught']}/{record['recall']['total']} caught")
    return 0
