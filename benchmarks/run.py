"""``make bench``: speed goals, measured on real engines (benchmarks, not timed tests).

``python -m benchmarks.run [NAME ...] [--repeats N]`` runs the named benchmarks (default:
all), writes ``reports/bench/<name>.json`` for each, and prints one table with the goal
beside each figure. Each ratio is measured side by side in one run, interleaved, because
this machine is shared and noisy.

- ``harness_vs_bare`` (a): ``refit-harness run --paths reload_weights`` on the embedded
  model vs ``benchmarks/bare_vllm.py`` doing the same cold starts, refits and generations
  with no observation, two engines at a time. First run (reference reuse off) and repeated
  run (reuse on, reference already cached).
- ``digest`` (b): the census's digest throughput (``digest_many`` over all its tensors, as the
  census calls it, thousands of small tensors included) over >= 1 GB, for the default (xxh3)
  and blake3 side by side, vs this machine's memory bandwidth (a copy between two pre-touched
  buffers with the same threads, bytes read + written); also one ``digest`` call per tensor (the
  kernel-input recorder's way), whole census entries and the device digest's CPU twin.
- ``kernel_capture`` (c): one prefill with the kernel-input recorder vs without.
- ``paths_scaling`` (d): wall time and engine cold starts for 1, 3 and all CPU paths.
- ``sabotage``: what earned verdicts cost: a run with its sabotaged twins (the default) vs
  ``--no-sabotage``, interleaved, the reference reused.
- ``model_size`` (e): peak RSS of the parent and of each arm, and wall time, for
  checkpoints of about 0.01, 0.5 and 2 GB (a wide tiny Qwen3: large vocabulary and hidden size).
- ``prepare_memory`` (e, no engines): the parent's peak RSS and wall time for making B and
  B′ alone, from the same checkpoints, each in a fresh process and a fresh cache.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

OUT = Path("reports/bench")
Row = tuple[str, str, str, bool | None]  # figure, value, goal, met (None: no goal)


# ---- (b) digest throughput vs memory bandwidth ------------------------------------------


def digest_tensors(gen) -> list:
    """1.24 GB of model-like state: large matrices in float32 and bfloat16, and the thousands
    of small tensors (norms, biases, scales) whose per-tensor cost a census pays as well."""
    import torch

    tensors = [torch.randn(8192, 8192 // 2, generator=gen) for _ in range(8)]  # 8 x 128 MiB
    tensors += [torch.randn(4096, 8192, generator=gen).to(torch.bfloat16) for _ in range(2)]  # 2 x 64 MiB
    tensors += [torch.randn(4096, generator=gen) for _ in range(2048)]  # 2048 x 16 KiB
    tensors += [torch.randn(128, generator=gen) for _ in range(4096)]  # 4096 x 512 B
    return tensors


def bench_digest(repeats: int) -> dict:
    """Every digest algorithm over the same tensors through the census's own entry points, and a
    copy with the same threads, interleaved in one run (the machine is shared)."""
    import torch

    from harness.worker.census import CensusEntry, observe_entries
    from harness.worker.digest import ALGORITHMS, digest, digest_many, resolve

    default = resolve("auto")
    gen = torch.Generator().manual_seed(0)
    tensors = digest_tensors(gen)
    total = sum(t.numel() * t.element_size() for t in tensors)
    small = sum(1 for t in tensors if t.numel() * t.element_size() < 1 << 20)
    largest = max(t.numel() * t.element_size() for t in tensors)
    src = torch.empty(largest, dtype=torch.uint8).fill_(1)
    dst = torch.empty(largest, dtype=torch.uint8).fill_(0)  # pre-touched: no page faults in the copy
    host = [ALGORITHMS["xxh3"], ALGORITHMS["blake3"]]  # the device digest on CPU is its twin: measured apart
    entries = [CensusEntry(f"t{i}", "parameter", t) for i, t in enumerate(tensors)]

    def timed(fn) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - start, time.process_time() - cpu

    def copy_total() -> None:
        done = 0
        while done < total:
            dst.copy_(src)
            done += largest

    phases: dict[str, Callable[[], object]] = {
        "copy": copy_total,
        **{a: (lambda a=a: digest_many(tensors, a)) for a in host},
        "per tensor": lambda: [digest(t, default) for t in tensors],
        "census": lambda: observe_entries(entries, 0, default),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in phases}
    order = list(phases)
    # Interleaved and short (about 1 s a round), so load hits all alike; each round starts one
    # phase later, so none always runs right after the copy (measured: the phase that did ran
    # up to 8% slower on the idle EPYC).
    for r in range(max(repeats, 7)):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            samples[name].append(timed(phases[name]))
    wall = {k: statistics.median(w for w, _ in v) for k, v in samples.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
    copy_s = wall["copy"] * total / (math.ceil(total / largest) * largest)
    copy_gbs = 2 * total / copy_s / 1e9  # STREAM convention: read + write
    rate = {a: total / wall[a] / 1e9 for a in host}
    ratio = {a: rate[a] / copy_gbs for a in host}
    # With equal CPU: bytes per CPU-second given (the machine is shared; phases get unequal shares).
    copy_cpu_s = cpu["copy"] * total / (math.ceil(total / largest) * largest)
    equal_cpu = {a: (total / cpu[a]) / (2 * total / copy_cpu_s) for a in host}
    census_gbs = total / wall["census"] / 1e9
    per_tensor_gbs = total / wall["per tensor"] / 1e9
    twin_bytes, twin_s = _device_twin_rate(gen)
    goal = 0.8
    rows = [
        (
            f"tensors digested: {total / 1e9:.2f} GB in {len(tensors)} tensors ({small} under 1 MiB), "
            f"{torch.get_num_threads()} threads",
            "",
            "",
            None,
        ),
        ("memory bandwidth (copy, read+write, same threads)", f"{copy_gbs:.2f} GB/s", "", None),
    ]
    for a in host:
        mark = " (default)" if a == default else ""
        rows.append((f"digest {a}{mark}", f"{rate[a]:.2f} GB/s", "", None))
        rows.append(
            (
                f"(b) {a}{mark} / memory bandwidth",
                f"{ratio[a]:.2f}",
                f">= {goal}" if a == default else "",
                ratio[a] >= goal if a == default else None,
            )
        )
        rows.append(("    the same, per CPU-second each was given", f"{equal_cpu[a]:.2f}", "", None))
    rows += [
        (
            f"  {default}, one digest() call per tensor (the recorder's way) / memory bandwidth",
            f"{per_tensor_gbs / copy_gbs:.2f}",
            "",
            None,
        ),
        (f"census entries ({default}: digest + NaN count + absmax)", f"{census_gbs:.2f} GB/s", "", None),
        (
            "  CPU given to copy / default digest (cpu s per wall s)",
            f"{cpu['copy'] / wall['copy']:.2f} / {cpu[default] / wall[default]:.2f}" if default in cpu else "",
            "",
            None,
        ),
        (
            f"device digest's CPU twin ({ALGORITHMS['device']}, {twin_bytes >> 20} MiB)",
            f"{twin_bytes / twin_s / 1e9:.3f} GB/s",
            "",
            None,
        ),
    ]
    met = ratio.get(default, 0.0) >= goal
    return {
        "default": default,
        "bytes": total,
        "tensors": len(tensors),
        "small_tensors": small,
        "threads": torch.get_num_threads(),
        "memory_bandwidth_gb_per_s": copy_gbs,
        "digest_gb_per_s": rate,
        "ratio_per_cpu_second": equal_cpu,
        "ratio": ratio,
        "goal": goal,
        "goal_met": met,
        "census_gb_per_s": census_gbs,
        "per_tensor_gb_per_s": per_tensor_gbs,
        "device_twin_gb_per_s": twin_bytes / twin_s / 1e9,
        "cpu_per_wall": {k: cpu[k] / wall[k] for k in wall},
        "rows": rows,
    }


def _device_twin_rate(gen) -> tuple[int, float]:
    """The device digest run on the CPU (its twin: what a CPU tensor in a GPU arm costs)."""
    import torch

    from harness.worker.device_digest import device_digest

    t = torch.randn(16 << 20, generator=gen)  # 64 MiB
    start = time.perf_counter()
    device_digest(t)
    return t.numel() * 4, time.perf_counter() - start


# ---- (c) kernel-input capture vs a plain forward ---------------------------------------


def bench_kernel_capture(repeats: int) -> dict:
    from harness.arm.engines import LocalEngine
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.orchestrate.execute import resolve_prompts
    from harness.plan import PathNeeds, make_plan
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import PromptSpec, RunSpec

    model = str(tiny_qwen3())
    spec = resolve_prompts(RunSpec(model=model))
    cs = CheckpointSet(a=model, b=model, b_control=model, control_tensor="")
    arm = make_plan(spec, cs, {"reload_weights": PathNeeds(EngineRequirements(), ("B",))}, {}).arms[0]
    engine = LocalEngine(arm)
    batch = PromptSpec(token_ids=arm.prompts.token_ids, max_tokens=1, logprobs=1)

    def plain() -> None:
        engine.generate(batch)

    def recorded() -> None:
        engine.rpc("refit_harness_recorder_start")
        engine.generate(batch)
        engine.rpc("refit_harness_recorder_stop")

    try:
        for fn in (plain, recorded):  # warm up both
            fn()
        timings: dict[str, list[float]] = {"plain": [], "recorded": []}
        for _ in range(max(7, repeats)):  # interleaved, so drift hits both alike
            for name, fn in (("plain", plain), ("recorded", recorded)):
                start = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - start)
    finally:
        engine.close()
    plain_s, recorded_s = (statistics.median(timings[k]) for k in ("plain", "recorded"))
    ratio = recorded_s / plain_s
    return {
        "batch_prompts": len(batch.token_ids),
        "plain_prefill_s": plain_s,
        "recorded_prefill_s": recorded_s,
        "ratio": ratio,
        "goal": 3.0,
        "goal_met": ratio <= 3.0,
        "rows": [
            ("plain prefill", f"{plain_s * 1e3:.1f} ms", "", None),
            ("prefill with kernel-input capture", f"{recorded_s * 1e3:.1f} ms", "", None),
            ("(c) capture / plain forward", f"{ratio:.2f}x", "<= 3x", ratio <= 3.0),
        ],
    }


# ---- running the CLI, watching memory --------------------------------------------------


def harness_run(args: list[str], out: Path, env: dict[str, str] | None = None) -> dict:
    """``refit-harness run ARGS --out OUT``: wall time, summary, and peak RSS of the parent
    and of each arm (arm process plus its engine processes), sampled from /proc."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "harness.cli", "run", *args, "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watcher = PeakRss(proc.pid, str(out))
    watcher.start()
    output = proc.communicate()[0]
    seconds = time.perf_counter() - start
    watcher.stop()
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return {
        "seconds": seconds,
        "exit_code": proc.returncode,
        "summary": summary,
        "output": output[-3000:],
        "parent_peak_rss_bytes": watcher.parent_peak,
        "arm_peak_rss_bytes": watcher.arm_peaks(),
    }


