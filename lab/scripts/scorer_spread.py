"""Has a straight-through rule's boundary scorer learned anything? For each run folder given, the
logits its scorer gives on val windows: their mean and spread, the cut probability at spaces and
elsewhere, and at the last byte before a space (a cut that ends a word without its space) and at
neither, against the logit it started from (logit(target rate)). A scorer that never moved from
its start draws i.i.d. cuts at the target rate: random cuts, whatever the rule is called.

    python lab/scripts/scorer_spread.py 'study/docs-en/runs/C1e12__gumbel__*' --data data/docs-en --out spread.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from rltok.data.corpus import load_eval_bytes
from rltok_lab.run_folders import expand, trainer_folder
from rltok_lab.tables_file import commanded_table
from rltok.training.loading import load_checkpoint


# byte classes for --classes: what a scorer that varies keys on (ASCII; every byte >= 128 is "utf-8")
CLASSES = {"lower": range(97, 123), "upper": range(65, 91), "digit": range(48, 58), "space": [32],
           "newline": [10], "punct": [c for c in range(33, 127) if not chr(c).isalnum()], "utf-8": range(128, 256)}


def class_probs(p: torch.Tensor, x: torch.Tensor) -> dict[str, float | None]:
    """Mean cut probability where the byte deciding is of each class (None where the class is absent)."""
    out = {}
    for name, codes in CLASSES.items():
        mask = torch.isin(x, torch.tensor(list(codes)))
        out[name] = float(p[mask].mean()) if mask.any() else None
    return out


def spread(run: Path, data: str, windows: int, seq_len: int) -> dict:
    model, cfg, _, _ = load_checkpoint(trainer_folder(run))
    model.eval()
    if getattr(model, "chunker", None) is None:
        raise SystemExit(f"scorer_spread: {run} draws no boundaries (model.arch={cfg.model.arch})")
    val = load_eval_bytes(data, "val", max_bytes=windows * seq_len).long()
    x = val[: windows * seq_len].view(windows, seq_len)
    seen = {}
    hook = model.chunker.register_forward_hook(lambda mod, inp, out: seen.setdefault("bd", out))
    with torch.no_grad():
        model(x, generator=torch.Generator().manual_seed(0))
    hook.remove()
    bd = seen["bd"]
    p = bd.probs[:, 1:-1].float() if getattr(bd, "probs", None) is not None else None
    if p is None:
        raise SystemExit(f"scorer_spread: {run}: its rule ({cfg.model.chunker.kind}) gives no cut probabilities")
    logits = torch.logit(p.clamp(1e-6, 1 - 1e-6))
    space = x[:, 1:-1] == 32
    before = (x[:, 2:] == 32) & ~space  # the last byte of a word: a cut there ends the chunk before its space
    rate = cfg.model.target_rate
    return {"run": str(run), "rule": cfg.model.chunker.kind, "rate_logit": math.log(rate / (1 - rate)),
            "logit_mean": float(logits.mean()), "logit_sd": float(logits.std()),
            "p_space": float(p[space].mean()), "p_other": float(p[~space].mean()),
            "p_before": float(p[before].mean()), "p_rest": float(p[~space & ~before].mean()),
            "classes": class_probs(p, x[:, 1:-1])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (a study point's folder or its trainer folder; a quoted "
                                             "pattern with * is expanded)")
    ap.add_argument("--data", required=True, help="the corpus folder the runs trained on")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--classes", action="store_true", help="also the cut probability by the deciding byte's class")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    runs = expand(args.runs)
    if not runs:
        raise SystemExit(f"scorer_spread: no run folder matches {' '.join(args.runs)}")
    rows = [spread(r, args.data, args.windows, args.seq_len) for r in runs]
    lines = ["| run | rule | logit(target rate) | logit mean | logit sd | p(cut) at spaces | p(cut) elsewhere | "
             "p(cut) before a space | p(cut) neither |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {Path(r['run']).name} | {r['rule']} | {r['rate_logit']:.3f} | {r['logit_mean']:.3f} | "
              f"{r['logit_sd']:.3f} | {r['p_space']:.3f} | {r['p_other']:.3f} | {r['p_before']:.3f} | "
              f"{r['p_rest']:.3f} |" for r in rows]
    if args.classes:
        lines += ["", "Cut probability by the class of the byte that decides (the chunk's last byte):", "",
                  "| run | " + " | ".join(CLASSES) + " |", "|---|" + "---:|" * len(CLASSES)]
        lines += [f"| {Path(r['run']).name} | " + " | ".join("–" if v is None else f"{v:.3f}" for v in r["classes"].values())
                  + " |" for r in rows]
    commanded_table("scorer_spread.py", argv if argv is not None else sys.argv[1:], lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
