"""The trainer paths without an engine: the plan a live trainer makes, one verdict per
optimizer step judged against that step's cold start, and the trainer itself (real
transformers training on the tiny Qwen3, no vLLM)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.judge.evaluate import step_verdict_name, trainer_step_verdicts
from harness.judge.verdict import VerdictStatus
from harness.plan import Observe, PathNeeds, Refit, make_plan, trainer_targets
from harness.records import ObservationLabel
from harness.spec.checkpoint_set import CheckpointSet, trainer_step, trainer_target
from harness.spec.run import JudgePolicy, PromptSpec, RunSpec, TrainerSpec
from tests.records import QWEN_PACKED, A, arm, obs, output

CONTROL_TENSOR = "qkv_proj.weight"
S1 = {"w": "1-w", "norm": "1-n", "qkv_proj.<kernel-output>": "1-k"}
S2 = {"w": "2-w", "norm": "2-n", "qkv_proj.<kernel-output>": "2-k"}
S2_CONTROL = {**S2, "qkv_proj.<kernel-output>": "2'-k"}
S3 = {"w": "3-w", "norm": "3-n", "qkv_proj.<kernel-output>": "3-k"}


def test_targets_are_the_steps_then_repeat_control_and_round_trip():
    assert trainer_targets(2) == ("T1", "T2", "T2", "T2_control", "A")
    assert trainer_targets(2, sabotage=True) == ("T3", "A")
    assert trainer_step("T12_control") == (12, True) and trainer_step("T1") == (1, False)
    assert trainer_step("B_control") is None and trainer_step("A") is None and trainer_step("Tx") is None
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x", trainer_steps=("/t1", "/t2"))
    assert cs.directory(trainer_target(2)) == "/t2" and cs.directory("T2_control") == "/t2"
    with pytest.raises(ValueError, match="no trainer step 3"):
        cs.directory("T3")


def test_plan_has_a_cold_start_per_step_and_the_trainer_in_the_subject():
    from harness.spec.requirements import EngineRequirements

    spec = RunSpec(model="/a", paths=("trainer_steps",), sabotage=True, prompts=PromptSpec(token_ids=((1, 2),)))
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x", trainer_steps=("/t1", "/t2", "/t3"))
    needs = PathNeeds(EngineRequirements(kind="ray_llm"), ("B",), trains=True)
    plan = make_plan(spec, cs, {"trainer_steps": needs}, {})
    refs = [a for a in plan.arms if a.role == "trainer_reference"]
    assert sorted((a.name, a.start, a.cold_label.stage) for a in refs) == [
        ("reference-T1", "T1", "cold_T1"),
        ("reference-T2", "T2", "cold_T2"),
        ("reference-T3", "T3", "cold_T3"),
    ]
    subject = plan.subject_of("trainer_steps")
    assert subject is not None and subject.trainer == TrainerSpec()
    refits = [(s.target, s.sabotaged) for s in subject.steps if isinstance(s, Refit)]
    assert refits == [
        ("T1", False),
        ("T2", False),
        ("T2", False),
        ("T2_control", False),
        ("A", False),
        ("T3", True),
    ]  # the twin ends the arm: nothing after it needs the engine back at A
    stages = [str(s.label) for s in subject.steps if isinstance(s, Observe)]
    assert stages[1:4] == ["trainer_steps/warm_T1", "trainer_steps/warm_T2", "trainer_steps/warm_T2_again"]
    assert stages[-2:] == ["trainer_steps/warm_A", "trainer_steps~sabotage/warm_T3"]


def _subject(warm_t2=S2, twin_t3=None):
    def own(stage, tensors, path="trainer_steps", outputs=None):
        return obs(ObservationLabel(stage, path), tensors, outputs)

    return arm(
        "subject-trainer_steps",
        "subject",
        obs("cold_A", A, [output(0, (9, 9, 9))]),
        own("warm_T1", S1, outputs=[output(0, (1, 1, 1))]),
        own("warm_T2", warm_t2),
        own("warm_T2_again", warm_t2),
        own("warm_T2_control", S2_CONTROL, outputs=[output(0, (1, 2, 3), -1.5)]),
        own("warm_A", A, outputs=[output(0, (9, 9, 9))]),
        own(
            "warm_T3",
            twin_t3 or {**S3, "qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"]},
            "trainer_steps~sabotage",
        ),
        own("warm_A", A, "trainer_steps~sabotage", [output(0, (9, 9, 9))]),
        paths=("trainer_steps",),
    )


def _verdicts(subject):
    results = {
        "reference-T1": arm("reference-T1", "trainer_reference", obs("cold_T1", S1, [output(0, (1, 1, 1))])),
        "reference-T2": arm("reference-T2", "trainer_reference", obs("cold_T2", S2)),
        "reference-T3": arm("reference-T3", "trainer_reference", obs("cold_T3", S3)),
    }
    b = {"w": "b", "norm": "b", "qkv_proj.<kernel-output>": "b"}
    comparisons, verdicts = trainer_step_verdicts(
        "trainer_steps",
        subject,
        subject,
        results,
        arm("reference", "reference", obs("cold_B", b)),
        arm("noise", "noise", obs("cold_B", b)),
        CONTROL_TENSOR,
        2,
        JudgePolicy(),
        False,
        (),
        QWEN_PACKED,
        sabotage="one trainer parameter not sent",
    )
    return comparisons, verdicts


def test_every_step_passes_with_its_own_cold_start_and_the_twin_caught():
    comparisons, verdicts = _verdicts(_subject())
    assert [v.path for v in verdicts] == [step_verdict_name("trainer_steps", 1), "trainer_steps@T2"]
    for v in verdicts:
        assert v.status is VerdictStatus.PASS, v.reasons
        assert v.control_detected and v.sabotage is not None and v.sabotage.caught, v.sabotage
    assert comparisons[-1].path == "trainer_steps@T3~sabotage"
    # Step 1 is compared with cold T1, not with the run's cold B.
    refit_1 = {d.tensor: d.status.value for d in comparisons[0].tensors if d.check == "refit"}
    assert refit_1 == {"w": "OK", "norm": "OK", "qkv_proj.<kernel-output>": "OK"}


def test_a_tensor_left_at_the_previous_step_is_stale_against_that_step():
    _, verdicts = _verdicts(_subject(warm_t2={**S2, "norm": S1["norm"]}))
    first, second = verdicts
    assert first.status is VerdictStatus.PASS
    assert second.status is VerdictStatus.FAIL and second.first_divergent_tensor == "norm (STALE, refit)"


def test_a_twin_that_sent_everything_leaves_every_step_inconclusive():
    _, verdicts = _verdicts(_subject(twin_t3=S3))
    assert all(v.status is VerdictStatus.INCONCLUSIVE for v in verdicts)
    assert "sabotaged twin not caught" in verdicts[0].reasons[0]


def test_a_step_without_its_cold_start_is_an_error_not_a_comparison_with_b():
    subject = _subject()
    comparisons, verdicts = trainer_step_verdicts(
        "trainer_steps",
        subject,
        None,
        {},
        arm("reference", "reference", obs("cold_B", S1)),
        arm("noise", "noise", obs("cold_B", S1)),
        CONTROL_TENSOR,
        2,
        JudgePolicy(),
        False,
        (),
        QWEN_PACKED,
        sabotage="x",
    )
    assert all(v.status is VerdictStatus.ERROR for v in verdicts)
    assert any("reference-T1 (cold start on step 1) never observed" in r for r in verdicts[0].reasons)


def test_the_trainer_steps_deterministically_and_sends_its_own_names(tmp_path):
    pytest.importorskip("transformers")
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.machinery.trainer import Trainer, TrainerDiverged
    from harness.spec.prompts import shared_prefix_prompts

    a = str(tiny_qwen3())
    prompts = shared_prefix_prompts(512)[:2]
    first = Trainer(a, TrainerSpec(), prompts)
    first.step()
    first.save(tmp_path / "T1")
    again = Trainer(a, TrainerSpec(), prompts)
    again.advance_to(1)
    again.verify(str(tmp_path / "T1"))  # the same step, bit for bit
    names = [n for n, _ in again.named_parameters()]
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.mlp.gate_proj.weight" in names
    assert all(t.dtype.is_floating_point and str(t.dtype) == "torch.float32" for _, t in again.named_parameters())
    again.step()  # one step further: no longer the saved weights
    with pytest.raises(TrainerDiverged, match="step 2 is not the prepared one"):
        again.verify(str(tmp_path / "T1"))
    with pytest.raises(ValueError, match="cannot go back"):
        again.advance_to(1)
    assert dataclasses.asdict(TrainerSpec())["steps"] == 2


def test_a_pre_quantized_checkpoint_gets_no_trainer_and_nothing_is_trained(tmp_path, monkeypatch):
    """transformers trains a compressed-tensors checkpoint dequantized and saves float weights
    under its quantized config: no checkpoint of that format, so the trainer paths SKIP."""
    import json
    import subprocess

    from harness.checkpoints import trainer
    from harness.errors import CheckpointError

    a = tmp_path / "fp8"
    a.mkdir()
    qconfig = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": "channel"}}},
    }
    (a / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "quantization_config": qconfig}))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a pre-quantized checkpoint was trained"))
    with pytest.raises(CheckpointError, match=r"pre-quantized \(compressed-tensors/float/channel\)"):
        trainer.trainer_steps(str(a), TrainerSpec(), ((1, 2, 3),), 2, cache=tmp_path / "cache")
    # KV-cache scales alone (the zoo's fp8-KV family) leave the weights float: it is trained.
    from harness.checkpoints.variants import KV_FP8_CONFIG

    (a / "config.json").write_text(json.dumps({"architectures": ["X"], "quantization_config": KV_FP8_CONFIG}))
    with pytest.raises(pytest.fail.Exception, match="was trained"):
        trainer.trainer_steps(str(a), TrainerSpec(), ((1, 2, 3),), 2, cache=tmp_path / "cache")


@pytest.mark.parametrize("label", ("qwen3-moe", "mixtral", "nemotron-h", "qwen3-fp8kv"))
def test_the_trainer_sends_and_saves_the_checkpoints_layout(tmp_path, label):
    """transformers 5 converts these checkpoints as it loads them (fused experts, renamed
    modules) and keeps the KV scales beside the weights: what the trainer sends must be what it
    saves, in A's names, and the saved step keeps A's KV-scale config for vLLM to load them."""
    pytest.importorskip("transformers")
    import json

    from harness import safetensors_files
    from harness.checkpoints.zoo import tiny_model
    from harness.machinery.trainer import Trainer
    from harness.spec.prompts import shared_prefix_prompts

    a = tiny_model(label)
    trainer = Trainer(str(a), TrainerSpec(), shared_prefix_prompts(512)[:1])
    trainer.step()
    trainer.save(tmp_path / "T1")
    trainer.verify(str(tmp_path / "T1"))  # every sent tensor is present, bit for bit
    sent = {n for n, _ in trainer.named_parameters()}
    in_a = {n for n, _ in safetensors_files.tensors(safetensors_files.files(str(a)))}
    assert sent == in_a - {"lm_head.weight"} or sent == in_a, sorted(sent ^ in_a)[:6]
    source = json.loads((a / "config.json").read_text())
    saved = json.loads((tmp_path / "T1" / "config.json").read_text())
    assert saved.get("quantization_config") == source.get("quantization_config")
