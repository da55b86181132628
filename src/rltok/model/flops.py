"""Matmul FLOPs per byte, asked of the built model (docs/BENCHMARKS.md, "FLOPs per byte"): `ModelCost`
is what training holds; `run_cost` is the one way to cost a config."""

from __future__ import annotations

import torch

from rltok.model.cost import Level, module_flops

ATTENTION = {"causal": False, "kernel": True}  # attention= -> count what the kernel computes


def model_flops(model: torch.nn.Module, seq_len: int, rate: float | None = None, rate2: float | None = None,
                attention: str = "causal") -> dict[str, float]:
    """Forward FLOPs per byte of a built model on windows of `seq_len` bytes, by component, with
    `total`. `rate`: chunks (tokens) per byte, `rate2`: supertokens per chunk (defaults: the
    model's targets). A model that cannot say is walked module by module (model/cost.py)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r}: choose one of {', '.join(ATTENTION)}")
    own = getattr(model, "forward_flops", None)
    if callable(own):
        return own(seq_len, rate, rate2, kernel=ATTENTION[attention])
    return {"total": module_flops(model, Level(seq_len))}


class ModelCost:
    """What training a built model costs per distinct byte. With group_size K, the K
    segmentations of a sequence share what the model lists as `group_shared` (the encoder pass)
    and repeat the rest; a model without a shared part runs once per sequence."""

    def __init__(self, model: torch.nn.Module, seq_len: int, group_size: int = 1):
        self.model, self.seq_len = model, seq_len
        self.shared = getattr(model, "group_shared", ())
        self.group_size = group_size if self.shared else 1
        self._chunk_cost: tuple[float, float] | None = None

    def at(self, seq_len: int) -> ModelCost:
        """The same model on windows of `seq_len` bytes."""
        return self if seq_len == self.seq_len else ModelCost(self.model, seq_len, self.group_size)

    def forward(self, rate: float | None = None, rate2: float | None = None,
                attention: str = "causal") -> dict[str, float]:
        return model_flops(self.model, self.seq_len, rate, rate2, attention)

    def forward_per_byte(self, rate: float | None = None, rate2: float | None = None,
                         attention: str = "causal") -> float:
        """Forward FLOPs per distinct byte at `rate` (tokens per byte for the BPE-token model)."""
        f = self.forward(rate, rate2, attention)
        shared = sum(f[k] for k in self.shared)
        return shared + self.group_size * (f["total"] - shared)

    def counterfactual_per_byte(self, rate: float | None = None, rate2: float | None = None) -> float:
        """The flips estimator's counterfactual pass: everything after the encoder, forward only."""
        f = self.forward(rate, rate2)
        return self.group_size * (f["total"] - sum(f[k] for k in self.shared))

    def tokenizer_phase_per_byte(self) -> float:
        """Training FLOPs per distinct byte of a tokenizer-phase step (`encoder_side` and the rule)."""
        f = self.forward()
        shared = sum(f[k] for k in self.model.encoder_side)
        return train_flops_per_byte({"total": shared + self.group_size * f["policy"]})

    def step_train_per_byte(self, rate: float | None = None, rate2: float | None = None,
                            counterfactual: bool = False) -> float:
        """Training FLOPs per distinct byte of one step at the chunks per byte and supertokens per
        chunk it drew; `counterfactual`: it also ran the flips' pass."""
        total = train_flops_per_byte({"total": self.forward_per_byte(rate, rate2)})
        if counterfactual:
            total += self.counterfactual_per_byte(rate, rate2)
        return total

    def chunk_cost(self) -> tuple[float, float]:
        """(a, c) such that one more chunk per byte costs a + c * rate forward FLOPs per byte (exact:
        the chunk-level FLOPs are quadratic in the rate). Worked out once."""
        def slope(r: float, h: float = 1e-3) -> float:
            return (self.forward(r + h)["chunk_level"] - self.forward(r - h)["chunk_level"]) / (2 * h)

        if self._chunk_cost is None:
            a = slope(0.0)
            self._chunk_cost = (a, slope(1.0) - a)
        return self._chunk_cost

    def cost_slope(self, rate: float) -> float:
        """d ln(forward FLOPs per byte) / d rate at `rate`."""
        a, c = self.chunk_cost()
        return (a + c * rate) / self.forward_per_byte(rate)


def run_cost(cfg, model: torch.nn.Module | None = None, vocab_size: int | None = None) -> ModelCost:
    """What a step of training a full `Config` costs, asked of `model` (the one training built) or
    of planned_model(cfg.model, vocab_size). The one way a config is costed."""
    if model is None:
        from rltok.model.factory import planned_model

        model = planned_model(cfg.model, vocab_size)
    return ModelCost(model, cfg.train.seq_len, cfg.objective.group_size)


def train_flops_per_byte(forward: dict[str, float]) -> float:
    """Forward + backward: the backward pass costs about twice the forward."""
    return 3.0 * forward["total"]
