"""The supertoken frontier (the compute-aware policy, fixed-rate and two-stage RL, and BPE): test bpb
against forward FLOPs per byte at equal training compute, rendered into lab/reports/SUPERTOKENS.md with one
plot per corpus.

    bash lab/scripts/frontier_sweep.sh DATA_ROOT            # trains (resumable), runs/frontier/<corpus>/
    .venv/bin/python lab/scripts/frontier_report.py --collect   # copies the JSONs to lab/results/frontier/
    .venv/bin/python lab/scripts/frontier_report.py             # renders from lab/results/frontier/
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]
RESULTS = ROOT / "lab" / "results" / "frontier"


def family(r: dict) -> str:
    """Which curve a run belongs to: compute-aware RL, fixed-rate RL, two-stage RL or a BPE rule."""
    obj, model = r["config"]["objective"], r["config"]["model"]
    if model.get("chunker") == "rl":
        if model.get("stages", 1) == 2:
            return "rl two-stage"
        if obj.get("rate_control", "penalty") == "none" and obj.get("compute_price", 0) > 0:
            return "rl compute-aware"
        return "rl fixed rate"
    if model.get("chunker") == "bpe":
        return f"bpe ({model.get('bpe_pretokenize', 'gpt2')} pre-tokenisation)"
    return r["method"]


def label(r: dict) -> str:
    obj, model = r["config"]["objective"], r["config"]["model"]
    f = family(r)
    if f == "rl compute-aware":
        return f"price {obj['compute_price']:g} bit/MFLOP"
    if f.startswith("bpe") or f == "rl fixed rate":
        return f"target {model['target_rate']:g}"
    if model.get("stages", 1) == 2:
        return f"targets {model['target_rate']:g} and {model['stage2_target_rate']:g} per chunk"
    return f


def points(runs: list[dict]) -> list[dict]:
    """One point per (family, label): seeds averaged."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        by.setdefault((family(r), label(r)), []).append(r)
    out = []
    for (fam, lab), rs in by.items():
        out.append({"family": fam, "label": lab, "seeds": len(rs),
                    "bpb": statistics.mean(r["bpb"] for r in rs),
                    "bpb_sd": statistics.stdev([r["bpb"] for r in rs]) if len(rs) > 1 else None,
                    "rate": statistics.mean(r["rate"] for r in rs),
                    "fpb": statistics.mean(r["train_flops_per_byte"] for r in rs) / 3.0,  # forward
                    "train_flops": statistics.mean(r["train_flops"] for r in rs),
                    "train_bytes": statistics.mean(r["train_bytes"] for r in rs),
                    "space_align": statistics.mean(r["space_align"] or 0 for r in rs),
                    "commits": sorted({r["commit"] for r in rs})})
    return sorted(out, key=lambda p: (p["family"], p["fpb"]))


def interpolate(curve: list[dict], x: float) -> float | None:
    """The fixed-rate curve's bpb at x FLOPs/byte (piecewise linear; None outside its range)."""
    curve = sorted(curve, key=lambda p: p["fpb"])
    for a, b in zip(curve, curve[1:]):
        if a["fpb"] <= x <= b["fpb"]:
            w = (x - a["fpb"]) / (b["fpb"] - a["fpb"])
            return a["bpb"] + w * (b["bpb"] - a["bpb"])
    return None


