"""The live trainer of the trainer paths: a real ``transformers`` model of checkpoint A.

``AutoModelForCausalLM`` in fp32 (master weights), AdamW, the next-token loss over the run's
prompts. After each optimizer step its parameters are what a trainer sends, in the
checkpoint's names and layout (separate q/k/v and gate/up, per-expert tensors, no tied copy of
the head) and its own dtype; vLLM's loaders do the packing, the tying and the cast to the
engine's dtype.

Two processes run this same code: the prepare step (``python -m harness.machinery.trainer``, before
any engine) saves each step with ``save_pretrained``, where the per-step cold starts read it;
the subject arm trains again, live, and sends each step. A step depends on the thread count
(the backward pass's reductions split by threads), and vLLM's CPU worker replaces
``torch.set_num_threads`` with a no-op in its own process, so the trainer always runs outside
vLLM's processes with ``TrainerSpec.threads`` threads, and the arm checks every step against
the prepared one before sending it (``verify``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from harness.spec.run import TrainerSpec


class TrainerDiverged(RuntimeError):
    """The live trainer's weights are not the prepared step's: the cold start would not be its weights."""


class Trainer:
    """A transformers model of ``model_dir`` in fp32 and its AdamW optimizer."""

    def __init__(self, model_dir: str, spec: TrainerSpec, prompts: tuple[tuple[int, ...], ...]) -> None:
        import torch
        import transformers

        self._torch = torch
        self.spec = spec
        self.prompts = prompts
        self.model_dir = model_dir
        torch.manual_seed(spec.seed)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.lr)
        self.step_no = 0
        self.losses: list[float] = []

    def step(self) -> float:
        """One optimizer step on the mean next-token loss of the prompts (one sequence each, no padding)."""
        torch = self._torch
        saved = torch.get_num_threads()
        torch.set_num_threads(self.spec.threads)
        try:
            self.optimizer.zero_grad(set_to_none=True)
            losses = []
            for ids in self.prompts:
                batch = torch.tensor([list(ids)])
                losses.append(self.model(input_ids=batch, labels=batch).loss)
            loss = torch.stack(losses).mean()
            loss.backward()
            self.optimizer.step()
        finally:
            torch.set_num_threads(saved)
        self.step_no += 1
        self.losses.append(float(loss.detach()))
        return self.losses[-1]

    def advance_to(self, step: int) -> None:
        """Take optimizer steps until ``step`` steps are done (a trainer never goes back)."""
        if step < self.step_no:
            raise ValueError(f"the trainer is at step {self.step_no}; it cannot go back to step {step}")
        while self.step_no < step:
            self.step()

    def named_parameters(self, exclude: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
        """What the trainer sends: its parameters, detached, in the checkpoint's names and layout.

        transformers 5 converts some checkpoints as it loads them (MoE experts fused into one
        ``experts.gate_up_proj``, Mixtral's ``block_sparse_moe`` renamed ``mlp``, NemotronH's
        ``backbone`` renamed ``model``), and ``save_pretrained`` reverts that conversion. A
        trainer sends what vLLM's loaders read, which is the saved layout, so it goes through
        the same reversal (a no-op where nothing was converted)."""
        state = {name: p.detach() for name, p in self.model.named_parameters()}
        saved_layout = self._checkpoint_layout(state)
        return [(name, t) for name, t in saved_layout.items() if name not in exclude]

    def _checkpoint_layout(self, state: dict[str, Any]) -> dict[str, Any]:
        import importlib.util

        # Feature detection: transformers 4 loads checkpoints unconverted and has no reversal.
        if importlib.util.find_spec("transformers.core_model_loading") is None:
            return state
        from transformers.core_model_loading import revert_weight_conversion

        return dict(revert_weight_conversion(self.model, state))

    def save(self, directory: Path) -> None:
        """``save_pretrained`` of the current weights, with A's ``config.json`` architecture."""
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp), safe_serialization=True)
        config = json.loads((tmp / "config.json").read_text())
        source = json.loads((Path(self.model_dir) / "config.json").read_text())
        config["architectures"] = source.get("architectures", config.get("architectures"))
        config["torch_dtype"] = "float32"
        if "quantization_config" in source:
            # Only a config of KV-cache scales gets here (``checkpoints.trainer`` refuses quantized
            # weights): the trainer keeps and saves A's scales, but save_pretrained drops the
            # config that tells vLLM to load them.
            config["quantization_config"] = source["quantization_config"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for extra in Path(self.model_dir).iterdir():  # the tokenizer, for text prompts
            if extra.is_file() and extra.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
                shutil.copy2(extra, tmp / extra.name)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)

    def verify(self, directory: str) -> None:
        """Raise ``TrainerDiverged`` unless every parameter equals the prepared step's tensor
        of the same name bit for bit (a tied parameter is saved once, under its first name)."""
        from harness import safetensors_files

        saved = dict(safetensors_files.tensors(safetensors_files.files(directory)))
        differ = [n for n, t in self.named_parameters() if n in saved and not self._torch.equal(t, saved[n])]
        absent = [n for n, _ in self.named_parameters() if n not in saved]
        if differ or absent:
            raise TrainerDiverged(
                f"the live trainer's step {self.step_no} is not the prepared one in {directory}: "
                f"{len(differ)} parameter(s) differ (first: {(differ or ['-'])[0]}), {len(absent)} absent "
                f"(first: {(absent or ['-'])[0]}); the cold start on that step would not hold this trainer's weights"
            )


def main(argv: list[str]) -> int:
    """Prepare: train from A and ``save_pretrained`` each step into ``OUT/T<k>``."""
    parser = argparse.ArgumentParser(prog="python -m harness.machinery.trainer")
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--spec", required=True, help="TrainerSpec as JSON")
    parser.add_argument("--prompts", required=True, help="token-id prompts as JSON")
    args = parser.parse_args(argv)
    spec = TrainerSpec(**json.loads(args.spec))
    prompts = tuple(tuple(p) for p in json.loads(args.prompts))
    trainer = Trainer(args.model, spec, prompts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, args.steps + 1):
        loss = trainer.step()
        trainer.save(out / f"T{k}")
        print(f"trainer step {k}: loss {loss:.6f}", flush=True)
    (out / "trainer.json").write_text(json.dumps({"losses": trainer.losses, "spec": json.loads(args.spec)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
