"""Estimator diagnostics (`python -m rltok_lab diagnose`): how noisy is each policy-gradient
variant, and how well aligned?

For one checkpoint and one fixed batch, each variant's estimates are measured as rltok measures a
run's own estimator (`rltok_lab.estimator_snr`: variance, snr, cos_ref, cos_mean_ref), plus
ms_per_estimate and the time of a full training step (forward + loss + backward) with it, and
each variant's SNR, step time and SNR per training FLOP relative to the reference's.

With a lexicon (`diagnose(..., lexicon=)`, `--objective lexicon`) the objective is instead the
one the lexicon recipe's policy is trained on: the segmentation's code length under the
checkpoint's lexicon (counts frozen). Every estimator then sees the per-position reward -cost (the
score function with its discount and baselines) or the cost's change under its flips (no model
pass: the credit is the lexicon's), and the reference is the score function's unbiased estimate
of that gradient.
"""

from __future__ import annotations

import statistics
import time

import torch

from rltok_lab.estimator_snr import group_batch, lm_credit, measure, policy_only, reference_gradient
from rltok.config import FlipsSettings, ObjectiveConfig, with_settings
from rltok.objective.build import build_estimator, build_lexicon, terms_of_objective
from rltok.objective.loss import compute_loss


def _score_function(baseline: str = "batch", gamma: float = 0.99, reward: str = "early_exit", k: int = 1) -> dict:
    return {"estimator": {"kind": "score_function", "baseline": baseline, "gamma": gamma}, "reward": reward,
            "group_size": k}


# name -> objective settings on top of the checkpoint's (as a config file's objective section): the
# reference estimator, its ablations (gamma = 1, no batch baseline, final-loss reward), the variance
# reducers (group baselines, the critic) and the flips
VARIANTS: dict[str, dict] = {
    "reference": _score_function(),
    "gamma=1": _score_function(gamma=1.0),
    "no batch baseline": _score_function(baseline="none"),
    "no early-exit reward": _score_function(reward="final"),
    "group K=4": _score_function(baseline="group", k=4),
    "batch+value": _score_function(baseline="batch+value"),
    "group K=4 + value": _score_function(baseline="group+value", k=4),
    "flips/16": {"estimator": {"kind": "flips", "stride": 16}, "group_size": 1},
    "flips/4": {"estimator": {"kind": "flips", "stride": 4}, "group_size": 1},
}
# what `--objective lexicon` measures by default (the early-exit reward has no meaning there)
LEXICON_VARIANTS = ["reference", "gamma=1", "group K=4", "flips/16", "flips/4"]


def checkpoint_lexicon(folder, cfg, device="cpu"):
    """The lexicon a checkpoint was trained with, its counts read from the trainer state."""
    from rltok.config import ConfigError
    from rltok.training.checkpoint import read_trainer_state

    state = (read_trainer_state(folder) or {}).get("objective") or {}
    est = cfg.objective.estimator
    if not isinstance(est, FlipsSettings) or est.lexicon.weight <= 0 or state.get("lexicon") is None:
        raise ConfigError(f"--objective lexicon: checkpoint {folder} was not trained with the lexicon prior "
                          "(objective.estimator.lexicon.weight > 0) or has no trainer state")
    lexicon = build_lexicon(cfg, device)
    lexicon.load_state_dict(state["lexicon"])
    return lexicon


def train_flops_per_byte_of(model, cfg: ObjectiveConfig, seq_len: int) -> float:
    """Training FLOPs per distinct byte of a step with this estimator, at the model's target rate."""
    from rltok.model.flops import ModelCost

    return ModelCost(model, seq_len, cfg.group_size).step_train_per_byte(counterfactual=build_estimator(cfg).model_pass)


def step_time(model, x, y, cfg: ObjectiveConfig, target_rate: float, generator, repeats: int = 3,
              lexicon=None) -> float:
    """Median seconds of a full training step's compute (forward, loss, backward) with `cfg`."""
    k = cfg.group_size
    xs, ys = group_batch(x, y, k)
    estimator = build_estimator(cfg, lexicon)
    terms = terms_of_objective(cfg, target_rate, estimator=estimator)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = model(xs, generator=generator, group_size=k)
        cf = estimator.counterfactual(model, xs, ys, out, generator)
        loss, _ = compute_loss(out, ys, terms, counterfactual=cf)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _select_variants(base: ObjectiveConfig, x: torch.Tensor, variants, lexicon, reference_group: int, log
                     ) -> tuple[dict[str, dict], dict[str, int]]:
    """The variants to measure and those left out. -> (name -> objective overrides, name -> group
    size of each variant skipped because it does not divide the batch)."""
    default = LEXICON_VARIANTS if lexicon is not None else list(VARIANTS)
    specs = variants if isinstance(variants, dict) else {v: VARIANTS[v] for v in (variants or default)}
    if reference_group < 2:
        raise ValueError(f"the reference needs at least 2 segmentations per sequence, got {reference_group}")
    # a variant with group_size K segments len(x) / K sequences K times: K must divide the batch;
    # the default set leaves out those that do not, named variants are an error
    misfit = {n: s.get("group_size", base.group_size) for n, s in specs.items()
              if len(x) % s.get("group_size", base.group_size)}
    if misfit and variants:
        raise ValueError("; ".join(f"variant {n!r} needs a batch that is a multiple of its group size {k}"
                                   for n, k in misfit.items()) + f" (the batch has {len(x)} sequences)")
    for n, k in misfit.items():
        log(f"skipping {n!r}: its group size {k} does not divide the batch of {len(x)}")
    return {n: s for n, s in specs.items() if n not in misfit}, misfit


