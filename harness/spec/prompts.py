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
