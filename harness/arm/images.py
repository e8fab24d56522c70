"""The images of image prompts: pixels drawn from a seed, so every arm sends the same image
and nothing is downloaded."""

from __future__ import annotations

from typing import Any

from harness.spec.run import PromptSpec

IMAGE_SIDE = 64
"""Pixels per side of a generated image (the processor resizes it to the model's own size)."""

SERVED_CHAT_TEMPLATE = (
    "{% for message in messages %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endfor %}"
)
"""The chat template ``vllm serve`` gets for image prompts (``--chat-template``, with the OpenAI
content format): a message's text parts as they are, and the image placeholder where its image
part is, with no role markers, so a request's prompt is the offline prompt's text around its
image. ``/v1/completions`` takes no image; ``/v1/chat/completions`` is how users send one."""


def generated_image(seed: int):
    """An RGB image of uniform random pixels drawn from ``seed``."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def image_data_url(seed: int) -> str:
    """The generated image as a PNG ``data:`` URL, as an OpenAI-style client sends one."""
    import base64
    import io

    buffer = io.BytesIO()
    generated_image(seed).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_content(before: str, seed: int, after: str) -> list[dict[str, Any]]:
    """One user message's content parts: the text before the image, the image (with the id its
    caches know it by, as in ``engine_prompts``), the text after."""
    return [
        {"type": "text", "text": before},
        {"type": "image_url", "image_url": {"url": image_data_url(seed)}, "uuid": image_uuid(seed)},
        {"type": "text", "text": after},
    ]


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