def _variant_config(base: ObjectiveConfig, spec: dict, lexicon) -> ObjectiveConfig:
    cfg = with_settings(base, spec, "objective.")
    if lexicon is not None and isinstance(cfg.estimator, FlipsSettings):  # the credit: the code length's change
        cfg = with_settings(cfg, {"estimator": {"lexicon": {"weight": 1.0}, "model_pass": False}}, "objective.")
    cfg.validate()
    return cfg


def _measure_variant(model, x, y, cfg: ObjectiveConfig, params, gen, lexicon, n_estimates: int,
                     target_rate: float, reference: torch.Tensor) -> dict:
    """`estimator_snr.measure` with one variant, its training FLOPs per byte and the time of a step."""
    r = measure(model, x, y, cfg, params, gen, lexicon, n_estimates, reference)
    for p in model.parameters():  # time a full step with every parameter trainable
        p.requires_grad_(True)
    st = step_time(model, x, y, cfg, target_rate, gen, lexicon=lexicon)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return {"variance": r["variance"], "snr": r["snr"],
            "train_flops_per_byte": train_flops_per_byte_of(model, cfg, x.shape[1]),
            **{k: r[k] for k in ("cos_ref", "cos_ref_std", "cos_mean_ref", "ms_per_estimate")},
            "step_seconds": st, "critic_loss": r["critic_loss"]}


def _add_reference_ratios(rows: dict[str, dict]) -> None:
    """Each variant's SNR, step time and SNR per training FLOP relative to the reference's (or the
    checkpoint's own estimator's), when one was measured."""
    ref_row = rows.get("reference") or rows.get("own")
    if ref_row:
        for r in rows.values():
            r["snr_vs_reference"] = r["snr"] / ref_row["snr"] if ref_row["snr"] > 0 else None
            r["step_time_vs_reference"] = r["step_seconds"] / ref_row["step_seconds"]
            # SNR grows linearly with the number of estimates averaged, so per training FLOP it is
            # snr / FLOPs: the ratio at equal compute
            flops_ratio = r["train_flops_per_byte"] / ref_row["train_flops_per_byte"]
            r["snr_per_flop_vs_reference"] = (r["snr"] / ref_row["snr"] / flops_ratio) if ref_row["snr"] > 0 else None


def diagnose(model, x: torch.Tensor, y: torch.Tensor, base: ObjectiveConfig, target_rate: float,
             variants: list[str] | dict[str, dict] | None = None, n_estimates: int = 32, n_reference: int = 64,
             reference_group: int = 8, seed: int = 0, log=print, lexicon=None) -> dict:
    """`variants`: names from VARIANTS, or a mapping name -> objective overrides on `base`
    ({"own": {}} measures the checkpoint's own estimator). `lexicon`: measure the estimators of
    the lexicon code length's gradient instead of the LM loss's (a ChunkLexicon, not updated)."""
    specs, misfit = _select_variants(base, x, variants, lexicon, reference_group, log)
    # each estimator of the LM loss's gradient, or with `lexicon`, of the code length's (set per variant)
    base = lm_credit(base)
    model, params = policy_only(model)
    gen = torch.Generator().manual_seed(seed)
    # one generator for every draw, in this order: the reference, then each variant's critic, estimates, step
    reference = reference_gradient(model, x, y, base, params, gen, lexicon, n_reference, reference_group, log)
    rows = {}
    for name, spec in specs.items():
        cfg = _variant_config(base, spec, lexicon)
        rows[name] = r = _measure_variant(model, x, y, cfg, params, gen, lexicon, n_estimates, target_rate, reference)
        log(f"{name:>22}: snr {r['snr']:.4f}  cos_ref {r['cos_ref']:.3f}  "
            f"cos_mean_ref {r['cos_mean_ref']:.3f}  {r['ms_per_estimate']:.0f} ms/estimate  "
            f"step {r['step_seconds'] * 1000:.0f} ms")
    _add_reference_ratios(rows)
    return {"variants": rows, "n_estimates": n_estimates, "n_reference": n_reference,
            "batch": list(x.shape), "reference_group": reference_group, "skipped": sorted(misfit),
            "objective": "lm" if lexicon is None else "lexicon"}


def markdown(result: dict) -> str:
    lines = ["| variant | gradient SNR | SNR vs reference | SNR per FLOP vs reference | cos(single, ref) "
             "| cos(mean, ref) | step time vs reference |",
             "|---|---|---|---|---|---|---|"]
    rows = result["variants"]
    ref = rows.get("reference") or rows.get("own")
    for name, r in rows.items():
        # a reference SNR of 0 means its signal is below the noise of n estimates: no ratio
        ratio = f"{r['snr'] / ref['snr']:.2f}x" if ref and ref["snr"] > 0 else "— (reference at noise floor)"
        per_flop = r.get("snr_per_flop_vs_reference")
        ratio += f" | {per_flop:.2f}x" if per_flop is not None else " | —"
        lines.append(f"| {name} | {r['snr']:.4f} | {ratio} "
                     f"| {r['cos_ref']:.3f} ± {r['cos_ref_std']:.3f} | {r['cos_mean_ref']:.3f} "
                     f"| {r.get('step_time_vs_reference', float('nan')):.2f}x |")
    return "\n".join(lines)
