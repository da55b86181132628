"""The size ladder of each model family (rltok.model.sizing) as a markdown table: per target
non-embedding size N, the achieved N, widths, depths and forward FLOPs per byte of the built model.

    .venv/bin/python lab/scripts/size_ladder.py [--n-min 2e4] [--n-max 2e6] [--points 7] [--seq-len 512]
                                            [--rate 0.2] [--flat-window 64] [--preset tiny]

FLOPs per byte are rltok.model.flops.model_flops of the model built on the meta device (causal
attention pairs), the hierarchy at --rate chunks per byte, the BPE-token model at --rate tokens
per byte (its real rate depends on the corpus and the vocabulary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]

from rltok.model.flops import model_flops  # noqa: E402
from rltok.model.sizing import built_model, geometric_sizes, ladder  # noqa: E402

# (family, base overrides, also costed with a window); the hierarchy with uniform cuts (a rule
# without layers, so its N is that of every fixed rule; the learned rule adds its policy's few)
FAMILIES = [("flat", [], True), ("bpe_token", [], False), ("hourglass", ["model.chunker=uniform"], False)]


def rows(family: str, base: list[str], windowed: bool, args) -> list[str]:
    out = []
    for rung in ladder(family, geometric_sizes(args.n_min, args.n_max, args.points), base, args.preset):
        model = built_model([*base, *rung.overrides], args.preset)
        facts = model.shape_facts()
        fpb = model_flops(model, args.seq_len, args.rate)["total"]
        cells = [family, f"{rung.target:.3g}", f"{rung.achieved:,}", f"{rung.achieved / rung.target:.3f}",
                 str(facts["width"]), str(facts["depth"]), f"{fpb / 1e6:.3f}"]
        if windowed and args.flat_window:  # the same shape with windowed attention
            windowed = built_model([*base, *rung.overrides, f"model.flat_window={args.flat_window}"], args.preset)
            cells.append(f"{model_flops(windowed, args.seq_len, args.rate)['total'] / 1e6:.3f}")
        else:
            cells.append("")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-min", type=float, default=2e4)
    ap.add_argument("--n-max", type=float, default=2e6)
    ap.add_argument("--points", type=int, default=7)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--flat-window", type=int, default=64, help="also cost the flat model with this window (0: no)")
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args()
    window = f"M FLOPs/byte, window {args.flat_window}" if args.flat_window else ""
    print(f"| family | N target | N achieved | ratio | width | depth | M FLOPs/byte | {window} |")
    print("|---|---|---|---|---|---|---|---|")
    for family, base, windowed in FAMILIES:
        print("\n".join(rows(family, base, windowed, args)))


if __name__ == "__main__":
    main()
