"""What a finished run is, read back from disk: its root record and its evaluation.

Plain data apart from the orchestrator (``harness.orchestrate.execute``), so that the reports and the
cross-build comparison read runs without importing the code that starts engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.judge.diff import PathComparison
from harness.judge.verdict import Verdict
from harness.plan import Plan
from harness.records import ArmResult, CpuCapabilities
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.run import RunSpec


@dataclass(frozen=True)
class RunRecord:
    """What was asked and where things are: the root record of a report directory."""

    spec: RunSpec
    """The run's spec."""
    checkpoints: CheckpointSet
    """Resolved A, B and B'."""
    plan: Plan
    """Arms and skipped paths."""
    git_sha: str
    """Commit of the harness that ran."""
    started: str
    """UTC start time, ISO 8601."""
    arm_env: tuple[tuple[str, str], ...] = ()
    """Environment set for every arm of the run (OpenMP placement), the same for all, so numerics match."""
    reference_key: str | None = None
    """Content key of the cold-B reference and noise observations (``harness.orchestrate.reference``); None
    when reference reuse was off. With ``plan.reused`` set, their results came from the cache."""
    cpu: CpuCapabilities | None = None
    """The machine's CPU as the parent read it (``/proc/cpuinfo``), with the ``--cpu-isa`` override
    applied; each arm records what vLLM itself saw (``ArmResult.cpu``). None in older records."""
    finished: str | None = None
    """UTC time the last arm ended, ISO 8601 (rewritten by ``--resume``); None while the run is
    going, or in older records. With ``started``, the run's duration on the report's first lines."""


@dataclass(frozen=True)
class Evaluation:
    """Everything a report shows, derived from records on disk."""

    record: RunRecord
    """The run's root record."""
    arms: tuple[ArmResult, ...]
    """Results of the arms that have run."""
    comparisons: tuple[PathComparison, ...]
    """One per path that had a subject arm."""
    verdicts: tuple[Verdict, ...]
    """One per requested path, in request order."""

    @property
    def exit_code(self) -> int:
        from harness.judge import exit_codes

        return exit_codes.for_verdicts(v.status for v in self.verdicts)
