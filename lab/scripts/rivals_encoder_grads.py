"""How the learned rule's losses reach the encoder (lab/notes/rivals.md, R26): on the parameters the
LM and the rule share, the rule's gradient against the LM's, raw and after Adam's scaling.

For each checkpoint of each run named, a copy of the run folder holding that checkpoint alone is
resumed by the trainer, so the lexicon, the price, the flips' stream and the optimizer's moments are
the run's own. On `--batches` training batches, drawn as training draws them:

    g_lm   = d(LM terms) / d(shared)          g_rule = d(full loss) / d(shared) - g_lm

`shared`: every parameter outside the rule's own head (`chunker.`) that the rule's losses reach.
Per batch, then for the batches' mean gradients (what is left once their noise averages out).
Adam's scaling divides each coordinate by sqrt(v / (1 - beta2^t)) + eps, with v the checkpoint's
second moment. A rule trained with `model.chunker.detach=true` is measured with detaching switched
off: the gradient it would have sent.

    python lab/scripts/rivals_encoder_grads.py --runs OUT/docs-en/runs/C3e11__rl__N17321__s0 ... \\
        --data DATA --out lab/results/rivals_checks/encoder_grads.json

Resumable: a checkpoint already in --out is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from rltok.model.pretrained import read_config
from rltok.objective.loss import compute_loss
from rltok.training.checkpoint import list_checkpoints
from rltok.training.trainer import Trainer
from rltok_lab.run_folders import trainer_folder


def resumed_at(run: Path, ckpt: Path, data: Path | None, scratch: Path) -> Trainer:
    """A trainer resumed from `ckpt` in a copy of `run` (the study's folder is never written)."""
    copy = scratch / f"{run.parent.name}__{ckpt.name}"
    shutil.rmtree(copy, ignore_errors=True)
    (copy / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, copy / "checkpoints" / ckpt.name)
    cfg, _ = read_config(ckpt)  # the config alone: the trainer loads the weights
    if data is not None:  # the corpus the run read, where it is on this machine
        cfg.data.train = str(data / Path(cfg.data.train).name)
    cfg.train.out_dir = str(copy)
    saved = json.loads((run / "config.json").read_text())
    saved["data"] = {**saved["data"], "train": cfg.data.train}
    saved["train"] = {**saved["train"], "out_dir": str(copy)}
    (copy / "config.json").write_text(json.dumps(saved, indent=2))
    return Trainer(cfg, resume=True, quiet=True)


def _flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else math.nan


def _adam_scale(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor | None:
    """1 / (sqrt(v / (1 - beta2^t)) + eps): what Adam divides the parameter's gradient by (None for
    a parameter Adam has not stepped: the LM's gradient never reached it, so it is never kept)."""
    st = opt.state.get(p, {})
    if "exp_avg_sq" not in st:
        return None
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    beta2, eps = group["betas"][1], group["eps"]
    return 1.0 / ((st["exp_avg_sq"] / (1 - beta2 ** float(st["step"]))).sqrt() + eps)


def measure(trainer: Trainer, batches: int) -> dict:
    """Medians over `batches` of the norm ratio and cosine of g_rule against g_lm, raw and scaled."""
    model, objective = trainer.model, trainer.objective
    chunker = getattr(model, "chunker", None)
    if chunker is not None and getattr(chunker, "detach_input", False):
        chunker.detach_input = False  # the gradient a detached rule would have sent
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith("chunker.")]
    params = [p for _, p in named]
    scales = [_adam_scale(trainer.opt, p) for p in params]  # no step is taken: the moments stay as loaded
    objective.begin_step(model, trainer.step, trainer.step_bytes, trainer.sampler.seq_len)
    rows, sum_lm, sum_rule = [], 0.0, 0.0
    for _ in range(batches):
        x, y = trainer.sampler.next()
        out = trainer.forward(x, generator=trainer.noise, **trainer.group_kw)
        cf = objective.counterfactual(model, x, y, out, trainer.step)
        full, _ = objective.loss(out, y, trainer.step, cf)
        lm, _ = compute_loss(out, y, objective.terms, batch_mean=objective.reduce, policy_on=False)
        g_full = torch.autograd.grad(full, params, retain_graph=True, allow_unused=True)
        g_lm = torch.autograd.grad(lm, params, allow_unused=True)
        keep = [i for i, (a, b) in enumerate(zip(g_full, g_lm)) if a is not None and b is not None
                and not torch.equal(a, b)]  # the parameters the rule's losses reach
        lm_g = [g_lm[i] for i in keep]
        rule_g = [g_full[i] - g_lm[i] for i in keep]
        scale = [scales[i] for i in keep]
        a, b = _flat(lm_g), _flat(rule_g)
        sum_lm, sum_rule = sum_lm + a, sum_rule + b  # the same parameters every batch
        sa, sb = _flat([g * s for g, s in zip(lm_g, scale)]), _flat([g * s for g, s in zip(rule_g, scale)])
        rows.append({"ratio": float(b.norm() / a.norm()), "cos": _cos(a, b),
                     "ratio_adam": float(sb.norm() / sa.norm()), "cos_adam": _cos(sa, sb),
                     "shared": [named[i][0] for i in keep]})
    med = {k: statistics.median(r[k] for r in rows) for k in ("ratio", "cos", "ratio_adam", "cos_adam")}
    # the batches' mean gradients: what is left of each once the batches' noise averages out
    mean = {"ratio_mean": float(sum_rule.norm() / sum_lm.norm()), "cos_mean": _cos(sum_lm, sum_rule)}
    return {**med, **mean, "batches": len(rows), "shared": rows[0]["shared"] if rows else [], "per_batch": [
        {k: r[k] for k in ("ratio", "cos", "ratio_adam", "cos_adam")} for r in rows]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="study point folders (OUT/<corpus>/runs/<point>)")
    ap.add_argument("--data", help="the folder holding the corpora, where the runs' own path is not")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--out", required=True, help="JSON with every measurement (rewritten as each finishes)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.exists() else {}
    with tempfile.TemporaryDirectory() as scratch:
        for point in map(Path, args.runs):
            run = trainer_folder(point)
            if not (run / "checkpoints").is_dir():
                raise SystemExit(f"error: {point} holds no run folder with checkpoints")
            for ckpt in list_checkpoints(run):
                key = f"{point.parent.parent.name}/{point.name}/{ckpt.name}"  # OUT/<corpus>/runs/<point>
                if key in done:
                    continue
                torch.manual_seed(0)
                trainer = resumed_at(run, ckpt, Path(args.data) if args.data else None, Path(scratch))
                try:
                    done[key] = {"step": trainer.step, **measure(trainer, args.batches)}
                finally:
                    trainer.lock.release()
                r = done[key]
                print(f"{key}: ratio {r['ratio']:.3f} cos {r['cos']:+.3f} | adam ratio {r['ratio_adam']:.3f} "
                      f"cos {r['cos_adam']:+.3f} | of the means: ratio {r['ratio_mean']:.3f} cos {r['cos_mean']:+.3f} "
                      f"({r['batches']} batches)", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(done, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
