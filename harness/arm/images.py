"""The images of image prompts: pixels drawn from a seed, so every arm sends the same image
and nothing is downloaded."""

from __future__ import annotations

from typing import Any

from harness.spec.run import PromptSpec

IMAGE_SIDE = 64
"""Pixels per side of a generated image (the processor resizes it to the model's own size)."""


def generated_image(seed: int):
    """An RGB image of uniform random pixels drawn from ``seed``."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def image_uuid(seed: int) -> str:
    """The id the engines' caches know a generated image by."""
    return f"refit-harness-image-{seed}"


def engine_prompts(prompts: PromptSpec) -> list[dict[str, Any]]:
    """vLLM's prompts: token ids, and the generated image of a prompt that carries one."""
    images = prompts.images or ()
    out: list[dict[str, Any]] = []
    for i, ids in enumerate(prompts.token_ids or ()):
        prompt: dict[str, Any] = {"prompt_token_ids": list(ids)}
        if i < len(images):
            prompt["multi_modal_data"] = {"image": generated_image(images[i])}
            # vLLM keys its caches by a hash of the image and the model's path, which differs from
            # arm to arm; an id of the image's own keys each one alike in every engine.
            prompt["multi_modal_uuids"] = {"image": [image_uuid(images[i])]}
        out.append(prompt)
    return out
