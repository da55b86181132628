"""Does a trained hierarchy use its chunk level at all? For each run folder, the val bpb with the
cuts its own rule draws, and with no free cut (only the forced first and last bytes close a chunk,
so every byte but the last gets the first byte's chunk), and with the chunk path switched off (what
the main network sends back up set to zero, so the byte layers alone predict). A model whose bpb
does not move with no free cut predicts without regard to which chunk each byte receives; one whose
bpb does not move with the path off does not use the chunk level at all.

    python lab/scripts/chunk_path_use.py 'study/docs-en/runs/C1e12__*' --data data/docs-en --out use.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from rltok.data.corpus import load_eval_bytes
from rltok_lab.run_folders import expand, trainer_folder
from rltok_lab.tables_file import commanded_table
from rltok.training.loading import load_checkpoint


def bits(logits: torch.Tensor, y: torch.Tensor) -> float:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1)).item() / math.log(2)


def use(run: Path, x: torch.Tensor, y: torch.Tensor) -> dict | None:
    model, cfg, _, _ = load_checkpoint(trainer_folder(run))
    if getattr(model, "chunker", None) is None:
        return None  # a flat model: no chunk level
    model.eval()
    with torch.no_grad():
        out = model(x, generator=torch.Generator().manual_seed(0))
        none = torch.zeros_like(out.boundaries.b)
        none[:, 0] = none[:, -1] = True
        alone = model.score(x, none)
        off = model.up.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
        try:
            cut_off = model(x, generator=torch.Generator().manual_seed(0))
        finally:
            off.remove()
    return {"run": run.name, "rule": cfg.model.chunker.kind, "rate": float(out.boundaries.b[:, 1:-1].float().mean()),
            "bpb": bits(out.logits, y), "bpb_no_cuts": bits(alone.logits, y), "bpb_path_off": bits(cut_off.logits, y)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (quoted patterns with * are expanded)")
    ap.add_argument("--data", required=True, help="the corpus folder the runs trained on")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    runs = expand(args.runs)
    if not runs:
        raise SystemExit(f"chunk_path_use: no run folder matches {' '.join(args.runs)}")
    w = load_eval_bytes(args.data, "val", max_bytes=args.windows * (args.seq_len + 1)).long()
    w = w[: args.windows * (args.seq_len + 1)].view(args.windows, args.seq_len + 1)
    rows = [r for r in (use(run, w[:, :-1], w[:, 1:]) for run in runs) if r is not None]
    lines = ["| run | rule | rate | val bpb, own cuts | val bpb, no free cut | difference | val bpb, chunk path off "
             "| difference |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['rule']} | {r['rate']:.3f} | {r['bpb']:.3f} | {r['bpb_no_cuts']:.3f} | "
              f"{r['bpb_no_cuts'] - r['bpb']:+.3f} | {r['bpb_path_off']:.3f} | {r['bpb_path_off'] - r['bpb']:+.3f} |"
              for r in rows]
    commanded_table("chunk_path_use.py", argv if argv is not None else sys.argv[1:], lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
