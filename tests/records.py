"""Builders of synthetic observation records for unit tests (no vLLM, no torch)."""

from __future__ import annotations

import dataclasses

from harness.records import ArmResult, ModelInfo, Observation, ObservationLabel, ProbeLabel, PromptOutput, TensorRecord

QWEN_PACKED = (("gate_up_proj", ("gate_proj", "up_proj")), ("qkv_proj", ("q_proj", "k_proj", "v_proj")))


def tensor(
    name: str, digest: str, address: int = 1000, kind: str = "parameter", nan_count: int = 0, rank: int = 0
) -> TensorRecord:
    return TensorRecord(
        name=name,
        kind=kind,
        dtype="float32",
        shape=(4,),
        device="cpu",
        address=address,
        digest=digest,
        nan_count=nan_count,
        absmax=1.0,
        rank=rank,
    )


def output(prompt: int, tokens: tuple[int, ...], logprob: float = -1.0) -> PromptOutput:
    return PromptOutput(
        prompt=prompt, token_ids=tokens, logprobs=tuple(((t, logprob), (t + 1, logprob - 1)) for t in tokens)
    )


def obs(
    label: str | ObservationLabel, tensors: dict[str, str] | list[TensorRecord], outputs=None, world_size: int = 1
) -> Observation:
    """``label``: a stage name (``cold_A``) or a whole label."""
    recs = tuple(tensor(n, d) for n, d in tensors.items()) if isinstance(tensors, dict) else tuple(tensors)
    return Observation(
        label=label if isinstance(label, ObservationLabel) else ObservationLabel(label),
        tensors=recs,
        outputs=tuple(outputs or (output(0, (1, 2, 3)),)),
        model=ModelInfo(architecture="Qwen3ForCausalLM", packed_modules_mapping=QWEN_PACKED, world_size=world_size),
    )


def probe(kind: str, point: str) -> ProbeLabel:
    """A probe at ``point``: a cold start (``cold_B``) or, after its refit to B, a path."""
    return ProbeLabel(kind, ObservationLabel(point) if point.startswith("cold_") else ObservationLabel("warm_B", point))


def arm(
    name: str, role: str, *observations: Observation, paths: tuple[str, ...] = (), error: str | None = None
) -> ArmResult:
    return ArmResult(
        arm=name,
        role=role,
        paths=paths,
        status="error" if error else "ok",
        error=error,
        observations=tuple(observations),
        seconds=1.0,
        environment=(("device", "cpu"),),
    )


A = {"w": "a-w", "norm": "a-n", "qkv_proj.<kernel-output>": "a-k"}
B = {"w": "b-w", "norm": "b-n", "qkv_proj.<kernel-output>": "b-k"}
CONTROL = {**B, "qkv_proj.<kernel-output>": "b'-k"}


EXPECTED = ("warm_B", "warm_B_again", "warm_B_control", "warm_A")


def segment(
    path: str, warm_b=B, warm_b_again=None, warm_a=A, control=CONTROL, outputs_b=None, outputs_control=None, drop=()
) -> list[Observation]:
    """One path's observations; they default to a perfect refit."""
    steps = [
        obs("warm_B", warm_b, outputs_b),
        obs("warm_B_again", warm_b_again or warm_b, outputs_b),
        obs("warm_B_control", control, outputs_control or [output(0, (1, 2, 3), -1.5)]),
        obs("warm_A", warm_a),
    ]
    return [
        dataclasses.replace(o, label=ObservationLabel(o.label.stage, path)) for o in steps if o.label.stage not in drop
    ]


def subject(drop=(), **kwargs) -> ArmResult:
    """A subject arm with one path, ``p``."""
    return arm("subject-p", "subject", obs("cold_A", A), *segment("p", drop=drop, **kwargs), paths=("p",))
