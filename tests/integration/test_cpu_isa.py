"""The other CPU branch on this machine: ``--cpu-isa avx2`` on real engines.

vLLM's CPU kernels depend on the instruction set (docs/isa.md). ``tests/integration/test_zoo.py``
measures the machine's own branch; this one cell makes vLLM take the AVX2 branch here, so both
run wherever the suite runs: Mamba2 in bf16, where an AVX512-BF16 CPU prepacks the conv1d weight
and the reload leaves ``conv_weights`` stale (XFAIL there), and an AVX2 CPU does not (PASS).
On an AVX2-only machine the override changes nothing vLLM chooses, and the cell is the same PASS.
"""

from __future__ import annotations

import json

import pytest

from harness.cpu_isa import host_capabilities

pytestmark = [pytest.mark.cpu]
HOST = host_capabilities()
GROUP = "mamba2-eager-tp1-bf16"


@pytest.fixture(scope="module")
def forced(run_oracle):
    if HOST.arch != "x86_64" or "avx2" not in HOST.flags:
        pytest.skip(f"--cpu-isa lowers an x86 CPU with AVX2; this one is {HOST.arch} {HOST.level}")
    return run_oracle("cpu-isa-avx2", "-s", "zoo", "--only", f"reload_weights[{GROUP}]", "--cpu-isa", "avx2")


def summary(run) -> dict:
    return json.loads((run.out / GROUP / "summary.json").read_text())


def test_the_forced_avx2_branch_is_recorded_as_such_everywhere(forced):
    cpu = summary(forced)["cpu"]
    seen = cpu["measured"]
    # What vLLM saw in the worker: the CPU lowered, the real one beside it, the override named.
    assert seen["source"] == "torch (worker)" and seen["override"] == "avx2", seen
    assert seen["level"] == "avx2" and seen["flags"] == ["avx2"], seen
    assert seen["host_flags"] == list(HOST.flags), seen
    # vLLM loaded its AVX2 kernel library, and oneDNN was capped the same way.
    assert seen["kernel_library"] == "_C_AVX2" and seen["onednn_max_cpu_isa"] == "AVX2", seen
    assert cpu["arms_on_another_cpu"] == [], cpu
    run_json = json.loads((forced.out / GROUP / "run.json").read_text())["data"]
    assert run_json["cpu"]["override"] == "avx2" and run_json["spec"]["engine"]["cpu_isa"] == "avx2"
    assert "forced by --cpu-isa avx2" in (forced.out / GROUP / "summary.md").read_text()
    assert "forced by --cpu-isa avx2" in (forced.out / GROUP / "index.html").read_text()


def test_the_avx2_branch_packs_nothing_and_the_mamba_reload_passes(forced):
    cpu = summary(forced)["cpu"]
    conv = [k for k in cpu["layers"] if k["kind"] == "conv1d"]
    assert len(conv) == 2 and all(k["path"] == "not prepacked" for k in conv), conv
    # oneDNN refuses bf16 below AVX-512 and there are no AMX tiles: every linear runs torch's.
    linears = {k["path"] for k in cpu["layers"] if k["kind"] == "linear"}
    assert linears and all(p.startswith("torch linear") for p in linears), linears
    path = summary(forced)["paths"]["reload_weights"]
    assert path["verdict"] == "PASS", path["reasons"]
    assert path["sabotage"]["caught"], path["sabotage"]  # and the path could have failed here
    assert forced.exit_code == 0, forced.output
