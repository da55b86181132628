"""Supertokens: the compute-aware objective, the Lagrange rate controller, FLOPs-budgeted training
and the two-stage (chunks of chunks) model."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.analysis.compare import method_config, method_overrides, method_slug
from rltok.config import ConfigError, load_config
from rltok.data.sources import Corpus
from rltok.model.flops import run_cost
from rltok.model import HourglassLM
from rltok.objective.loss import ChunkPrice, compute_loss, make_chunk_price
from rltok.objective import LagrangePrice
from rltok.training.trainer import Trainer, lr_at

TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox\n" % (i, i * 3) for i in range(1500))


@pytest.fixture(scope="module")
def corpus():
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return Corpus(train=data[:cut].clone(), val=data[cut:].clone(), source="synthetic")


def train_run(tmp_path, corpus, name, *overrides, steps=60):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / name}", f"train.max_steps={steps}",
                                         "train.device=cpu", "train.threads=1", "train.log_every=5",
                                         "train.eval_every=1000", "train.checkpoint_every=1000", *overrides])
    trainer = Trainer(cfg, corpus=corpus, quiet=True)
    trainer.fit()
    return trainer


def late_mean(trainer, key, share=0.5):
    recs = [r for r in trainer.history if key in r]
    recs = recs[int(len(recs) * (1 - share)):]
    return sum(r[key] for r in recs) / len(recs)


# ---- the price per chunk ---------------------------------------------------------------------

def test_chunk_cost_is_the_derivative_of_chunk_level_flops():
    cost = run_cost(load_config("small", overrides=["train.seq_len=512"]))
    a, c = cost.chunk_cost()
    for r in (0.1, 0.2, 0.45):
        h = 1e-4
        numeric = (cost.forward(r + h)["chunk_level"] - cost.forward(r - h)["chunk_level"]) / (2 * h)
        assert a + c * r == pytest.approx(numeric, rel=1e-6)
    # attention over more chunks makes each extra chunk dearer
    assert a > 0 and c > 0


def test_price_is_in_bits_per_mflop():
    cfg = load_config("small", overrides=["objective.compute_price=0.5", "objective.rate_control=none"])
    cost = run_cost(cfg)
    price = make_chunk_price(cfg.model, cfg.objective, cfg.train.seq_len, cost=cost)
    a, c = cost.chunk_cost()
    rate = torch.tensor(0.2)
    expected_nats = 0.5 * (a + c * 0.2) / 1e6 * torch.log(torch.tensor(2.0))
    assert price(rate).item() == pytest.approx(expected_nats.item(), rel=1e-5)
    assert make_chunk_price(cfg.model, load_config("small").objective, 512, cost=cost) is None  # the reference: free chunks


@pytest.mark.parametrize("estimator", ["exact", "reward"])
def test_price_pushes_the_policy_towards_fewer_boundaries(estimator):
    """One gradient of the loss on the policy's bias: a price per chunk makes it more positive
    (descent lowers the logits). Large batch, same samples with and without the price."""
    torch.manual_seed(0)
    model = randomize_(HourglassLM(tiny_model_config()), scale=0.1)
    x = torch.randint(0, 256, (64, 48))
    lab = ["plugins=rltok_lab.variants"] if estimator == "reward" else []  # the price in the reward is the lab's
    cfg = load_config("test", overrides=[*lab, f"objective.cost_estimator={estimator}",
                                         "objective.rate_control=none"]).objective

    def bias_grad(price):
        model.zero_grad()
        out = model(x, generator=torch.Generator().manual_seed(1))
        loss, metrics = compute_loss(out, x, cfg, 0.2, price=price)
        loss.backward()
        return model.chunker.head.bias.grad.item(), metrics

    g0, _ = bias_grad(None)
    g1, metrics = bias_grad(ChunkPrice(compute=2.0))
    assert metrics["chunk_price"].item() == pytest.approx(2.0)
    assert g1 > g0
    if estimator == "exact":  # closed form: pg_weight * price * mean p(1-p) over free positions
        out = model(x, generator=torch.Generator().manual_seed(1))
        p = torch.sigmoid(out.boundaries.logits.detach())[out.boundaries.free]
        assert g1 - g0 == pytest.approx(cfg.pg_weight * 2.0 * (p * (1 - p)).mean().item(), rel=1e-4)


def test_compute_price_lowers_the_achieved_rate(tmp_path, corpus):
    # 40 steps: the priced rate is near 0.02 by then, the free one near 0.33
    free = train_run(tmp_path, corpus, "free", "objective.rate_control=none", "train.lr=0.01", steps=40)
    priced = train_run(tmp_path, corpus, "priced", "objective.rate_control=none", "objective.compute_price=30",
                       "train.lr=0.01", steps=40)
    assert late_mean(priced, "expected_rate") < late_mean(free, "expected_rate") - 0.05
    assert all(r["chunk_price"] > 0 for r in priced.history)


# ---- the Lagrange controller -----------------------------------------------------------------

def test_lagrange_price_moves_against_the_error():
    lp = LagrangePrice(target=0.3, lr=0.5, gain=2.0)
    lp.update(0.4)  # too many chunks: dearer
    assert lp.price.item() == pytest.approx(0.5 * 0.1 + 2.0 * 0.1)
    lp.update(0.3)
    assert lp.price.item() == pytest.approx(0.05)  # integral kept, proportional part gone
    lp.update(0.1)
    assert lp.price.item() < 0  # too few: subsidised
    clone = LagrangePrice(target=0.3, lr=0.5, gain=2.0)
    clone.load_state_dict(lp.state_dict())
    assert clone.price.item() == lp.price.item()


@pytest.mark.parametrize("target", [0.12, 0.35])
def test_controller_holds_the_requested_rate(tmp_path, corpus, target):
    trainer = train_run(tmp_path, corpus, f"lag{target}", "objective.rate_control=lagrange",
                        f"model.target_rate={target}", steps=160)
    held = late_mean(trainer, "expected_rate", share=0.5)
    assert abs(held - target) <= 0.01, held
    assert "rate_loss" not in trainer.history[-1]  # no fixed penalty in this mode


def test_config_rejects_unknown_rate_control():
    with pytest.raises(ConfigError, match="lagrange"):
        load_config("test", overrides=["objective.rate_control=lagrnge"])
    with pytest.raises(ConfigError):
        load_config("test", overrides=["objective.compute_price=-1"])


# ---- training to a FLOPs budget ----------------------------------------------------------------

def test_flops_budget_stops_training_and_drives_the_schedule(tmp_path, corpus):
    cfg = load_config("test")
    per_step = run_cost(cfg).forward_per_byte() * 3 * cfg.train.batch_size * cfg.train.seq_len
    budget = 12.5 * per_step
    trainer = train_run(tmp_path, corpus, "budget", f"train.flops_budget={budget}", steps=1000)
    assert 10 <= trainer.step <= 16  # the achieved rate differs a little from the target
    assert trainer.flops_spent >= budget
    assert trainer.history[-1]["train_flops"] == pytest.approx(trainer.flops_spent)
    tc = trainer.cfg.train
    assert lr_at(10, tc, progress=1.0) == pytest.approx(tc.lr * tc.min_lr_ratio)
    assert lr_at(10, tc, progress=0.0) == pytest.approx(tc.lr)


def test_resume_restores_the_multiplier_and_flops(tmp_path, corpus):
    extra = ["objective.rate_control=lagrange", "model.target_rate=0.3", "train.flops_budget=1e12"]
    full = train_run(tmp_path, corpus, "full", *extra, steps=20)
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'part'}", "train.max_steps=20", "train.device=cpu",
                                         "train.threads=1", "train.log_every=5", "train.eval_every=1000",
                                         "train.checkpoint_every=1000", *extra])
    Trainer(cfg, corpus=corpus, quiet=True).fit(stop_at=9)
    resumed = Trainer(cfg, corpus=corpus, quiet=True, resume=True)
    assert resumed.step == 9 and resumed.flops_spent > 0
    resumed.fit()
    assert resumed.objective.price.lagrange.price.item() == full.objective.price.lagrange.price.item()
    assert resumed.flops_spent == full.flops_spent
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)


# ---- compare: methods with overrides, budgets at the achieved rate ------------------------------

def test_method_overrides_and_slugs(tmp_path):
    assert method_overrides("rl@model.target_rate=0.3") == ["model.chunker=rl", "model.target_rate=0.3"]
    assert method_slug("rl@objective.compute_price=0.1,model.stages=2") == "rl__objective.compute_price-0.1_model.stages-2"
    cfg = method_config("rl@objective.rate_control=none,objective.compute_price=0.1", [], "stdlib", tmp_path, 0, "test")
    assert cfg.objective.rate.kind == "none" and cfg.objective.rate.compute_price == 0.1
    with pytest.raises(ValueError, match="unknown method"):
        method_overrides("rll@model.target_rate=0.3")
    with pytest.raises(ConfigError):
        method_config("rl@model.target_rat=0.3", [], "stdlib", tmp_path, 0, "test")


def test_compare_spends_the_budget_of_an_adaptive_rule(tmp_path):
    from rltok.cli import main

    data = tmp_path / "corpus.txt"
    data.write_bytes(TEXT)
    method = "rl@objective.rate_control=none,objective.compute_price=5"
    rc = main(["compare", "--data", str(data), "--preset", "test", "--budget-bytes", "4000", "--split", "val",
               "--seeds", "0", "--methods", method, "--out", str(tmp_path / "cmp"), "train.threads=1"])
    assert rc == 0
    res = json.loads((tmp_path / "cmp" / f"{method_slug(method)}_s0.json").read_text())
    cfg = load_config("test")
    budget = 4000 * 3 * run_cost(cfg).forward()["total"]
    step = res["train_flops"] / res["steps"]
    assert budget <= res["train_flops"] < budget + 2 * step
    assert res["forward_flops_per_byte"] > 0


# ---- two stages ----------------------------------------------------------------------------------

def two_stage_model(**kw):
    torch.manual_seed(0)
    return randomize_(HourglassLM(tiny_model_config(stages=2, main_layers=1, stage2_layers=1, **kw))).eval()


def test_two_stage_prediction_at_t_ignores_bytes_after_t():
    model = two_stage_model()
    T = 48
    x = torch.randint(0, 256, (2, T))
    b = torch.rand(2, T) < 0.35
    ref = model.score(x, b, generator=torch.Generator().manual_seed(3))
    assert ref.boundaries2 is not None and (ref.n_chunks2 < ref.n_chunks).any()
    for t in (0, 9, 20, T - 2):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(0, 256, (2, T - t - 1))
        out = model.score(x2, b, generator=torch.Generator().manual_seed(3))
        assert torch.allclose(out.logits[:, : t + 1], ref.logits[:, : t + 1], atol=1e-5)
        assert not torch.allclose(out.logits[:, t + 1:], ref.logits[:, t + 1:], atol=1e-5)


def test_two_stage_sampled_decisions_are_causal():
    """Both policies sample with a fixed seed: nothing at or before byte t moves when the bytes
    after t change, though the number of chunks (and so the stage-2 tensors' width) does."""
    model = two_stage_model()
    T = 40
    x = torch.randint(0, 256, (3, T))
    ref = model(x, generator=torch.Generator().manual_seed(5), force_last=False)
    t = 17
    x2 = x.clone()
    x2[:, t + 1:] = torch.randint(0, 256, (3, T - t - 1))
    out = model(x2, generator=torch.Generator().manual_seed(5), force_last=False)
    assert torch.equal(out.boundaries.b[:, : t + 1], ref.boundaries.b[:, : t + 1])
    assert torch.allclose(out.logits[:, : t + 1], ref.logits[:, : t + 1], atol=1e-5)
    for row in range(3):
        n = int(ref.boundaries.b[row, : t + 1].sum())  # chunks ending at or before t
        assert torch.equal(out.boundaries2.b[row, :n], ref.boundaries2.b[row, :n])


def test_two_stage_gradient_causality():
    model = two_stage_model()
    T = 32
    x = torch.randint(0, 256, (1, T))
    b = torch.rand(1, T) < 0.4
    emb = model.embed(x).detach().requires_grad_(True)
    model.embed.forward = lambda _idx: emb
    out = model.score(x, b, generator=torch.Generator().manual_seed(0))
    t = 14
    out.logits[0, t].sum().backward()
    assert emb.grad[0, t + 1:].abs().max() == 0
    assert emb.grad[0, : t + 1].abs().max() > 0


def test_two_stage_supertokens_are_unions_of_chunks_and_get_gradients():
    model = two_stage_model()
    x = torch.randint(0, 256, (4, 40))
    out = model(x, generator=torch.Generator().manual_seed(2))
    bd2 = out.boundaries2
    for row in range(4):
        n = int(out.n_chunks[row])
        assert not bd2.b[row, n:].any() and not bd2.free[row, n:].any()  # padding closes nothing
        assert bd2.b[row, 0]  # the first chunk always closes a supertoken
    cfg = load_config("test").objective
    loss, metrics = compute_loss(out, x, cfg, 0.2, target_rate2=0.33)
    loss.backward()
    assert model.stage2.chunker.head.weight.grad.abs().sum() > 0
    assert 0 < metrics["rate2"].item() <= 1 and "rate_loss2" in metrics


def test_two_stage_trains_and_holds_both_rates(tmp_path, corpus):
    trainer = train_run(tmp_path, corpus, "two", "model.stages=2", "objective.rate_control=lagrange",
                        "model.target_rate=0.25", "model.stage2_target_rate=0.4", steps=120)
    assert abs(late_mean(trainer, "expected_rate") - 0.25) <= 0.02
    assert abs(late_mean(trainer, "expected_rate2") - 0.4) <= 0.03
    first, last = trainer.history[0]["bpb"], late_mean(trainer, "bpb", 0.2)
    assert last < first - 0.5
    f1 = run_cost(trainer.cfg).forward()
    assert f1["stage2"] > 0 and f1["main"] == pytest.approx(
        0.25 * 0.4 * run_cost(load_config("test", overrides=["model.target_rate=0.25"])).forward()["main"] / 0.25)


def test_two_stage_model_generates_with_its_caches():
    """Cached decoding runs the chunk encoder per closed chunk and the main network per closed
    supertoken: greedy output is the parallel pass's argmax with the kept decisions of both
    stages, also across context slides (which start where a supertoken closed)."""
    model = two_stage_model(max_seq_len=32)
    with torch.no_grad():
        model.chunker.head.bias.fill_(-0.8)
    for n, prompt in ((20, b"def f(x):"), (60, b"x")):
        g = model.generate(prompt, n, temperature=0, seed=0)
        data = g.prompt + g.output
        b, b2 = torch.tensor(g.boundaries), torch.tensor(g.boundaries2)
        assert len(b) == len(b2) == len(data) - 1 and not (b2 & ~b).any() and b2[0]
        if n == 20:  # no slide: one parallel pass over everything
            with torch.no_grad():
                out = model.score(torch.tensor([list(data[:-1])]), b.unsqueeze(0),
                                  [b2[b].unsqueeze(0)], force_last=False)
            assert out.logits[0, len(g.prompt) - 1:, :256].argmax(-1).tolist() == list(g.output)
            assert 2 <= int(b2.sum()) < int(b.sum())
        else:
            assert len(g.output) == 60  # slid (context 32) and kept going


def test_two_stage_config_errors():
    with pytest.raises(ConfigError, match="stages"):
        load_config("test", overrides=["model.stages=3"])
    with pytest.raises(ConfigError, match="chunker=rl"):
        load_config("test", overrides=["model.stages=2", "model.chunker=fixed"])


def test_unsupported_combinations_are_refused():
    with pytest.raises(ConfigError, match="stages=2 needs"):
        load_config("test", overrides=["model.stages=2", "objective.rate_control=none"])
    # the BPE-token reference counts its FLOPs at the tokens per byte each batch holds
    assert load_config("test", overrides=["model.arch=bpe_token", "train.flops_budget=1e9"]).train.flops_budget == 1e9


def test_lagrange_integral_is_bounded():
    lp = LagrangePrice(target=0.2, lr=100.0)
    for _ in range(50):
        lp.update(1.0)  # a policy that never responds
    assert lp.price.item() == pytest.approx(LagrangePrice.max_price)


def test_matched_flat_depth_yields_to_explicit_overrides(tmp_path):
    assert method_config("flat@model.flat_layers=2", [], "stdlib", tmp_path, 0, "test").model.flat_layers == 2
    assert method_config("flat", [], "stdlib", tmp_path, 0, "test").model.flat_layers >= 1


def test_two_stage_flops_follow_the_achieved_supertoken_rate():
    cfg = load_config("test", overrides=["model.stages=2"])
    cost = run_cost(cfg)
    lo = cost.forward_per_byte(0.2, 0.2)
    hi = cost.forward_per_byte(0.2, 0.6)
    assert hi > lo
    assert cost.forward_per_byte(0.2) == pytest.approx(cost.forward_per_byte(0.2, cfg.model.stage2_target_rate))


def test_two_stage_parameter_names_and_order_are_the_checkpoint_format():
    """Checkpoints and exported models load by these names, and optimizer states by this order:
    the stage at chunk level stays `stage2`, with its own encoder, policy, main network, decoder."""
    model = HourglassLM(tiny_model_config(stages=2))
    names = list(dict.fromkeys(re.sub(r"blocks\.\d+\..*", "blocks", k) for k in model.state_dict()))
    assert names == ["embed.weight", "encoder.blocks", "encoder.norm.weight", "early_head.weight",
                     "chunker.head.weight", "chunker.head.bias", "down.weight",
                     "stage2.encoder.blocks", "stage2.encoder.norm.weight", "stage2.chunker.head.weight",
                     "stage2.chunker.head.bias", "stage2.main.blocks", "stage2.main.norm.weight",
                     "stage2.decoder.blocks", "stage2.decoder.norm.weight", "up.weight", "decoder.blocks",
                     "decoder.norm.weight", "head.weight"]
    assert [k for k, _ in model.named_parameters()] == list(model.state_dict())
