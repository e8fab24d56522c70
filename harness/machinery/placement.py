"""Ray placement of a transfer arm's engine actor and trainer ranks, from its
``harness.spec.transfer.TransferLayout``. The arm's engines and trainers use it, and so does
the preflight (``harness.arm.preflight``), which places stand-in actors with the very same
options on a Ray told it has N GPUs.

Nothing here waits forever: a placement group or a trainer rank Ray cannot place is an error
naming what it asked for and what the arm's Ray has, not an arm that hangs until its timeout.
(The ``LLM`` actor is not waited on this way: its constructor, which ``__ray_ready__`` waits
for, loads and compiles the model for minutes. Its GPUs are the arm's own, sized for it, or a
placement group placed first.)
"""

from __future__ import annotations

from typing import Any

from harness.spec.transfer import TrainerSlot, TransferLayout

PLACEMENT_TIMEOUT_S = 120.0
"""How long a placement group may wait for Ray to place it before the arm fails."""
TRAINER_START_TIMEOUT_S = 300.0
"""How long a trainer rank may take to be placed and constructed (it imports vLLM)."""


class PlacementError(RuntimeError):
    """Ray could not place an actor or a placement group with what the arm's Ray has."""


def engine_placement_group(ray, layout: TransferLayout, timeout_s: float = PLACEMENT_TIMEOUT_S):
    """The placement group the ``LLM`` actor and vLLM's Ray workers run in (one GPU per
    bundle, as vLLM requires: "Placement group bundle cannot have more than 1 GPU"), ready;
    None for a layout without one."""
    if not layout.bundles:
        return None
    from ray.util.placement_group import placement_group

    pg = placement_group([{"GPU": 1.0} for _ in range(layout.bundles)], strategy="STRICT_PACK")
    if not group_ready(ray, pg, timeout_s):
        ray.util.remove_placement_group(pg)
        raise PlacementError(
            f"{layout.backend}: the engine's placement group ({layout.bundles} one-GPU bundles) could not be "
            f"placed in {timeout_s:.0f} s; {_have(ray)}"
        )
    return pg


def group_ready(ray, pg, timeout_s: float) -> bool:
    """Whether a placement group is placed within ``timeout_s`` (at once when it can be;
    ``PlacementGroup.wait`` polls once a second)."""
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    return bool(ready)


def engine_actor_options(layout: TransferLayout, pg) -> dict[str, Any]:
    """Ray options of the ``LLM`` actor. Under the ``ray`` executor it asks for no GPU itself:
    it runs in the placement group, whose bundles its workers take (vLLM finds the group with
    ``get_current_placement_group``, hence ``capture_child_tasks``)."""
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": layout.engine_gpus}
    if pg is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_capture_child_tasks=True
        )
    env = layout.engine_env()
    if env:
        options["runtime_env"] = {"env_vars": env}
    return options


def worker_actor_options(layout: TransferLayout, pg, rank: int) -> dict[str, Any]:
    """What vLLM's Ray executor asks for each worker (``RayExecutorV2._get_actor_resource_kwargs``
    and ``VLLM_RAY_BUNDLE_INDICES``): the preflight places stand-ins with these."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": 0,
        "num_gpus": layout.worker_gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank),
    }


def trainer_actor_options(slot: TrainerSlot, pg) -> dict[str, Any]:
    """Ray options of one trainer rank: on its worker's bundle (colocated), or on its own."""
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": slot.gpus}
    if slot.bundle is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if pg is None:
            raise PlacementError(
                f"trainer rank {slot.rank} shares bundle {slot.bundle}, but there is no placement group"
            )
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=slot.bundle
        )
    return options


def wait_placed(ray, actor, what: str, gpus: float, timeout_s: float = TRAINER_START_TIMEOUT_S) -> None:
    """Return once Ray has placed ``actor`` and run its constructor; raise ``PlacementError``
    if that has not happened within ``timeout_s``."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise PlacementError(
            f"{what} (asks {gpus:g} GPU) was not placed and started in {timeout_s:.0f} s; {_have(ray)}"
        ) from None


def _have(ray) -> str:
    total = ray.cluster_resources().get("GPU", 0.0)
    free = ray.available_resources().get("GPU", 0.0)
    return f"the arm's Ray has {total:g} GPU(s), {free:g} free"
