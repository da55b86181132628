"""The policy gradient's variance reducers: group-relative (leave-one-out) baselines, the critic,
GAE."""

import itertools
import math

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config import ConfigError, ObjectiveConfig, RLChunkerSettings, ScoreFunctionSettings, load_config
from rltok.model import HourglassLM
from rltok.objective.loss import boundary_advantages, compute_loss, returns_of, token_nll
from rltok.objective import policy_gradient_loss


def test_group_forward_shares_the_encoder_and_samples_k_segmentations():
    model = randomize_(HourglassLM(tiny_model_config()))
    x = torch.randint(0, 256, (3, 40))
    out = model(x, generator=torch.Generator().manual_seed(0), group_size=4)
    assert out.logits.shape[0] == 12
    early = out.early_logits.view(3, 4, 40, -1)
    assert torch.equal(early[:, 0], early[:, 3])  # one encoder pass, repeated
    b = out.boundaries.b.view(3, 4, 40)
    assert not torch.equal(b[:, 0], b[:, 1])  # but different segmentations


def test_group_loo_estimator_is_unbiased_on_an_enumerable_problem():
    """K segmentations of one 6-byte sequence, leave-one-out baseline, gamma = 1: the average
    estimate equals -grad E_b[sum_t r_t] / n_free from enumerating all 16 segmentations."""
    torch.manual_seed(0)
    model = randomize_(HourglassLM(tiny_model_config(chunker=RLChunkerSettings(window=2))), scale=0.6, seed=3)
    T = 6
    x, y = torch.randint(0, 256, (1, T)), torch.randint(0, 256, (1, T))
    params = list(model.chunker.parameters())
    n_free = T - 2
    segs = torch.tensor([[1, *bits, 1] for bits in itertools.product([0, 1], repeat=n_free)], dtype=torch.bool)
    out = model.score(x.expand(len(segs), T), segs)
    r = (token_nll(out.early_logits, y.expand(len(segs), T)) - token_nll(out.logits, y.expand(len(segs), T))).detach()
    J = ((out.boundaries.logp * out.boundaries.free).sum(1).exp() * r.sum(1)).sum()
    exact = torch.cat([g.flatten() for g in torch.autograd.grad(J, params)]) * (-1.0 / n_free)

    K = 4
    cfg = ObjectiveConfig(estimator=ScoreFunctionSettings(gamma=1.0, baseline="group"), group_size=K)
    gen = torch.Generator().manual_seed(7)
    estimates = []
    for _ in range(8):
        n_seq = 1024  # 1024 independent groups of K samples of the same sequence
        o = model(x.expand(n_seq, T), generator=gen, group_size=K)
        yy = y.expand(n_seq * K, T)
        rr = (token_nll(o.early_logits, yy) - token_nll(o.logits, yy)).detach()
        adv, _ = boundary_advantages(rr, o.boundaries.free, returns_of(cfg))
        loss = policy_gradient_loss(o.boundaries.logp, adv, o.boundaries.free)
        estimates.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    est = torch.stack(estimates)
    mean, se = est.mean(0), est.std(0) / math.sqrt(len(est))
    assert exact.abs().max() > 1e-3
    assert torch.all((mean - exact).abs() <= 4 * se + 0.02 * exact.abs().max())
    assert torch.nn.functional.cosine_similarity(mean, exact, dim=0) > 0.98


def test_critic_loss_falls_on_a_fixed_policy():
    torch.manual_seed(0)
    cfg = load_config("test", overrides=["objective.baseline=batch+value"])
    assert cfg.model.value_head  # the baseline switches the critic on
    model = HourglassLM(cfg.model)
    randomize_(model, scale=0.1)
    critic = list(model.value_head.parameters())
    opt = torch.optim.Adam(critic, lr=1e-2)
    x = torch.randint(97, 123, (8, 64))
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(150):
        out = model(x, generator=gen)
        _, m = compute_loss(out, x.roll(-1, 1), cfg.objective, 0.2)
        value_loss = m["value_loss"]
        losses.append(value_loss.item())
        opt.zero_grad()
        # the critic's own term, isolated: only value_head parameters are stepped
        r = (token_nll(out.early_logits, x.roll(-1, 1)) - token_nll(out.logits, x.roll(-1, 1))).detach()
        _, vl = boundary_advantages(r, out.boundaries.free, returns_of(cfg.objective), out.values)
        vl.backward()
        opt.step()
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    # part of the squared error is irreducible (the policy keeps sampling), so the bar is a clear
    # fall, not zero
    assert last < 0.85 * first, (first, last)


