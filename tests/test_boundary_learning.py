"""Boundary learning: the counterfactual-flips estimator and the warm start (the plumbing check, a
synthetic reward the policy must learn through the real estimator path, is the lab's:
lab/tests/test_variants.py)."""

import itertools
import math

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok.data.sources import Corpus
from rltok.model.flops import run_cost, train_flops_per_byte
from rltok.objective.flips import boundary_values, draw_flips, flip_segment_sums, local_expectation_loss
from rltok.training.trainer import Trainer
from conftest import straight_and_resumed

def synthetic_text(n_bytes: int = 260_000, seed: int = 0) -> bytes:
    """Fixed pseudo-code text (words, punctuation, indented lines) from a seeded generator: the
    same bytes on every machine and whatever the repository's own files hold."""
    words = [b"def", b"return", b"self", b"value", b"import", b"for", b"in", b"range", b"if", b"else",
             b"the", b"model", b"data", b"x", b"y", b"batch", b"loss", b"step", b"print", b"None"]
    g = torch.Generator().manual_seed(seed)
    out = bytearray()
    while len(out) < n_bytes:
        line = [words[i] for i in torch.randint(0, len(words), (int(torch.randint(2, 9, (1,), generator=g)),),
                                                   generator=g).tolist()]
        out += b"    " * int(torch.randint(0, 3, (1,), generator=g)) + b" ".join(line) + b":\n"
    return bytes(out[:n_bytes])


DATA = torch.frombuffer(bytearray(synthetic_text()), dtype=torch.uint8)


def corpus() -> Corpus:
    return Corpus(DATA[:200_000], DATA[200_000:260_000], "src")


def test_flip_segment_sums_charge_each_flip_up_to_the_next():
    delta = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    flips = torch.tensor([[False, True, False, False, True, False]])
    assert flip_segment_sums(delta, flips).tolist() == [[0.0, 9.0, 0.0, 0.0, 11.0, 0.0]]
    b = torch.tensor([[True, True, False, False, False, True]])
    # taken b_1 = 1 (the flip removed it): D = L(0) - L(1) = +effect; b_4 = 0: D = -effect
    assert boundary_values(torch.zeros_like(delta), delta, flips, b).tolist() == [[0.0, 9.0, 0.0, 0.0, -11.0, 0.0]]


def test_draw_flips_is_regular_free_only_and_seeded():
    free = torch.ones(64, 40, dtype=torch.bool)
    free[:, 0] = free[:, -1] = False
    f = draw_flips(free, 4, torch.Generator().manual_seed(0))
    assert not (f & ~free).any()
    for row in f:
        pos = torch.nonzero(row).flatten()
        assert (torch.diff(pos) == 4).all()
    assert torch.equal(f, draw_flips(free, 4, torch.Generator().manual_seed(0)))
    per_position = f[:, 4:-4].float().mean(0)  # every decision is flipped about 1/stride of the time
    assert (per_position - 0.25).abs().max() < 0.2


def test_flips_estimator_is_unbiased_on_an_enumerable_problem():
    """One flip per row charged to the end of the row is the exact local-expectation gradient:
    stride x its mean equals d E[L] / d logits computed by enumerating every segmentation."""
    torch.manual_seed(0)
    T, free_n = 6, 4  # positions 0 and 5 forced
    logits = torch.randn(free_n, requires_grad=True)
    weights = torch.randn(T, 2 ** T)  # byte t's loss: an arbitrary function of b_0..b_t

    def per_byte_loss(b: torch.Tensor) -> torch.Tensor:  # (N, T) bool -> (N, T)
        codes = torch.zeros(b.shape[0], T, dtype=torch.long)
        for t in range(T):
            codes[:, t] = sum(b[:, j].long() << j for j in range(t + 1))
        return torch.gather(weights, 1, codes.T).T

    # exact gradient of E[sum_t L_t] by enumeration
    p = torch.sigmoid(logits)
    exact_obj = 0.0
    for bits in itertools.product([0, 1], repeat=free_n):
        bt = torch.tensor(bits, dtype=torch.float32)
        prob = torch.prod(torch.where(bt > 0, p, 1 - p))
        b = torch.tensor([[True, *map(bool, bits), True]])
        exact_obj = exact_obj + prob * per_byte_loss(b).sum()
    exact = torch.autograd.grad(exact_obj, logits)[0]

    # 8 independent batches: their spread gives the Monte Carlo standard error the check is held to
    n, stride = 25_000, T
    gen = torch.Generator().manual_seed(1)
    full_logits = torch.cat([torch.zeros(1), logits, torch.zeros(1)]).expand(n, T)
    free = torch.zeros(n, T, dtype=torch.bool)
    free[:, 1:-1] = True
    estimates = []
    for _ in range(8):
        b = torch.rand(n, T, generator=gen) < torch.sigmoid(full_logits.detach())
        b = b | ~free
        flips = draw_flips(free, stride, gen)
        values = boundary_values(per_byte_loss(b), per_byte_loss(b ^ flips), flips, b)
        # per row: one flip at most, so the surrogate's mean over flips is its per-row value
        surrogate = -(torch.sigmoid(full_logits) * values)[flips].sum() / n
        estimates.append(torch.autograd.grad(surrogate, logits)[0] * stride)
    est = torch.stack(estimates)
    mean, se = est.mean(0), est.std(0) / math.sqrt(len(est))
    assert exact.abs().max() > 0.1  # the problem is not degenerate
    assert torch.all((mean - exact).abs() <= 4 * se + 0.01 * exact.abs().max()), (mean, exact, se)
    assert torch.all(se < 0.25 * exact.abs().max())  # and the bound is tight enough to mean something
    assert torch.nn.functional.cosine_similarity(mean, exact, dim=0) > 0.98


