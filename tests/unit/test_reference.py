"""The reference cache key covers exactly what a cold-B observation depends on."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from harness import store
from harness.orchestrate import reference
from harness.plan import PathNeeds, make_plan
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.requirements import EngineRequirements
from harness.spec.run import EngineSpec, PromptSpec, RunSpec
from tests.records import A, arm, obs


def checkpoint(directory: Path, weights: bytes = b"\x00\x01\x02\x03" * 64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text('{"vocab_size": 512}')
    (directory / "model.safetensors").write_bytes(weights)
    return directory


def reference_arm(b: Path, spec_changes: dict | None = None, a: str = "/a"):
    spec = dataclasses.replace(RunSpec(model=a), **(spec_changes or {}))
    cs = CheckpointSet(a=a, b=str(b), b_control="/b-control", control_tensor="w")
    plan = make_plan(spec, cs, {"reload_weights": PathNeeds(EngineRequirements(), ("B",))}, {})
    return next(x for x in plan.arms if x.role == "reference")


@pytest.fixture
def base(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith(("VLLM_", "OMP_", "REFIT_HARNESS_CPU_ISA", "ONEDNN_", "ATEN_")):
            monkeypatch.delenv(k)
    b = checkpoint(tmp_path / "B")
    return b, reference.reference_key(reference.reference_inputs(reference_arm(b), {}))


def key(b: Path, env: dict | None = None, **spec_changes) -> str:
    return reference.reference_key(reference.reference_inputs(reference_arm(b, spec_changes), env or {}))


def test_same_inputs_same_key_and_irrelevant_changes_keep_it(base, tmp_path, monkeypatch):
    b, k = base
    assert key(b) == k
    assert reference.reference_key(reference.reference_inputs(reference_arm(b, a="/elsewhere/A"), {})) == k
    assert key(b, arm_timeout_s=5.0) == k  # the timeout does not change what is observed
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "x")
    assert key(b) == k
    os.utime(b / "model.safetensors", (1, 1))  # only the mtime: content-based, so still a hit
    assert key(b) == k
    moved = shutil.copytree(b, tmp_path / "B-copy")  # the same B in another directory
    assert key(moved) == k


@pytest.mark.parametrize("change", ["weights", "config", "extra_file"])
def test_changing_checkpoint_b_content_changes_the_key(base, change):
    b, k = base
    stat = (b / "model.safetensors").stat()
    if change == "weights":  # one byte, same size, same mtime
        data = bytearray((b / "model.safetensors").read_bytes())
        data[17] ^= 1
        (b / "model.safetensors").write_bytes(bytes(data))
        os.utime(b / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif change == "config":
        (b / "config.json").write_text('{"vocab_size": 513}')
    else:
        (b / "generation_config.json").write_text("{}")
    assert key(b) != k


@pytest.mark.parametrize(
    "spec_change",
    [
        {"engine": EngineSpec(dtype="bfloat16")},
        {"engine": EngineSpec(mode="compiled")},
        {"engine": EngineSpec(tensor_parallel_size=2)},
        {"engine": EngineSpec(seed=1)},
        {"engine": EngineSpec(kv_cache_memory_bytes=32 << 20)},
        {"engine": EngineSpec(engine_args=(("kv_cache_dtype", '"fp8"'),))},
        {"engine": EngineSpec(reload_mode="direct")},
        {"prompts": PromptSpec(max_tokens=11)},
        {"prompts": PromptSpec(token_ids=((1, 2, 3),))},
        {"prompts": PromptSpec(logprobs=4)},
        {"digest": "blake3"},  # a reference digested another way can never serve this run
        {"digest": "xxh3"},  # auto resolves per arm: "auto" and "xxh3" are kept apart
    ],
    ids=lambda c: repr(c)[:60],
)
def test_changing_the_engine_spec_or_prompts_changes_the_key(base, spec_change):
    b, k = base
    assert key(b, **spec_change) != k


@pytest.mark.parametrize(
    "variable",
    ["VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_USE_V2", "CUDA_VISIBLE_DEVICES", "REFIT_HARNESS_MODELS"],
)
def test_changing_an_engine_environment_variable_changes_the_key(base, monkeypatch, variable):
    b, k = base
    assert key(b, env={variable: "1"} if variable != "REFIT_HARNESS_MODELS" else {variable: "X=json:loads"}) != k
    monkeypatch.setenv(variable, "2" if variable != "REFIT_HARNESS_MODELS" else "Y=json:loads")  # inherited
    assert key(b) != k


def test_changing_the_build_or_the_device_changes_the_key(base, monkeypatch):
    b, k = base
    real = reference.build_identity()
    assert dict(real)["vllm"] != "absent" and dict(real)["torch_sha"] not in ("", "unknown")
    for i, (name, value) in enumerate(real):
        changed = real[:i] + ((name, value + "-other"),) + real[i + 1 :]
        monkeypatch.setattr(reference, "build_identity", lambda c=changed: c)
        assert key(b) != k, name
    monkeypatch.setattr(reference, "build_identity", lambda: real)
    assert key(b) == k
    monkeypatch.setattr(reference, "device_name", lambda: "cuda (NVIDIA H100)")
    assert key(b) != k


def test_changing_the_cpu_capabilities_or_the_override_changes_the_key(base, monkeypatch):
    """vLLM's CPU kernels differ by instruction set (docs/isa.md): a reference measured on
    another ISA, or with another ``--cpu-isa`` override, is never reused. The CPU model name
    does not tell them apart (a virtual machine shows a generic one), the flags do."""
    import dataclasses

    from harness import cpu_isa

    b, k = base
    real = cpu_isa.host_capabilities
    assert real().flags, "this machine's /proc/cpuinfo shows no dispatch flag"
    here = real()
    # Each change is to a value this machine does not have (CI runs on Intel and AMD alike).
    for change in (
        {"flags": ("avx2",) if here.flags != ("avx2",) else ("avx2", "avx512_f")},
        {"host_flags": ("avx2",) if here.host_flags != ("avx2",) else ("avx2", "avx512_f")},
        {"is_zen_cpu": not here.is_zen_cpu},
        {"arch": "aarch64" if here.arch != "aarch64" else "x86_64"},
        {"vendor": "AuthenticAMD" if here.vendor != "AuthenticAMD" else "GenuineIntel"},
    ):
        monkeypatch.setattr(
            cpu_isa, "host_capabilities", lambda o="native", c=change: dataclasses.replace(real(o), **c)
        )
        assert key(b) != k, change
    monkeypatch.setattr(cpu_isa, "host_capabilities", real)
    assert key(b) == k
    if "avx2" in real().flags:
        assert key(b, engine=EngineSpec(cpu_isa="avx2")) != k
    assert key(b, env={"REFIT_HARNESS_CPU_ISA": "avx2"}) != k  # inherited by the arm's vLLM processes
    assert key(b, env={"ONEDNN_MAX_CPU_ISA": "AVX2"}) != k


def test_changing_the_observation_code_changes_the_key(base, tmp_path, monkeypatch):
    b, k = base
    harness_copy = shutil.copytree(
        Path(reference.__file__).parents[1], tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__")
    )
    monkeypatch.setattr(reference, "__file__", str(harness_copy / "orchestrate" / "reference.py"))
    assert key(b) == k  # the same code elsewhere
    for name in (
        "worker/census.py",
        "worker/recorder.py",
        "worker/extension.py",
        "worker/fixtures/models.py",
        "worker/cpu_dispatch.py",
        "cpu_isa.py",
    ):
        original = (harness_copy / name).read_text()
        (harness_copy / name).write_text(original + "\n# changed\n")
        assert key(b) != k, name
        (harness_copy / name).write_text(original)
    (harness_copy / "report" / "html.py").write_text("# the report does not observe\n")
    assert key(b) == k


def test_an_out_of_tree_model_modules_code_is_part_of_the_key(base, tmp_path, monkeypatch):
    b, _ = base
    (tmp_path / "my_model_mod.py").write_text("class M: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"REFIT_HARNESS_MODELS": "M=my_model_mod:M"}
    before = key(b, env=env)
    (tmp_path / "my_model_mod.py").write_text("class M: x = 1\n")
    assert key(b, env=env) != before


def test_cache_returns_both_arms_only_when_both_are_ok(base, tmp_path):
    b, k = base
    cache = tmp_path / "cache"
    inputs = reference.reference_inputs(reference_arm(b), {})
    assert reference.cached(k, cache) is None
    files = {}
    for role in reference.CACHED_ROLES:
        files[role] = store.dump(arm(role, role, obs("cold_B", A)), tmp_path / f"{role}.json", "arm_result")
    reference.save(k, inputs, files, cache)
    hit = reference.cached(k, cache)
    assert hit is not None and {r.role for r in hit.values()} == {"reference", "noise"}
    assert (cache / "references" / k / "inputs.json").is_file()
    store.dump(arm("noise", "noise", obs("cold_B", A), error="boom"), files["noise"], "arm_result")
    reference.save("other", inputs, files, cache)
    assert reference.cached("other", cache) is None


def test_thread_placement_depends_on_the_plan_and_cpus_not_on_free_memory(monkeypatch, tmp_path):
    from harness.orchestrate import execute as pipeline
    from harness.orchestrate import fanout
    from harness.orchestrate.fanout import FanoutSpec

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(fanout, "cuda_available", lambda: False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    spec = RunSpec(model="/a")
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="w")
    plan = make_plan(spec, cs, {"reload_weights": PathNeeds(EngineRequirements(), ("B",))}, {})
    envs = set()
    for free_pages in (1, 10**9):  # almost no free memory, then plenty
        monkeypatch.setattr(os, "sysconf", lambda name, p=free_pages: p if name == "SC_AVPHYS_PAGES" else 4096)
        envs.add(tuple(sorted(pipeline.arm_env(plan, spec, FanoutSpec()).items())))
    assert envs == {(("OMP_NUM_THREADS", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"))}
    assert pipeline.arm_env(plan, spec, FanoutSpec(max_concurrent=1)) == {}
    assert pipeline.arm_env(plan, spec, None) == {}
