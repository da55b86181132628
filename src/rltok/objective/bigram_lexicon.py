"""A bigram lexicon prior: the code length of a segmentation when each unit is predicted from the
unit before it.

Why: under the unigram lexicon (rl/lexicon.py) a recurring multi-word string is cheapest as one
unit, so its optimum memorises long strings (Bayesian word segmentation's known undersegmentation;
on code "self.assertEqual(" as one unit). With the unit before as context the string is already
cheap as a sequence of short units ("self", ".", "assertEqual", "("), each well predicted by the
previous one, so the model has no reason to glue them: a hierarchical Dirichlet-process bigram

    p(w | v) = (n_vw + b * p1(w)) / (n_v + b)

with n_vw the (decayed) count of w right after v among the policy's recent units, n_v the count
of v as a context, b the concentration and p1 the unigram lexicon's p(w) as the back-off. The
first unit of a window has an unknown predecessor: it gets one shared start context.

A flip changes the unit it merges or splits and the context of the unit after it, so its cost
change reaches one unit further than the unigram's; `flip_deltas` re-costs every single flip
exactly (slower than the unigram's closed form, fine for diagnostics). EM over segmentations
(`update_posterior`) is the unigram's only.
"""

from __future__ import annotations

import math

import torch

from rltok.objective.lexicon import ChunkLexicon

_PAIR_MULT = 0x9E3779B1  # odd: mixes the context row into the pair row
_START = 0  # the context row of a window's first unit


class BigramLexicon(ChunkLexicon):
    def __init__(self, size: int = 1 << 20, concentration: float = 100.0, mean_len: float = 5.0,
                 decay: float = 0.995, lag: int = 0, collapse_blanks: bool = False, device=None):
        super().__init__(size, concentration, mean_len, decay, lag, collapse_blanks, device)
        self.pair_counts = torch.zeros(size, device=device)
        self.context_counts = torch.zeros(size, device=device)

    def _units(self, x: torch.Tensor, u: torch.Tensor):
        """For unit ends u (the window's last byte ends one too): the start of the unit holding each
        position, its row if it ended there, and the row of the unit before it (the start context
        for a window's first unit)."""
        t = torch.arange(x.shape[1], device=x.device).expand_as(x)
        start = self.chunk_starts(self.ends(u))
        row = self.rows(x, t, start)
        before = torch.gather(row, 1, (start - 1).clamp(min=0))
        context = torch.where(start > 0, before, torch.full_like(before, _START))
        return start, row, context

    def _pair_rows(self, context: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return torch.remainder(context * _PAIR_MULT + row, self.size)

    def unit_costs(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """-log p(unit | unit before) at each unit's last byte (units closed by b and by the window's end)."""
        t = torch.arange(x.shape[1], device=x.device).expand_as(x)
        start, row, context = self._units(x, b)
        log_p1 = -self.span_costs(x, start, t, rows=row)  # the unigram lexicon: the back-off
        n_pair = self.pair_counts[self._pair_rows(context, row)]
        n_context = self.context_counts[context]
        log_p = torch.logaddexp(n_pair.clamp(min=1e-30).log(), log_p1 + math.log(self.concentration)) \
            - torch.log(n_context + self.concentration)
        return torch.where(self.ends(b), -log_p, torch.zeros_like(log_p))

    @torch.no_grad()
    def update(self, x: torch.Tensor, b: torch.Tensor) -> None:
        """Count the complete units (unigram) and each complete unit after the unit before it."""
        ends = self.unit_ends(b)
        _, row, context = self._units(x, ends)
        pairs, contexts = self._pair_rows(context, row)[ends], context[ends]
        one = torch.ones_like(pairs, dtype=self.pair_counts.dtype)
        self._count(x, row[ends], one)  # the unigram counts, as ChunkLexicon.update counts them
        self.pair_counts.mul_(self.decay).index_add_(0, pairs, one)
        self.context_counts.mul_(self.decay).index_add_(0, contexts, one)

    @torch.no_grad()
    def flip_deltas(self, x: torch.Tensor, b: torch.Tensor, rows_per_pass: int = 256) -> torch.Tensor:
        """(B, T): the change in total code length when b_t alone is flipped, by re-costing every
        flipped segmentation (exact; T segmentations per window)."""
        bsz, length = b.shape
        base = self.costs(x, b).sum(1)
        out = torch.zeros(bsz, length, device=b.device)
        eye = torch.eye(length, dtype=torch.bool, device=b.device)
        for i in range(bsz):
            for lo in range(0, length, rows_per_pass):
                flips = eye[lo : lo + rows_per_pass]
                flipped = b[i].bool().expand_as(flips) ^ flips
                out[i, lo : lo + len(flips)] = self.costs(x[i].expand(len(flips), -1), flipped).sum(1) - base[i]
        return out

    def unit_posteriors(self, x, max_len=None, rows=None):
        raise NotImplementedError("EM over segmentations is the unigram lexicon's only")

    update_posterior = unit_posteriors

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pair_counts": self.pair_counts.clone(),
                "context_counts": self.context_counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        if "pair_counts" not in state:
            raise ValueError("the checkpoint's lexicon is a unigram one; objective.lexicon_context=bigram needs "
                             "a bigram lexicon's counts")
        super().load_state_dict(state)
        self.pair_counts.copy_(state["pair_counts"])
        self.context_counts.copy_(state["context_counts"])
