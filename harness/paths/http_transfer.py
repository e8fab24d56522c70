"""vLLM's RL HTTP API on a real ``vllm serve``: weight transfer with generation paused.

The server starts with ``--weight-transfer-config`` (the harness's gloo backend on the CPU,
NCCL on CUDA). The trainer runs in the arm process, as an RL trainer beside a server does,
and drives vLLM's own ``HTTPVLLMWeightSyncClient`` (``vllm/distributed/weight_transfer/clients.py``):
``/init_weight_transfer_engine`` once, then per refit ``/start_weight_update``,
``/update_weights`` and ``/finish_weight_update``, all inside ``/pause?mode=keep`` ...
``/resume`` (``vllm/entrypoints/rl/online/api_router.py``) while one streaming request per
prompt is generating. Those requests are followed to their end and recorded
(``records.InFlightRequest``); the observation after ``/resume`` is the usual census and
fresh greedy requests, judged against cold B.
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.device import cuda_available
from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath
from harness.records import InFlightRequest
from harness.spec.requirements import EngineRequirements, RefitTarget
from harness.spec.transfer import arm_gpus

PAUSE_MODE = "keep"
"""``/pause?mode=keep``: the scheduler freezes the running requests; they go on after ``/resume``."""
IN_FLIGHT_TOKENS = 128
"""Token budget of each in-flight request (cut to what ``max_model_len`` leaves after the
prompt)."""
IN_FLIGHT_STEP_S = 0.1
"""Until ``/pause`` answers, each engine step is held this long (``refit_harness_pace``), so
a request needs at least ``budget × IN_FLIGHT_STEP_S`` seconds to end. Unpaced, a tiny CPU
model streamed all its tokens before a loaded machine answered the pause (measured in CI:
a request with no token after ``/resume``)."""


def transfer_backend() -> str:
    """The weight-transfer backend the server is started with: NCCL where there is CUDA,
    the harness's gloo twin of it on the CPU."""
    return "nccl" if cuda_available() else "gloo"


@reload_path
class HTTPWeightTransfer(ReloadPath):
    name = "http_weight_transfer"
    exercises = (
        "vllm serve --weight-transfer-config (gloo on CPU, nccl on CUDA): vLLM's HTTPVLLMWeightSyncClient drives "
        "/init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update inside "
        "/pause?mode=keep ... /resume, with one streaming request per prompt in flight"
    )
    requirements = EngineRequirements(kind="http", weight_transfer_backend=transfer_backend())
    sabotage = "the positive-control tensor left out of the update the trainer sends over the RL HTTP API"

    pause_mode: ClassVar[str] = PAUSE_MODE

    @classmethod
    def gpus_needed(cls, tensor_parallel_size: int) -> int:
        """On CUDA (the only place GPUs are counted) the server's NCCL trainer needs a GPU of
        its own beside the workers' (``trainer_gpu``): a machine without one SKIPS the path
        instead of an arm that waits forever for Ray to place it."""
        return arm_gpus(tensor_parallel_size, "nccl")

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self.trainer: Any = None
        self.client: Any = None
        self._in_flight: tuple[InFlightRequest, ...] = ()

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, exclude: tuple[str, ...] = ()) -> None:
        import requests
        import requests_unixsocket

        from harness.machinery.in_flight import InFlight, in_flight_prompts
        from harness.machinery.transfer import checkpoint_source

        server: Any = engine  # an HTTPEngine: the path's requirements ask for ``vllm serve``
        backend = self.requirements.weight_transfer_backend or "gloo"
        prompts = in_flight_prompts(self.prompts)
        if not prompts:
            raise ValueError("http_weight_transfer needs the run's token-id prompts for its in-flight requests")
        budget = min(IN_FLIGHT_TOKENS, max(1, server.max_model_len - max(len(p) for p in prompts) - 1))
        # requests-unixsocket lets vLLM's requests-based client reach the server's private socket.
        with requests_unixsocket.monkeypatch():
            if self.trainer is None:
                self._connect(server, backend)
            flight = InFlight(server.connection, server.model_name(), prompts, budget)
            server.rpc("refit_harness_pace", {"seconds_per_step": IN_FLIGHT_STEP_S})
            flight.start()
            server.post(f"/pause?mode={self.pause_mode}")
            flight.mark_paused()
            server.rpc("refit_harness_pace", {"seconds_per_step": 0.0})  # after /resume: full speed
            if server.get_json("/is_paused").get("is_paused") is not True:
                raise RuntimeError("the server answered /pause but /is_paused says it is not paused")
            self.trainer.source = checkpoint_source(backend, checkpoint_dir, exclude=exclude)
            try:
                self.trainer.send_weights()  # start_weight_update -> update_weights -> finish_weight_update
            except requests.HTTPError as exc:
                # vLLM's client raises the status alone; the server's answer carries vLLM's own words.
                raise RuntimeError(f"{exc}: {exc.response.text[:1000]}") from exc
            flight.mark_resumed()
            server.post("/resume")
            flight.finish(timeout_s=300.0)
            if flight.finished_before_pause:
                raise RuntimeError(
                    f"{flight.finished_before_pause} of {len(prompts)} in-flight requests ran to their end before "
                    f"/pause answered ({budget} tokens each, {IN_FLIGHT_STEP_S} s a step): the refit was not "
                    "made with every request in flight"
                )
            self._in_flight = flight.records(server.complete)

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

    def take_in_flight(self) -> tuple[InFlightRequest, ...]:
        found, self._in_flight = self._in_flight, ()
        return found

    def _connect(self, server: Any, backend: str) -> None:
        """vLLM's HTTP client and the backend's trainer engine, joined with the server's workers."""
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.plugins import load_general_plugins

        from harness.loopback import free_port
        from harness.machinery.transfer import trainer_init_info, trainer_source

        load_general_plugins()  # the harness's gloo trainer engine, registered in this process too
        ranks = len(server.rpc("refit_harness_ping"))
        if backend == "gloo":
            port = 0  # the trainer binds first and hands the kernel-picked port to the workers
        else:
            port = free_port()  # vLLM's NCCL trainer binds the port it is given itself
            trainer_gpu(ranks)
        fields = {"rank": 0, "master_address": "127.0.0.1", "master_port": port, "world_size": 1 + ranks}
        self.client = HTTPVLLMWeightSyncClient(server.unix_url)
        # Segments start at A: the engine holds A when the trainer joins.
        self.trainer = WeightTransferTrainerFactory.trainer_init(
            trainer_init_info(backend, fields),
            client=self.client,
            source=trainer_source(backend, self.checkpoints.a),
        )

    def close(self) -> None:
        if self.trainer is not None:
            try:
                self.trainer.shutdown()
            finally:
                self.trainer = None


def trainer_gpu(ranks: int) -> None:
    """Give an NCCL trainer a GPU of its own: NCCL refuses two ranks of one group on one device,
    and the server's workers hold GPUs ``0..ranks-1``."""
    import torch

    if torch.cuda.device_count() <= ranks:
        raise RuntimeError(
            f"http_weight_transfer over nccl needs a GPU for the trainer beside the server's {ranks}: "
            f"{torch.cuda.device_count()} visible"
        )
    torch.cuda.set_device(ranks)