def test_local_expectation_loss_centres_and_normalises():
    logits = torch.zeros(2, 4, requires_grad=True)
    flips = torch.tensor([[True, False, True, False], [True, False, False, False]])
    values = torch.tensor([[3.0, 0.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    loss = local_expectation_loss(logits, values, flips, center=True, normalize=True)
    loss.backward()
    g = logits.grad[flips]
    assert abs(g.sum().item()) < 1e-6  # centred: no net push on the rate
    assert g[0] < 0 < g[1]  # the larger value gets its boundary probability raised (descent)


def test_warm_start_leaves_the_policy_alone_then_trains_it(tmp_path):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=12", "train.threads=1",
                                         "objective.policy_start_step=8", "objective.estimator=flips",
                                         "train.log_every=1", "train.eval_every=1000"])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    before = [p.detach().clone() for p in trainer.model.chunker.parameters()]
    trainer.fit(stop_at=8)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.chunker.parameters()))
    assert all("pg_loss" not in r for r in trainer.history)
    trainer.fit()
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.model.chunker.parameters()))
    assert "pg_loss" in trainer.history[-1]


def test_flips_training_counts_the_extra_pass_and_resumes_exactly(tmp_path):
    over = ["train.max_steps=6", "train.threads=1", "objective.estimator=flips", "objective.policy_lr_mult=3",
            "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=3", "objective.policy_start_step=2"]
    full, _ = straight_and_resumed(
        lambda out: load_config("test", overrides=[f"train.out_dir={out}", *over]), tmp_path, 3, corpus)
    cfg = full.cfg
    step_bytes = cfg.train.batch_size * cfg.train.seq_len
    expected = 0.0
    for rec in full.history:
        cpb = rec["chunks_per_byte"]
        step = train_flops_per_byte({"total": run_cost(cfg).forward_per_byte(cpb)})
        if rec["step"] > 2:  # the flipped pass runs once the policy trains
            step += run_cost(cfg).counterfactual_per_byte(cpb)
        expected += step * step_bytes
    assert full.flops_spent == pytest.approx(expected, rel=1e-6)


def test_flips_config_validation():
    with pytest.raises(ConfigError, match="estimator"):
        load_config("test", overrides=["objective.estimator=flip"])
    with pytest.raises(ConfigError, match="one stage"):
        load_config("test", overrides=["objective.estimator=flips", "model.stages=2"])
    with pytest.raises(ConfigError, match="objective.estimator.stride"):
        load_config("test", overrides=["objective.estimator=flips", "objective.estimator.stride=0"])


def test_boundary_objective_state_round_trip_and_legacy_keys():
    from rltok.objective.loss import BoundaryObjective

    cfg = load_config("test", overrides=["objective.rate_control=lagrange", "objective.estimator=flips"])
    a = BoundaryObjective(cfg, run_cost(cfg))
    rates = {"expected_rate": 0.3, "chunks_per_byte": 0.25, "expected_rate2": None, "supertokens_per_chunk": None}
    a.after_step(0, rates, step_bytes=256, seq_len=64)
    torch.rand(3, generator=a.flip_gen)
    b = BoundaryObjective(cfg, run_cost(cfg))
    b.load_state_dict(a.state_dict())
    assert b.flops_spent == a.flops_spent > 0
    assert b.price.lagrange.price.item() == a.price.lagrange.price.item() != 0
    assert torch.equal(torch.rand(4, generator=b.flip_gen), torch.rand(4, generator=a.flip_gen))
    # trainer states written before the component kept these keys at their top level
    c = BoundaryObjective(cfg, run_cost(cfg))
    legacy = a.state_dict()
    c.load_state_dict({"flops_spent": legacy["flops_spent"], "lagrange": legacy["lagrange"]})
    assert c.flops_spent == a.flops_spent and c.price.lagrange.price.item() == a.price.lagrange.price.item()
    # the warm start: a frozen policy does not move the controller, but the FLOPs still count
    warm = load_config("test", overrides=["objective.rate_control=lagrange", "objective.policy_start_step=5"])
    w = BoundaryObjective(warm, run_cost(warm))
    w.after_step(0, rates, step_bytes=256, seq_len=64)
    assert w.price.lagrange.price.item() == 0 and w.flops_spent > 0


