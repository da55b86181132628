"""How closely objective.rate_control=lagrange holds a requested rate on a real corpus.

    .venv/bin/python bench/controller_check.py --data ~/data/code-py --target 0.1 \\
        [--steps 250 --preset small] [--out lab/results/controller_code-py_0.1.json]

Trains a short run with the Lagrange controller (no penalty) and reports the mean expected and
sampled rate over the second half of training and the largest deviation of a logged record
(each record averages train.log_every steps), with the multiplier's final value. The objective
is pinned to the reference recipe (score-function estimator): the presets' lexicon recipe adds a
second price controller (the flips estimator's target price) beside the Lagrange one. The JSON
records the objective config the run used.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from rltok.analysis.compare import git_commit  # noqa: E402
from rltok.config import load_config  # noqa: E402
from rltok.training.trainer import Trainer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.preset, overrides=[
            f"data.train={args.data}", f"train.out_dir={tmp}/run", f"train.max_steps={args.steps}",
            f"train.threads={args.threads}", "train.log_every=10", f"train.eval_every={args.steps}",
            f"train.checkpoint_every={args.steps}",
            "objective.recipe=reference",  # so that the Lagrange controller alone holds the rate (not lexicon's flips)
            "objective.rate=lagrange", f"model.target_rate={args.target}"])
        trainer = Trainer(cfg, quiet=True)
        trainer.fit()
    late = trainer.history[len(trainer.history) // 2:]
    res = {
        "data": args.data, "target": args.target, "steps": args.steps, "preset": args.preset,
        "lagrange_lr": cfg.objective.rate.lr, "lagrange_gain": cfg.objective.rate.gain,
        "expected_rate": sum(r["expected_rate"] for r in late) / len(late),
        "sampled_rate": sum(r["rate"] for r in late) / len(late),
        "max_record_deviation": max(abs(r["expected_rate"] - args.target) for r in late),
        "final_price": trainer.history[-1]["chunk_price"], "val_rate": trainer.history[-1].get("val_rate"),
        "commit": git_commit(), "command": " ".join(["python", "bench/controller_check.py", *sys.argv[1:]]),
        "objective": cfg.to_dict()["objective"],
    }
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
