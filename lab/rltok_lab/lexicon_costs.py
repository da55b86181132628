"""Where a lexicon-trained policy cuts, and what each cut is worth to the lexicon, per byte class.

The lexicon recipe trains the boundary policy on the change each decision makes to the
segmentation's code length under the lexicon (objective/lexicon.py), with a price per boundary
that holds the rate. For a checkpoint this draws the policy's segmentation of some windows and,
at every free position, the exact change in code length from flipping that decision alone
(`LabLexicon.flip_deltas`, rltok_lab.lexicon_instruments), then reports per byte class
(rltok_lab.true_advantage.byte_classes):

* share: the class's share of the free positions;
* cut_rate: how often the policy cuts there;
* remove_cut: the mean change in nats when a cut there is removed (negative: the lexicon would
  rather not have it);
* add_cut: the mean change when a cut is added where the policy did not cut.

When the rate asked of the policy is above what the lexicon would choose, the surplus cuts go where
they cost least: the class with the smallest add_cut takes them whatever its remove_cut says.
"""

from __future__ import annotations

import torch

from rltok_lab.lexicon_instruments import LabLexicon
from rltok.objective.lexicon import ChunkLexicon
from rltok_lab.true_advantage import CLASSES, byte_classes


@torch.no_grad()
def lexicon_costs_by_class(model, lexicon: ChunkLexicon, x: torch.Tensor, seed: int = 0,
                           batch_size: int = 8) -> dict:
    """Per byte class: share, cut_rate, remove_cut and add_cut (see the module docstring), and the
    sampled rate, over the windows x (B, T) of byte ids."""
    lexicon = LabLexicon.of(lexicon)  # a checkpoint's training lexicon, with the instruments
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=x.device).manual_seed(seed)
    sums = {c: torch.zeros(4, dtype=torch.float64) for c in CLASSES}  # positions, cuts, removed, added
    cuts = free_total = 0.0
    for i in range(0, len(x), batch_size):
        xb = x[i : i + batch_size]
        bd = model(xb, mode="sample", generator=gen).boundaries
        b, free = bd.b.bool(), bd.free.bool()
        delta = lexicon.flip_deltas(xb, b).double().cpu()
        b, free = b.cpu(), free.cpu()
        cuts += (b & free).sum().item()
        free_total += free.sum().item()
        cls = torch.tensor([[CLASSES.index(c) for c in byte_classes(r)] for r in xb.cpu()])
        for k, c in enumerate(CLASSES):
            here, cut = (cls == k) & free, (cls == k) & free & b
            sums[c] += torch.stack([here.sum().double(), cut.sum().double(), delta[cut].sum(),
                                    delta[here & ~b].sum()])
    model.train(was_training)
    total = sum(s[0].item() for s in sums.values())
    classes = {}
    for c, s in sums.items():
        n, n_cut, removed, added = s.tolist()
        classes[c] = {"positions": int(n), "share": n / max(1.0, total), "cut_rate": n_cut / n if n else None,
                      "remove_cut": removed / n_cut if n_cut else None,
                      "add_cut": added / (n - n_cut) if n - n_cut else None}
    return {"rate": cuts / max(1.0, free_total), "classes": classes}


def format_lexicon_costs(result: dict) -> str:
    """A markdown table of `lexicon_costs_by_class`."""
    def cell(v, fmt):
        return "–" if v is None else format(v, fmt)

    lines = [f"sampled rate {result['rate']:.3f}; change in the lexicon's code length (nats) from flipping one "
             "decision", "", "| class | share | cut rate | remove a cut | add a cut |", "|---|---|---|---|---|"]
    for c, st in result["classes"].items():
        lines.append(f"| {c} | {st['share']:.3f} | {cell(st['cut_rate'], '.3f')} | {cell(st['remove_cut'], '+.2f')} "
                     f"| {cell(st['add_cut'], '+.2f')} |")
    return "\n".join(lines)
