"""How noisy and how well aligned a boundary-policy gradient estimator is, on one checkpoint and
one fixed batch: a run's own estimator (`own_estimator`: the grad_snr and grad_cos_ref that the
study records before this moved to the lab hold), and `diagnose` compares variance reducers with these pieces.

Many independent estimates (each re-samples the segmentation) give, per estimator:
- variance: E||g - E g||^2 (trace of the covariance) of a single estimate,
- snr: ||E g||^2 / variance, with ||E g||^2 estimated without the var/n bias of ||mean||^2
  (scale-free: estimators that rescale advantages are comparable),
- cos_ref: mean cosine of a single estimate with a high-sample reference gradient, and
  cos_mean_ref: cosine of the mean with it (below 1: the estimator is biased).
The reference is the unbiased estimator of the gradient of the expected LM loss (gamma = 1,
leave-one-out baseline over many segmentations per sequence), averaged over many draws; with a
lexicon, of the segmentation's code length under it. Gradients are taken with respect to the
boundary policy's own parameters.
"""

from __future__ import annotations

import copy
import time

import torch

from rltok.config import FlipsSettings, ObjectiveConfig, ScoreFunctionSettings, with_settings
from rltok.model.chunkers import learned_rules
from rltok.objective.batch import MicroBatch, per_segmentation
from rltok.objective.build import build_estimator, returns_of
from rltok.objective.score_function import boundary_advantages


