"""Gradient-estimator diagnostics on trained checkpoints, rendered into lab/reports/ESTIMATORS.md.

    .venv/bin/python lab/scripts/estimator_report.py --run code-py=runs/compare/code-py/runs/rl_s0 \\
        --run docs-en=runs/compare/docs-en/runs/rl_s0 [--estimates 24 --reference 32]
    .venv/bin/python lab/scripts/estimator_report.py --render-only

Each diagnosis is written to lab/results/estimators_<name>.json as soon as it exists; a name
whose JSON exists is skipped (resumable). Ablation training runs made with `rltok compare`
(lab/scripts/ablation_sweep.sh: methods rl_gamma1, rl_no_batch, ...) are tabulated from their JSON
files in lab/results/ablation/<corpus>/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]
RESULTS = ROOT / "lab" / "results"

from rltok.analysis.compare import git_commit, mean_sd  # noqa: E402  (shared with the comparison report)


def run(name: str, ckpt: str, args) -> dict:
    import torch

    from rltok.training.loading import load_checkpoint
    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok_lab.diagnose import checkpoint_lexicon, diagnose

    torch.set_num_threads(args.threads)
    model, cfg, _, path = load_checkpoint(ckpt)
    data = load_eval_bytes(cfg.data.train, "val")
    x, y = eval_windows(data, cfg.train.seq_len, args.batch)
    lexicon = checkpoint_lexicon(path, cfg) if args.objective == "lexicon" else None
    res = diagnose(model, x, y, cfg.objective, cfg.model.target_rate, n_estimates=args.estimates,
                   n_reference=args.reference, reference_group=args.reference_group, seed=0,
                   log=lambda m: print(f"[{name}] {m}", file=sys.stderr), lexicon=lexicon)
    res.update(name=name, checkpoint=str(path), data=f"DATA/{Path(cfg.data.train).name}", commit=git_commit(),
               threads=args.threads, command=" ".join(["python", "lab/scripts/estimator_report.py", *sys.argv[1:]]))
    return res


ABLATION_LABELS = {
    "rl": "reference recipe (early-exit reward, batch baseline, γ 0.99, w 1, rate loss)",
    "rl_gamma1": "γ = 1", "rl_no_batch": "no batch-relative baseline", "rl_final_reward": "no early-exit reward",
    "rl_w8": "w = 8", "rl_no_rate": "no rate loss", "rl_group4": "group-relative, K = 4",
    "rl_value": "batch + critic (GAE λ 0.95)", "rl_group4_value": "group K = 4 + critic",
}


def ablation_tables(results: Path = RESULTS) -> list[str]:
    """The training ablations at equal compute, one table per corpus, from their JSON files."""
    root = results / "ablation"
    corpora = sorted(p for p in root.glob("*") if p.is_dir()) if root.exists() else []
    if not corpora:
        return []
    lines = ["## Training ablations at equal compute", "",
             "Each variant trained with `rltok compare` (preset `small`, 3.48e12 training FLOPs = 1M bytes of the",
             "reference model, test split), so a variant that costs more per byte sees fewer bytes. *grad SNR* and",
             "*cos(mean, ref)* are the run's own estimator diagnosed at its final checkpoint (16 estimates, 16-estimate",
             "reference, 8 test windows: noisy; 0 means the debiased ‖mean‖² did not exceed var/n). Commands:",
             "`bash lab/scripts/ablation_sweep.sh DATA_ROOT` (the folder holding the prepared corpora code-py/ and",
             "docs-en/) then `python lab/scripts/estimator_report.py --render-only`.", ""]
    for corpus in corpora:
        runs = [json.loads(p.read_text()) for p in sorted(corpus.glob("*_s*.json"))]
        by: dict[str, list[dict]] = {}
        for r in runs:
            by.setdefault(r["method"], []).append(r)
        commits = sorted({r["commit"] for r in runs})
        lines += [f"### {corpus.name}", "", f"Commits: {', '.join(f'`{c}`' for c in commits)}.", "",
                  "| variant | seeds | test bpb | rate | space align | grad SNR | cos(mean, ref) | train FLOPs/byte "
                  "| bytes seen | train bytes/s |", "|---|---|---|---|---|---|---|---|---|---|"]
        order = [m for m in ABLATION_LABELS if m in by] + sorted(m for m in by if m not in ABLATION_LABELS)
        for m in order:
            rs = by[m]
            lines.append(
                f"| {ABLATION_LABELS.get(m, m)} | {len(rs)} | {mean_sd([r['bpb'] for r in rs], 4)} "
                f"| {mean_sd([r['rate'] for r in rs])} | {mean_sd([r['space_align'] for r in rs])} "
                f"| {mean_sd([r.get('grad_snr') for r in rs])} | {mean_sd([r.get('grad_cos_ref') for r in rs], 2)} "
                f"| {sum(r['train_flops_per_byte'] for r in rs) / len(rs) / 1e6:.2f}M "
                f"| {sum(r['train_bytes'] for r in rs) / len(rs) / 1e6:.2f}M "
                f"| {sum(r['train_bytes_per_s'] or 0 for r in rs) / len(rs) / 1e3:.1f}k |")
        lines += ["", f"![{corpus.name} curves](../results/ablation/{corpus.name}/bpb_vs_flops.png)", ""]
    return lines


def render(results: Path = RESULTS) -> str:
    from rltok_lab.diagnose import markdown

    lines = ["# Gradient estimators: what each variance reducer buys", "",
             "Generated by `lab/scripts/estimator_report.py` from `lab/results/estimators_*.json`; do not edit by hand.", "",
             "For one trained checkpoint (the `rl` run of the comparison, preset `small`) and one fixed batch of",
             "validation windows, each variant draws many independent score-function estimates of the boundary",
             "policy's gradient (each re-samples the segmentation; the batch of segmentations is the same size for",
             "every variant, so `group K=4` sees a quarter as many distinct sequences). *SNR* = ‖E g‖² / E‖g − E g‖²;",
             "*cos(single, ref)* = mean cosine of one estimate with the reference gradient (the unbiased γ = 1,",
             "leave-one-out estimator over 8 segmentations per sequence, averaged over many draws); *cos(mean, ref)*",
             "below 1 shows bias (γ < 1 and GAE trade bias for variance by design). Step time: forward + loss +",
             "backward of a full training step with that variant, relative to the reference recipe.", ""]
    for path in sorted(results.glob("estimators_*.json")):
        r = json.loads(path.read_text())
        objective = ("the lexicon's code length (what the lexicon recipe's policy is trained on: every estimator "
                     "sees the reward -cost under the checkpoint's lexicon, the flips its change; `exact` credits "
                     "every decision exactly)" if r.get("objective") == "lexicon" else "the LM loss")
        lines += [f"## {r['name']}", "", f"Gradient of {objective}. Checkpoint `{r['checkpoint']}`, batch {r['batch']}, "
                  f"{r['n_estimates']} estimates per variant, reference from {r['n_reference']} estimates; "
                  f"commit `{r['commit']}`.", "", markdown(r), "", f"Command: `{r['command']}`", ""]
    lines += ablation_tables(results)
    notes = ROOT / "lab" / "notes" / "estimators.md"
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", default=[], help="NAME=CHECKPOINT_OR_RUN_DIR")
    ap.add_argument("--estimates", type=int, default=24)
    ap.add_argument("--reference", type=int, default=32)
    ap.add_argument("--reference-group", type=int, default=8)
    ap.add_argument("--objective", choices=["lm", "lexicon"], default="lm",
                    help="the gradient estimated: of the LM loss, or of the lexicon's code length")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where the estimators_<name>.json results are "
                                                                 "written and read, with ablation/ (default: lab/results)")
    ap.add_argument("--out", default=str(ROOT / "lab" / "reports" / "ESTIMATORS.md"), help="the report (default: lab/reports/ESTIMATORS.md)")
    args = ap.parse_args()
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        for spec in args.run:
            name, _, ckpt = spec.partition("=")
            out = results / f"estimators_{name}.json"
            if out.exists():
                print(f"{name}: done already")
                continue
            res = run(name, ckpt, args)
            out.write_text(json.dumps(res, indent=2))
    out_md = Path(args.out)
    out_md.write_text(render(results))
    print(out_md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