class PeakRss(threading.Thread):
    """Peak RSS (VmHWM: exact per process) of the parent, and per arm the sum over its
    processes (an upper bound: pages shared between them count once per process)."""

    def __init__(self, parent: int, marker: str) -> None:
        super().__init__(daemon=True)
        self.parent, self.marker = parent, marker
        self.parent_peak = 0
        self.per_pid: dict[int, tuple[str, int]] = {}  # pid -> (arm, VmHWM)
        self._stop_event = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._stop_event.wait(0.25):
            self.parent_peak = max(self.parent_peak, _hwm(self.parent))
            for p in psutil.process_iter(["pid", "cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if "harness.arm.process" in cmd and self.marker in cmd:
                    arm = Path(cmd.split("arm_process ", 1)[1].split()[0]).name.removesuffix(".plan.json")
                    try:
                        family = [p, *p.children(recursive=True)]
                    except psutil.Error:
                        continue
                    for q in family:
                        hwm = _hwm(q.pid)
                        if hwm:
                            self.per_pid[q.pid] = (arm, max(hwm, self.per_pid.get(q.pid, ("", 0))[1]))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def arm_peaks(self) -> dict[str, int]:
        peaks: dict[str, int] = {}
        for arm, hwm in self.per_pid.values():
            peaks[arm] = peaks.get(arm, 0) + hwm
        return peaks


def _hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- (a) harness vs bare vLLM ----------------------------------------------------------


def bench_harness_vs_bare(repeats: int) -> dict:
    from benchmarks.bare_vllm import run_all
    from harness.checkpoints.prepare import prepare
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.orchestrate import execute as pipeline
    from harness.orchestrate.fanout import FanoutSpec
    from harness.paths import PATHS
    from harness.plan import PathNeeds, make_plan
    from harness.spec.run import RunSpec

    # A cache of its own: the first run is sure to miss the reference cache, and stores the
    # entry the repeated runs reuse.
    work = Path(tempfile.mkdtemp(prefix="refit-bench-a-"))
    cache = work / "cache"
    model = str(tiny_qwen3(cache=cache))
    spec = pipeline.resolve_prompts(RunSpec(model=model))
    cs = prepare(spec.model, spec.target, spec.perturb, spec.control, cache=cache)
    plan = make_plan(spec, cs, {"reload_weights": PathNeeds.of(PATHS.get("reload_weights"))}, {})
    env = pipeline.arm_env(plan, spec, FanoutSpec())  # the bare engines get the harness's thread placement
    dirs = {"A": cs.a, "B": cs.b, "B_control": cs.b_control}
    # The bare script runs no sabotaged twins, so neither does the harness here (their cost: ``sabotage``).
    args = ["--model", model, "--paths", "reload_weights", "--no-sabotage"]
    cache_env = {"REFIT_HARNESS_CACHE": str(cache)}
    first, repeated, bare = [], [], []
    for i in range(repeats):  # interleaved triples
        bare.append(run_all(dirs, env))
        run = harness_run(
            args + ["--reuse-reference" if i == 0 else "--no-reuse-reference"], work / f"first{i}", cache_env
        )
        assert run["exit_code"] == 0 and not run["summary"]["reference"]["reused"], run["output"]
        first.append(run["seconds"])
        run = harness_run(args + ["--reuse-reference"], work / f"repeated{i}", cache_env)
        assert run["exit_code"] == 0 and run["summary"]["reference"]["reused"], run["output"]
        repeated.append(run["seconds"])
    shutil.rmtree(work, ignore_errors=True)
    b, f, r = (statistics.median(x) for x in (bare, first, repeated))
    return {
        "bare_s": bare,
        "first_run_s": first,
        "repeated_run_s": repeated,
        "thread_env": env,
        "ratio_first": f / b,
        "ratio_repeated": r / b,
        "goal_first": 1.0,
        "goal_repeated": 0.5,
        "rows": [
            ("bare vLLM, same work (3 engines, 2 at a time)", f"{b:.1f} s", "", None),
            ("harness, first run", f"{f:.1f} s", "", None),
            ("harness, repeated run (reused reference)", f"{r:.1f} s", "", None),
            ("(a) first run / bare", f"{f / b:.2f}", "<= 1.0", f / b <= 1.0),
            ("(a) repeated run / bare", f"{r / b:.2f}", "<= 0.5", r / b <= 0.5),
        ],
    }


# ---- (d) scaling with paths ------------------------------------------------------------

CPU_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "discard_reload",
    "transfer_gloo",
    "http_reload",
    "dummy_start",
    "prefix_cache",
    "compiled",
    "reload_kernel_format",
    "sharded_state",
)


def bench_paths_scaling(repeats: int) -> dict:
    from harness.checkpoints.tiny import tiny_qwen3

    model = str(tiny_qwen3())
    work = Path(tempfile.mkdtemp(prefix="refit-bench-d-"))
    results, rows = {}, []
    for label, paths in (("1 path", CPU_PATHS[:1]), ("3 paths", CPU_PATHS[:3]), ("all CPU paths", CPU_PATHS)):
        run = harness_run(["--model", model, "--paths", ",".join(paths), "--no-reuse-reference"], work / label[0])
        s = run["summary"]
        results[label] = {
            "paths": list(paths),
            "seconds": run["seconds"],
            "exit_code": run["exit_code"],
            "cold_starts": s.get("cold_starts"),
            "arms": len(s.get("arms", [])),
            "verdicts": {p: v["verdict"] for p, v in s.get("paths", {}).items()},
        }
        rows.append((f"(d) {label} ({len(paths)}): wall time", f"{run['seconds']:.0f} s", "", None))
        rows.append((f"(d) {label}: engine cold starts", str(s.get("cold_starts")), "= 2 + subject engines", None))
    shutil.rmtree(work, ignore_errors=True)
    return {"runs": results, "rows": rows}


# ---- the cost of earned verdicts: sabotaged twins on (the default) vs --no-sabotage ------


def bench_sabotage(repeats: int) -> dict:
    """Wall time and refits of a plain run with its sabotaged twins (the default) and without
    (``--no-sabotage``), interleaved, on three CPU paths. The cold-B reference and noise arms are
    reused from the cache after the first run, so the difference is the twins' own refits."""
    from harness.checkpoints.tiny import tiny_qwen3

    work = Path(tempfile.mkdtemp(prefix="refit-bench-s-"))
    cache_env = {"REFIT_HARNESS_CACHE": str(work / "cache")}
    model = str(tiny_qwen3(cache=work / "cache"))
    args = ["--model", model, "--paths", ",".join(CPU_PATHS[:3]), "--reuse-reference"]
    twins, plain, verdicts = [], [], {}
    harness_run([*args, "--no-sabotage"], work / "warm", cache_env)  # stores the reference both reuse
    for i in range(repeats):
        for label, flags, into in (("twins", [], twins), ("no twins", ["--no-sabotage"], plain)):
            run = harness_run([*args, *flags], work / f"{label[0]}{i}", cache_env)
            assert run["exit_code"] == 0 and run["summary"]["reference"]["reused"], run["output"]
            into.append(run["seconds"])
            verdicts[label] = {p: v.get("shown", v["verdict"]) for p, v in run["summary"]["paths"].items()}
    shutil.rmtree(work, ignore_errors=True)
    t, n = statistics.median(twins), statistics.median(plain)
    return {
        "paths": list(CPU_PATHS[:3]),
        "twins_s": twins,
        "no_twins_s": plain,
        "verdicts": verdicts,
        "rows": [
            (f"sabotage: {len(CPU_PATHS[:3])} paths with twins (default), reused reference", f"{t:.1f} s", "", None),
            ("sabotage: the same with --no-sabotage", f"{n:.1f} s", "", None),
            ("sabotage: cost of earned verdicts", f"+{t - n:.1f} s ({t / n - 1:+.0%})", "", None),
        ],
    }


# ---- (e) scaling with model size -------------------------------------------------------

SIZES = {
    "0.01GB": dict(vocab_size=8192, hidden_size=256),
    "0.5GB": dict(vocab_size=65536, hidden_size=1024),
    "2GB": dict(vocab_size=131072, hidden_size=2048),
}


def wide_model(name: str, dims: dict, cache: Path) -> Path:
    """A tiny-depth Qwen3 made wide, written tensor by tensor (never all in memory)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from harness.checkpoints.tiny import TINY_QWEN3

    dest = cache / f"wide-qwen3-{name}"
    if (dest / "config.json").is_file():
        return dest
    config = Qwen3Config(**{**TINY_QWEN3, "intermediate_size": 2 * dims["hidden_size"], **dims})
    with torch.device("meta"):
        shapes = {n: (p.shape, n.endswith("norm.weight")) for n, p in Qwen3ForCausalLM(config).named_parameters()}
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    shard, shard_bytes, index = {}, 0, {}

    def flush() -> None:
        nonlocal shard, shard_bytes
        if shard:
            fname = f"model-{len(set(index.values())) + 1:05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
            index.update({n: fname for n in shard})
            shard, shard_bytes = {}, 0

    for n, (shape, is_norm) in sorted(shapes.items()):
        t = (1.0 + 0.2 * torch.randn(shape, generator=gen)) if is_norm else 0.02 * torch.randn(shape, generator=gen)
        shard[n] = t
        shard_bytes += t.numel() * 4
        if shard_bytes >= 256 << 20:
            flush()
    flush()
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    cfg = config.to_dict()
    cfg.update(architectures=["Qwen3ForCausalLM"], torch_dtype="float32")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    os.replace(tmp, dest)
    return dest


def bench_model_size(repeats: int) -> dict:
    from harness.settings import DEFAULT_CACHE

    work = Path(tempfile.mkdtemp(prefix="refit-bench-e-"))
    results, rows = {}, []
    for name, dims in SIZES.items():
        model = wide_model(name, dims, DEFAULT_CACHE / "models")
        size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        # One arm at a time: a 2 GB model's engines would not fit two at once beside other users.
        run = harness_run(
            [
                "--model",
                str(model),
                "--paths",
                "reload_weights",
                "--no-reuse-reference",
                "--arm-timeout",
                "1800",
                "--max-parallel",
                "1",
            ],
            work / name,
        )
        results[name] = {
            "checkpoint_bytes": size,
            "seconds": run["seconds"],
            "exit_code": run["exit_code"],
            "parent_peak_rss_bytes": run["parent_peak_rss_bytes"],
            "arm_peak_rss_bytes": run["arm_peak_rss_bytes"],
            "verdict": run["summary"].get("paths", {}).get("reload_weights", {}).get("verdict"),
            "output_tail": run["output"][-1500:] if run["exit_code"] else "",
        }
        arms = run["arm_peak_rss_bytes"]
        rows.append((f"(e) {size / 1e9:.2f} GB checkpoint: wall time", f"{run['seconds']:.0f} s", "", None))
        rows.append(
            (
                f"(e) {size / 1e9:.2f} GB: parent peak RSS",
                f"{run['parent_peak_rss_bytes'] / 1e9:.2f} GB",
                "< checkpoint",
                run["parent_peak_rss_bytes"] < size if size > 1e9 else None,
            )
        )
        rows.append(
            (
                f"(e) {size / 1e9:.2f} GB: arm peak RSS (max; each)",
                f"{max(arms.values(), default=0) / 1e9:.2f} GB; "
                + ", ".join(f"{a} {v / 1e9:.2f}" for a, v in sorted(arms.items())),
                "",
                None,
            )
        )
    shutil.rmtree(work, ignore_errors=True)
    return {"sizes": results, "rows": rows}


def prepare_child(model: str, cache: str) -> None:
    """In a process of its own: ``prepare`` (B and B′, made afresh in ``cache``),
    then print its own exact peak RSS (VmHWM) and the RSS it had before, with torch and the
    harness already imported, as one JSON line."""
    import torch  # noqa: F401  (imported before the baseline: a real run's parent has it too)

    from harness.checkpoints.prepare import prepare
    from harness.spec.run import ControlSpec, PerturbSpec

    def status(key: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    baseline = status("VmRSS")
    start = time.perf_counter()
    prepare(model, None, PerturbSpec(), ControlSpec(), cache=Path(cache))
    print(
        json.dumps(
            {"seconds": time.perf_counter() - start, "baseline_rss_bytes": baseline, "peak_rss_bytes": status("VmHWM")}
        )
    )


def bench_prepare_memory(repeats: int) -> dict:
    """(e) without engines: the parent's preparation alone (making B and B′) for each size,
    each in a fresh process and a fresh cache, so B and B′ are really made."""
    from harness.checkpoints.read import read_headers
    from harness.settings import DEFAULT_CACHE

    results, rows = {}, []
    for name, dims in SIZES.items():
        model = wide_model(name, dims, DEFAULT_CACHE / "models")
        size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        largest = max(math.prod(h.shape) * _DTYPE_BYTES[h.dtype] for h in read_headers(model).values())
        cache = Path(tempfile.mkdtemp(prefix="refit-bench-prepare-"))
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from benchmarks.run import prepare_child; prepare_child(sys.argv[1], sys.argv[2])",
                    str(model),
                    str(cache),
                ],
                capture_output=True,
                text=True,
                timeout=3600,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if proc.returncode:
            raise RuntimeError(f"prepare on {model} failed: {proc.stderr[-2000:]}")
        child = json.loads(proc.stdout.strip().splitlines()[-1])
        peak, extra = child["peak_rss_bytes"], child["peak_rss_bytes"] - child["baseline_rss_bytes"]
        results[name] = {
            "checkpoint_bytes": size,
            "largest_tensor_bytes": largest,
            **child,
            "extra_rss_bytes": extra,
            "extra_per_largest_tensor": extra / largest,
        }
        rows.append((f"(e) {size / 1e9:.2f} GB: making B and B′, wall time", f"{child['seconds']:.0f} s", "", None))
        rows.append(
            (
                f"(e) {size / 1e9:.2f} GB: making B and B′, parent peak RSS",
                f"{peak / 1e9:.2f} GB",
                "< checkpoint",
                peak < size if size > 1e9 else None,
            )
        )
        rows.append(
            (
                f"(e) {size / 1e9:.2f} GB:   above the imports, ÷ largest tensor ({largest / 1e9:.2f} GB)",
                f"{extra / 1e9:.2f} GB, {extra / largest:.2f}x",
                "about 1x",
                None,
            )
        )
    return {"sizes": results, "rows": rows}


_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


BENCHMARKS: dict[str, Callable[[int], dict]] = {
    "harness_vs_bare": bench_harness_vs_bare,
    "digest": bench_digest,
    "kernel_capture": bench_kernel_capture,
    "paths_scaling": bench_paths_scaling,
    "sabotage": bench_sabotage,
    "model_size": bench_model_size,
    "prepare_memory": bench_prepare_memory,
}


def print_table(rows: list[Row]) -> None:
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"\n{'figure':{width}}  {'measured':{vwidth}}  goal")
    for figure, value, goal, met in rows:
        verdict = "" if met is None else ("  met" if met else "  MISSED")
        print(f"{figure:{width}}  {value:{vwidth}}  {goal}{verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run")
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; available: {', '.join(BENCHMARKS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for name in args.names or list(BENCHMARKS):
        print(f"[bench] {name} ...", flush=True)
        started, load_before = time.perf_counter(), os.getloadavg()
        result = BENCHMARKS[name](args.repeats)
        result = {
            "benchmark": name,
            "seconds": time.perf_counter() - started,
            "cpus": os.cpu_count(),
            "load_average_before_after": [load_before[0], os.getloadavg()[0]],
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **result,
        }
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
        rows += [tuple(r) for r in result["rows"]]
        print_table([tuple(r) for r in result["rows"]])
    if len(args.names or BENCHMARKS) > 1:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
