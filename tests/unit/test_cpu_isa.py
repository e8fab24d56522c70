"""The CPU capabilities vLLM dispatches on: read from /proc/cpuinfo and from torch, lowered by
the override, recorded, and used to scope known issues and refuse cross-ISA comparisons
(synthetic records and CPU descriptions; no engine)."""

from __future__ import annotations

import dataclasses

import pytest

from harness import cpu_isa
from harness.errors import CompareError, UsageError
from harness.records import CpuCapabilities, KernelPath
from harness.spec.known_issues import KNOWN_ISSUES, KnownIssue, Subject
from tests.helpers import cli

# The "flags" lines of real CPUs, cut to what matters (and some that must be ignored).
EPYC_ZEN3 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma bmi2 sha_ni\n"
EPYC_ZEN4 = (
    "vendor_id\t: AuthenticAMD\nflags\t\t: avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi\n"
)
XEON_SPR = (
    "vendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile "
    "amx_int8\n"
)
XEON_CLX = "vendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f avx512bw avx512_vnni\n"
GRAVITON3 = "CPU implementer\t: 0x41\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, arch, level",
    [
        (EPYC_ZEN3, "x86_64", "avx2"),
        (EPYC_ZEN4, "x86_64", "avx512_bf16"),
        (XEON_CLX, "x86_64", "avx512"),
        (XEON_SPR, "x86_64", "amx"),
        (GRAVITON3, "aarch64", "arm_bf16"),
    ],
)
def test_the_host_level_is_read_from_cpuinfo_flags(cpuinfo, arch, level):
    cpu = cpu_isa.host_capabilities(cpuinfo=cpuinfo, arch=arch)
    assert cpu.level == level and cpu.flags == cpu.host_flags and cpu.override == "native"
    assert set(cpu.flags) <= set(cpu_isa.FLAGS)
    assert "avx512dq" not in cpu.flags and "sha_ni" not in cpu.flags  # not what vLLM dispatches on


def test_cpuinfo_names_become_torchs_names():
    flags, vendor = cpu_isa.cpuinfo_flags(XEON_SPR)
    assert vendor == "GenuineIntel"
    assert flags == (
        "amx_bf16",
        "amx_int8",
        "amx_tile",
        "avx2",
        "avx512_bf16",
        "avx512_f",
        "avx512_fp16",
        "avx512_vnni",
    )


@pytest.mark.parametrize(
    "override, flags, level",
    [
        ("native", None, "amx"),
        ("avx512_bf16", ("avx2", "avx512_bf16", "avx512_f", "avx512_fp16", "avx512_vnni"), "avx512_bf16"),
        ("avx512", ("avx2", "avx512_f", "avx512_vnni"), "avx512"),
        ("avx2", ("avx2",), "avx2"),
    ],
)
def test_an_override_hides_capabilities_and_keeps_what_the_cpu_has(override, flags, level):
    cpu = cpu_isa.host_capabilities(override, cpuinfo=XEON_SPR, arch="x86_64")
    assert cpu.level == level and cpu.override == override
    assert cpu.flags == (flags or cpu.host_flags)
    assert cpu.host_flags == cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64").flags


def test_an_override_can_only_take_away():
    amx = cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64")
    zen3 = cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN3, arch="x86_64")
    for level in cpu_isa.LEVEL_CHOICES:
        cpu_isa.check_override(level, amx)  # every level is below AMX
    cpu_isa.check_override("avx2", zen3)
    with pytest.raises(UsageError, match="can only hide capabilities"):
        cpu_isa.check_override("avx512_bf16", zen3)
    with pytest.raises(UsageError, match="can only hide capabilities"):
        cpu_isa.check_override("avx2", cpu_isa.host_capabilities(cpuinfo=GRAVITON3, arch="aarch64"))
    with pytest.raises(UsageError, match="not a capability level"):
        cpu_isa.check_override("sse2", amx)


