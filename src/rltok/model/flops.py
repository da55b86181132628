"""Matmul FLOPs per byte, for compute-matched comparisons, asked of the built model.

Every model answers `forward_flops(seq_len, rate, rate2, kernel)`: forward FLOPs per byte by
component, each of its modules asked for its own (model/cost.py: a module's `flops(level)`, or
its linear layers where it has none). FLOPs per byte = byte-level FLOPs + chunk-level FLOPs x
rate, attention included. One multiply-add counts as 2 FLOPs; only matrix products count.
Attention counts the (query, key) pairs the model actually uses, a causal window
(attention="causal", the default: what runs are matched on), or with attention="kernel" what
its kernel computes, masked pairs and padding included (a windowed kernel that reads 2 x 128
keys is charged 256). Training costs about 3x the forward pass (backward = 2x).

`ModelCost` is what training holds: the cost of a step, of the counterfactual pass and of the
tokenizer phase, and the slope of the cost in the rate. Where only a config is at hand,
`cost_of_config` builds its model once on the meta device (no memory) and asks that.
"""

from __future__ import annotations

import torch

from rltok.config import VOCAB_SIZE, ModelConfig
from rltok.model.cost import Level, causal_keys, module_flops

ATTENTION = {"causal": False, "kernel": True}  # attention= -> count what the kernel computes


def model_flops(model: torch.nn.Module, seq_len: int, rate: float | None = None, rate2: float | None = None,
                attention: str = "causal") -> dict[str, float]:
    """Forward FLOPs per byte of a built model on windows of `seq_len` bytes, by component, with
    `total` (and, for the hourglass, `byte_level` and `chunk_level`). `rate`: chunks (tokens) per
    byte, `rate2`: supertokens per chunk (defaults: the model's targets). A model that cannot say
    is walked module by module (model/cost.py: each its own answer, or its linear layers), once per byte."""
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
        """Forward FLOPs per distinct byte at `rate` (tokens per byte for the BPE-token model);
        attention counted as `model_flops` says (the causal pairs, what budgets are charged)."""
        f = self.forward(rate, rate2, attention)
        shared = sum(f[k] for k in self.shared)
        return shared + self.group_size * (f["total"] - shared)

    def counterfactual_per_byte(self, rate: float | None = None, rate2: float | None = None) -> float:
        """The counterfactual pass of the flips estimator: everything after the encoder, once
        more, without a backward pass."""
        f = self.forward(rate, rate2)
        return self.group_size * (f["total"] - sum(f[k] for k in self.shared))

    def tokenizer_phase_per_byte(self) -> float:
        """Training FLOPs per distinct byte of a tokenizer-phase step: the byte input, the
        encoder, the early-exit head and the boundary rule, forward and backward."""
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
        """(a, c) such that one more chunk per byte costs a + c * rate forward FLOPs per byte: the
        derivative of the chunk-level FLOPs per byte in the rate. Those are quadratic in the rate
        (attention over the chunks), so the central differences below are exact. (Worked out
        once: the loss-slope price asks every step.)"""
        def slope(r: float, h: float = 1e-3) -> float:
            return (self.forward(r + h)["chunk_level"] - self.forward(r - h)["chunk_level"]) / (2 * h)

        if self._chunk_cost is None:
            a = slope(0.0)
            self._chunk_cost = (a, slope(1.0) - a)
        return self._chunk_cost

    def cost_slope(self, rate: float) -> float:
        """d ln(forward FLOPs per byte) / d rate at `rate`: what one more boundary per byte costs,
        relative to what a byte costs."""
        a, c = self.chunk_cost()
        return (a + c * rate) / self.forward_per_byte(rate)


_META_MODELS: dict[tuple, torch.nn.Module] = {}


def _on_meta(key: tuple, build) -> torch.nn.Module:
    """build() on the meta device (its shape only, no memory), once per key."""
    if key not in _META_MODELS:
        if len(_META_MODELS) > 64:
            _META_MODELS.clear()
        with torch.device("meta"):
            _META_MODELS[key] = build()
    return _META_MODELS[key]


def unfitted_model(cfg: ModelConfig, vocab_size: int = VOCAB_SIZE) -> torch.nn.Module:
    """The model `cfg` builds, on the meta device, built once per config. `vocab_size`: the
    BPE-token model's vocabulary (its tokenizer is fitted to data, which a config does not hold)."""
    def build():
        from rltok.model.factory import model_class

        cfg.validate()
        model = model_class(cfg.arch).unfitted(cfg, vocab_size)
        model.model_config = cfg
        return model

    return _on_meta(("model", repr(cfg), vocab_size), build)


def cost_of_config(cfg, vocab_size: int = VOCAB_SIZE, seq_len: int | None = None) -> ModelCost:
    """The cost of the model a full `Config` builds, on its train.seq_len windows (or `seq_len`)."""
    return ModelCost(unfitted_model(cfg.model, vocab_size), seq_len or cfg.train.seq_len, cfg.objective.group_size)


