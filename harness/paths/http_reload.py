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
