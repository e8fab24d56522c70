"""The accuracy probe (``--accuracy FILE.jsonl``): the file, read before any engine starts,
and the judging, from records alone.

- Exact match: the completion's answer (its text up to the first newline, stripped)
  equals the known answer (stripped). *Invalid*: that answer is empty (the model wrote
  nothing the tokenizer can decode before a newline), so no answer was given at all.
- Discriminating power: the damaged arm (cold on a heavily damaged copy of B) must answer
  fewer items correctly than every undamaged cold B (reference and noise). Otherwise the
  eval cannot tell a broken model from a good one, and no accuracy result is a pass.
- With discriminating power, a path whose correct count after its refit lies outside the
  range of the cold-B counts (the noise floor) *differs from cold B*, and is flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.errors import AccuracyFileError
from harness.records import ArmResult
from harness.spec.run import AccuracySpec

# lm-eval-style field names, in the order tried: (prompt field, answer field)
FIELDS = (("question", "answer"), ("input", "target"), ("prompt", "answer"))

NO_POWER = "no discriminating power"
SAME = "same as cold B"
DIFFERS = "differs from cold B"


def read_accuracy_file(path: str | Path, max_tokens: int = AccuracySpec.max_tokens) -> AccuracySpec:
    """Every line a JSON object with a prompt and its answer (``question``/``answer``,
    ``input``/``target`` or ``prompt``/``answer``); blank lines are skipped."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccuracyFileError(f"--accuracy {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    prompts, answers = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise AccuracyFileError(f"--accuracy {path}, line {n}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise AccuracyFileError(
                f"--accuracy {path}, line {n}: a JSON object is expected, not {type(item).__name__}"
            )
        fields = next(((q, a) for q, a in FIELDS if q in item and a in item), None)
        if fields is None:
            raise AccuracyFileError(
                f"--accuracy {path}, line {n}: needs a prompt and its answer as "
                + ", ".join(f"{q}/{a}" for q, a in FIELDS)
                + f"; has {sorted(item)[:6]}"
            )
        prompt, answer = item[fields[0]], item[fields[1]]
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(prompt, str) or not prompt.strip():
            raise AccuracyFileError(f"--accuracy {path}, line {n}: {fields[0]!r} must be a non-empty string")
        if not isinstance(answer, str) or not answer.strip():
            raise AccuracyFileError(f"--accuracy {path}, line {n}: {fields[1]!r} must be a non-empty string or number")
        prompts.append(prompt)
        answers.append(answer)
    if not prompts:
        raise AccuracyFileError(f"--accuracy {path}: no items (one JSON object per line)")
    return AccuracySpec(file=str(p), prompts=tuple(prompts), answers=tuple(answers), max_tokens=max_tokens)


def extract_answer(completion: str) -> str:
    """The answer a completion gives: its text up to the first newline, stripped."""
    return completion.split("\n", 1)[0].strip()


@dataclass(frozen=True)
class AccuracyPoint:
    """Exact-match accuracy at one point of one arm."""

    point: str
    """``cold_B``, ``cold_B_damaged`` or the reload path whose refit to B the subject had just done."""
    arm: str
    """Arm that measured it (cold B is measured twice: ``reference`` and ``noise``)."""
    correct: int
    """Items whose answer equals the known answer."""
    invalid: int
    """Items whose completion gave no answer (empty before its first newline)."""
    total: int
    """Items asked."""
    status: str
    """For a path: ``same as cold B``, ``differs from cold B`` (flagged) or ``no discriminating
    power``; for cold B and the damaged arm: empty."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def invalid_rate(self) -> float:
        return self.invalid / self.total if self.total else 0.0

    @property
    def flagged(self) -> bool:
        return self.status == DIFFERS


@dataclass(frozen=True)
class AccuracyJudgement:
    """The probe's outcome for one run."""

    points: tuple[AccuracyPoint, ...]
    """Cold B (every cold arm), the damaged arm, then each path."""
    discriminates: bool
    """The damaged arm answered fewer items correctly than every cold B."""
    cold_range: tuple[int, int] | None
    """Lowest and highest correct count of the cold-B arms: the noise floor."""

    @property
    def summary(self) -> str:
        if not self.points:
            return "not measured"
        if not self.discriminates:
            return NO_POWER
        flagged = [p.point for p in self.points if p.flagged]
        return f"{DIFFERS}: {', '.join(flagged)}" if flagged else SAME


def score(texts: tuple[str, ...], answers: tuple[str, ...]) -> tuple[int, int]:
    """(correct, invalid) of completions against the known answers."""
    given = [extract_answer(t) for t in texts]
    correct = sum(1 for g, a in zip(given, answers) if g == a.strip())
    return correct, sum(1 for g in given if not g)


def judge_accuracy(arms: tuple[ArmResult, ...] | list[ArmResult], answers: tuple[str, ...]) -> AccuracyJudgement:
    """Judge every arm's completions against ``answers`` (pure: records in, judgement out)."""
    raw = []
    for a in arms:
        for c in a.completions:
            correct, invalid = score(c.texts, answers)
            raw.append((c.label.point, a.arm, correct, invalid))
    cold = [r[2] for r in raw if r[0] == "cold_B"]
    damaged = [r[2] for r in raw if r[0] == "cold_B_damaged"]
    cold_range = (min(cold), max(cold)) if cold else None
    discriminates = bool(cold and damaged) and max(damaged) < min(cold)
    points = []
    for point, arm, correct, invalid in raw:
        status = ""
        if point not in ("cold_B", "cold_B_damaged"):
            if not discriminates or cold_range is None:
                status = NO_POWER
            else:
                status = SAME if cold_range[0] <= correct <= cold_range[1] else DIFFERS
        points.append(
            AccuracyPoint(point=point, arm=arm, correct=correct, invalid=invalid, total=len(answers), status=status)
        )
    order = {"cold_B": 0, "cold_B_damaged": 1}
    points.sort(key=lambda p: order.get(p.point, 2))
    return AccuracyJudgement(points=tuple(points), discriminates=discriminates, cold_range=cold_range)


def judge_run(arms: tuple[ArmResult, ...] | list[ArmResult], spec: AccuracySpec | None) -> AccuracyJudgement | None:
    """The judgement of a run's records, or None when it ran without ``--accuracy``."""
    return None if spec is None else judge_accuracy(arms, spec.answers)
