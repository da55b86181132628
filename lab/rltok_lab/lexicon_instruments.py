"""The lexicon prior's research variants and instruments, beside the training lexicon
(rltok.objective.lexicon.ChunkLexicon, which training uses as it is and which has none of them).

`LabLexicon` is a ChunkLexicon with three options that training no longer offers (their config
keys were removed: they changed nothing the runs could tell apart), kept for the scripts and the
analysis that study them, and the instruments over whole segmentations:

Units one byte late (lag = 1): a boundary at byte t then closes the unit that ended at t - 1,
so the units are the spans from one boundary up to the byte before the next (" word", a whole
indentation run, "self", "."), and the cost of a unit is charged at the boundary that closes it.
A causal policy deciding at byte t sees that byte: it can tell that a unit has just ended (a "."
after "self", the first byte after an indentation run), not that the one it is inside ends here.
Under lag 0 a run of spaces split space by space is cheap and a causal rule cannot find its last
byte; under lag 1 the run's first and last boundaries are both visible when they are decided.

Blank runs as one unit (collapse_blanks): a unit's identity (its count-table row) and its base
probability read every run of repeated spaces or tabs as one byte, so "\\n    " and "\\n        "
are the same unit. How deep a line is indented is then not the lexicon's business (a side cost
the same for every segmentation that keeps the run whole), and splitting an indentation run into
single spaces costs one unit per piece instead of buying cheap ones: on code, where most spaces
are indentation, the policy's own counts otherwise lock onto "every space a chunk".

A bigram base (base="bigram"): a unit's bytes are spelled by a byte-bigram model, its first byte
by the unigram. Cutting between bytes a and b then costs about log p(b | a) - log p(b), their
pointwise mutual information, on top of the price of one more unit: cuts are cheap where the
text's byte statistics change (after a run, between an identifier and the punctuation after it)
and dear inside anything that hangs together byte to byte, a run of blanks included. The unigram
base charges a cut the same wherever it falls.

The instruments: `flip_deltas` (what flipping each decision alone changes in the total code
length, all at once and exactly: rltok_lab.lexicon_costs), `unit_posteriors` and
`update_posterior` (forward-backward over unit ends; an EM step of the unigram model), and
`best_segmentation` (Viterbi: the least code length plus a price per unit). With the default
options a LabLexicon costs and counts exactly as the training lexicon does; `LabLexicon.of`
turns a training lexicon (a checkpoint's) into one.
"""

from __future__ import annotations

import math

import torch

from rltok.model.chunk_vocab import span_hash
from rltok.objective.lexicon import HASHED_LEN, ChunkLexicon


def is_blank_byte(x: torch.Tensor) -> torch.Tensor:
    """Which byte ids are blanks (space or tab): the bytes that indent a line and space its tokens,
    whose runs the instruments treat as one thing (form feed is too rare in code to matter)."""
    return (x == 32) | (x == 9)

BASES = ("unigram", "bigram")  # how the base distribution spells a unit's bytes