def group_batch(x: torch.Tensor, y: torch.Tensor, k: int):
    """With group_size K the batch holds len(x) / K distinct sequences, so every estimator pays
    for len(x) segmentations."""
    return (x, y) if k == 1 else (x[: len(x) // k], y[: len(x) // k])


def _rollout(model, x, y, cfg: ObjectiveConfig, generator, lexicon=None, estimator=None
             ) -> tuple[MicroBatch, torch.Tensor]:
    """Sample segmentations of (x, y) and score them, as the objective's estimator sees them
    (with `estimator`, its counterfactual too): the micro-batch and its reward, the estimator's
    or with a lexicon minus the segmentation's code length under it."""
    estimator = build_estimator(cfg, lexicon) if estimator is None else estimator
    k = cfg.group_size
    xs, ys = group_batch(x, y, k)
    out = model(xs, generator=generator, group_size=k)
    cf = estimator.counterfactual(model, xs, ys, out, generator)
    ys = ys.repeat_interleave(k, 0) if k > 1 else ys
    mb = MicroBatch.of(out, ys, cf)
    if lexicon is not None:
        return mb, -lexicon.costs(per_segmentation(xs, len(ys)), out.boundaries.b)
    return mb, estimator.reward(mb)


def estimate(model, x: torch.Tensor, y: torch.Tensor, cfg: ObjectiveConfig, params, generator,
             lexicon=None) -> torch.Tensor:
    """One estimate of the policy gradient on (x, y): the gradient of the estimator's surrogate
    (the score function on the baselined, discounted reward, the counterfactual-flips one, ...)."""
    estimator = build_estimator(cfg, lexicon)
    mb, reward = _rollout(model, x, y, cfg, generator, lexicon, estimator)
    grads = torch.autograd.grad(estimator.policy_loss(mb, reward).surrogate, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def fit_critic(model, x, y, cfg: ObjectiveConfig, generator, steps: int = 200, lr: float = 3e-3,
               lexicon=None) -> float:
    """Fit the value head on the fixed policy and batch (the checkpoint's critic, if any, is the
    starting point). Returns the final critic loss."""
    critic = list(model.value_head.parameters())
    flags = [p.requires_grad for p in critic]
    for p in critic:
        p.requires_grad_(True)
    opt = torch.optim.Adam(critic, lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        mb, reward = _rollout(model, x, y, cfg, generator, lexicon)
        _, loss = boundary_advantages(reward, mb.bd.free, returns_of(cfg), mb.out.values)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p, f in zip(critic, flags):
        p.requires_grad_(f)
    return float(loss.detach())


def policy_only(model):
    """A training-mode copy of the model whose only trainable parameters are the boundary
    policy's, with a (fresh) critic when it has none. -> (copy, the policy's parameters)."""
    from rltok.model.hourglass import ValueHead

    model = copy.deepcopy(model).train()
    for _, rule in learned_rules(model):  # a settled rule (every stage's): measured as the policy it stopped at
        if rule.is_settled:
            rule.is_settled, rule.learns, rule.cut_at = False, True, 0.0
    if model.value_head is None:  # a critic for the value variants, fitted later
        model.value_head = ValueHead(model.cfg.d_byte)
    for p in model.parameters():
        p.requires_grad_(False)
    params = list(model.chunker.parameters())
    for p in params:
        p.requires_grad_(True)
    if not params:
        raise ValueError(f"chunker {model.cfg.chunker.kind!r} has no parameters: nothing to diagnose")
    return model, params


def lm_credit(base: ObjectiveConfig) -> ObjectiveConfig:
    """The objective whose estimators are measured: the flips' credit re-runs the model, with no
    lexicon (a second objective) and no price (nothing for one to answer to)."""
    if isinstance(base.estimator, FlipsSettings):
        return with_settings(base, {"estimator": {"lexicon": {"weight": 0.0}, "model_pass": True, "price": "none"}},
                             "objective.")
    return base


def reference_gradient(model, x, y, base: ObjectiveConfig, params, gen, lexicon, n_reference: int,
                       reference_group: int, log) -> torch.Tensor:
    """Whatever the checkpoint trained with: the score function's unbiased estimate (gamma = 1,
    leave-one-out baseline over reference_group segmentations per sequence), averaged."""
    ref_cfg = with_settings(base, {"estimator": {"kind": "score_function", "gamma": 1.0, "baseline": "group",
                                                 "normalize_advantages": False},
                                   "group_size": reference_group, "reward": "early_exit"}, "objective.")
    t0 = time.perf_counter()
    # the reference sees len(x) distinct sequences, each segmented reference_group times
    xr, yr = x.repeat(reference_group, 1), y.repeat(reference_group, 1)
    reference = torch.stack([estimate(model, xr, yr, ref_cfg, params, gen, lexicon)
                             for _ in range(n_reference)]).mean(0)
    log(f"reference gradient: {n_reference} estimates x {len(x)} sequences x {reference_group} "
        f"segmentations ({time.perf_counter() - t0:.0f} s)")
    return reference


def measure(model, x, y, cfg: ObjectiveConfig, params, gen, lexicon, n_estimates: int,
            reference: torch.Tensor) -> dict:
    """n_estimates gradient estimates with one estimator (after fitting the critic it needs), their
    variance, SNR and alignment with the reference, and the time of an estimate."""
    critic_loss = None
    if isinstance(cfg.estimator, ScoreFunctionSettings) and "value" in cfg.estimator.baseline_parts():
        critic_loss = fit_critic(model, x, y, cfg, gen, lexicon=lexicon)
    t0 = time.perf_counter()
    g = torch.stack([estimate(model, x, y, cfg, params, gen, lexicon) for _ in range(n_estimates)])
    ms = 1000 * (time.perf_counter() - t0) / n_estimates
    mean = g.mean(0)
    var = (g - mean).square().sum(1).sum().item() / (len(g) - 1)  # unbiased trace of the covariance
    # ||mean||^2 overestimates ||E g||^2 by var / n: remove it, or small SNRs read as 1/n
    signal = max(0.0, mean.square().sum().item() - var / len(g))
    cos = torch.nn.functional.cosine_similarity(g, reference.unsqueeze(0), dim=1)
    return {"variance": var, "snr": signal / max(var, 1e-30), "cos_ref": cos.mean().item(),
            "cos_ref_std": cos.std().item(),
            "cos_mean_ref": torch.nn.functional.cosine_similarity(mean, reference, dim=0).item(),
            "ms_per_estimate": ms, "critic_loss": critic_loss}


def own_estimator(model, x: torch.Tensor, y: torch.Tensor, objective: ObjectiveConfig, n_estimates: int = 16,
                  n_reference: int = 16, reference_group: int = 8, seed: int = 0) -> dict:
    """The checkpoint's own estimator of the LM loss's gradient (`measure`), against the reference;
    the model itself is left untouched."""
    if len(x) % objective.group_size:  # K segmentations of each of len(x) / K sequences
        raise ValueError(f"variant 'own' needs a batch that is a multiple of its group size {objective.group_size} "
                         f"(the batch has {len(x)} sequences)")
    base = lm_credit(objective)
    model, params = policy_only(model)
    gen = torch.Generator().manual_seed(seed)  # one generator: the reference, then the critic and the estimates
    reference = reference_gradient(model, x, y, base, params, gen, None, n_reference, reference_group, lambda m: None)
    cfg = with_settings(base, {}, "objective.")
    cfg.validate()
    return measure(model, x, y, cfg, params, gen, None, n_estimates, reference)