def test_value_advantages_are_gae_of_the_baselined_rewards():
    from rltok.objective import batch_relative, discounted_cumsum, gae

    r = torch.randn(4, 30)
    v = torch.randn(4, 30)
    free = torch.ones(4, 30, dtype=torch.bool)
    cfg = ObjectiveConfig(estimator=ScoreFunctionSettings(baseline="batch+value", gamma=0.9, gae_lambda=0.8))
    adv, vl = boundary_advantages(r, free, returns_of(cfg), v)
    centred = batch_relative(r)
    assert torch.allclose(adv, gae(centred, v, 0.9, 0.8), atol=1e-5)
    assert torch.allclose(vl, (v - discounted_cumsum(centred, 0.9)).square().mean(), atol=1e-5)
    # lambda = 1: GAE is the discounted return minus the value
    cfg1 = ObjectiveConfig(estimator=ScoreFunctionSettings(baseline="batch+value", gamma=0.9, gae_lambda=1.0))
    adv1, _ = boundary_advantages(r, free, returns_of(cfg1), v)
    assert torch.allclose(adv1, discounted_cumsum(centred, 0.9) - v, atol=1e-4)


def test_baseline_config_validation():
    ref = "objective.recipe=reference"
    with pytest.raises(ConfigError, match="group_size"):
        load_config(overrides=[ref, "objective.estimator.baseline=group"])
    with pytest.raises(ConfigError, match="batch', 'batch_loo' and 'group"):
        load_config(overrides=[ref, "objective.estimator.baseline=batch+group", "objective.group_size=2"])
    with pytest.raises(ConfigError, match="batch', 'batch_loo' and 'group"):
        load_config(overrides=[ref, "objective.estimator.baseline=batch+batch_loo"])
    assert returns_of(load_config(overrides=[ref, "objective.estimator.baseline=batch_loo+value"]).objective) \
        .leave_one_out
    with pytest.raises(ConfigError, match="did you mean 'value'"):
        load_config(overrides=[ref, "objective.estimator.baseline=batch+valeu"])
    with pytest.raises(ConfigError, match="multiple of objective.group_size"):
        load_config(overrides=[ref, "objective.estimator.baseline=group", "objective.group_size=3"])


def test_group_training_counts_distinct_bytes(tmp_path):
    from rltok.training.trainer import Trainer

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=3", "objective.baseline=group",
                                         "objective.group_size=2", "train.eval_every=3"])
    trainer = Trainer(cfg, quiet=True)
    trainer.fit()
    assert trainer.sampler.batch_size == 2
    assert trainer.bytes_seen == 3 * 2 * 64


# ---------------------------------------------------------------- hand-computed cases
# Each pins one step of the estimator to numbers worked out by hand, so a wrong axis, a missing
# mask or a flipped sign fails here, not only in the recorded whole-run cases.

def test_normalised_returns_are_the_z_scores_of_the_free_positions_alone():
    from rltok.objective.score_function import Returns

    r = torch.tensor([[0.0, 1, 2, 3], [4, 5, 6, 7]])
    free = torch.ones_like(r, dtype=torch.bool)
    free[:, [0, 3]] = False  # the forced first and last positions
    settings = Returns(batch_baseline=False, normalize=True, gamma=0.0)
    adv, _ = boundary_advantages(r, free, settings)
    v = r[free]
    assert torch.allclose(adv[free], (v - v.mean()) / v.std(correction=0))
    assert adv[1, 2] > adv[1, 1] > adv[0, 2] > adv[0, 1]  # more reward, more advantage
    loud = r.clone()
    loud[~free] = 1e3  # what forced positions hold moves nothing (gamma 0: nothing carries back)
    assert torch.allclose(boundary_advantages(loud, free, settings)[0][free], adv[free])


def test_the_group_baseline_leaves_each_segmentation_out_of_its_own_group():
    from rltok.objective.score_function import Returns

    r = torch.tensor([[1.0], [3.0], [10.0], [20.0]])  # two sequences, two segmentations each
    adv, _ = boundary_advantages(r, torch.ones_like(r, dtype=torch.bool),
                                 Returns(batch_baseline=False, group_baseline=True, group_size=2, gamma=0.0))
    assert adv.flatten().tolist() == [-2.0, 2.0, -10.0, 10.0]  # a batch mean would give -7.5, -5.5, 1.5, 11.5


def test_the_batch_baseline_holds_the_rows_own_reward_and_batch_loo_leaves_it_out():
    from rltok.objective.score_function import Returns

    r = torch.tensor([[1.0], [3.0], [8.0]])
    free = torch.ones_like(r, dtype=torch.bool)
    with_own, _ = boundary_advantages(r, free, Returns(gamma=0.0))
    assert with_own.flatten().tolist() == [-3.0, -1.0, 4.0]  # the mean of all three, 4
    others, _ = boundary_advantages(r, free, Returns(leave_one_out=True, gamma=0.0))
    assert torch.allclose(others.flatten(), torch.tensor([1 - 5.5, 3 - 4.5, 8 - 2.0]))  # the other two's mean
    alone, _ = boundary_advantages(r[:1], free[:1], Returns(gamma=0.0))
    assert alone.abs().max() == 0  # one row: its baseline is its own reward (the trainer refuses it)
    with pytest.raises(ValueError, match="at least 2 rows"):  # and it has no other rows to average
        boundary_advantages(r[:1], free[:1], Returns(leave_one_out=True, gamma=0.0))