def test_the_override_caps_onednn_and_aten_the_way_the_smaller_cpu_would():
    assert cpu_isa.override_env("native") == {"REFIT_HARNESS_CPU_ISA": "native"}
    env = cpu_isa.override_env("avx2")
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert cpu_isa.override_env("avx512_bf16")["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"


def test_the_same_dispatch_needs_the_same_flags_zen_path_and_override():
    amx = cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64")
    assert cpu_isa.same_dispatch(amx, dataclasses.replace(amx, source="torch (worker)", kernel_library="_C"))
    assert not cpu_isa.same_dispatch(amx, cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN4, arch="x86_64"))
    assert not cpu_isa.same_dispatch(amx, dataclasses.replace(amx, is_zen_cpu=True))
    # A forced AVX2 branch is not a real AVX2 CPU: the kernel library and oneDNN's own code differ.
    forced = cpu_isa.host_capabilities("avx2", cpuinfo=XEON_SPR, arch="x86_64")
    assert not cpu_isa.same_dispatch(forced, cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN3, arch="x86_64"))
    assert not cpu_isa.same_dispatch(amx, None)


def test_describe_names_the_override_and_the_kernel_library():
    forced = dataclasses.replace(
        cpu_isa.host_capabilities("avx2", cpuinfo=XEON_SPR, arch="x86_64"), kernel_library="_C_AVX2"
    )
    text = cpu_isa.describe_cpu(forced)
    assert (
        text.startswith("x86_64 avx2 (avx2)") and "--cpu-isa avx2 (the CPU itself: amx)" in text and "_C_AVX2" in text
    )
    assert cpu_isa.describe_cpu(None) == "not recorded"


def test_the_kernel_library_follows_vllms_choice_by_capability():
    """vLLM loads ``_C`` only with AVX512-BF16, ``_C_AVX512`` with AVX-512 alone, else ``_C_AVX2``;
    an override lowers the choice with the capabilities it hides."""

    def library(cpuinfo: str, override: str = cpu_isa.NATIVE, arch: str = "x86_64") -> str:
        return cpu_isa.vllm_kernel_library(cpu_isa.host_capabilities(override, cpuinfo=cpuinfo, arch=arch).flags, arch)

    assert library(XEON_SPR) == library(EPYC_ZEN4) == "_C"
    assert library(EPYC_ZEN3) == library(XEON_SPR, "avx2") == library(EPYC_ZEN4, "avx2") == "_C_AVX2"
    assert library(XEON_SPR, "avx512") == library(XEON_CLX) == "_C_AVX512"
    assert library(XEON_SPR, "avx512_bf16") == "_C"
    assert library(XEON_SPR, arch="aarch64") == ""


# ---- known issues scoped by capability ------------------------------------------------------


def _issue(**kw) -> KnownIssue:
    return KnownIssue(device="cpu", reason="r", **kw)


def test_a_capability_scoped_issue_applies_only_where_the_cpu_shows_it():
    issue = _issue(cpu_capabilities=("avx512_bf16", "bf16"), dtypes=("bfloat16",))
    spr, zen3 = (cpu_isa.host_capabilities(cpuinfo=c, arch="x86_64").flags for c in (XEON_SPR, EPYC_ZEN3))
    forced = cpu_isa.host_capabilities("avx2", cpuinfo=XEON_SPR, arch="x86_64").flags
    graviton = cpu_isa.host_capabilities(cpuinfo=GRAVITON3, arch="aarch64").flags
    assert issue.applies("p", Subject("cpu (x86_64)", "0.32.0", None, "bfloat16", cpu_flags=spr))
    assert issue.applies("p", Subject("cpu (aarch64)", "0.32.0", None, "bfloat16", cpu_flags=graviton))
    assert not issue.applies("p", Subject("cpu (x86_64)", "0.32.0", None, "bfloat16", cpu_flags=zen3))
    assert not issue.applies(
        "p", Subject("cpu (x86_64)", "0.32.0", None, "bfloat16", cpu_flags=forced)
    )  # the override counts
    assert not issue.applies(
        "p", Subject("cpu (x86_64)", "0.32.0", None, "bfloat16", cpu_flags=None)
    )  # not recorded: not expected
    assert not issue.applies("p", Subject("cpu (x86_64)", "0.32.0", None, "float32", cpu_flags=spr))
    assert _issue().applies(
        "p", Subject("cpu (x86_64)", "0.32.0", None, "bfloat16", cpu_flags=None)
    )  # unscoped: every CPU


