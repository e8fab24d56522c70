"""The accuracy probe's tokenizer, engine side only (the parent never tokenizes).

A checkpoint's own tokenizer when its directory has one (``transformers.AutoTokenizer``,
offline); else the harness's character-level tokenizer, which the embedded tiny model ships
with: built here with the ``tokenizers`` library, deterministically, no network. Its ids
(``harness.accuracy.CHAR_VOCAB`` of them) fit any vocabulary at least that large.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.accuracy import CHAR_VOCAB, CHARACTERS, has_tokenizer

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]


def char_tokenizer():
    """One id per character: 0 ``<unk>`` (special, dropped on decode), then ``CHARACTERS``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, **{c: i for i, c in enumerate(CHARACTERS, 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens([AddedToken("<unk>", special=True)])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
    tok.decoder = decoders.Fuse()  # characters join without separators
    return tok


def load_tokenizer(checkpoint: str | Path) -> tuple[str, Encode, Decode]:
    """(name recorded with the completions, encode, decode)."""
    if has_tokenizer(checkpoint):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
        return (f"checkpoint ({Path(checkpoint).name})", lambda text: list(tok.encode(text)),
                lambda ids: tok.decode(ids, skip_special_tokens=True))
    tok = char_tokenizer()
    return (f"harness character-level ({CHAR_VOCAB} ids)", lambda text: tok.encode(text).ids,
            lambda ids: tok.decode(ids, skip_special_tokens=True))
