"""A checkpoint that ships a tokenizer runs real text prompts, and the report shows what the
engines wrote, decoded by that tokenizer (here the harness's character-level one, saved as
the checkpoint's own ``tokenizer.json``)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness.checkpoints.tiny import tiny_qwen3
from harness.spec.prompts import PROMPT_QUESTIONS
from tests.helpers import cli

pytestmark = [pytest.mark.cpu]


def test_text_prompts_run_and_the_report_shows_the_decoded_outputs(tmp_path):
    from tokenizers import Tokenizer

    from harness.tokenizer import char_tokenizer

    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_qwen3(), model)
    char_tokenizer().save(str(model / "tokenizer.json"))
    proc = cli("run", "--model", str(model), "--out", str(out), "--paths", "reload_weights", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((out / "run.json").read_text())["data"]["plan"]["arms"][0]["prompts"]
    assert all(t.endswith(" " + q) for t, q in zip(plan["texts"], PROMPT_QUESTIONS)), plan["texts"]
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokens = pd.read_csv(out / "tokens.csv", keep_default_na=False)
    assert len(tokens) > 0
    for row in tokens.itertuples():  # every decoded text is exactly its token ids, decoded
        assert row.reference_text == tok.decode([int(t) for t in str(row.reference_tokens).split()]), row
    shown = tokens[tokens["check"] != "noise"]
    assert (out / "index.html").read_text().count("class='decoded'") == 2 * len(shown)  # subject and reference
