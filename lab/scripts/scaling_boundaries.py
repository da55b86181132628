"""What each hierarchy's boundaries look like at its best size of one budget: per corpus and family
the test bpb, the chunks per byte it trained and was scored at, the share of whitespace bytes with
a boundary beside them (`space_align`) and of whitespace bytes closing a chunk (`space_end`), bpb
with greedy instead of sampled boundaries,
and, for learned rules, its own gradient estimator's signal-to-noise ratio and cosine to a
reference gradient, each the mean over the seeds of the best size (chosen on val, as everywhere
in the study). The instrument behind the question "why do learned cuts not pay here?".

    python lab/scripts/scaling_boundaries.py --out lab/results/scaling --budget 3e11
    # how one learned rule's policy settled during its run: entropy and rate of its training log
    python lab/scripts/scaling_boundaries.py --trajectory lab/results/scaling/docs-en/runs/C3e11__rl__N27386__s3
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rltok.analysis.scaling import read_records
from rltok.analysis.scaling_fit import best_by_choice, record_family, record_size

COLUMNS = (("bpb", "test bpb", ".3f"), ("train_rate", "rate trained", ".3f"), ("rate", "rate scored", ".3f"),
           ("space_align", "whitespace with a boundary", ".2f"), ("space_end", "whitespace closing a chunk", ".2f"),
           ("bpb_greedy", "bpb, greedy cuts", ".3f"), ("grad_snr", "estimator SNR", ".2f"),
           ("grad_cos_ref", "cos to reference", ".3f"), ("forward_flops_per_byte", "FLOPs/byte", ",.0f"))


def boundary_rows(records: list[dict], budget: float) -> list[tuple[str, float, int, dict]]:
    """(family, best size, seeds, {field: mean over those seeds}) of every family with chunk
    boundaries (a `rate`) at `budget`."""
    here = [r for r in records if float(r["budget_flops"]) == budget and r.get("bpb") is not None
            and r.get("rate") is not None]
    rows = []
    for family, size in sorted(best_by_choice(here).items()):
        runs = [r for r in here if record_family(r) == family and record_size(r) == size]
        means = {key: statistics.mean(r[key] for r in runs if r.get(key) is not None)
                 for key, _, _ in COLUMNS if any(r.get(key) is not None for r in runs)}
        rows.append((family, size, len(runs), means))
    return rows


def trajectory(run: Path, points: int = 12) -> str:
    """Markdown: the policy's entropy and the rate drawn, with the training bpb, at about `points`
    steps of a learned rule's training log (`metrics.jsonl` under the point's run folder)."""
    logs = sorted(Path(run).rglob("metrics.jsonl"))
    if not logs:
        raise SystemExit(f"error: no metrics.jsonl under {run}")
    rows = [r for r in map(json.loads, logs[0].read_text().splitlines()) if "entropy" in r]
    if not rows:
        raise SystemExit(f"error: {logs[0]} has no policy entropy: not a learned rule's run")
    picked = rows[::max(1, len(rows) // points)] + ([rows[-1]] if (len(rows) - 1) % max(1, len(rows) // points) else [])
    lines = ["| step | share of the run | policy entropy (nats) | rate drawn | training bpb |", "|---|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['step'] / rows[-1]['step']:.2f} | {r['entropy']:.3f} | {r['rate']:.3f} | {r['bpb']:.3f} |"
              for r in picked]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the study's results folder (corpus subfolders)")
    ap.add_argument("--budget", type=float)
    ap.add_argument("--trajectory", help="a learned rule's point folder (OUT/<corpus>/runs/<point>): its policy over the run")
    args = ap.parse_args(argv)
    if args.trajectory:
        print(trajectory(Path(args.trajectory)))
        return 0
    if not (args.out and args.budget):
        ap.error("--out and --budget (or --trajectory)")
    head = "| corpus | family | N | seeds | " + " | ".join(label for _, label, _ in COLUMNS) + " |"
    print(head + "\n|" + "---|" * (4 + len(COLUMNS)))
    for folder in sorted(p for p in Path(args.out).iterdir() if p.is_dir() and any(p.glob("C*__*.json"))):
        for family, size, seeds, means in boundary_rows(read_records(folder), args.budget):
            cells = [format(means[key], fmt) if key in means else "–" for key, _, fmt in COLUMNS]
            print(f"| {folder.name} | {family} | {size:,.0f} | {seeds} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
