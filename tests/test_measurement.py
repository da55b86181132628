"""The measuring stick: every rule evaluated with the rule it trained with, FLOPs counted as
spent, one definition of rate, RL terms in fp32 under autocast."""

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config import FixedChunkerSettings, LagrangeRateSettings, ObjectiveConfig, load_config
from rltok.data.sources import Corpus
from rltok.data.windows import eval_windows
from rltok.eval.evaluate import evaluate
from rltok.model.flops import run_cost, train_flops_per_byte
from rltok.model import HourglassLM
from rltok.model.factory import build_model
from rltok.objective.loss import boundary_rate, compute_loss
from rltok.objective import LagrangePrice, masked_mean, rate_loss
from rltok.training.trainer import Trainer

# real text: this package's own sources (spaces, words, punctuation)
SRC = Path(__file__).resolve().parents[1] / "src" / "rltok"
TEXT = b"".join(p.read_bytes() for p in sorted(SRC.rglob("*.py")))[:120_000]
ALL_RULES = ["rl", "fixed", "uniform", "whitespace", "entropy", "hnet", "gumbel", "dynamic_pooling", "bpe"]


def windows(n: int, length: int = 128, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.frombuffer(bytearray(TEXT[offset:]), dtype=torch.uint8)
    x, y = eval_windows(data, length, n)
    return x, y


@pytest.mark.parametrize("rule", ALL_RULES)
def test_eval_rate_matches_training_rate(rule):
    """A rule evaluated with mode="sample" cuts at the rate it cut at in training (within
    sampling noise): the evaluation measures the rule that was trained."""
    cfg = tiny_model_config(chunker=rule, target_rate=0.2)
    torch.manual_seed(0)
    train_bytes = torch.frombuffer(bytearray(TEXT[:60_000]), dtype=torch.uint8)
    model = build_model(cfg, train_bytes=train_bytes) if rule == "bpe" else HourglassLM(cfg)
    randomize_(model, scale=0.3)
    x, _ = windows(24, offset=60_000)
    gen = torch.Generator().manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(3):  # rules with running state (the entropy threshold) see a few batches
            model(x[:8], generator=gen)
        bd = model(x[8:], generator=gen).boundaries
    train_rate = boundary_rate(bd.b, bd.free).item()
    model.eval()
    ev = evaluate(model, x[8:], x[8:].roll(-1, 1), batch_size=16, mode="sample", seed=1)
    n_free = int(bd.free.sum())
    noise = 4 * math.sqrt(max(train_rate * (1 - train_rate), 0.01) / n_free)
    assert abs(ev["rate"] - train_rate) <= noise + 1e-9, (rule, train_rate, ev["rate"])
    if rule in ("rl", "gumbel", "dynamic_pooling", "uniform", "entropy", "hnet"):
        assert train_rate > 0.05, (rule, train_rate)  # the rule does cut: not a vacuous match


def test_gumbel_greedy_is_a_separate_inference_rule():
    model = randomize_(HourglassLM(tiny_model_config(chunker="gumbel", target_rate=0.2)), scale=0.01).eval()
    x, y = windows(8)
    sample = evaluate(model, x, y, mode="sample")
    greedy = evaluate(model, x, y, mode="greedy")
    assert 0.1 < sample["rate"] < 0.3  # sampled: the training rule, near its target
    assert greedy["rate"] < 0.02  # thresholding the initial p = 0.2 at 0.5 draws (almost) nothing


@pytest.mark.parametrize("method", [["model.chunker=rl"], ["model.chunker=whitespace"], ["model.chunker=entropy"],
                                    ["model.chunker=hnet"], ["model.chunker=gumbel"], ["model.arch=flat"],
                                    ["model.arch=bpe_token", "model.flat_layers=1"],
                                    ["model.chunker=rl", "model.stages=2"]])
def test_train_flops_is_the_sum_of_each_steps_drawn_rate(tmp_path, method):
    """Always counted (no budget, no controller), step by step at the chunks each step drew."""
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=6", "train.log_every=1",
                                         "train.eval_every=100", "train.threads=1", *method])
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    trainer = Trainer(cfg, corpus=Corpus(data[:100_000], data[100_000:], "src"), quiet=True)
    trainer.fit()
    vocab = getattr(trainer.model, "vocab_size", 264)
    step_bytes = cfg.train.batch_size * cfg.train.seq_len
    expected = 0.0
    for rec in trainer.history:  # one record per step (log_every=1)
        fwd = run_cost(cfg, vocab_size=vocab).forward_per_byte(rec.get("chunks_per_byte"), rec.get("supertokens_per_chunk"))
        expected += train_flops_per_byte({"total": fwd}) * step_bytes
    assert len(trainer.history) == 6
    assert trainer.flops_spent == pytest.approx(expected, rel=1e-6)
    assert trainer.history[-1]["train_flops"] == pytest.approx(expected, rel=1e-6)
    if cfg.model.arch != "flat":  # the count follows the drawn rate, not the plan
        assert all("chunks_per_byte" in r for r in trainer.history)


