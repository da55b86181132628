"""Analytical matmul FLOPs per byte, for compute-matched comparisons.

FLOPs per byte = byte-level FLOPs + chunk-level FLOPs x rate, attention included. One
multiply-add counts as 2 FLOPs. Only matrix products are counted (linear layers, QK^T and AV);
norms, RoPE, activations and the loss are elementwise and ignored, as is usual. Attention counts
the (query, key) pairs the model actually uses — a causal window, not whatever a kernel
computes and then masks away. Training costs about 3x the forward pass (backward = 2x).
"""

from __future__ import annotations

from rltok.config import VOCAB_SIZE, ModelConfig


def block_linear_flops(dim: int, mlp_ratio: float) -> float:
    """Forward FLOPs per token of the linear layers of one transformer block."""
    hidden = int(dim * mlp_ratio)  # as in layers.MLP
    return 2.0 * (3 * dim * dim + dim * dim + 2 * dim * hidden)  # qkv, out proj, MLP in and out


def mean_keys(seq_len: int, window: int | None) -> float:
    """Average number of keys a query attends to: causal, optionally limited to a window."""
    if seq_len <= 0:
        return 0.0
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2.0
    # query i sees min(i + 1, window) keys
    return (window * (window + 1) / 2.0 + (seq_len - window) * window) / seq_len


def attention_flops(dim: int, keys: float) -> float:
    """Forward FLOPs per query: QK^T and AV, each dim multiply-adds per key (all heads)."""
    return 4.0 * dim * keys


def boundary_rule_flops(chunker: str, dim: int) -> float:
    """Forward FLOPs per byte of the boundary rule's own layers (the `policy` component)."""
    if chunker == "rl":
        return 2.0 * dim  # Linear(dim, 1)
    if chunker == "hnet":
        return 2.0 * 2 * dim * dim  # q and k projections
    if chunker == "gumbel":
        return 2.0 * (dim * dim + dim)  # MLP dim -> dim -> 1
    return 0.0  # fixed, uniform, whitespace, entropy (reuses the early-exit logits), bpe


def ngram_tables(cfg: ModelConfig) -> int:
    """How many n-gram embeddings are summed into each byte's input (model.ngram_vocab; 0 when off)."""
    return len(cfg.ngram_sizes) if getattr(cfg, "ngram_vocab", 0) else 0


def ngram_flops(cfg: ModelConfig, dim: int) -> float:
    """Per byte: one add per n-gram table per dimension."""
    return float(ngram_tables(cfg) * dim)


def hourglass_flops(cfg: ModelConfig, seq_len: int, rate: float | None = None,
                    rate2: float | None = None) -> dict[str, float]:
    """Forward FLOPs per byte of `HourglassLM(cfg)` on windows of `seq_len` bytes, by component.

    `rate` is boundaries per byte (default: the config's target rate); the main network runs on
    rate * seq_len chunks. Keys ending in `_attn` are attention, the rest linear layers (and
    H-Net's smoothing product); `policy` is the boundary rule's own layers; `byte_level` +
    `chunk_level` = `total` (chunk-level terms already multiplied by the rate). K segmentations
    per sequence (group_size) are not modelled: they repeat everything after the encoder.
    With model.stages=2, `rate2` is supertokens per chunk (default model.stage2_target_rate).
    """
    rate = cfg.target_rate if rate is None else rate
    n_chunks = rate * seq_len
    two_stage = getattr(cfg, "stages", 1) == 2
    # two stages: the main network runs on supertokens, rate2 of the chunks
    rate2 = (cfg.stage2_target_rate if rate2 is None else rate2) if two_stage else 1.0
    n_super = rate2 * n_chunks
    byte_keys = mean_keys(seq_len, cfg.window)
    chunk_keys = (n_chunks + 1) / 2.0  # full causal attention over the chunks
    db, dc = cfg.d_byte, cfg.d_chunk
    out = {
        # hashed n-gram embeddings: lookups, not matrix products; count the adds that sum them
        "ngram": ngram_flops(cfg, db),
        "encoder": cfg.encoder_layers * block_linear_flops(db, cfg.mlp_ratio),
        "encoder_attn": cfg.encoder_layers * attention_flops(db, byte_keys),
        "early_head": 2.0 * db * VOCAB_SIZE,
        "policy": boundary_rule_flops(cfg.chunker.kind, db),
        "value_head": 2.0 * ((db + 1) * db + db) if getattr(cfg, "value_head", False) else 0.0,
        "down": rate * 2.0 * db * dc,
        "main": rate * rate2 * cfg.main_layers * block_linear_flops(dc, cfg.mlp_ratio),
        "main_attn": rate * rate2 * cfg.main_layers * attention_flops(dc, (n_super + 1) / 2.0),
        # two stages: chunk-level encoder and decoder (full causal attention) and the second policy
        "stage2": rate * (2 * cfg.stage2_layers * block_linear_flops(dc, cfg.mlp_ratio) + 2.0 * dc) if two_stage else 0.0,
        "stage2_attn": rate * 2 * cfg.stage2_layers * attention_flops(dc, chunk_keys) if two_stage else 0.0,
        "up": rate * 2.0 * dc * db,
        # H-Net's EMA over chunks: a dense (chunks x chunks) @ (chunks x d_byte) product per sequence
        "smoothing": rate * 2.0 * n_chunks * db if cfg.chunker.kind == "hnet" else 0.0,
        "decoder": cfg.decoder_layers * block_linear_flops(db, cfg.mlp_ratio),
        "decoder_attn": cfg.decoder_layers * attention_flops(db, byte_keys),
        "head": 2.0 * db * VOCAB_SIZE,
    }
    chunk_parts = ("down", "main", "main_attn", "stage2", "stage2_attn", "up", "smoothing")
    out["chunk_level"] = sum(out[k] for k in chunk_parts)
    out["byte_level"] = sum(v for k, v in out.items() if k not in chunk_parts and k != "chunk_level")
    out["total"] = out["byte_level"] + out["chunk_level"]
    return out