def _hourglass(cfg_or_model) -> torch.nn.Module:
    """A built hourglass model as given, or HourglassLM(cfg) on the meta device (whatever
    model.arch says: these functions always described that model)."""
    if not isinstance(cfg_or_model, ModelConfig):
        return cfg_or_model
    from rltok.model.hourglass import HourglassLM

    return _on_meta(("hourglass", repr(cfg_or_model)), lambda: HourglassLM.unfitted(cfg_or_model))


# ---- the functions callers used before the walk, computed by it ---------------------------------

def hourglass_flops(cfg: ModelConfig | torch.nn.Module, seq_len: int, rate: float | None = None,
                    rate2: float | None = None, attention: str = "causal") -> dict[str, float]:
    """Forward FLOPs per byte of `HourglassLM(cfg)` (or of a built hourglass model), by
    component: see HourglassLM.forward_flops. K segmentations per sequence (group_size) are not
    modelled here: ModelCost repeats everything after the encoder."""
    return model_flops(_hourglass(cfg), seq_len, rate, rate2, attention)


def flat_flops(d_model: int, n_layers: int, seq_len: int, window: int | None = None,
               mlp_ratio: float = 4.0, ngram_tables: int = 0, attention: str = "causal") -> dict[str, float]:
    """Forward FLOPs per byte of a `FlatByteLM` of that shape; `ngram_tables`: how many n-gram
    embeddings are summed into each byte's input."""
    from rltok.model.flat import FlatByteLM

    with torch.device("meta"):
        model = FlatByteLM(d_model, n_layers, 1, mlp_ratio, window, ngram_sizes=tuple(range(1, ngram_tables + 1)),
                           ngram_vocab=1 if ngram_tables else 0)
    return model_flops(model, seq_len, attention=attention)


def block_linear_flops(dim: int, mlp_ratio: float) -> float:
    """Forward FLOPs per token of the linear layers of one transformer block."""
    hidden = int(dim * mlp_ratio)  # as in layers.MLP
    return 2.0 * (3 * dim * dim + dim * dim + 2 * dim * hidden)  # qkv, out proj, MLP in and out


def attention_flops(dim: int, keys: float) -> float:
    """Forward FLOPs per query: QK^T and AV, each dim multiply-adds per key (all heads)."""
    return 4.0 * dim * keys


def mean_keys(seq_len: int, window: int | None) -> float:
    """Average number of keys a query attends to: causal, optionally limited to a window."""
    return causal_keys(seq_len, window) if seq_len > 0 else 0.0


def chunk_cost_flops(cfg: ModelConfig | torch.nn.Module, seq_len: int) -> tuple[float, float]:
    """(a, c) such that one more chunk per byte costs a + c * rate forward FLOPs per byte (see
    ModelCost.chunk_cost), for `HourglassLM(cfg)` or a built hourglass model."""
    return ModelCost(_hourglass(cfg), seq_len).chunk_cost()


def config_forward_flops_per_byte(cfg, rate: float | None = None, vocab_size: int = VOCAB_SIZE,
                                  rate2: float | None = None) -> float:
    """Forward FLOPs per distinct training byte of the model a full `Config` builds, at `rate`
    (default: the target). `rate2`: supertokens per chunk (stages=2)."""
    return cost_of_config(cfg, vocab_size).forward_per_byte(rate, rate2)


def counterfactual_flops_per_byte(cfg, rate: float | None = None, rate2: float | None = None) -> float:
    """Forward FLOPs per distinct byte of the counterfactual pass (objective.estimator="flips")."""
    return cost_of_config(cfg).counterfactual_per_byte(rate, rate2)


def tokenizer_phase_flops_per_byte(cfg) -> float:
    """Training FLOPs per distinct byte of one tokenizer-phase step (objective.tokenizer_phase)."""
    return cost_of_config(cfg).tokenizer_phase_per_byte()


def train_flops_per_byte(forward: dict[str, float]) -> float:
    """Forward + backward: the backward pass costs about twice the forward."""
    return 3.0 * forward["total"]


def step_train_flops_per_byte(cfg, seq_len: int | None = None, chunks_per_byte: float | None = None,
                              supertokens_per_chunk: float | None = None, vocab_size: int = VOCAB_SIZE,
                              counterfactual: bool = False) -> float:
    """Training FLOPs per distinct byte of one step of the model a full `Config` builds (see
    ModelCost.step_train_per_byte), on windows of `seq_len` bytes (default train.seq_len)."""
    return cost_of_config(cfg, vocab_size, seq_len).step_train_per_byte(chunks_per_byte, supertokens_per_chunk,
                                                                        counterfactual)
