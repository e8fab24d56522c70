"""Registered scenario factories: ``refit-harness list`` shows them, ``run -s NAME`` runs one."""

from harness.registry import Registry

SCENARIOS: Registry = Registry("scenario")
SCENARIOS.register("default", "scenarios.default:default")
SCENARIOS.register("smoke", "scenarios.default:smoke")
SCENARIOS.register("pr-review", "scenarios.default:pr_review")
SCENARIOS.register("gpu-nightly", "scenarios.gpu_nightly:gpu_nightly")
SCENARIOS.register("zoo", "scenarios.zoo:zoo")
SCENARIOS.register("quantized", "scenarios.quantized:quantized")
SCENARIOS.register("rl-paths", "scenarios.zoo:rl_paths")
SCENARIOS.register("regressions", "scenarios.regressions:regressions")
SCENARIOS.register("reload-lifecycle", "scenarios.reload_lifecycle:reload_lifecycle")
