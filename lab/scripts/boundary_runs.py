"""Boundary-learning experiments: named training configurations on a corpus, one run each,
resumable (a finished run is skipped, an interrupted one resumes from its checkpoint), each
result written to lab/results/boundary/<corpus>/<name>.json as soon as it exists.

    .venv/bin/python lab/scripts/boundary_runs.py DATA_DIR NAME [NAME ...] [--steps N] [--seed S]

DATA_DIR: a folder with train.*/val.* files. Results hold the validation curve (bpb, rate,
whitespace alignment) and the final boundary probability by byte class.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]

from rltok.analysis.compare import git_commit  # noqa: E402
from rltok.config import load_config, load_plugin  # noqa: E402
from rltok.training.trainer import Trainer  # noqa: E402

load_plugin("rltok_lab.variants")  # the probes are the lab's

# name -> overrides on the default (tiny) config with the published recipe (objective.recipe=reference).
# The runs of keys since removed because they changed nothing (objective.flip_weight, lexicon_lag,
# lexicon_collapse_blanks, lexicon_context, flip_rate_start/_anneal_steps, lexicon_credit) are
# gone: warm_flips_w01, lexicon_late, lexicon_late_r118, lexicon_late_blanks, lexicon_late_blanks_r118,
# lexicon_blanks_r118, lexicon_late_blanks_r33, bigram, lexicon_anneal, lexicon_late_blanks_anneal,
# bigram_late_blanks, bigram_late_blanks_r33, lexicon_exact. Their results stay in lab/results/boundary/.
RUNS: dict[str, list[str]] = {
    "reference": [],
    # a synthetic reward that names Python's token starts: can the policy learn them at all?
    "token_probe": ["objective.estimator=flips", "objective.reward=token_probe"],
    "flips": ["objective.estimator=flips"],
    "warm": ["objective.policy_start_step=250"],
    "warm_flips": ["objective.estimator=flips", "objective.policy_start_step=250"],
    "warm_flips_s8": ["objective.estimator=flips", "objective.policy_start_step=250", "objective.estimator.stride=8"],
    # a learned chunk vocabulary: recurring chunks get their own embedding
    "warm_flips_vocab": ["objective.estimator=flips", "objective.policy_start_step=250", "model.chunk_vocab=65536"],
    "warm_flips_vocab_detach": ["objective.estimator=flips", "objective.policy_start_step=250", "model.chunk_vocab=65536",
                                "model.chunker.detach=true"],
    "warm_flips_vocab_lr01": ["objective.estimator=flips", "objective.policy_start_step=250", "model.chunk_vocab=65536",
                              "objective.policy_lr_mult=0.1"],
    "warm500_flips_vocab": ["objective.estimator=flips", "objective.policy_start_step=500", "model.chunk_vocab=65536"],
    # byte attention over 8 bytes only: the decoder cannot predict from local context alone, so
    # the chunk level (and where it cuts) has to carry more
    "window8_warm_flips": ["objective.estimator=flips", "objective.policy_start_step=250", "model.window=8"],
    "window8_warm_flips_vocab": ["objective.estimator=flips", "objective.policy_start_step=250", "model.window=8",
                                 "model.chunk_vocab=65536"],
    # and hashed byte n-gram embeddings: the byte level gets a vocabulary's memory too
    "warm_flips_vocab_ngram": ["objective.estimator=flips", "objective.policy_start_step=250", "model.chunk_vocab=65536",
                               "model.ngram_vocab=32768"],
    # a lexicon prior: the flips' credits also count the segmentation's code length under a
    # unigram model of the policy's own recent chunks (cut the same strings the same way)
    # (centred on the mean credit, the rate penalty cannot hold the rate against it)
    "lexicon_meancenter": ["objective.estimator=flips", "objective.estimator.lexicon.weight=1"],
    # a price per boundary inside the credit, held by dual ascent: the credit holds the rate
    "lexicon": ["objective.estimator=flips", "objective.estimator.lexicon.weight=1", "objective.estimator.price=target"],
    # the lexicon's credit alone, no counterfactual model pass: the lexicon recipe (objective.recipe=lexicon)
    "lexicon_only": ["objective.recipe=lexicon"],
    # at the whitespace rule's rate on code: the policy cannot afford a chunk per space
    "lexicon_r118": ["objective.recipe=lexicon", "model.target_rate=0.118"],
    # counts that forget faster: the lexicon follows the policy's new cuts sooner
    "lexicon_d98": ["objective.recipe=lexicon", "objective.estimator.lexicon.decay=0.98"],
    "lexicon_w01": ["objective.estimator=flips", "objective.estimator.lexicon.weight=0.1", "objective.estimator.price=target"],
    "lexicon_vocab": ["objective.estimator=flips", "objective.estimator.lexicon.weight=1", "objective.estimator.price=target",
                      "model.chunk_vocab=65536"],
    "lexicon_vocab_ngram": ["objective.estimator=flips", "objective.estimator.lexicon.weight=1",
                            "objective.estimator.price=target", "model.chunk_vocab=65536", "model.ngram_vocab=32768"],
    "vocab_ngram": ["model.chunk_vocab=65536", "model.ngram_vocab=32768"],
    "vocab": ["model.chunk_vocab=65536"],
    "uniform_vocab": ["model.chunker=uniform", "model.chunk_vocab=65536"],
}


CURVE_KEYS = ("step", "bytes", "train_flops", "val_bpb", "val_rate", "val_space_align", "val_space_end", "entropy",
              "lexicon_bpb")


def validation_curve(records) -> list[dict]:
    """The validation records of a run's log (CURVE_KEYS of each)."""
    return [{k: r[k] for k in CURVE_KEYS if k in r} for r in records if "val_bpb" in r]