def test_the_mamba_conv_weights_issue_is_scoped_by_capability_dtype_and_architecture():
    conv = [k for k in KNOWN_ISSUES if "conv_weights" in (k.tensor_pattern or "")]
    assert len(conv) == 1, [k.title for k in KNOWN_ISSUES]
    k = conv[0]
    assert set(k.architectures) == {"Mamba2ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM"}
    assert k.dtypes == ("bfloat16",) and "avx512_bf16" in k.cpu_capabilities
    assert "repro/mamba_conv_weights_stale_after_reload.py" in k.reason
    spr = cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64").flags
    zen3 = cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN3, arch="x86_64").flags
    assert k.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "Mamba2ForCausalLM", "bfloat16", cpu_flags=spr)
    )
    assert not k.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "Mamba2ForCausalLM", "bfloat16", cpu_flags=zen3)
    )
    assert not k.applies(
        "reload_weights", Subject("cpu (x86_64)", "0.32.0", "LlamaForCausalLM", "bfloat16", cpu_flags=spr)
    )


# ---- what the arm records ---------------------------------------------------------------------


def test_the_torch_mask_hides_what_vllm_reads_and_native_restores_it():
    torch = pytest.importorskip("torch")
    from harness.worker.cpu_dispatch import apply_override, capabilities

    real = dict(torch.cpu.get_capabilities())
    try:
        apply_override("avx2")
        assert not torch.cpu._is_avx512_bf16_supported() and not torch.cpu._is_amx_tile_supported()
        assert not torch.cpu._is_avx512_supported()
        assert torch.cpu._is_avx2_supported() == bool(real.get("avx2"))
        seen = capabilities("test")
        assert seen.override == cpu_isa.override_from_env()  # what the arm exported, not the mask itself
        assert not set(seen.flags) & {"avx512_f", "avx512_bf16", "amx_tile"}
        assert set(seen.host_flags) == {f for f in cpu_isa.FLAGS if real.get(f) is True}
        apply_override("avx2")  # idempotent: the plugin applies it again in the same process
        assert not torch.cpu._is_avx512_supported()
    finally:
        apply_override("native")
    assert dict(torch.cpu.get_capabilities()) == real


def test_each_cpu_linear_branch_is_named_from_its_closure():
    torch = pytest.importorskip("torch")
    from harness.worker.cpu_dispatch import kernel_paths

    def sgl():
        packed_weight = torch.zeros(1)
        return lambda x, weight, bias: packed_weight

    def onednn():
        handler = object()
        return lambda x, weight, bias: handler

    model = torch.nn.Module()
    for name, fn in (("a", sgl()), ("b", onednn()), ("c", lambda x, w, b: x), ("d", torch.nn.functional.linear)):
        m = torch.nn.Module()
        m.cpu_linear = fn
        model.add_module(name, m)
    conv = torch.nn.Module()
    conv.weight = torch.nn.Parameter(torch.zeros(8, 1, 4))
    conv._cpu_unpacked_conv_weight = torch.zeros(8, 4)
    model.add_module("conv1d", conv)
    assert kernel_paths(model) == (
        KernelPath("a", "linear", "sgl weight_packed_linear"),
        KernelPath("b", "linear", "oneDNN onednn_mm"),
        KernelPath("c", "linear", "torch linear (fallback)"),
        KernelPath("d", "linear", "torch linear"),
        KernelPath("conv1d", "conv1d", "prepacked"),
    )


