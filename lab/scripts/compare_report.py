"""Collect the comparison runs (runs/<section>/<corpus>/*_s*.json, from lab/scripts/compare_sweep.sh
and lab/scripts/embedding_sweep.sh) into lab/results/ and render lab/reports/COMPARISON.md: one table per section
and corpus, plots, and a computed verdict (rl against every rule; the best byte models against
the BPE-token transformer).

    .venv/bin/python lab/scripts/compare_report.py [--runs runs] [--corpora code-py docs-en]

The per-run JSON files are copied to lab/results/<section>/<corpus>/ (small; the checkpoints
stay in runs/), so the report can be regenerated from the repository alone with --from-docs.
Hand-written interpretation lives in lab/notes/comparison.md and is included verbatim.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]

from rltok.analysis.compare import markdown_table, plot, summarize  # noqa: E402


def verdict(rows: list[dict], method: str = "rl") -> list[str]:
    """`method` (or the one method that is `method@<overrides>`) against every other row."""
    by = {r["method"]: r for r in rows}
    if method not in by:
        with_overrides = [m for m in by if m.startswith(method + "@")]
        if len(with_overrides) != 1:
            return []
        method = with_overrides[0]
    ours = by[method]
    lines = []
    for other in rows:
        if other["method"] == method:
            continue
        diff = other["bpb_mean"] - ours["bpb_mean"]
        spread = max(ours["bpb_std"] or 0.0, other["bpb_std"] or 0.0)
        if not spread:  # one seed on both sides: an order, not a verdict
            word = "is ahead of (one seed each, no spread to judge by)" if diff > 0 else \
                "is behind (one seed each, no spread to judge by)"
        elif abs(diff) <= 2 * spread:
            word = "ties (within 2 std of the seeds)"
        else:
            word = "beats" if diff > 0 else "loses to"
        lines.append(f"- `{method}` {word} `{other['method']}`: {ours['bpb_mean']:.4f} vs {other['bpb_mean']:.4f} "
                     f"bpb (Δ = {diff:+.4f}{', seeds ' + str(ours['seeds']) + '/' + str(other['seeds']) if spread else ''}"
                     f"{paired(ours, other)})")
    return lines


def paired(ours: dict, other: dict) -> str:
    """The difference paired by seed (same seed: same initialisation and data order), as mean ± sd
    over the seeds both rows ran; empty below two common seeds."""
    a, b = ours.get("bpb_by_seed") or {}, other.get("bpb_by_seed") or {}
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return ""
    d = [b[s] - a[s] for s in common]
    return f"; paired by seed {statistics.mean(d):+.4f} ± {statistics.stdev(d):.4f} over {len(common)}"


# (results folder under lab/results and runs/, section title, the verdict it computes: the method
# (or methods) the others are set against, "gap" for the best byte models against the BPE-token
# transformer, or "bpe_grid" for a tuned BPE-token grid against the byte models)
SECTIONS = [
    ("compare", "Boundary rules (`rl` here: the published recipe, today's `rl_reference`)", "rl"),
    ("boundaries/b1000000", "Learned boundaries (the lexicon recipe) against the fixed rules: 1M-byte budget", "rl"),
    ("boundaries/b4000000", "Learned boundaries (the lexicon recipe) against the fixed rules: 4M-byte budget", "rl"),
    ("boundaries_phase/b1000000", "The tokenizer phase (15% of the FLOPs on the encoder side alone) under learned, "
     "uniform, fixed and whitespace cuts, beside the same rules without it: 1M-byte budget",
     ("rl@objective.tokenizer_phase=0.15,objective.policy_lr_mult=3",
      "rl@model.target_rate=0.158,objective.tokenizer_phase=0.15,objective.policy_lr_mult=3")),
    ("phase_val/b1000000", "Choosing the tokenizer phase's settings (validation split, one seed): 1M-byte budget",
     "rl@objective.tokenizer_phase=0.15,objective.policy_lr_mult=3"),
    ("rate_price_val/b1000000", "A rate the rule picks (`objective.rate_price=loss_slope`) against uniform cuts at "
     "fixed rates (validation split, one seed): 1M-byte budget",
     "rl@objective.rate_price=loss_slope,objective.tokenizer_phase=0.15,objective.policy_lr_mult=3"),
    ("rate_price/b4000000", "A rate the rule picks against the fixed rates of the 4M runs: 4M-byte budget",
     "rl@objective.rate_price=loss_slope"),
    ("embedding/b1000000", "With a vocabulary's memory: 1M-byte budget", "gap"),
    ("embedding/b4000000", "With a vocabulary's memory: 4M-byte budget", "gap"),
    ("boundaries_vocab/b1000000", "Learned boundaries with a vocabulary's memory, at the whitespace rule's rate: "
     "1M-byte budget", "rl+ngram+cvocab"),
    ("boundaries_vocab/b4000000", "Learned boundaries with a vocabulary's memory, at the whitespace rule's rate: "
     "4M-byte budget", "rl+ngram+cvocab"),
    ("bpe_baseline/b1000000", "The BPE-token model tuned: vocabulary x depth, 1M-byte budget "
     "(lab/scripts/bpe_baseline_sweep.sh)", "bpe_grid"),
    ("bpe_baseline/b4000000", "The BPE-token model tuned: the 1M grid's three best per corpus, 4M-byte budget",
     "bpe_grid"),
]
# the byte models a tuned BPE-token model is held against: the sections of its budget with vocabularies
BYTE_MODELS_FOR = {"bpe_baseline/b1000000": ("embedding/b1000000", "boundaries_vocab/b1000000"),
                   "bpe_baseline/b4000000": ("embedding/b4000000", "boundaries_vocab/b4000000")}


def byte_model_runs(folders, corpus: str, results_root: Path) -> list[dict]:
    """Per-run JSON of several sections, one record per (method, seed): a run copied into two
    sections (a shared seed-0 run, say) counts once."""
    runs = {}
    for folder in folders:
        for f in sorted((results_root / folder / corpus).glob("*_s*.json")):
            r = json.loads(f.read_text())
            runs.setdefault((r["method"], r["seed"]), r)
    return list(runs.values())


def gap_to_tokens(rows: list[dict]) -> list[str]:
    """The best byte-level model of each family against the BPE-token transformer."""
    by = {r["method"]: r for r in rows}
    if "bpe_token" not in by:
        return []
    ref = by["bpe_token"]
    lines = []
    for family, test in (("hierarchical", lambda m: not m.startswith(("flat", "bpe_token"))),
                         ("flat byte", lambda m: m.startswith("flat"))):
        cands = [r for r in rows if test(r["method"])]
        if not cands:
            continue
        best = min(cands, key=lambda r: r["bpb_mean"])
        spread = max(ref["bpb_std"] or 0.0, best["bpb_std"] or 0.0)
        lines.append(f"- best {family} model `{best['method']}`: {best['bpb_mean']:.4f} bpb against "
                     f"`bpe_token` {ref['bpb_mean']:.4f} (Δ = {best['bpb_mean'] - ref['bpb_mean']:+.4f}; "
                     f"seeds {best['seeds']}/{ref['seeds']}, largest seed sd {spread:.4f})")
    return lines


def tuned_bpe_against_bytes(rows: list[dict], byte_rows: list[dict]) -> list[str]:
    """The best BPE-token configuration of a grid against the best byte-level model (any family)
    and the best byte-level model with no more parameters, each margin in seed sds. Byte models
    run beside the grid (tables shrunk to a BPE model's parameters) count with `byte_rows`."""
    byte_rows = byte_rows + [r for r in rows if not r["method"].startswith("bpe_token")]  # param-matched runs
    rows = [r for r in rows if r["method"].startswith("bpe_token")]
    if not rows:
        return []
    best = min(rows, key=lambda r: r["bpb_mean"])
    lines = [f"- best BPE-token configuration: `{best['method']}`, {best['bpb_mean']:.4f} bpb "
             f"({best['seeds']} seeds, sd {best['bpb_std'] or 0:.4f}), {best['params'] / 1e6:.2f}M parameters"]
    byte = [r for r in byte_rows if not r["method"].startswith("bpe_token")]
    for label, cands in (("at equal FLOPs", byte),
                         ("at equal FLOPs and no more parameters", [r for r in byte if r["params"] <= best["params"]])):
        if not cands:
            lines.append(f"- best byte-level model {label}: none in the comparison")
            continue
        b = min(cands, key=lambda r: r["bpb_mean"])
        spread = max(best["bpb_std"] or 0.0, b["bpb_std"] or 0.0)
        gap = b["bpb_mean"] - best["bpb_mean"]
        margin = f"{gap / spread:+.1f} of the larger seed sd, {spread:.4f}" if spread else "one seed: no sd"
        lines.append(f"- best byte-level model {label}: `{b['method']}`, {b['bpb_mean']:.4f} bpb, "
                     f"{b['params'] / 1e6:.2f}M parameters: {gap:+.4f} bpb against the tuned BPE-token model "
                     f"({margin})")
    return lines


def render_corpus(name: str, corpus: str, src: Path, from_docs: bool, only, kind: str | tuple[str, ...],
                  results: Path = ROOT / "lab" / "results") -> list[str]:
    results_root, dest = results, results / name / corpus
    if not from_docs and not any(src.glob("*_s*.json")):
        from_docs = True  # a section not re-run: render it from the JSON already in lab/results/
    src = dest if from_docs else src
    files = sorted(src.glob("*_s*.json"))
    if not files:
        return [f"### {corpus}", "", "No finished runs.", ""]
    dest.mkdir(parents=True, exist_ok=True)
    results = []
    for f in files:
        r = json.loads(f.read_text())
        if only and r["method"] not in only:
            continue
        results.append(r)
        if not from_docs:
            slim = {k: v for k, v in r.items() if k != "config"}
            slim["data"] = f"DATA/{Path(r['data']).name}"  # the corpus, not where this machine keeps it
            slim["config"] = {"model": r["config"]["model"], "objective": r["config"]["objective"],
                              "train": r["config"]["train"]}
            (dest / f.name).write_text(json.dumps(slim, indent=2))
    rows = summarize(results)
    plots = plot(results, dest, corpus)
    first = results[0]
    commits = sorted({r["commit"] for r in results})
    tr = first["config"]["train"]
    md = [f"### {corpus} ({first['split']} split)", "",
          f"Budget: {statistics.mean(r.get('budget_flops', r['train_flops']) for r in results):.3g} training "
          f"FLOPs per run, spent as counted step by step at the chunks each step drew (column `spend/budget`; "
          f"`(!)` marks a run more than 2% off); "
          f"preset `small` (byte width {first['config']['model']['d_byte']}, chunk width "
          f"{first['config']['model']['d_chunk']}), seq_len {tr['seq_len']}, batch {tr['batch_size']}, "
          f"lr {tr['lr']}, every method with the same optimiser settings and no per-method tuning. "
          f"Commits: {', '.join(f'`{c}`' for c in commits)}.", "",
          markdown_table(rows, first["split"]), ""]
    snr = [(r["method"], r["seed"], r["grad_snr"]) for r in results if r.get("grad_snr") is not None]
    if snr:
        md += ["Gradient SNR of the rl runs' own estimator at their final checkpoint: " +
               ", ".join(f"{m} s{s}: {v:.3f}" for m, s, v in snr) + ".", ""]
    if kind == "bpe_grid":
        byte_rows = summarize(byte_model_runs(BYTE_MODELS_FOR[name], corpus, results_root))
        v = tuned_bpe_against_bytes(rows, byte_rows)
        if v:
            where = " and ".join(f"`{f}`" for f in BYTE_MODELS_FOR[name])
            md += [f"Against the byte-level models of {where} (mean over seeds):", "", *v, ""]
    elif kind != "gap":
        for ours in (kind,) if isinstance(kind, str) else kind:
            v = verdict(rows, ours)
            if v:
                md += [f"Verdict for `{ours}` (mean over seeds):", "", *v, ""]
    else:
        v = gap_to_tokens(rows)
        if v:
            md += ["Gap to the BPE-token transformer (mean over seeds):", "", *v, ""]
    # the report lives in lab/reports; it shows the main comparison's plots (tracked in lab/results),
    # the other sections' are drawn again by `python -m rltok_lab.regenerate --only compare`
    if name == "compare":
        md += [f"![bpb vs FLOPs, {corpus}](../results/{name}/{corpus}/{p.name})" for p in plots] + [""]
    elif plots:
        md += [f"Plots ({', '.join(p.name for p in plots)}): drawn with the tables by "
               "`python -m rltok_lab.regenerate --only compare`, into its unpacked results folder.", ""]
    return md


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default=str(ROOT / "runs"), help="the folder holding compare/ and embedding/")
    ap.add_argument("--corpora", nargs="+", default=["code-py", "docs-en"])
    ap.add_argument("--from-docs", action="store_true", help="use the JSON already copied into lab/results/")
    ap.add_argument("--only", nargs="*", help="methods to include (default: all found)")
    ap.add_argument("--results-dir", default=str(ROOT / "lab" / "results"),
                    help="where the per-run JSON is copied (read with --from-docs) and the plots go (default: lab/results)")
    ap.add_argument("--out", default=str(ROOT / "lab" / "reports" / "COMPARISON.md"))
    ap.add_argument("--notes", default=str(ROOT / "lab" / "notes" / "comparison.md"))
    ap.add_argument("--title", default="Byte-level models at equal training compute")
    args = ap.parse_args()
    out_md = Path(args.out)
    md = [f"# {args.title}", "",
          "The commands and method names here use the flat config keys of the time (`objective.rate_price`,",
          "`objective.flip_rate_control`, ...), which still load; [CONFIG.md](../../docs/CONFIG.md#old-flat-keys) gives",
          "each one's nested key today.", "",
          f"Generated by `python lab/scripts/compare_report.py {' '.join(sys.argv[1:])}` from the per-run JSON in",
          "`lab/results/<section>/<corpus>/`; do not edit by hand (interpretation: the notes section below).", "",
          "Rates are boundaries per byte over the positions a rule decides (first and last forced positions "
          "left out), measured on the test split with the rule the model trained with (sampled where it "
          "samples); `rate (train)` is the mean over the last logged training steps. `greedy` columns: the "
          "same checkpoint with its sampling rule replaced by thresholding p > 0.5. `+ngram`: hashed byte "
          "3..6-gram embeddings (32768 rows per n) added to each byte's embedding; `+cvocab`: a hashed "
          "chunk-content vocabulary (32768 rows) added to each chunk vector; `depth`: layers (hierarchical: "
          "encoder+main+decoder), `width`: model width (hierarchical: byte/chunk), `vocab`: the BPE-token "
          "model's BPE vocabulary, or a byte model's n-gram rows / chunk-vocabulary rows (– in runs recorded "
          "before these columns); `state MB`: weights, gradients "
          "and AdamW moments in fp32; `peak mem MB`: the training process's peak resident set on a CPU (the "
          "allocator's peak on a GPU).", ""]
    for name, title, kind in SECTIONS:
        md += [f"## {title}", ""]
        for corpus in args.corpora:
            md += render_corpus(name, corpus, Path(args.runs) / name / corpus, args.from_docs, args.only, kind,
                                Path(args.results_dir))
    notes = Path(args.notes)
    if notes.exists():
        md += ["## Notes", "", notes.read_text().strip(), ""]
    out_md.write_text("\n".join(md))
    print(out_md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
