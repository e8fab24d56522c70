"""A real ``vllm serve`` process, refit and observed over HTTP."""

from __future__ import annotations

from harness.paths import reload_path
from harness.paths.reload_weights import ReloadWeightsFromDirectory
from harness.spec.requirements import EngineRequirements


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


@reload_path
class HTTPDataParallelReload(HTTPReload):
    # One trainer refits a DP engine: vLLM's DP client broadcasts the collective RPC to every
    # rank, but answers with rank 0's results only, so a census cannot see a rank left behind;
    # the greedy requests, pinned round-robin to the ranks, can.
    name = "http_dp_reload"
    exercises = (
        f"vllm serve --data-parallel-size {DATA_PARALLEL_RANKS} (engine cores behind one API server): POST "
        "/collective_rpc reload_weights, sent by vLLM's DP client to every rank; greedy requests pinned "
        "round-robin to the ranks with X-data-parallel-rank"
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

    def sabotaged_refit(self, engine, target):
        engine.rpc(
            "refit_harness_reload_on_data_parallel_rank",
            {"rank": 0, "weights_path": self.checkpoints.directory(target)},
        )