@pytest.mark.parametrize("leave_one_out, shrink", [(False, 0.5), (True, 1.0)])
def test_two_rows_batch_baseline_halves_the_expected_gradient_unless_it_leaves_one_out(leave_one_out, shrink):
    """Independent Bernoulli decisions, reward -price * b: the exact gradient of -E[sum r] / n_free
    with respect to each logit is price * p(1 - p) / n_free. Two rows per batch: the batch mean
    holding the row's own reward gives half of it, the other row's mean all of it."""
    torch.manual_seed(0)
    n_batches, T, price = 20000, 4, 1.0
    logits = torch.full((n_batches, 2, T), 0.3, requires_grad=True)
    p = torch.sigmoid(logits)
    b = torch.bernoulli(p.detach())
    logp = torch.where(b.bool(), torch.nn.functional.logsigmoid(logits), torch.nn.functional.logsigmoid(-logits))
    reward = -price * b
    free = torch.ones(2, T, dtype=torch.bool)
    from rltok.objective.score_function import Returns
    settings = Returns(leave_one_out=leave_one_out, gamma=0.0)
    loss = sum(policy_gradient_loss(logp[i], boundary_advantages(reward[i], free, settings)[0], free)
               for i in range(n_batches)) / n_batches
    (grad,) = torch.autograd.grad(loss, logits)
    q = torch.sigmoid(torch.tensor(0.3)).item()
    exact = price * q * (1 - q) / (2 * T)
    measured = grad.mean().item() * n_batches  # the average per-batch gradient of one logit
    assert abs(measured / exact - shrink) < 0.05, measured / exact


def test_returns_with_no_free_position_are_not_blown_up_by_normalisation():
    from rltok.objective.score_function import Returns

    r = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    adv, _ = boundary_advantages(r, torch.zeros_like(r, dtype=torch.bool),
                                 Returns(batch_baseline=False, normalize=True, gamma=0.0))
    assert adv.abs().max() <= r.abs().max()  # an sd of 0 divides by 1, not by 1e-6


def test_the_discounted_sum_stays_fp32_under_autocast():
    from rltok.objective import discounted_cumsum

    x = torch.randn(3, 300)
    expected = torch.zeros_like(x)
    running = torch.zeros(3)
    for t in range(299, -1, -1):
        running = x[:, t] + 0.99 * running
        expected[:, t] = running
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = discounted_cumsum(x, 0.99)
    assert got.dtype == torch.float32
    assert torch.allclose(got, expected, atol=1e-4)


def test_the_registered_rewards_are_the_early_exit_gain_and_minus_the_final_loss_detached():
    from rltok.objective.rewards import make_reward

    ce_early = torch.tensor([[2.0, 3.0]], requires_grad=True)
    ce_final = torch.tensor([[1.0, 1.0]], requires_grad=True)
    gain, own = make_reward("early_exit")(ce_early, ce_final), make_reward("final")(ce_early, ce_final)
    assert gain.tolist() == [[1.0, 2.0]] and own.tolist() == [[-1.0, -1.0]]
    assert not gain.requires_grad and not own.requires_grad  # a reward never trains the LM


def test_the_critic_regresses_on_the_free_positions_only():
    from rltok.objective import batch_relative, discounted_cumsum

    r, v = torch.randn(4, 30), torch.randn(4, 30)
    free = torch.ones(4, 30, dtype=torch.bool)
    free[:, [0, -1]] = False
    v[:, 0] = 100.0  # a wild value at a forced position: not the critic's to fit
    cfg = ObjectiveConfig(estimator=ScoreFunctionSettings(baseline="batch+value", gamma=0.9, gae_lambda=0.8))
    _, vl = boundary_advantages(r, free, returns_of(cfg), v)
    want = (v - discounted_cumsum(batch_relative(r), 0.9)).square()[free].mean()
    assert torch.allclose(vl, want, atol=1e-5)


def test_the_policy_term_never_trains_the_critic():
    """The critic's weight in the total loss is held by test_objective_terms; here: the surrogate
    alone (its advantages from the critic, detached) gives the value head no gradient."""
    cfg = load_config("test", overrides=["model.chunker=rl", "objective.estimator.baseline=batch+value"])
    model = HourglassLM(cfg.model)
    x = torch.randint(0, 256, (4, 64))
    out = model(x, generator=torch.Generator().manual_seed(0))
    bd, y = out.boundaries, x.roll(-1, 1)
    reward = (token_nll(out.early_logits, y) - token_nll(out.logits, y)).detach()
    adv, _ = boundary_advantages(reward, bd.free, returns_of(cfg.objective), out.values)
    grads = torch.autograd.grad(policy_gradient_loss(bd.logp, adv, bd.free), list(model.value_head.parameters()),
                                allow_unused=True)
    assert all(g is None or not g.any() for g in grads)


def test_the_leave_one_out_scale_counts_the_global_batch_under_data_parallel():
    from rltok.objective.batch import LOCAL
    from rltok.training.distributed import DistInfo, GlobalBatchMean

    x = torch.zeros(3, 5)
    assert LOCAL.rows(x) == 3
    assert GlobalBatchMean(DistInfo(rank=0, world_size=4, backend="gloo")).rows(x) == 12  # no collective needed