def test_one_rate_for_controller_rate_loss_logs_and_eval():
    """seq_len 64 with forced first/last positions: a policy at p = target on every free position
    is *at* the target for the controller, the rate loss and the logs, and the logged rate is
    the share of free positions that got a boundary, as eval reports it."""
    target = 0.12
    cfg = tiny_model_config(chunker="rl", target_rate=target)
    model = HourglassLM(cfg)  # head weight 0, bias logit(target): p = target at every free position
    x, y = windows(16, length=64)
    out = model(x, generator=torch.Generator().manual_seed(0))
    loss, metrics = compute_loss(out, y, ObjectiveConfig(rate="lagrange"), target)
    assert metrics["expected_rate"].item() == pytest.approx(target, abs=1e-6)
    lp = LagrangePrice(target, lr=1.0)
    lp.update(metrics["expected_rate"])
    assert abs(lp.price.item()) < 1e-6  # the controller sees no error
    bd = out.boundaries
    l_rate = rate_loss(bd.logits, bd.free, target)
    assert abs(l_rate.item()) < 1e-6  # the rate loss sees no error either
    b, free = bd.b, bd.free
    assert metrics["rate"].item() == pytest.approx(((b & free).sum() / free.sum()).item())
    assert metrics["chunks_per_byte"].item() == pytest.approx(b.float().mean().item())
    # eval reports the same rate for the same decisions
    fixed = HourglassLM(tiny_model_config(chunker=FixedChunkerSettings(stride=7)))
    out_f = fixed(x)
    _, m_f = compute_loss(out_f, y, ObjectiveConfig(), target)
    ev = evaluate(fixed, x, y)
    assert ev["rate"] == pytest.approx(m_f["rate"].item())
    assert ev["chunks_per_byte"] == pytest.approx(m_f["chunks_per_byte"].item())


def test_masked_mean_counts_exactly_under_bf16():
    x = torch.full((65_504,), 3.0, dtype=torch.bfloat16)
    mask = torch.ones(65_504, dtype=torch.bool)
    mask[::7] = False
    got = masked_mean(x, mask)
    assert got.dtype == torch.float32 and got.item() == 3.0
    share = masked_mean(mask.to(torch.bfloat16), torch.ones_like(mask))
    assert share.item() == pytest.approx(mask.sum().item() / 65_504, rel=1e-7)


@pytest.mark.parametrize("rule", ["rl", "hnet", "gumbel"])
def test_bf16_autocast_step_keeps_rl_terms_in_fp32(rule):
    cfg = tiny_model_config(chunker=rule)
    model = randomize_(HourglassLM(cfg), scale=0.3)
    x, y = windows(4, length=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, generator=torch.Generator().manual_seed(0))
        loss, metrics = compute_loss(out, y, ObjectiveConfig(rate=LagrangeRateSettings(compute_price=0.01)), 0.2)
    assert out.logits.dtype == torch.bfloat16  # the autocast really was on
    bd = out.boundaries
    for t in (bd.logits, bd.logp, bd.scores, bd.gate, bd.confidence, bd.smooth):
        assert t is None or t.dtype == torch.float32
    for k in ("rate", "chunks_per_byte", "expected_rate", "pg_loss", "rate_loss", "p_mean", "entropy", "aux_loss",
              "chunk_price"):
        if k in metrics:
            assert metrics[k].dtype == torch.float32, k
    loss.backward()
    assert torch.isfinite(loss)


def test_compare_stops_every_method_on_its_spend_and_reports_it(tmp_path):
    from rltok.cli import main

    data = tmp_path / "corpus.txt"
    data.write_bytes(TEXT[:80_000])
    methods = ["whitespace", "gumbel", "flat"]
    rc = main(["compare", "--data", str(data), "--preset", "test", "--budget-bytes", "6000", "--split", "val",
               "--seeds", "0", "--methods", *methods, "--out", str(tmp_path / "cmp"), "train.threads=1"])
    assert rc == 0
    for m in methods:
        res = json.loads((tmp_path / "cmp" / f"{m}_s0.json").read_text())
        assert abs(res["budget_ratio"] - 1) <= 0.02 + res["train_flops_per_byte"] * 4 * 64 / res["budget_flops"], m
        assert res["train_flops"] == pytest.approx(res["curve"][-1]["train_flops"])
        if m == "gumbel":  # sampled in eval as in training; the thresholded rule reported beside it
            assert res["rate"] > 0.05 and res["rate_greedy"] is not None
            assert abs(res["rate"] - res["train_rate"]) < 0.1
    report = (tmp_path / "cmp" / "README.md").read_text()
    assert "spend/budget" in report and str(tmp_path) not in report.split("\n")[0]
