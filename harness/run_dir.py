"""The layout of an output directory: the one place a file name in it is spelled.

A run's directory holds its record (``run.json``), the reports beside it, one plan, result
and log per arm under ``arms/`` and ``scratch/`` for full weight copies (swept after each arm
and on start and resume). A scenario, a comparison, a corpus run and a review write the same
report trio (``summary.json``, ``summary.md``, ``index.html``) beside files of their own. The
names are a stable interface (records written by earlier versions keep loading): change one
only with a schema version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

RUN_RECORD = "run.json"
"""The run record (``RunRecord``): spec, plan, checkpoints, machine."""
PREFLIGHT = "preflight.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
INDEX_HTML = "index.html"
REPRO = "repro.py"
HARNESS_LOG = "harness.log"
"""The tracebacks of harness errors, appended by the CLI."""
TENSORS_CSV = "tensors.csv"
TOKENS_CSV = "tokens.csv"
CONSUMED_CSV = "consumed.csv"
HOOKS_CSV = "hooks.csv"
ACCURACY_CSV = "accuracy.csv"
RUN_TABLES = (TENSORS_CSV, TOKENS_CSV, CONSUMED_CSV, HOOKS_CSV, ACCURACY_CSV)
"""The CSV tables of a run's report."""
ARMS_DIR = "arms"
SCRATCH_DIR = "scratch"
ARM_PLAN_SUFFIX, ARM_RESULT_SUFFIX, ARM_LOG_SUFFIX = ".plan.json", ".result.json", ".log"

COMPARISON = "comparison.json"
"""A comparison of two builds' runs (``refit-harness compare``, ``--build``)."""
COMPARE_TABLES = (
    "verdicts.csv",
    TOKENS_CSV,
    "tensor_changes.csv",
    "values.csv",
    HOOKS_CSV,
    "timings.csv",
    "throughput.csv",
    ACCURACY_CSV,
    "builds.csv",
)
"""A comparison's CSV tables, in the order it writes them."""
EXPECTATIONS_CSV = "expectations.csv"
REGRESSIONS_RECORD = "regressions.json"
"""The regression corpus's record (its outcomes and recall)."""
REGRESSIONS_MD, REGRESSIONS_CSV = "regressions.md", "regressions.csv"
REVIEW_RECORD = "review.json"

FILE_NAMES = frozenset(
    {
        RUN_RECORD,
        PREFLIGHT,
        SUMMARY_JSON,
        SUMMARY_MD,
        INDEX_HTML,
        REPRO,
        HARNESS_LOG,
        *RUN_TABLES,
        ARM_PLAN_SUFFIX,
        ARM_RESULT_SUFFIX,
        COMPARISON,
        *COMPARE_TABLES,
        EXPECTATIONS_CSV,
        REGRESSIONS_RECORD,
        REGRESSIONS_MD,
        REGRESSIONS_CSV,
        REVIEW_RECORD,
    }
)
"""Every file name (or arm file suffix) of an output directory: spelled here only."""


class _Named(Protocol):
    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class ArmFiles:
    """One arm's files in a run directory."""

    plan: Path
    """Its plan (``ArmPlan``), written before it starts."""
    result: Path
    """Its result (``ArmResult``), saved before each risky step."""
    log: Path
    """Its engine's output."""
    scratch: Path
    """Its full weight copies, swept after it ends."""


@dataclass(frozen=True)
class RunDir:
    """An output directory, by what it holds."""

    root: Path
    """The directory."""

    @property
    def record(self) -> Path:
        return self.root / RUN_RECORD

    @property
    def preflight(self) -> Path:
        return self.root / PREFLIGHT

    @property
    def summary_json(self) -> Path:
        return self.root / SUMMARY_JSON

    @property
    def summary_md(self) -> Path:
        return self.root / SUMMARY_MD

    @property
    def index_html(self) -> Path:
        return self.root / INDEX_HTML

    @property
    def repro(self) -> Path:
        return self.root / REPRO

    @property
    def harness_log(self) -> Path:
        return self.root / HARNESS_LOG

    @property
    def comparison(self) -> Path:
        return self.root / COMPARISON

    @property
    def expectations_csv(self) -> Path:
        return self.root / EXPECTATIONS_CSV

    @property
    def regressions_record(self) -> Path:
        return self.root / REGRESSIONS_RECORD

    @property
    def regressions_md(self) -> Path:
        return self.root / REGRESSIONS_MD

    @property
    def regressions_csv(self) -> Path:
        return self.root / REGRESSIONS_CSV

    @property
    def review_record(self) -> Path:
        return self.root / REVIEW_RECORD

    @property
    def arms_dir(self) -> Path:
        return self.root / ARMS_DIR

    @property
    def scratch_dir(self) -> Path:
        return self.root / SCRATCH_DIR

    def table(self, name: str) -> Path:
        """One of the CSV tables (``RUN_TABLES``, ``COMPARE_TABLES``)."""
        assert name in RUN_TABLES or name in COMPARE_TABLES, f"{name} is no table of an output directory"
        return self.root / name

    def arm(self, arm: _Named) -> ArmFiles:
        """An arm's plan, result, log and scratch directory."""
        base = self.arms_dir / arm.name
        return ArmFiles(
            plan=base.with_suffix(ARM_PLAN_SUFFIX),
            result=base.with_suffix(ARM_RESULT_SUFFIX),
            log=base.with_suffix(ARM_LOG_SUFFIX),
            scratch=self.scratch_dir / arm.name,
        )

    def is_run(self) -> bool:
        """The directory holds a run (its record)."""
        return self.record.is_file()
