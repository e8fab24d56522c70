"""A live trainer refits the engine after every optimizer step.

The trainer (``harness.machinery.trainer``: a transformers model of A in fp32, AdamW, next-token
loss over the prompts) runs in the arm process, outside vLLM's processes; the engine is
``vllm.LLM`` in a Ray actor, as RL frameworks run it. After each step the trainer sends its
parameters in the checkpoint's names and layout (``Trainer.named_parameters``) and in fp32:
- ``trainer_steps``: through the iterator path, ``reload_weights(weights_iterator=...)`` inside
  the worker (the tensors travel as the call's arguments);
- ``trainer_steps_gloo``: through vLLM's weight-transfer API and the harness's gloo backend
  (``RayVLLMWeightSyncClient``: start, update, finish).
Packing (q/k/v, gate/up), tied weights and the fp32 -> engine-dtype cast are left to vLLM's
loaders. Each step ``T<k>`` is judged against a cold start on that step's ``save_pretrained``
(made before any engine by the same trainer code; the arm checks the live step equals it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath
from harness.spec.checkpoint_set import trainer_step
from harness.spec.requirements import EngineRequirements, RefitTarget


class TrainerPath(ReloadPath):
    """Shared by both transports: the trainer, and what each refit target means for it."""

    trains: ClassVar[bool] = True
    """Its targets are the trainer's optimizer steps (``harness.plan.trainer_targets``)."""
    # Its own engine: transfer_gloo's sender would otherwise find its group replaced by this one's.
    requirements = EngineRequirements(kind="ray_llm", weight_transfer_backend="gloo", apart="trainer")
    sabotage = "one trainer parameter (the positive-control tensor) not sent after an optimizer step"

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self.trainer: Any = None
        self.spec: Any = None  # the run's TrainerSpec, set by the arm (ArmPlan.trainer)

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, exclude: tuple[str, ...] = ()) -> None:
        step = trainer_step(target)
        if step is None:  # back to A: the checkpoint's own tensors, through the same transport
            from harness import safetensors_files

            self.send(engine, list(safetensors_files.tensors(safetensors_files.files(checkpoint_dir))))
            return
        k, control = step
        trainer = self._trainer()
        trainer.advance_to(k)
        trainer.verify(checkpoint_dir)
        tensors = trainer.named_parameters(exclude=exclude)
        if control:
            scale = self.checkpoints.control_scale
            tensors = [(n, t * scale if n == self.checkpoints.control_tensor else t) for n, t in tensors]
            if not any(n == self.checkpoints.control_tensor for n, _ in tensors):
                raise ValueError(
                    f"the positive-control tensor {self.checkpoints.control_tensor} is no trainer parameter"
                )
        self.send(engine, tensors)

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

    def _trainer(self):
        if self.trainer is None:
            from harness.machinery.trainer import Trainer

            if self.spec is None:
                raise ValueError(f"{self.name} runs in an arm planned with a trainer spec (ArmPlan.trainer)")
            prompts = self.prompts.token_ids if self.prompts and self.prompts.token_ids else ()
            self.trainer = Trainer(self.checkpoints.a, self.spec, prompts)
        return self.trainer

    def send(self, engine: Engine, tensors: list) -> None:
        raise NotImplementedError


@reload_path
class TrainerSteps(TrainerPath):
    name = "trainer_steps"
    exercises = (
        "a live transformers trainer (fp32 AdamW) sends named_parameters() after each optimizer step through "
        "reload_weights(weights_iterator=...) inside the worker; each step judged against a cold start on its "
        "save_pretrained"
    )

    def send(self, engine: Engine, tensors: list) -> None:
        engine.rpc("refit_harness_load_tensors", {"tensors": tensors})


@reload_path
class TrainerStepsGloo(TrainerPath):
    name = "trainer_steps_gloo"
    exercises = (
        "a live transformers trainer (fp32 AdamW) sends named_parameters() after each optimizer step through "
        "vLLM's weight-transfer API (gloo backend, RayVLLMWeightSyncClient: start, update, finish); each step "
        "judged against a cold start on its save_pretrained"
    )

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self.sender: Any = None

    def send(self, engine: Engine, tensors: list) -> None:
        from harness.machinery.transfer import TensorSource

        if self.sender is None:
            self.sender = self._connect(engine)
        self.sender.source = TensorSource(tensors)
        self.sender.send_weights()

    def _connect(self, engine: Any):
        from vllm.distributed.weight_transfer.clients import RayVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.plugins import load_general_plugins

        from harness.machinery.transfer import TensorSource, trainer_init_info

        load_general_plugins()  # the harness's gloo trainer engine, registered in this process
        ranks = len(engine.rpc("refit_harness_ping"))
        fields = {"rank": 0, "master_address": "127.0.0.1", "master_port": 0, "world_size": 1 + ranks}
        return WeightTransferTrainerFactory.trainer_init(
            trainer_init_info("gloo", fields), client=RayVLLMWeightSyncClient(engine.actor), source=TensorSource([])
        )

    def close(self) -> None:
        if self.sender is not None:
            try:
                self.sender.shutdown()
            finally:
                self.sender = None