def test_a_bad_override_is_one_line_and_exit_2(tmp_path):
    env = {"REFIT_HARNESS_CACHE": str(tmp_path / "cache"), "REFIT_HARNESS_CPU_ISA": "sse2"}

    proc = cli("run", "--out", str(tmp_path / "o"), extra_env=env, timeout=300)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "not a capability level" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


# ---- reports and comparisons ------------------------------------------------------------------


def _with_cpu(ev, cpu: CpuCapabilities, kernels=()):
    arms = tuple(dataclasses.replace(a, cpu=cpu, kernel_paths=kernels) for a in ev.arms)
    return dataclasses.replace(ev, arms=arms, record=dataclasses.replace(ev.record, cpu=cpu))


def test_two_builds_on_cpus_with_other_kernel_branches_are_refused_unless_allowed():
    from harness.judge.crossbuild import compare_builds
    from tests.unit.test_crossbuild import evaluation

    spr = cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64")
    zen3 = cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN3, arch="x86_64")
    same = compare_builds(_with_cpu(evaluation(), spr), _with_cpu(evaluation(), spr))
    assert not any("CPU" in n for n in same.notes) and same.build("pr").cpu.startswith("x86_64 amx")
    with pytest.raises(CompareError, match="different vLLM kernel branches.*--allow-cpu-mismatch"):
        compare_builds(_with_cpu(evaluation(), spr), _with_cpu(evaluation(), zen3))
    with pytest.raises(CompareError, match="base2 on x86_64 avx2"):
        compare_builds(_with_cpu(evaluation(), spr), _with_cpu(evaluation(), spr), _with_cpu(evaluation(), zen3))
    allowed = compare_builds(_with_cpu(evaluation(), spr), _with_cpu(evaluation(), zen3), allow_cpu_mismatch=True)
    assert any("measured on different CPUs" in n for n in allowed.notes), allowed.notes
    unknown = compare_builds(evaluation(), _with_cpu(evaluation(), spr))
    assert any("recorded no CPU capabilities" in n for n in unknown.notes), unknown.notes


def test_the_cpu_and_its_kernel_branches_are_in_the_summary_and_its_header():
    from harness.report.summary import render_markdown, summary_dict
    from tests.unit.test_crossbuild import evaluation

    spr = dataclasses.replace(
        cpu_isa.host_capabilities(cpuinfo=XEON_SPR, arch="x86_64"), kernel_library="_C", source="torch (worker)"
    )
    kernels = (
        KernelPath("model.layers.0.qkv_proj", "linear", "sgl weight_packed_linear"),
        KernelPath("model.layers.1.qkv_proj", "linear", "sgl weight_packed_linear"),
        KernelPath("backbone.layers.0.mixer.conv1d", "conv1d", "prepacked"),
    )
    ev = _with_cpu(evaluation(), spr, kernels)
    s = summary_dict(ev)
    assert s["cpu"]["measured"]["level"] == "amx" and s["cpu"]["measured_by"] == "reference"
    assert s["cpu"]["kernel_paths"] == {"linear": {"sgl weight_packed_linear": 2}, "conv1d": {"prepacked": 1}}
    assert s["cpu"]["arms_on_another_cpu"] == []
    line = s["environment"]["cpu_capabilities"]
    assert line.startswith("x86_64 amx (") and "vLLM kernels _C" in line and "conv1d prepacked x1" in line
    md = render_markdown(ev, s)
    assert "CPU as vLLM saw it: x86\\_64 amx" in md and "another CPU" not in md
    # An arm that saw another CPU (a reference reused from another machine) is called out.
    zen3 = cpu_isa.host_capabilities(cpuinfo=EPYC_ZEN3, arch="x86_64")
    mixed = dataclasses.replace(ev, arms=(*ev.arms[:2], dataclasses.replace(ev.arms[2], cpu=zen3)))
    s = summary_dict(mixed)
    assert s["cpu"]["arms_on_another_cpu"] == [ev.arms[2].arm]
    assert "**arms measured on another CPU**" in render_markdown(mixed, s)
