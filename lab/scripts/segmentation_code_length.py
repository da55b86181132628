"""Which fixed segmentations does the lexicon prior find cheapest? For each rule, count a fresh
lexicon (the unigram one, objective/lexicon.py; the bigram column of older results came from the
removed bigram lexicon) on training windows cut by
that rule, costing each batch before counting it (as in training), and report the code length in
nats per byte over the second half: what the lexicon objective would pay if the policy cut that
way for good. A rule with a lower number is one the objective prefers, whatever the policy can find.

    .venv/bin/python lab/scripts/segmentation_code_length.py DATA/code-py [--bytes 3000000] [--out FILE]

Rules: the whitespace rule, character-class runs (units are runs of name bytes, of blanks, and
single other bytes), a cut at every blank, uniform cuts at 0.2, and a cut every 5 bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]
sys.path.insert(0, str(ROOT / "scripts"))

from rltok.data.corpus import load_eval_bytes  # noqa: E402
from rltok.objective.lexicon import ChunkLexicon  # noqa: E402
from token_alignment_rules import class_runs, whitespace_rule  # noqa: E402


def rules(gen: torch.Generator) -> dict:
    """Each rule: (B, T) bytes -> (B, T) unit ends (byte t is the last of a unit)."""
    def run_ends(x):
        starts = class_runs(x)
        ends = torch.zeros_like(starts)
        ends[:, :-1] = starts[:, 1:]
        return ends

    return {"whitespace": whitespace_rule, "class runs": run_ends,
            "every blank": lambda x: (x == 32) | (x == 9) | (x == 10),
            "uniform 0.2": lambda x: torch.rand(x.shape, generator=gen) < 0.2,
            "every 5th byte": lambda x: (torch.arange(x.shape[1]) % 5 == 4).expand_as(x)}


def code_length(lexicon: ChunkLexicon, x: torch.Tensor, rule, batch: int = 16) -> float:
    """Nats per byte over the second half of the windows, each batch costed before it is counted."""
    total, n = 0.0, 0
    for i in range(0, len(x), batch):
        xb = x[i : i + batch]
        b = rule(xb)
        if i >= len(x) // 2:
            total += lexicon.costs(xb, b).sum().item()
            n += xb.numel()
        lexicon.update(xb, b)
    return total / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", help="a folder with a train.* file")
    ap.add_argument("--bytes", type=int, default=3_000_000)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--out", help="write the result as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    train = torch.as_tensor(load_eval_bytes(args.data, "train", args.bytes), dtype=torch.long)
    x = train[: len(train) // args.seq_len * args.seq_len].view(-1, args.seq_len)
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for name, rule in rules(gen).items():
        rows[name] = {"rate": rule(x[:64]).float().mean().item(),
                      "unigram": code_length(ChunkLexicon(decay=0.995), x, rule)}
        print(f"{name:15s} rate {rows[name]['rate']:.3f}  unigram {rows[name]['unigram']:.3f} nats/byte", flush=True)
    result = {"data": Path(args.data).name, "bytes": x.numel(),
              "command": f"python lab/scripts/segmentation_code_length.py DATA/{Path(args.data).name} --bytes {args.bytes}",
              "rules": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
