"""Default prompts fit any checkpoint: real text through the checkpoint's own tokenizer where
it ships one (sharing a prefix long enough for the prefix cache), else ids drawn from the
vocabulary; a tokenizer that cannot be read is bad input (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.checkpoints.tiny import tiny_qwen3
from harness.errors import UsageError
from harness.orchestrate.execute import validate
from harness.orchestrate.resolve import resolve_prompts
from harness.spec.prompts import PROMPT_QUESTIONS, SHARED_PREFIX_TOKENS, shared_prefix_prompts
from harness.spec.run import RunSpec


def _checkpoint_with_tokenizer(tmp_path: Path, vocab_size: int | None = None) -> Path:
    from harness.tokenizer import char_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_qwen3(), model)
    char_tokenizer().save(str(model / "tokenizer.json"))
    if vocab_size is not None:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    return model


def test_a_checkpoint_with_a_tokenizer_gets_text_prompts_sharing_a_prefix(tmp_path):
    from tokenizers import Tokenizer

    model = _checkpoint_with_tokenizer(tmp_path)
    prompts = resolve_prompts(RunSpec(model=str(model))).prompts
    assert prompts.texts is not None and len(prompts.texts) == len(prompts.token_ids) == len(PROMPT_QUESTIONS)
    prefix = prompts.token_ids[0][:SHARED_PREFIX_TOKENS]
    assert all(ids[:SHARED_PREFIX_TOKENS] == prefix for ids in prompts.token_ids)
    assert len({ids[SHARED_PREFIX_TOKENS:] for ids in prompts.token_ids}) == len(PROMPT_QUESTIONS)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    for ids, text, question in zip(prompts.token_ids, prompts.texts, PROMPT_QUESTIONS):
        decoded = tok.decode(list(ids))
        assert decoded.endswith(" " + question) and text.endswith(" " + question)
        assert text.startswith(decoded[:SHARED_PREFIX_TOKENS])  # the prefix is cut from the text
    validate(RunSpec(model=str(model)))  # and fits max_model_len


def test_without_a_fitting_tokenizer_prompts_are_drawn_from_the_vocabulary(tmp_path):
    plain = resolve_prompts(RunSpec(model=str(tiny_qwen3()))).prompts
    assert plain.texts is None and plain.token_ids == shared_prefix_prompts(512)
    # The character tokenizer's ids (up to 97) do not fit a vocabulary of 64: ids, not text.
    small = resolve_prompts(RunSpec(model=str(_checkpoint_with_tokenizer(tmp_path, vocab_size=64)))).prompts
    assert small.texts is None and small.token_ids == shared_prefix_prompts(64)


def test_an_unreadable_tokenizer_is_bad_input(tmp_path):
    model = _checkpoint_with_tokenizer(tmp_path)
    (model / "tokenizer.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot read the checkpoint's tokenizer"):
        validate(RunSpec(model=str(model)))
