"""A real ``vllm serve`` process, refit and observed over HTTP."""

from __future__ import annotations

from typing import Any

from harness.paths import reload_path
from harness.paths.base import Engine
from harness.paths.http_transfer import IN_FLIGHT_STEP_S
from harness.paths.reload_weights import ReloadWeightsFromDirectory
from harness.records import InFlightRequest
from harness.spec.requirements import EngineRequirements, RefitTarget, data_parallel_rank


@reload_path
class HTTPReload(ReloadWeightsFromDirectory):
    # The refit is the same collective_rpc; HTTPEngine sends it as POST /collective_rpc.
    name = "http_reload"
    exercises = (
        "vllm serve (VLLM_SERVER_DEV_MODE=1) on a loopback port: POST /collective_rpc reload_weights, "
        "generation over /v1/completions, observation through --worker-extension-cls"
    )
    requirements = EngineRequirements(kind="http")
    sabotage = "POST /collective_rpc reload_weights with the wrong checkpoint (A, the weights it already holds)"

    def sabotaged_refit(self, engine, target):
        self.refit(engine, self.checkpoints.a, target)


DATA_PARALLEL_RANKS = 2
"""Ranks of the data-parallel engine: the fewest that can disagree."""
GATE_DRAIN_S = 120.0
"""How long the requests ``/pause?mode=wait`` drains may take to end once it answered."""


@reload_path
class HTTPDataParallelReload(HTTPReload):
    # One trainer refits a DP engine: vLLM's DP client broadcasts the collective RPC to every
    # rank, but answers with rank 0's results only, so a census cannot see a rank left behind;
    # the greedy requests, pinned round-robin to the ranks, can. The refit is gated as RL
    # trainers gate it (verl #7511): requests stream on every rank, /pause?mode=wait drains
    # them, requests sent while paused wait in the queue, and each must be all A's or all B's.
    name = "http_dp_reload"
    exercises = (
        f"vllm serve --data-parallel-size {DATA_PARALLEL_RANKS} (engine cores behind one API server): POST "
        "/collective_rpc reload_weights, sent by vLLM's DP client to every rank, inside /pause?mode=wait ... "
        "/resume while streaming requests pinned to every rank drain before it and queue behind it; greedy "
        "requests pinned round-robin to the ranks with X-data-parallel-rank"
    )
    requirements = EngineRequirements(kind="http", data_parallel_size=DATA_PARALLEL_RANKS)
    sabotage = (
        "reload_weights on data-parallel rank 0 only (a trainer that refits one rank): the other rank keeps "
        "its weights, and the census, answered by rank 0, cannot tell"
    )
    sabotage_evidence = "tokens"

    @classmethod
    def gpus_needed(cls, tensor_parallel_size: int) -> int:
        """Each rank holds the whole model on GPUs of its own."""
        return tensor_parallel_size * DATA_PARALLEL_RANKS

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self._in_flight: tuple[InFlightRequest, ...] = ()

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        self._gated(engine, lambda: super(HTTPDataParallelReload, self).refit(engine, checkpoint_dir, target))

    def sabotaged_refit(self, engine, target):
        self._gated(
            engine,
            lambda: engine.rpc(
                "refit_harness_reload_on_data_parallel_rank",
                {"rank": 0, "weights_path": self.checkpoints.directory(target)},
            ),
        )

    def take_in_flight(self) -> tuple[InFlightRequest, ...]:
        found, self._in_flight = self._in_flight, ()
        return found

    def _gated(self, engine: Engine, reload) -> None:
        """``reload()`` inside ``/pause?mode=wait`` ... ``/resume``: one streaming request per prompt
        (pinned round-robin to the ranks, the observation's token budget) is generating when the
        pause is sent and must end before it answers; a second one per prompt is sent while paused
        and must run after the resume. Both waves are recorded (``pause_mode="wait"``)."""
        from harness.machinery.in_flight import InFlight, in_flight_prompts

        server: Any = engine  # an HTTPEngine: the path's requirements ask for ``vllm serve``
        spec = self.prompts
        prompts = in_flight_prompts(spec)
        if spec is None or not prompts:
            raise ValueError(f"{self.name} needs the run's token-id prompts for its streaming requests")
        ranks = tuple(data_parallel_rank(i, DATA_PARALLEL_RANKS) for i in range(len(prompts)))

        def wave() -> InFlight:
            return InFlight(server.connection, server.model_name(), prompts, spec.max_tokens, ranks, pause_mode="wait")

        drained, queued = wave(), wave()
        server.rpc("refit_harness_pace", {"seconds_per_step": IN_FLIGHT_STEP_S})
        drained.start()
        server.post("/pause?mode=wait")
        drained.finish(timeout_s=GATE_DRAIN_S)  # a wait-pause answers once they ended
        drained.mark_paused()
        server.rpc("refit_harness_pace", {"seconds_per_step": 0.0})
        queued.start(wait_for_first_token=False)
        queued.mark_paused()
        reload()
        drained.mark_resumed()
        queued.mark_resumed()
        server.post("/resume")
        queued.finish(timeout_s=300.0)
        self._in_flight = drained.records(server.complete) + queued.records(server.complete)