def run_record(name: str, args, corpus: str, curve: list[dict], **extra) -> dict:
    """What a result file holds: the run, its curve, the commit and the command that reproduces it."""
    return {"name": name, "seed": args.seed, "data": corpus, "overrides": RUNS[name], **extra,
            "commit": git_commit(), "curve": curve,
            "command": f"python lab/scripts/boundary_runs.py DATA/{corpus} {name} --steps {args.steps} --seed {args.seed}"}


def main() -> int:
    git_commit()  # the commit the runs start from: read now, kept for the records written later
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("names", nargs="+", choices=sorted(RUNS))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--snapshot", action="store_true",
                    help="do not train: write the validation curve of an unfinished run so far to <name>_s<seed>.partial.json")
    ap.add_argument("--results-dir", default=str(ROOT / "lab" / "results" / "boundary"),
                    help="where the result JSON goes, one folder per corpus (default: lab/results/boundary)")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "boundary"),
                    help="where the training runs go, one folder per corpus (default: runs/boundary)")
    args = ap.parse_args()
    corpus = Path(args.data).name
    out_dir = Path(args.results_dir) / corpus
    run_dir = Path(args.run_root) / corpus
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        tag = f"{name}_s{args.seed}"
        if args.snapshot:
            log = run_dir / tag / "metrics.jsonl"
            if not log.exists():
                print(f"{tag}: no run to snapshot ({log})", file=sys.stderr)
                continue
            curve = validation_curve(map(json.loads, log.read_text().splitlines()))
            record = run_record(name, args, corpus, curve, finished=False)
            (out_dir / f"{tag}.partial.json").write_text(json.dumps(record, indent=2))
            continue
        dest = out_dir / f"{tag}.json"
        if dest.exists():
            print(f"{tag}: done already", file=sys.stderr)
            continue
        overrides = ["objective.recipe=reference", f"data.train={args.data}", f"train.max_steps={args.steps}", f"train.seed={args.seed}",
                     f"train.eval_every={args.eval_every}", "train.log_every=50", "train.threads=1",
                     f"train.checkpoint_every={args.eval_every}", f"train.out_dir={run_dir / tag}",
                     *RUNS[name]]
        t0 = time.time()
        trainer = Trainer(load_config("tiny", overrides=overrides), resume=True, quiet=True)
        trainer.fit()
        if trainer.stop_requested:  # SIGINT/SIGTERM: checkpointed, not finished; rerun to resume
            print(f"{tag}: interrupted at step {trainer.step}; rerun to resume", file=sys.stderr)
            return 1
        curve = validation_curve(trainer.history)
        result = run_record(name, args, corpus, curve, steps=trainer.step, wall_s=time.time() - t0)
        dest.write_text(json.dumps(result, indent=2))
        last = curve[-1]
        print(f"{tag}: val bpb {last['val_bpb']:.3f} rate {last['val_rate']:.3f} "
              f"space_align {last['val_space_align']:.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
