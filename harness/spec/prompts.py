"""The default prompts: text through a checkpoint's own tokenizer, or token ids drawn from its
vocabulary. Pure: the caller encodes."""

from __future__ import annotations

# Default prompts share a prefix longer than two KV blocks (vLLM's CPU backend uses
# 128-token blocks), so a prefix cache has whole blocks to serve after a refit.
SHARED_PREFIX_TOKENS = 272
PROMPT_SUFFIX_TOKENS = (8, 10, 6, 11)


# Text prompts for a checkpoint with a tokenizer: a shared passage (repeated until it covers
# SHARED_PREFIX_TOKENS tokens, where it is cut) and a distinct question each.
PROMPT_PASSAGE = (
    "In reinforcement learning from human feedback, an inference engine generates samples "
    "while a trainer updates the policy weights. After every update the new weights are "
    "copied into the running engine, which must then compute exactly what a freshly "
    "loaded engine with the same weights would compute. "
)
PROMPT_QUESTIONS = (
    "Question: what must the engine compute after an update? Answer:",
    "Question: who updates the policy weights? Answer:",
    "Summarize the passage in one sentence:",
    "Question: where are the new weights copied to, and when? Answer:",
)


def text_prompts(encode, vocab_size: int) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] | None:
    """``(token_ids, texts)`` of the text prompts, encoded with a checkpoint's own tokenizer
    (``encode``: text -> ids); None if its ids do not fit the model's vocabulary."""
    passage = PROMPT_PASSAGE
    while len(encode(passage)) < SHARED_PREFIX_TOKENS:
        passage += PROMPT_PASSAGE
    prefix = tuple(encode(passage)[:SHARED_PREFIX_TOKENS])
    ids = tuple(prefix + tuple(encode(" " + q)) for q in PROMPT_QUESTIONS)
    if any(not 0 <= t < vocab_size for p in ids for t in p):
        return None
    return ids, tuple(passage + " " + q for q in PROMPT_QUESTIONS)


def shared_prefix_prompts(vocab_size: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """Token-id prompts for any checkpoint, offline: a shared prefix and a distinct suffix
    each, drawn deterministically from ``[1, vocab_size)`` (id 0 is often padding)."""
    import random

    if vocab_size < 2:
        raise ValueError(f"vocabulary of {vocab_size} token(s) is too small for prompts")
    draw = random.Random(seed)
    prefix = tuple(draw.randrange(1, vocab_size) for _ in range(SHARED_PREFIX_TOKENS))
    return tuple(prefix + tuple(draw.randrange(1, vocab_size) for _ in range(n)) for n in PROMPT_SUFFIX_TOKENS)


PROMPT_IMAGES = 2
"""Distinct generated images over the default prompts of a model that takes images: prompt i
carries image ``i % PROMPT_IMAGES``, so each image is served twice and the engine's encoder
cache has an entry to serve again."""


def with_images(
    token_ids: tuple[tuple[int, ...], ...], image_token: int
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """``(token_ids, image seeds)``: each prompt with one image placeholder (``image_token``,
    which vLLM's processor expands to the image's tokens) right after the shared prefix, so the
    prefix cache still has whole text blocks to serve; its image is drawn from its seed. A drawn id
    equal to the image token would be a second placeholder without an image: it takes its neighbour's."""
    other = image_token - 1 if image_token > 1 else image_token + 1
    cleared = tuple(tuple(other if t == image_token else t for t in p) for p in token_ids)
    placed = tuple(p[:SHARED_PREFIX_TOKENS] + (image_token,) + p[SHARED_PREFIX_TOKENS:] for p in cleared)
    return placed, tuple(i % PROMPT_IMAGES for i in range(len(token_ids)))


def without_images(token_ids: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The prompts ``with_images`` made, with the image placeholder taken out again: text prompts
    for a request that carries no image."""
    return tuple(before + after for before, after in map(image_split, token_ids))


def image_split(ids: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(before, after)``: a ``with_images`` prompt's token ids on each side of its image."""
    return ids[:SHARED_PREFIX_TOKENS], ids[SHARED_PREFIX_TOKENS + 1 :]