def flat_flops(d_model: int, n_layers: int, seq_len: int, window: int | None = None,
               mlp_ratio: float = 4.0, ngram_tables: int = 0) -> dict[str, float]:
    """Forward FLOPs per byte of `FlatByteLM` (same keys convention as `hourglass_flops`);
    `ngram_tables`: how many n-gram embeddings are summed into each byte's input."""
    out = {
        "ngram": float(ngram_tables * d_model),
        "body": n_layers * block_linear_flops(d_model, mlp_ratio),
        "body_attn": n_layers * attention_flops(d_model, mean_keys(seq_len, window)),
        "head": 2.0 * d_model * VOCAB_SIZE,
    }
    out["total"] = sum(out.values())
    return out


def chunk_cost_flops(cfg: ModelConfig, seq_len: int) -> tuple[float, float]:
    """(a, c) such that one more chunk per byte costs a + c * rate forward FLOPs per byte: the
    derivative of the chunk-level FLOPs per byte with respect to the rate. Those FLOPs are
    quadratic in the rate (attention over the chunks), so the derivative is linear in it and the
    central differences below are exact."""
    def slope(r: float, h: float = 1e-3) -> float:
        return (hourglass_flops(cfg, seq_len, r + h)["chunk_level"]
                - hourglass_flops(cfg, seq_len, r - h)["chunk_level"]) / (2 * h)

    a = slope(0.0)
    return a, slope(1.0) - a


def config_forward_flops_per_byte(cfg, rate: float | None = None, vocab_size: int = VOCAB_SIZE,
                                  rate2: float | None = None) -> float:
    """Forward FLOPs per distinct training byte of the model a full `Config` builds, at `rate`
    (default: the target). With objective.group_size K, the K segmentations of a sequence share
    the encoder pass and repeat everything after it. `rate2`: supertokens per chunk (stages=2)."""
    m, seq = cfg.model, cfg.train.seq_len
    if m.arch == "flat":
        return flat_flops(m.d_chunk, m.flat_layers, seq, None, m.mlp_ratio, ngram_tables(m))["total"]
    if m.arch == "bpe_token":  # a token costs a flat layer stack plus a vocab-sized head; rate tokens/byte
        rate = m.target_rate if rate is None else rate
        n_tok = max(1, int(seq * rate))
        per_token = flat_flops(m.d_chunk, m.flat_layers, n_tok, None, m.mlp_ratio)["total"]
        return rate * (per_token + 2.0 * m.d_chunk * (vocab_size - VOCAB_SIZE))
    f = hourglass_flops(m, seq, rate, rate2)
    k = cfg.objective.group_size
    shared = f["encoder"] + f["encoder_attn"] + f["early_head"]
    return shared + k * (f["total"] - shared)


def counterfactual_flops_per_byte(cfg, rate: float | None = None, rate2: float | None = None) -> float:
    """Forward FLOPs per distinct byte of the counterfactual pass (objective.estimator="flips"):
    everything after the encoder, once more, without a backward pass."""
    m = cfg.model
    f = hourglass_flops(m, cfg.train.seq_len, rate, rate2)
    shared = f["encoder"] + f["encoder_attn"] + f["early_head"]
    return cfg.objective.group_size * (f["total"] - shared)


def tokenizer_phase_flops_per_byte(cfg) -> float:
    """Training FLOPs per distinct byte of one tokenizer-phase step (objective.tokenizer_phase):
    the byte embedding's n-grams, the encoder, the early-exit head and the boundary rule, forward
    and backward; no chunk level and no decoder run."""
    m = cfg.model
    f = hourglass_flops(m, cfg.train.seq_len)
    shared = sum(f[k] for k in ("ngram", "encoder", "encoder_attn", "early_head"))
    return train_flops_per_byte({"total": shared + cfg.objective.group_size * f["policy"]})


def train_flops_per_byte(forward: dict[str, float]) -> float:
    """Forward + backward: the backward pass costs about twice the forward."""
    return 3.0 * forward["total"]


def step_train_flops_per_byte(cfg, seq_len: int | None = None, chunks_per_byte: float | None = None,
                              supertokens_per_chunk: float | None = None, vocab_size: int = VOCAB_SIZE,
                              counterfactual: bool = False) -> float:
    """Training FLOPs per distinct byte of one step of the model a full `Config` builds, at the
    chunks per byte (tokens per byte for the BPE-token reference) and supertokens per chunk the
    step actually drew (the config's targets where not given). `counterfactual`: the step also
    ran the flipped pass of objective.estimator="flips"."""
    import dataclasses

    if seq_len is not None and seq_len != cfg.train.seq_len:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=seq_len))
    total = train_flops_per_byte({"total": config_forward_flops_per_byte(cfg, chunks_per_byte, vocab_size,
                                                                         rate2=supertokens_per_chunk)})
    if counterfactual:
        total += counterfactual_flops_per_byte(cfg, chunks_per_byte, supertokens_per_chunk)
    return total
