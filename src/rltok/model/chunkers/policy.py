"""The learned boundary rule: an autoregressive Bernoulli policy whose decisions the objective's
estimator trains by reinforcement learning (model.chunker=rl)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.model.chunkers.base import Boundaries, Chunker, bernoulli_logp, fp32_linear
from rltok.model.noise import uniform  # noise that data-parallel ranks can slice from the global batch


# Largest (batch x positions x history patterns) table the window > 1 sampler builds (about 28
# bytes an entry at its peak, 2^23: ~235 MB; the reference's 147M shape at window 8 fits): beyond
# it (longer windows, larger batches) it samples one position after another instead.
SCAN_LIMIT = 1 << 23


class RLPolicy(Chunker):
    """Autoregressive Bernoulli boundary policy: logit_t = w . h_t + c + table[pattern_t], where
    pattern_t encodes its previous `window - 1` decisions (window=1: independent given the
    encoder). Given the decisions, every log-probability is computed in parallel (teacher forcing);
    sampling with window > 1 is a prefix scan over positions, on the device, with no host sync."""

    learned = True
    tracks_target = True
    stochastic = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, settings.window, rate or m.target_rate, settings.detach)

    def __init__(self, dim: int, window: int = 1, target_rate: float = 0.2, detach_input: bool = False):
        super().__init__()
        self.window = window
        self.detach_input = detach_input
        self.head = nn.Linear(dim, 1)
        nn.init.zeros_(self.head.weight)
        # start at the target rate, so neither the LM nor the rate loss sees a collapsed start
        nn.init.constant_(self.head.bias, math.log(target_rate / (1 - target_rate)) if target_rate < 1 else 6.0)
        self.history = nn.Embedding(2 ** (window - 1), 1) if window > 1 else None
        if self.history is not None:
            nn.init.zeros_(self.history.weight)
        # settled (objective.policy_until): its decisions are thresholded from then on, in training
        # and after. A buffer registered when it settles, so checkpoints keep it and a policy that
        # never settled has the state it always had; mirrored on the host so deciding never syncs.
        self.is_settled, self.cut_at, self.hold_at = False, 0.0, 0.0
        # whether the objective trains it this step (not in the warm start, not once settled):
        # otherwise it decides without a graph, so data parallel sees its weights unused
        self.learns = True

    def settle(self, cut: float = 0.0, hold: float = 0.0) -> None:
        """Stop sampling: every later decision is a boundary where the logit exceeds `cut`. `hold`
        > 0: the chunks per byte `follow_rate` holds by moving the cut (objective.settle_threshold=rate)."""
        device = self.head.weight.device
        for name, value in (("settled", torch.ones((), dtype=torch.bool, device=device)),
                            ("cut_logit", torch.tensor(float(cut), device=device)),
                            ("cut_hold", torch.tensor(float(hold), device=device))):
            if name in self._buffers:
                self._buffers[name].copy_(value)
            else:
                self.register_buffer(name, value)
        self.is_settled, self.cut_at, self.hold_at = True, float(cut), float(hold)

    def follow_rate(self, chunks_per_byte: float, gain: float = 0.1) -> None:
        """One step of holding the rate: move the cut by gain * ln(drawn / held) (more cuts than
        held: a higher cut). Called with the step's global rate, so every rank moves alike."""
        if self.is_settled and self.hold_at > 0 and chunks_per_byte > 0:
            self.cut_at += gain * math.log(chunks_per_byte / self.hold_at)
            self.cut_logit.fill_(self.cut_at)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the flag is in a state only once its policy settled: without it, the policy never did
        if prefix + "settled" in state_dict:
            # register the buffers, never reset them: their values are read below, and the state's
            # tensors may be these very buffers (a sharded load fills them in place first)
            if "settled" not in self._buffers:
                self.settle()
            for name in ("cut_logit", "cut_hold"):  # settled before cuts were kept: p > 0.5, nothing held
                state_dict.setdefault(prefix + name, torch.zeros(()))
        else:
            for name in ("settled", "cut_logit", "cut_hold"):
                self._buffers.pop(name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.is_settled = "settled" in self._buffers and bool(self.settled)
        self.cut_at = float(self.cut_logit) if self.is_settled else 0.0
        self.hold_at = float(self.cut_hold) if self.is_settled else 0.0

    def history_pattern(self, b: torch.Tensor) -> torch.Tensor:
        """pattern_t = sum_j b_{t-j} 2^(j-1) for j = 1..window-1 (positions before 0 count as 0)."""
        pattern = torch.zeros_like(b, dtype=torch.long)
        bl = b.long()
        for j in range(1, self.window):
            pattern[:, j:] += bl[:, :-j] << (j - 1)
        return pattern

    def teacher_forced_logits(self, base: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.history is None:
            return base
        return base + self.history(self.history_pattern(b)).squeeze(-1)

    def push(self, pattern: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The next position's pattern: the newest decision enters at bit 0."""
        return ((pattern << 1) | b.long()) & (2 ** (self.window - 1) - 1)

    def draw(self, logits: torch.Tensor, u: torch.Tensor | None, greedy: bool) -> torch.Tensor:
        """Sampled (u < p) or thresholded decisions: at logit 0, or at a settled rule's cut."""
        return (logits > self.cut_at) if greedy else (u < torch.sigmoid(logits))

    @torch.no_grad()
    def sample(self, base: torch.Tensor, forced: torch.Tensor, greedy: bool,
               generator: torch.Generator | None, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw decisions (B, T) and their log-probs as computed during sampling. `noise`: the
        uniform draws to use instead of drawing them from `generator`."""
        u = None if greedy else (noise if noise is not None else uniform(base.shape, base.device, generator))
        if self.history is None:
            logits = base.float()
            b = self.draw(logits, u, greedy) | forced
            return b, bernoulli_logp(b, logits)
        base = base.float()
        if 0 < base.numel() * 2 ** (self.window - 1) <= SCAN_LIMIT:
            return self._sample_scan(base, forced, u, greedy)
        return self._sample_sequential(base, forced, u, greedy)

    def _sample_sequential(self, base, forced, u, greedy) -> tuple[torch.Tensor, torch.Tensor]:
        """Window > 1, one position after another: the reference for `_sample_scan`, and what runs
        where its (B, T, 2^(window-1)) tables would not fit."""
        bsz, length = base.shape
        table = self.history.weight.squeeze(-1).float()
        b = torch.zeros(bsz, length, dtype=torch.bool, device=base.device)
        logp = torch.zeros(bsz, length, dtype=torch.float32, device=base.device)
        pattern = torch.zeros(bsz, dtype=torch.long, device=base.device)
        for t in range(length):
            lt = base[:, t] + table[pattern]
            bt = self.draw(lt, None if u is None else u[:, t], greedy) | forced[:, t]
            b[:, t] = bt
            logp[:, t] = bernoulli_logp(bt, lt)
            pattern = self.push(pattern, bt)
        return b, logp

    def _sample_scan(self, base, forced, u, greedy) -> tuple[torch.Tensor, torch.Tensor]:
        """Window > 1 without a loop over positions. With the draws u fixed, position t's decision
        depends only on its history pattern, so each position is a map pattern -> next pattern
        over all 2^(window-1) patterns; a prefix scan composes those maps in log2(T) gathers and
        gives every position's pattern at once. Same decisions and log-probs, bit for bit."""
        table = self.history.weight.squeeze(-1).float()
        logits = base.unsqueeze(-1) + table  # (B, T, patterns): position t's logit under each history
        cut = self.draw(logits, None if u is None else u.unsqueeze(-1), greedy) | forced.unsqueeze(-1)
        maps = self.push(torch.arange(table.shape[0], device=base.device), cut)
        step = 1
        while step < base.shape[1]:  # maps[t] becomes position t's map after those of 0..t-1
            maps = torch.cat([maps[:, :step], maps[:, step:].gather(2, maps[:, :-step])], dim=1)
            step *= 2
        # the pattern before t is the composed map of 0..t-1 applied to the empty history (0)
        pattern = F.pad(maps[:, :-1, 0], (1, 0)).unsqueeze(-1)
        b = cut.gather(2, pattern).squeeze(-1)
        return b, bernoulli_logp(b, logits.gather(2, pattern).squeeze(-1))

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None,
                noise: torch.Tensor | None = None, **_) -> Boundaries:
        # a rule that is not trained this step (or ever again) decides without a graph
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.learns and not self.is_settled):
            base = fp32_linear(self.head, h.detach() if self.detach_input else h).squeeze(-1)
            sample_logp = None
            if b is None:
                greedy = mode == "greedy" or self.is_settled
                b, sample_logp = self.sample(base.detach(), forced, greedy, generator, noise)
            else:
                b = b.bool() | forced
            logits = self.teacher_forced_logits(base, b)
            return Boundaries(b=b, free=~forced, logits=logits, logp=bernoulli_logp(b, logits),
                              sample_logp=sample_logp)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        if self.history is None:
            return {}
        # the pattern the position after the context sees: its last window - 1 decisions
        return {"pattern": self.history_pattern(F.pad(b.long(), (0, 1)))[:, -1]}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        logits = fp32_linear(self.head, h).squeeze(-1)
        if self.history is not None:
            logits = logits + self.history(state["pattern"]).squeeze(-1)
        if b is None:
            greedy = mode == "greedy" or self.is_settled
            u = None if greedy else (noise if noise is not None else uniform(logits.shape, logits.device, generator))
            b = self.draw(logits, u, greedy)
        b = b.bool() | forced
        if self.history is not None:
            state["pattern"] = self.push(state["pattern"], b)
        return Boundaries(b=b, free=~forced, logits=logits)  # (no log-probabilities: nothing learns here)


def learned_rules(model: nn.Module) -> list[tuple[str, RLPolicy]]:
    """The model's learned boundary policies (every stage's), by module name: the rules that settle."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, RLPolicy)]
