"""A real ``vllm serve`` process, refit and observed over HTTP."""

from __future__ import annotations

from harness.paths.base import EngineRequirements, ReloadPath


class HTTPReload(ReloadPath):
    name = "http_reload"
    exercises = ("vllm serve (VLLM_SERVER_DEV_MODE=1) on a loopback port: POST /collective_rpc reload_weights, "
                 "generation over /v1/completions, observation through --worker-extension-cls")
    requirements = EngineRequirements(kind="http")

    def refit(self, engine, checkpoint_dir, target):
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})
