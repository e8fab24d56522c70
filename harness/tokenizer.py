"""Tokenizers, shared by the parent (prompts) and the arms (the accuracy probe). No torch.

- ``own_tokenizer``: a checkpoint's own fast tokenizer (``tokenizer.json``), read with the
  ``tokenizers`` library, offline; the parent encodes the default text prompts with it.
- ``load_tokenizer``: what an arm decodes completions with: the checkpoint's own tokenizer
  (``transformers.AutoTokenizer``, offline) when its directory has one, else the harness's
  character-level tokenizer, which the embedded tiny model ships with. Its ids
  (``CHAR_VOCAB`` of them) fit any vocabulary at least that large.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
"""The harness's character-level tokenizer: id 0 unknown, then newline and printable ASCII."""
CHAR_VOCAB = len(CHARACTERS) + 1

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]


def has_tokenizer(directory: str | Path) -> bool:
    """Whether a checkpoint directory carries its own tokenizer files."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def own_tokenizer(directory: str | Path):
    """The checkpoint's own fast tokenizer (``tokenizer.json``), or None when it ships none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust library raises a bare Exception on a bad file
        raise CheckpointError(f"cannot read the checkpoint's tokenizer {path}: {exc}") from None


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
        return (
            f"checkpoint ({Path(checkpoint).name})",
            lambda text: list(tok.encode(text)),
            lambda ids: tok.decode(ids, skip_special_tokens=True),
        )
    tok = char_tokenizer()
    return (
        f"harness character-level ({CHAR_VOCAB} ids)",
        lambda text: tok.encode(text).ids,
        lambda ids: tok.decode(ids, skip_special_tokens=True),
    )
