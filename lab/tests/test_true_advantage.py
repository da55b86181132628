"""The true-advantage instrument: D_t = L(b_t=0) - L(b_t=1) by byte class, and the estimators'
correlation with the true advantage of the action taken."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import randomize_

from rltok.config import load_config
from rltok.model.factory import build_model
from rltok.objective.loss import token_nll
from rltok_lab.true_advantage import (CLASSES, byte_classes, format_true_advantage, sample_segmentation,
                                  true_advantage, variant_losses)

TEXT = (b"def f(x):\n    return x + 1\n\nthe quick brown fox, jumps over the lazy dog.\n"
        b"\tif y:\n\t\tpass  # done\n") * 8


@pytest.fixture(scope="module")
def cfg():
    return load_config("test")


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return randomize_(build_model(cfg.model), scale=0.1).train()


def windows(n: int = 3, length: int = 48):
    data = torch.tensor(list(TEXT))
    x = data[: n * length].view(n, length)
    y = data[1 : n * length + 1].view(n, length)
    return x, y


def direct_loss(model, x_row, y_row, b_row, t, horizon=None):
    """Per-byte NLL of one row and its loss over bytes t..t+horizon, one forward pass alone."""
    with torch.no_grad():
        nll = token_nll(model.score(x_row[None], b_row[None]).logits, y_row[None])[0].double()
    end = len(x_row) - 1 if horizon is None else min(len(x_row) - 1, t + horizon)
    return nll, nll[t : end + 1].sum().item()


def test_batched_D_equals_two_separate_forward_passes(model, cfg):
    x, y = windows()
    result = true_advantage(model, x, y, cfg.objective, n_per_class=3, batch_size=6, seed=1)
    assert model.training  # the mode is restored
    model.eval()
    try:
        out, rows = sample_segmentation(model, x, cfg.objective, seed=1)
        b = out.boundaries.b
        recs = result["positions"]
        assert len(recs) >= 4
        for rec in (recs[0], recs[len(recs) // 2], recs[-1]):
            i, t = rec["row"], rec["t"]
            assert 1 <= t <= x.shape[1] - 2 and rec["b"] == bool(b[i, t])
            b1, b0 = b[i].clone(), b[i].clone()
            b1[t], b0[t] = True, False
            _, l1 = direct_loss(model, x[rows[i]], y[rows[i]], b1, t)
            _, l0 = direct_loss(model, x[rows[i]], y[rows[i]], b0, t)
            assert rec["D"] == pytest.approx(l0 - l1, abs=1e-4)
            p = rec["p"]
            assert rec["A_true"] == pytest.approx((1 - p) * rec["D"] if rec["b"] else -p * rec["D"])
    finally:
        model.train()
    # the boundaries matter to this model: not every D is zero
    assert max(abs(r["D"]) for r in result["positions"]) > 1e-3
    json.dumps(result)  # serialisable
    assert set(result["estimators"]) == {"reference"}
    corr = result["estimators"]["reference"]["overall"]
    assert corr["n"] == len(result["positions"]) and -1 <= corr["pearson"] <= 1
    assert "| overall |" in format_true_advantage(result)


def test_causality_horizon_and_earlier_bytes(model, cfg):
    x, y = windows()
    full = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=2)
    large = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=2, horizon=10 * x.shape[1])
    assert [r["D"] for r in full["positions"]] == pytest.approx([r["D"] for r in large["positions"]], abs=1e-9)
    assert full["settings"]["causal_leak_max"] < 1e-5 and large["settings"]["causal_leak_max"] < 1e-5
    short = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=2, horizon=0)
    assert [(r["row"], r["t"]) for r in short["positions"]] == [(r["row"], r["t"]) for r in full["positions"]]

    # directly: the two variants give the same NLL at every byte before t
    model.eval()
    try:
        out, rows = sample_segmentation(model, x, cfg.objective, seed=2)
        b = out.boundaries.b
        for rec in full["positions"][:3]:
            i, t = rec["row"], rec["t"]
            b1, b0 = b[i].clone(), b[i].clone()
            b1[t], b0[t] = True, False
            n1, _ = direct_loss(model, x[rows[i]], y[rows[i]], b1, t)
            n0, _ = direct_loss(model, x[rows[i]], y[rows[i]], b0, t)
            assert torch.allclose(n1[:t], n0[:t], atol=1e-6, rtol=0)
        # horizon 0 counts byte t alone
        i, t = full["positions"][0]["row"], full["positions"][0]["t"]
        l1, l0, _ = variant_losses(model, x[rows], y[rows], b, [(i, t)], horizon=0)
        b1, b0 = b[i].clone(), b[i].clone()
        b1[t], b0[t] = True, False
        n1, _ = direct_loss(model, x[rows[i]], y[rows[i]], b1, t)
        n0, _ = direct_loss(model, x[rows[i]], y[rows[i]], b0, t)
        assert float(l0[0] - l1[0]) == pytest.approx(float(n0[t] - n1[t]), abs=1e-5)
    finally:
        model.train()


def test_byte_classes_on_a_hand_made_string():
    s = b"ab, cd\n  x.y\tzz"
    got = dict(enumerate(byte_classes(s)))
    want = {
        0: "other",  # 'a': no left neighbour, not before whitespace
        1: "other",  # 'b': before ','
        2: "before_whitespace",  # ',' then ' '
        3: "whitespace",
        4: "after_whitespace",  # 'c'
        5: "before_whitespace",  # 'd' then '\n'
        6: "whitespace",  # '\n'
        7: "indentation",
        8: "indentation",
        9: "after_whitespace",  # 'x'
        10: "punctuation",  # '.'
        11: "before_whitespace",  # 'y' then '\t'
        12: "whitespace",  # '\t' after a letter, not after a newline
        13: "after_whitespace",
        14: "other",  # last byte: no right neighbour
    }
    assert got == want
    assert byte_classes(b"word")[1:3] == ["mid_word", "mid_word"]
    assert byte_classes(b"  a")[:2] == ["whitespace", "whitespace"]  # run reaches the start: line start unseen
    assert byte_classes(b"\r\n\t\n")[2:] == ["indentation", "whitespace"]
    assert set(byte_classes(bytes(range(256)))) <= set(CLASSES)
    assert byte_classes(torch.tensor(list(b"a-b"))) == ["other", "punctuation", "other"]


def test_stratified_sample_is_seeded_and_bounded(model, cfg):
    x, y = windows()
    a = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=5)
    b = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=5)
    assert a["positions"] == b["positions"]
    for c in CLASSES:
        st = a["classes"][c]
        assert st["n"] == min(2, st["candidates"]) == sum(r["class"] == c for r in a["positions"])
    assert len({(r["row"], r["t"]) for r in a["positions"]}) == len(a["positions"])  # no repeats
    other = true_advantage(model, x, y, cfg.objective, n_per_class=2, seed=6)
    assert [(r["row"], r["t"]) for r in other["positions"]] != [(r["row"], r["t"]) for r in a["positions"]]


def test_cli_writes_every_class(tmp_path):
    from lab_cli import main
    from rltok.data.sources import Corpus
    from rltok.training.trainer import Trainer

    text = (b"import os\n\ndef main(argv):\n    for a in argv:\n        print(a, end=' ')\n    return 0\n"
            b"the quick brown fox jumps over the lazy dog; pack my box.\n") * 100  # a val part of 2+ windows
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    corpus = Corpus(train=data[: len(data) * 3 // 4], val=data[len(data) * 3 // 4 :], source=str(path))
    run = tmp_path / "run"
    cfg = load_config("test", overrides=[f"train.out_dir={run}", f"data.train={path}", "train.max_steps=3",
                                         "train.eval_every=3", "train.checkpoint_every=3", "train.seq_len=32"])
    Trainer(cfg, corpus=corpus, quiet=True).fit()
    out = tmp_path / "ta.json"
    rc = main(["diagnose", "-c", str(run), "--true-advantage", "--per-class", "2", "--horizon", "8",
               "--data", str(path), "--split", "val", "--batch", "4", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert set(result["classes"]) == set(CLASSES)
    assert result["settings"]["horizon"] == 8 and result["split"] == "val"
    assert "reference" in result["estimators"]
    assert result["overall"]["n"] == sum(st["n"] for st in result["classes"].values()) > 0


def test_the_reference_advantage_refuses_one_window_its_batch_baseline_would_zero(model, cfg):
    from rltok.config import ConfigError
    from rltok_lab.true_advantage import reference_advantage

    x, y = windows(1)
    out = model(x, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="at least 2 windows"):
        reference_advantage(model, out, x, y, cfg.objective)
    x, y = windows(2)
    out = model(x, generator=torch.Generator().manual_seed(0))
    assert reference_advantage(model, out, x, y, cfg.objective).abs().sum() > 0
