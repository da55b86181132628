"""Evaluation scores the same bytes for every family: with context c, the bytes w[c:] of every
window w, by byte models (flat, hierarchy) and by the BPE-token model alike; overlapping windows
score each byte once."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import randomize_
from rltok.config import load_config
from rltok.data.windows import eval_windows
from rltok.eval.evaluate import evaluate
from rltok.model.factory import build_model
from rltok.model.output import token_nll

TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox jumps\n" % (i, i * 7) for i in range(600))
DATA = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
SEQ = 64  # the test preset's seq_len


def _model(*overrides: str):
    cfg = load_config("test", overrides=list(overrides))
    torch.manual_seed(0)
    return randomize_(build_model(cfg.model, train_bytes=DATA[:20_000]), scale=0.05).eval()


@pytest.fixture(scope="module")
def families() -> dict:
    return {"flat": _model("model.arch=flat", "model.flat_layers=1"),
            "hierarchy": _model("model.chunker=uniform"),
            "bpe_token": _model("model.arch=bpe_token", "model.bpe_vocab=300", "model.flat_layers=1")}


@pytest.mark.parametrize("context", [1, 17])
def test_every_family_scores_the_same_number_of_bytes(families, context):
    x, y = eval_windows(DATA[20_000:], SEQ, 6, context=context)
    counts = {name: evaluate(m, x, y, context=context)["bytes"] for name, m in families.items()}
    assert set(counts.values()) == {len(x) * (SEQ + 1 - context)}, counts


@pytest.mark.parametrize("name", ["flat", "hierarchy"])
def test_context_one_is_what_byte_models_always_scored(families, name):
    x, y = eval_windows(DATA[20_000:], SEQ, 6)
    assert evaluate(families[name], x, y, context=1) == evaluate(families[name], x, y, context=None)


def test_a_byte_model_leaves_the_targets_before_the_context_out(families):
    model, c = families["flat"], 9
    x, y = eval_windows(DATA[20_000:], SEQ, 6, context=c)
    with torch.no_grad():
        nll = token_nll(model(x).logits, y)[:, c - 1:]
    got = evaluate(model, x, y, context=c)
    assert got["bytes"] == nll.numel()
    assert got["bpb"] == pytest.approx(nll.double().sum().item() / nll.numel() / math.log(2), rel=1e-6)


def test_the_bpe_token_model_scores_the_windows_last_byte(families):
    """Context 1: every target counts, the last one included, where training's forward (context
    None) skips its first token's bytes and never sees the window's last byte."""
    model = families["bpe_token"]
    x, y = eval_windows(DATA[20_000:], SEQ, 4)
    out = model.score_window(torch.cat([x, y[:, -1:]], 1), 1)
    assert out.byte_mask.all() and (out.byte_nll[:, -1] > 0).all()
    assert evaluate(model, x, y, context=None)["bytes"] < x.numel()


def test_a_split_at_a_natural_boundary_changes_nothing(families):
    """Before a space the gpt2 pre-tokenizer cuts anyway: tokenising the two sides on their own
    gives the whole window's tokens, so the forced split and the natural one score alike."""
    model = families["bpe_token"]
    x, y = eval_windows(DATA[20_000:], SEQ, 4)
    w = torch.cat([x, y[:, -1:]], 1)[:1]
    c = next(i for i in range(20, SEQ) if w[0, i] == ord(" ") and chr(w[0, i - 1]).isalnum())
    forced, natural = model.score_window(w, c), model.score_window(w, c, split=False)
    assert torch.equal(forced.byte_mask, natural.byte_mask)
    assert torch.allclose(forced.byte_nll, natural.byte_nll, atol=1e-6)
    assert forced.byte_mask[0].nonzero().min().item() == c - 1


def test_without_the_split_scoring_starts_at_the_next_token_boundary(families):
    model = families["bpe_token"]
    x, y = eval_windows(DATA[20_000:], SEQ, 4)
    w = torch.cat([x, y[:, -1:]], 1)
    _, ends, _ = model.encode(w)
    natural = model.score_window(w, 30, split=False)
    for row, end in zip(natural.byte_mask, ends):
        start = end[end >= 29].min().item()  # the token boundary at or after byte 30 (target 29)
        assert row.nonzero().min().item() == start


@pytest.mark.parametrize("context", [1, 5, 64])
def test_overlapping_windows_score_every_byte_once(context):
    data = DATA[:3000]
    x, y = eval_windows(data, SEQ, context=context)
    w = torch.cat([x, y[:, -1:]], 1)
    scored = torch.cat([row[context:] for row in w])
    assert torch.equal(scored, data[context:context + len(scored)].long())
    assert len(data) - context - len(scored) < SEQ + 1 - context  # only a tail shorter than a stride is left


def test_context_must_leave_a_byte_to_score():
    from rltok.data.sources import DataError

    with pytest.raises(DataError, match="context"):
        eval_windows(DATA[:3000], SEQ, context=SEQ + 1)
    x, y = eval_windows(DATA[:3000], SEQ)
    with pytest.raises(ValueError, match="context"):
        evaluate(_model("model.arch=flat", "model.flat_layers=1"), x, y, context=0)


def test_rltok_eval_context_and_the_natural_split(families, tmp_path, capsys):
    import json

    from rltok.cli import main

    families["bpe_token"].save_pretrained(tmp_path / "m")
    (tmp_path / "data.txt").write_bytes(TEXT)
    args = ["eval", "-c", str(tmp_path / "m"), "--data", str(tmp_path / "data.txt"), "--seq-len", str(SEQ),
            "--max-windows", "3", "--context", "9"]
    assert main(args) == 0
    forced = json.loads(capsys.readouterr().out)
    assert main([*args, "--no-forced-split"]) == 0
    natural = json.loads(capsys.readouterr().out)
    assert forced["context"] == 9 and forced["bytes"] == 3 * (SEQ + 1 - 9)
    assert natural["forced_split"] is False and natural["bytes"] <= forced["bytes"]


def test_no_byte_scored_is_no_number_rather_than_zero_bits():
    from rltok.eval.evaluate import _SCALARS, summarize

    none = summarize({"scalars": torch.zeros(len(_SCALARS), dtype=torch.float64), "hist": torch.zeros(65)})
    assert none["bytes"] == 0 and math.isnan(none["bpb"])
