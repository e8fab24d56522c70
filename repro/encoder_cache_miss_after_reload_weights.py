"""vLLM 0.32: after ``reload_weights``, the next request with an image the engine already served
kills the engine with ``RuntimeError: Encoder cache miss for <mm_hash>``.

Standalone (vLLM, torch, transformers, safetensors, PIL, numpy; no refit-harness). The model
runner's ``reload_weights`` (``v1/worker/gpu_model_runner.py``) ends with
``self.reset_encoder_cache()``, which empties the runner's own ``encoder_cache`` dict. The
scheduler's ``EncoderCacheManager`` is not told: it still lists the image's mm_hash as cached, so
it schedules no encoder run for it, and the runner, gathering the image's embeddings, finds
nothing and raises. ``EngineCore.reset_encoder_cache`` (``v1/engine/core.py``) resets both.

The mm_hash is a content hash salted with ``model_config.model``, which
``reload_weights(weights_path=...)`` sets to the new path. With the engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the front end shares that config, so a reload from another
directory changes every image's hash and hides the bug; a reload from the directory the engine
started on (``--same-path``, as a trainer overwriting its checkpoint does) does not. With the
engine core in its own process (the default, kept here) the front end's config never changes.

A tiny random Idefics3 (llama text model, SigLIP-like vision tower, a character-level tokenizer,
one 2x2-merged 56 px tile = 4 image tokens), B = A with every tensor moved (by 50 % of its
spread), random-pixel images. Cold start on B, then cold start on A: generate two image prompts,
``reload_weights(B)``, then generate, in this order, a text-only prompt, two images never served,
and the two images served before the reload. Each is compared with cold B's greedy tokens. Exit 1
when a step fails (the encoder-cache miss) or its tokens differ from cold B's, 0 when all match.

Run: python repro/encoder_cache_miss_after_reload_weights.py [--reset-encoder-cache] [--same-path]
  [--dtype bfloat16|float32]
(``--reset-encoder-cache``, the twin: after ``reload_weights``,
``llm.llm_engine.reset_encoder_cache()``, which resets the scheduler's and the workers' caches;
then every step matches cold B and it exits 0. ``--same-path``: the engine starts on a copy of A
that B's weights overwrite before ``reload_weights`` reads the same directory.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

SPECIALS = ("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", "<eos>", "<bos>", "<pad>")


def tokenizer():
    """One id per character (0 ``<unk>``, then newline and printable ASCII), then ``SPECIALS``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "\n" + "".join(chr(c) for c in range(32, 127))
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{c: i for i, c in enumerate(chars, 1)}}, unk_token="<unk>"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in ("<unk>", *SPECIALS)])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<eos>",
        bos_token="<bos>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>", "end_of_utterance_token": "<end_of_utterance>"},
    )
    return fast, {s: tok.token_to_id(s) for s in SPECIALS}


def checkpoint(directory: Path, seed: int) -> str:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    fast, ids = tokenizer()
    images = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": 56}, max_image_size={"longest_edge": 56}
    )
    Idefics3Processor(image_processor=images, tokenizer=fast, image_seq_len=4).save_pretrained(str(directory))
    text = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    text.update(head_dim=32, intermediate_size=256, max_position_embeddings=1024, tie_word_embeddings=False)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    vision.update(image_size=56, patch_size=14)
    torch.manual_seed(0)
    config = Idefics3Config(
        text_config=dict(model_type="llama", **text),
        vision_config=vision,
        image_token_id=ids["<image>"],
        scale_factor=2,
        tie_word_embeddings=False,
    )
    Idefics3ForConditionalGeneration(config).save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
    if seed:
        gen = torch.Generator().manual_seed(seed)
        tensors = {
            n: t + 0.5 * t.float().std().clamp(min=1e-2) * torch.randn(t.shape, generator=gen)
            for n, t in tensors.items()
        }
    save_file(
        {n: t.contiguous() for n, t in tensors.items()}, directory / "model.safetensors", metadata={"format": "pt"}
    )
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(architectures=["Idefics3ForConditionalGeneration"], torch_dtype="float32")
    cfg["text_config"].update(eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"], pad_token_id=ids["<pad>"])
    (directory / "config.json").write_text(json.dumps(cfg))
    return str(directory)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reset-encoder-cache", action="store_true")
    parser.add_argument("--same-path", action="store_true")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    import numpy as np
    from PIL import Image
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="encoder-cache-"))
    a, b = checkpoint(root / "A", 0), checkpoint(root / "B", 1)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def image_prompts(*seeds: int) -> list[dict]:
        pixels = {s: np.random.default_rng(s).integers(0, 256, (64, 64, 3), dtype=np.uint8) for s in seeds}
        return [
            {"prompt": f"look {s}: <image> now", "multi_modal_data": {"image": Image.fromarray(pixels[s])}}
            for s in seeds
        ]

    steps = {
        "text-only": [{"prompt": "no image here, just text"}],
        "images never served": image_prompts(2, 3),
        "images served before the reload": image_prompts(0, 1),
    }

    def engine(path: str) -> LLM:
        return LLM(
            model=path,
            dtype=args.dtype,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=512,
            max_num_seqs=4,
            limit_mm_per_prompt={"image": 1},
            seed=0,
        )

    def run(llm: LLM, prompts: list[dict]) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    llm = engine(b)
    cold_b = {name: run(llm, prompts) for name, prompts in steps.items()}
    llm.llm_engine.engine_core.shutdown()
    del llm
    live = shutil.copytree(a, root / "live") if args.same_path else a
    llm = engine(str(live))
    cold_a = run(llm, image_prompts(0, 1))
    print(f"cold A, images 0 and 1: {cold_a} (cold B: {cold_b['images served before the reload']})")
    if args.same_path:
        shutil.copy(Path(b) / "model.safetensors", Path(live) / "model.safetensors")
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(live) if args.same_path else b})
    if args.reset_encoder_cache:
        llm.llm_engine.reset_encoder_cache()  # EngineCore.reset_encoder_cache: scheduler and workers
    label = "A + reload_weights(B" + (", same path)" if args.same_path else ")")
    print(f"{label}{' + reset_encoder_cache()' if args.reset_encoder_cache else ''} vs cold B ({args.dtype})")
    failed = []
    for name, prompts in steps.items():
        try:
            warm = run(llm, prompts)
        except Exception as exc:  # the engine's own error is the finding
            print(f"  {name}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            if type(exc).__name__ == "EngineDeadError":  # the engine core's own process logged the cause
                print("    (the engine core's log above has it: RuntimeError: Encoder cache miss for <mm_hash>)")
            failed.append(name)
            continue
        print(f"  {name}: tokens equal cold B's: {warm == cold_b[name]}  {warm}")
        if warm != cold_b[name]:
            failed.append(name)
    print("broken after the reload: " + (", ".join(failed) or "nothing"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