class LabLexicon(ChunkLexicon):
    def __init__(self, size: int = 1 << 20, concentration: float = 100.0, mean_len: float = 5.0,
                 decay: float = 0.995, lag: int = 0, collapse_blanks: bool = False, base: str = "unigram",
                 device=None):
        if lag not in (0, 1) or base not in BASES:
            raise ValueError(f"LabLexicon needs lag 0 or 1 and base one of {BASES}")
        super().__init__(size, concentration, mean_len, decay, device)
        self.lag, self.collapse_blanks, self.base = lag, collapse_blanks, base
        self.byte_pair_counts = torch.zeros(256, 256, device=device) if base == "bigram" else None

    @classmethod
    def of(cls, lexicon: ChunkLexicon) -> LabLexicon:
        """A training lexicon seen through the instruments (default options), sharing its counts."""
        if isinstance(lexicon, LabLexicon):
            return lexicon
        lab = cls.__new__(cls)
        lab.__dict__.update(vars(lexicon))
        lab.lag, lab.collapse_blanks, lab.base, lab.byte_pair_counts = 0, False, "unigram", None
        return lab

    # ---- the options: which bytes spell a unit, where units end, the base distribution ----------
    def kept(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the bytes a unit is spelled with; without collapse_blanks all of them, with
        it all but a space or tab that repeats the byte before it (a unit's first byte is always
        spelled, see `rows`)."""
        keep = torch.ones_like(x, dtype=torch.bool)
        if self.collapse_blanks:
            blank = is_blank_byte(x)
            keep[:, 1:] = ~(blank[:, 1:] & (x[:, 1:] == x[:, :-1]))
        return keep

    def rows(self, x: torch.Tensor, end: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Count-table rows of the units x[start..end], (B, M) each: the content hash of the chunk
        vocabulary, or with collapse_blanks the same hash of the unit as spelled (`kept` bytes and
        its first byte), offsets and length counted in spelled bytes."""
        if not self.collapse_blanks:
            return span_hash(x, end, start, self.mult, self.size)
        max_len = self.mult.numel() - 1
        kept = self.kept(x)
        spelled = torch.cumsum(kept.long(), dim=1)  # spelled bytes in [0, t]
        pos = end.unsqueeze(-1) - torch.arange(max_len, device=x.device)  # (B, M, L): newest first
        flat = pos.clamp(min=0).flatten(1)
        here = torch.gather(kept, 1, flat).view(pos.shape) | (pos == start.unsqueeze(-1))
        offset = torch.gather(spelled, 1, end).unsqueeze(-1) - torch.gather(spelled, 1, flat).view(pos.shape)
        use = (pos >= start.unsqueeze(-1)) & here & (offset < max_len)
        byte = torch.gather(x.long(), 1, flat).view(pos.shape)
        length = torch.gather(spelled, 1, end) - torch.gather(spelled, 1, start) + 1
        h = ((byte + 1) * use * self.mult[1:][offset.clamp(0, max_len - 1)]).sum(-1) \
            + length.clamp(max=max_len + 1) * self.mult[0]
        return torch.remainder(h, self.size)

    def unit_ends(self, b: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the last byte of each complete unit of segmentation b (lag 1: the byte
        before each boundary; the unit that runs to the window's end is left open)."""
        if self.lag == 0:
            return b.bool()
        u = torch.zeros_like(b, dtype=torch.bool)
        u[:, :-1] = b[:, 1:].bool()
        return u

    @torch.no_grad()
    def costs(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(B, T) float: -log p(unit) in nats at the boundary that closes each unit (lag 0: its
        last byte; lag 1: the byte after it; the window's last unit at its last byte), 0 elsewhere."""
        if self.lag == 0:
            return super().costs(x, b)
        c = super().costs(x, self.unit_ends(b))
        moved = torch.zeros_like(c)
        moved[:, 1:] = c[:, :-1]
        moved[:, -1] += c[:, -1]  # the unit the window cuts off: no boundary closes it inside
        return moved

    def base_log_probs(self, x: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """log P0(x[start..end]): a geometric length in spelled bytes times the spelled bytes'
        probabilities (the first by the unigram; the later ones by the unigram or, with the bigram
        base, given the byte before)."""
        kept = self.kept(x)
        p_byte = self.byte_probs()
        log_pb = p_byte.log()[x.long()]  # a unit's first byte, and every byte under the unigram base
        log_inner = log_pb if self.base == "unigram" else self._log_p_given_previous(x, p_byte)
        pad = torch.nn.functional.pad
        cum = pad(torch.cumsum(log_inner * kept, dim=1), (1, 0))  # cum[:, i]: over spelled bytes < i
        spelled = pad(torch.cumsum(kept.float(), dim=1), (1, 0))
        first = ~torch.gather(kept, 1, start)  # an unspelled first byte is spelled all the same
        length = torch.gather(spelled, 1, end + 1) - torch.gather(spelled, 1, start) + first
        if self.base == "unigram":  # the first byte is in the sum when spelled, added when not
            spelled_sum = (torch.gather(cum, 1, end + 1) - torch.gather(cum, 1, start)) \
                + first * torch.gather(log_pb, 1, start)
        else:  # the first byte by the unigram, the later (spelled) ones given the byte before
            spelled_sum = (torch.gather(cum, 1, end + 1) - torch.gather(cum, 1, start + 1)) \
                + torch.gather(log_pb, 1, start)
        return spelled_sum + math.log(self.stop) + (length - 1) * math.log1p(-self.stop)

    def _log_p_given_previous(self, x: torch.Tensor, p_byte: torch.Tensor) -> torch.Tensor:
        """(B, T) log p(x_t | x_{t-1}) under the counted byte pairs, smoothed towards the unigram
        (one pseudo-count); position 0 has no byte before it and gets the unigram."""
        pairs = self.byte_pair_counts
        p = (pairs + p_byte) / (pairs.sum(1, keepdim=True) + 1)  # row a: p(b | a)
        xl = x.long()
        out = p_byte.log()[xl]
        out[:, 1:] = p.log()[xl[:, :-1], xl[:, 1:]]
        return out

    @torch.no_grad()
    def update(self, x: torch.Tensor, b: torch.Tensor) -> None:
        """Count the complete units of a sampled segmentation (those a boundary closes) and its bytes."""
        super().update(x, self.unit_ends(b))

    def _count(self, x: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> None:
        super()._count(x, rows, weights)
        if self.byte_pair_counts is not None:
            xl = x.long()
            pair = (xl[:, :-1] * 256 + xl[:, 1:]).flatten()
            flat = self.byte_pair_counts.view(-1)
            flat.mul_(self.decay).index_add_(0, pair, torch.ones(pair.numel(), device=x.device))

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.byte_pair_counts is not None:
            state["byte_pair_counts"] = self.byte_pair_counts.clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        if ("byte_pair_counts" in state) != (self.byte_pair_counts is not None):
            saved = "bigram" if "byte_pair_counts" in state else "unigram"
            raise ValueError(f"the saved lexicon spells units with a {saved} base, this one with a "
                             f"{self.base} base (LabLexicon(base=...))")
        rest = {k: v for k, v in state.items() if k != "byte_pair_counts"}
        super().load_state_dict(rest)
        if self.byte_pair_counts is not None:
            self.byte_pair_counts.copy_(state["byte_pair_counts"])

    # ---- instruments over whole segmentations -----------------------------------------------------
    @torch.no_grad()
    def flip_deltas(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(B, T): for every position t, the change in the segmentation's total code length when
        b_t alone is flipped, all at once and exactly: a flip merges two units or splits one, so
        it changes the cost of one or two units, the ones around t."""
        d = self._unit_flip_deltas(x, self.unit_ends(b))
        if self.lag:  # flipping b_t flips the unit end at t - 1; b_0 closes no unit
            d = torch.nn.functional.pad(d[:, :-1], (1, 0))
        return d

    def _unit_flip_deltas(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The same for unit ends u (the window's last byte always ends a unit: flipping it is 0)."""
        length = u.shape[1]
        t = torch.arange(length, device=u.device).expand_as(u)
        ends = self.ends(u)
        start = self.chunk_starts(u)  # first byte of the unit holding t
        first_end = torch.where(ends, t, torch.full_like(t, length)).flip(1).cummin(1).values.flip(1)  # >= t
        nxt = torch.cat([first_end[:, 1:], first_end[:, -1:]], dim=1)  # the first unit end >= t + 1
        right_start = (t + 1).clamp(max=length - 1)
        # cost(merged) - cost(left) - cost(right): removing a unit end at t; adding one is the negative
        split = self.span_costs(x, start, nxt) - self.span_costs(x, start, t) - self.span_costs(x, right_start, nxt)
        d = torch.where(u.bool(), split, -split)
        d[:, -1] = 0.0
        return d

    @staticmethod
    def unit_grid(bsz: int, length: int, max_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(start, end), each (B, T, max_len): the unit of k + 1 bytes that ends at byte e is
        [start, end][b, e, k] (start < 0 where it would begin before the window)."""
        e = torch.arange(length, device=device).view(1, length, 1)
        k = torch.arange(max_len, device=device).view(1, 1, max_len)
        return (e - k).expand(bsz, length, max_len), e.expand(bsz, length, max_len)

    def grid_rows(self, x: torch.Tensor, max_len: int = HASHED_LEN) -> torch.Tensor:
        """(B, T * max_len): the table rows of the units of `unit_grid`, flattened."""
        start, end = self.unit_grid(*x.shape, max_len, x.device)
        return self.rows(x, end.reshape(len(x), -1), start.clamp(min=0).reshape(len(x), -1))

    def span_log_probs(self, x: torch.Tensor, max_len: int = HASHED_LEN, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, max_len): log p of the unit of k + 1 bytes that ends at byte e, [b, e, k]
        (-inf where it would start before the window); `rows`: their `grid_rows` if at hand."""
        bsz, length = x.shape
        start, end = self.unit_grid(bsz, length, max_len, x.device)
        lp = -self.span_costs(x, start.clamp(min=0).reshape(bsz, -1), end.reshape(bsz, -1), rows)
        return lp.view(bsz, length, max_len).masked_fill(start < 0, float("-inf"))

    @torch.no_grad()
    def unit_posteriors(self, x: torch.Tensor, max_len: int = HASHED_LEN, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, max_len): the posterior probability, over all segmentations of each window into
        units of at most max_len bytes under the current lexicon, that the unit of k + 1 bytes
        ending at byte e is one of them (forward-backward over unit ends; `rows` as in
        `span_log_probs`)."""
        lp = self.span_log_probs(x, max_len, rows)
        bsz, length, _ = lp.shape
        neg = lp.new_full((bsz, max_len), float("-inf"))
        alpha = [lp.new_zeros(bsz)]  # alpha[i]: log-sum over segmentations of bytes < i
        for e in range(length):  # alpha[e + 1] = logsumexp_k alpha[e - k] + lp[e, k]
            prev = torch.stack(alpha[max(0, e + 1 - max_len):][::-1], dim=1)  # alpha[e], alpha[e - 1], ...
            prev = torch.cat([prev, neg[:, : max_len - prev.shape[1]]], dim=1)
            alpha.append(torch.logsumexp(prev + lp[:, e], dim=1))
        alpha = torch.stack(alpha, dim=1)  # (B, T + 1)
        beta = [lp.new_zeros(bsz)]  # built from the end: beta[i] = log-sum over segmentations of bytes >= i
        for i in range(length - 1, -1, -1):  # beta[i] = logsumexp_k lp[i + k, k] + beta[i + k + 1]
            ks = torch.arange(min(max_len, length - i), device=x.device)
            nxt = torch.stack(beta[-1: -len(ks) - 1: -1], dim=1)  # beta[i + 1], beta[i + 2], ...
            beta.append(torch.logsumexp(lp[:, i + ks, ks] + nxt, dim=1))
        beta = torch.stack(beta[::-1], dim=1)  # (B, T + 1)
        start, _ = self.unit_grid(bsz, length, max_len, x.device)
        before = torch.gather(alpha, 1, start.clamp(min=0).reshape(bsz, -1))
        post = before.view(bsz, length, max_len) + lp + beta[:, 1:].unsqueeze(-1) - alpha[:, -1:].unsqueeze(-1)
        return post.exp()

    @torch.no_grad()
    def best_segmentation(self, x: torch.Tensor, unit_price: float = 0.0, max_len: int = HASHED_LEN,
                          end_cost: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) bool unit ends of the segmentation into units of at most max_len bytes with the
        least code length plus `unit_price` nats per unit (Viterbi; a negative price buys more
        units: the lexicon's cheapest segmentation at a higher rate). `end_cost` (B, T), optional:
        nats more for a unit that ends at each byte (a prior on where units may end)."""
        cost = unit_price - self.span_log_probs(x, max_len)  # (B, T, max_len); inf before the window
        if end_cost is not None:
            cost = cost + end_cost.to(cost.dtype).unsqueeze(-1)
        bsz, length, _ = cost.shape
        best = [cost.new_zeros(bsz)]  # best[i]: least cost of bytes < i
        choice = []
        for e in range(length):
            k = min(max_len, e + 1)
            prev = torch.stack(best[e + 1 - k :][::-1], dim=1)  # best[e], best[e - 1], ...
            total = prev + cost[:, e, :k]
            value, arg = total.min(dim=1)
            best.append(value)
            choice.append(arg)
        choice = torch.stack(choice, dim=1).tolist()
        ends = torch.zeros(bsz, length, dtype=torch.bool)
        for row in range(bsz):
            e = length - 1
            while e >= 0:
                ends[row, e] = True
                e -= choice[row][e] + 1
        return ends.to(x.device)

    @torch.no_grad()
    def update_posterior(self, x: torch.Tensor, max_len: int = HASHED_LEN) -> None:
        """Count every possible unit by its posterior probability under the current lexicon (an EM
        step of the unigram model, as a unigram tokenizer is fitted) instead of by the policy's own
        segmentation: the lexicon then moves towards the text's shortest description, not towards
        whatever the policy cuts now (the policy's own counts reinforce any consistent cut)."""
        rows = self.grid_rows(x, max_len)  # hashed once: for the costs and for the counts
        post = self.unit_posteriors(x, max_len, rows)
        self._count(x, rows.flatten(), post.flatten().to(self.counts.dtype))