def plot(pts: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fam in sorted({p["family"] for p in pts}):
        ps = sorted((p for p in pts if p["family"] == fam), key=lambda p: p["fpb"])
        style = "-o" if len(ps) > 1 else "s"
        ax.plot([p["fpb"] / 1e6 for p in ps], [p["bpb"] for p in ps], style, label=fam, ms=5)
        for p in ps:
            ax.annotate(f"{p['rate']:.2f}", (p["fpb"] / 1e6, p["bpb"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("forward MFLOPs per byte (at the achieved rate; labels: rate)")
    ax.set_ylabel("test bpb")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def shown_command(r: dict) -> str:
    """A recorded command with its data folder written as DATA_ROOT/<corpus>: where the corpora
    lie differs from machine to machine."""
    data = r.get("data") or ""
    return r["command"].replace(data, f"DATA_ROOT/{Path(data).name}") if data else r["command"]


def controller_section(folder: Path) -> list[str]:
    """The Lagrange controller holding requested rates (`bench/controller_check.py`), from the
    controller_*.json in `folder` (the results root the frontier's folder lies in)."""
    paths = sorted(folder.glob("controller_*.json"))
    if not paths:
        return []
    lines = ["## Holding a requested rate with the Lagrange controller", "",
             "`objective.rate=lagrange` (no penalty weight), preset `small`; means over the second half",
             "of training. *Worst record*: the largest miss of one logged record (a 10-step average).", "",
             "| corpus | target | steps | expected rate | sampled rate | worst record | final price (nats/chunk) | command |",
             "|---|---|---|---|---|---|---|---|"]
    for p in paths:
        r = json.loads(p.read_text())
        lines.append(f"| {Path(r['data']).name} | {r['target']:g} | {r['steps']} | {r['expected_rate']:.4f} "
                     f"| {r['sampled_rate']:.4f} | {r['max_record_deviation']:.4f} | {r['final_price']:.4f} "
                     f"| `{shown_command(r)}` |")
    return lines + [""]


def vocab_section(folder: Path) -> list[str]:
    """Learned vocabularies against BPE at the same rate (`lab/scripts/vocab_report.sh`), from the
    JSON in `folder` (vocab/ beside the frontier's results)."""
    paths = sorted(folder.glob("*.json"))
    if not paths:
        return []
    lines = ["## Learned vocabularies against BPE at the same rate", "",
             "`rltok vocab` on 200k bytes of each test split (sampled boundaries), against a superword BPE",
             "(`line` pre-tokenisation) sized to the same rate on the same text. *multi-word*: the chunk",
             "still holds whitespace after stripping its ends; *whole word*: exactly one word, starting and",
             "ending at word edges; *boundary agreement*: share of learned chunk ends that are BPE token",
             "ends, next to the share expected by chance (the BPE rate). Where the learned rate is below what",
             "BPE can reach on the text (about 0.17 on code-py, 0.19 on docs-en with 65k merges), BPE is shown at",
             "its lowest rate. Details per run are linked.", "",
             "| corpus | run | rate (BPE rate) | bytes/chunk | distinct chunks | multi-word (BPE) | whole word (BPE) "
             "| top-1k coverage (BPE) | boundary agreement (chance) | learned chunks in BPE vocab |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in paths:
        r = json.loads(p.read_text())
        corpus, _, run = p.stem.partition("__")
        le, bp, ov = r["learned"], r.get("bpe") or {}, r.get("overlap") or {}

        def pct(x):
            return "–" if x is None else f"{100 * x:.1f}%"
        lines.append(f"| {corpus} | [{run}](../results/vocab/{p.stem}.md) | {le['rate']:.3f} ({bp.get('rate', float('nan')):.3f}) | {le['bytes_per_chunk']:.2f} "
                     f"| {le['distinct']:,} | {pct(le['multi_word'])} ({pct(bp.get('multi_word'))}) "
                     f"| {pct(le['whole_word'])} ({pct(bp.get('whole_word'))}) "
                     f"| {pct(le['coverage_top_1k'])} ({pct(bp.get('coverage_top_1k'))}) "
                     f"| {pct(ov.get('boundary_recall'))} ({pct(ov.get('boundary_recall_chance'))}) "
                     f"| {pct(ov.get('in_bpe_vocab'))} |")
    return lines + [""]


def render(results: Path = RESULTS) -> str:
    from rltok.analysis.compare import git_commit

    lines = ["# Supertokens: letting the policy choose how much to compress", "",
             "Generated by `lab/scripts/frontier_report.py` from `lab/results/frontier/`; do not edit by hand.", "",
             "Every run trained at the same total training compute (3.48e12 FLOPs = 1M bytes of the rate-0.2",
             "model; preset `small`, seed 0 unless noted), evaluated on the test split. A rule that spends fewer",
             "FLOPs per byte sees more bytes. Compute-aware runs have no rate target: each chunk costs the policy",
             "`objective.rate.compute_price` bits per MFLOP of the chunk-level network it adds, and training stops when",
             "the FLOPs spent at the rates actually drawn reach the budget (`train.flops_budget`). x = forward",
             "FLOPs per byte at the achieved rate (the model's inference cost).", "",
             "Commands: `bash lab/scripts/frontier_sweep.sh DATA_ROOT && python lab/scripts/frontier_report.py --collect`",
             "(`DATA_ROOT`: the folder holding the prepared corpora code-py/ and docs-en/, each with `train.*`,",
             "`val.*` and `test.*` files).",
             f"Rendered at commit `{git_commit()}`.", ""]
    for corpus in sorted(p for p in results.glob("*") if p.is_dir()):
        runs = [json.loads(p.read_text()) for p in sorted(corpus.glob("*_s*.json"))]
        pts = points(runs)
        fixed = [p for p in pts if p["family"] == "rl fixed rate"]
        lines += [f"## {corpus.name}", "",
                  "| rule | setting | seeds | test bpb | rate | fwd MFLOPs/byte | train bytes | space align | fixed-rate RL bpb at same FLOPs | Δ bpb |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in pts:
            ref = interpolate(fixed, p["fpb"]) if p["family"] != "rl fixed rate" else None
            ref_s = "–" if ref is None else f"{ref:.4f}"
            delta_s = "–" if ref is None else f"{p['bpb'] - ref:+.4f}"
            bpb = f"{p['bpb']:.4f}" + (f" ± {p['bpb_sd']:.4f}" if p["bpb_sd"] is not None else "")
            lines.append(f"| {p['family']} | {p['label']} | {p['seeds']} | {bpb} | {p['rate']:.3f} | {p['fpb'] / 1e6:.3f} "
                         f"| {p['train_bytes'] / 1e6:.2f}M | {p['space_align']:.3f} "
                         f"| {ref_s} | {delta_s} |")
        png = corpus / "frontier.png"
        plot(pts, png, f"{corpus.name}: test bpb vs inference FLOPs at equal training compute")
        lines += ["", f"![{corpus.name} frontier](../results/frontier/{corpus.name}/frontier.png)", "",
                  f"Commits of the runs: {', '.join(f'`{c}`' for c in sorted({c for p in pts for c in p['commits']}))}.", ""]
    lines += controller_section(results.parent)
    lines += vocab_section(results.parent / "vocab")
    notes = ROOT / "lab" / "notes" / "supertokens.md"
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--collect", action="store_true", help="copy runs/frontier/<corpus>/*.json first")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "frontier"), help="what --collect copies from (default: runs/frontier)")
    ap.add_argument("--results-dir", default=str(RESULTS), help="the per-run JSON, one folder per corpus, and where "
                                                                 "the plots go (default: lab/results/frontier)")
    ap.add_argument("--out", default=str(ROOT / "lab" / "reports" / "SUPERTOKENS.md"), help="the report (default: lab/reports/SUPERTOKENS.md)")
    args = ap.parse_args()
    results = Path(args.results_dir)
    if args.collect:
        for corpus in sorted(Path(args.runs).glob("*")):
            if corpus.is_dir():
                dest = results / corpus.name
                dest.mkdir(parents=True, exist_ok=True)
                for p in corpus.glob("*_s*.json"):
                    shutil.copy(p, dest / p.name)
    out_md = Path(args.out)
    out_md.write_text(render(results))
    print(out_md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
