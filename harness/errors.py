"""The one error hierarchy. Failures are values until the CLI turns them into exit codes:
every error the harness raises on purpose is a ``HarnessError`` carrying its exit code, and
``harness.cli`` has the one ``except`` that prints it as one line.

Exit 1 is never an error: it is a verdict (FAIL, INCONCLUSIVE, XPASS) or an expectation not
met (``harness.judge.exit_codes``). Everything here is exit 2.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class: a failure the harness names itself, shown as one line."""

    exit_code: int = 2
    """The CLI's exit code for it."""
    keeps_traceback: bool = False
    """Whether the CLI also writes its traceback to ``<out>/harness.log`` (machinery failing,
    as opposed to input the user can correct)."""


class UsageError(HarnessError, ValueError):
    """Bad input from the user (a flag, a file, a name): detected before any engine starts."""


class UnknownName(UsageError, KeyError):
    """A registry lookup named something it does not hold (the message lists what exists)."""

    def __str__(self) -> str:  # KeyError quotes its message; we want a plain line
        return str(self.args[0])


class CheckpointError(UsageError):
    """A checkpoint is missing, unreadable, or does not fit the run."""


class AccuracyFileError(UsageError):
    """The ``--accuracy`` file is missing, empty or malformed."""


class BuildError(UsageError):
    """A build cannot be used or created (bad name, no interpreter, failed install)."""


class CompareError(UsageError):
    """Two runs cannot be compared (different checkpoints, prompts or settings)."""


class SchemaError(HarnessError, ValueError):
    """A record on disk cannot be read by this harness."""


class UnreadableFile(HarnessError, ValueError):
    """A file that is not a readable safetensors file."""


class InfrastructureError(HarnessError, RuntimeError):
    """Ray (or another piece of the machinery, not an engine) failed."""

    keeps_traceback = True


class VllmApiError(HarnessError, RuntimeError):
    """The installed vLLM lacks a name the harness needs in every version it supports (the
    message says where it looked)."""
