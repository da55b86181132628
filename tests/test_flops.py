"""The FLOPs the modules report (rltok.model.flops: a walk over the built model) against
  - the analytical counts used before the walk, copied below as the reference: equal bit for
    bit, for every family at several rates (training stops and schedules on these numbers);
  - a brute-force count on a real forward pass: linear layers counted with forward hooks
    (in_features * out_features multiply-adds per row), attention by wrapping
    scaled_dot_product_attention and counting the (query, key) pairs its mask allows;
  - torch's profiler (FlopCounterMode) on one forward pass: every matrix product it sees equals
    the walk's count with attention="kernel" (what the kernels compute);
  - a boundary rule defined here, costed without touching src/.
Boundaries are fixed, so the chunk count, and hence the rate, is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.config import VOCAB_SIZE, ModelConfig, load_config
from rltok.model.cost import causal_keys
from rltok.model.factory import planned_model
from rltok.model.flops import ModelCost, model_flops, run_cost, train_flops_per_byte
from rltok.model import FlatByteLM, HourglassLM
from rltok.model.chunkers import Boundaries, Chunker
from rltok.model.layers import Attention
from rltok.model.token_lm import BPETokenLM

# module-name prefix -> component key of the analytical counter
COMPONENTS = {"encoder.": "encoder", "early_head": "early_head", "chunker.": "policy", "down": "down",
              "main.": "main", "up": "up", "decoder.": "decoder", "head": "head", "body.": "body",
              "value_head.": "value_head"}


def component(name: str) -> str:
    for prefix, key in COMPONENTS.items():
        if name == prefix or name.startswith(prefix):
            return key
    raise AssertionError(f"unattributed module {name}")


def brute_force_flops(model: nn.Module, run, monkeypatch) -> dict[str, float]:
    """FLOPs (2 x multiply-adds) of one forward pass, by component."""
    counts: dict[str, float] = {}
    current = []  # name of the Attention module being run

    def add(key: str, flops: float) -> None:
        counts[key] = counts.get(key, 0.0) + flops

    def linear_hook(name):
        def hook(mod, inputs, _out):
            rows = inputs[0].numel() // mod.in_features
            add(component(name), 2.0 * rows * mod.in_features * mod.out_features)
        return hook

    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            handles.append(mod.register_forward_hook(linear_hook(name)))
        if isinstance(mod, Attention):
            handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: current.append(name) and None))
            # a forward hook's return value would replace the output: return None explicitly
            handles.append(mod.register_forward_hook(lambda m, a, o: (current.pop(), None)[1]))

    real_sdpa = F.scaled_dot_product_attention

    def counting_sdpa(q, k, v, attn_mask=None, is_causal=False, **kw):
        t_q, t_k = q.shape[-2], k.shape[-2]
        if attn_mask is not None:
            allowed = torch.broadcast_to(attn_mask, (*q.shape[:-2], t_q, t_k)).sum().item()
        elif is_causal:
            allowed = q[..., 0, 0].numel() * t_q * (t_q + 1) / 2  # square causal
        else:
            allowed = q[..., 0, 0].numel() * t_q * t_k
        add(component(current[-1]) + "_attn", 2.0 * 2 * allowed * q.shape[-1])  # QK^T and AV
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    real_bmm = torch.bmm

    def counting_bmm(a, b, **kw):  # only H-Net's smoothing uses bmm in the model
        add("smoothing", 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2])
        return real_bmm(a, b, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    monkeypatch.setattr(torch, "bmm", counting_bmm)
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return counts


def hourglass_flops(cfg: ModelConfig, seq_len: int, rate=None, rate2=None) -> dict[str, float]:
    """The walk over the model `cfg` builds (on the meta device)."""
    return model_flops(planned_model(cfg), seq_len, rate, rate2)


def flat_flops(d_model, n_layers, seq_len, window=None, mlp_ratio=4.0, ngram_tables=0) -> dict[str, float]:
    with torch.device("meta"):
        model = FlatByteLM(d_model, n_layers, 1, mlp_ratio, window, ngram_sizes=tuple(range(1, ngram_tables + 1)),
                           ngram_vocab=1 if ngram_tables else 0)
    return model_flops(model, seq_len)


TINY = dict(d_byte=32, d_chunk=48, n_heads_byte=2, n_heads_chunk=2, encoder_layers=1,
            main_layers=2, decoder_layers=2, mlp_ratio=3.0)


@pytest.mark.parametrize("chunker,window,seq_len,value_head", [
    # window 16 of 64 bytes: the blocked kernel; 16 of 40: the dense mask; 64 of 40: plain causal
    ("fixed", 16, 64, False), ("fixed", 16, 40, False), ("fixed", 64, 40, False), ("rl", 16, 64, False),
    ("rl", 16, 64, True),
    ("hnet", 16, 64, False), ("gumbel", 16, 64, False), ("dynamic_pooling", 16, 64, False)])
def test_hourglass_flops_match_brute_force(chunker, window, seq_len, value_head, monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, window=window, chunker=chunker, value_head=value_head)
    model = HourglassLM(cfg).eval()
    bsz = 3
    x = torch.randint(0, 256, (bsz, seq_len))
    t = torch.arange(seq_len)
    b = ((t + 1) % 5 == 0).expand(bsz, seq_len).clone()  # every 5 bytes; forced ends are added
    out = {}
    counts = brute_force_flops(model, lambda: out.setdefault("o", model.score(x, b)), monkeypatch)
    n_chunks = int(out["o"].n_chunks[0])
    assert (out["o"].n_chunks == n_chunks).all()
    est = hourglass_flops(cfg, seq_len, rate=n_chunks / seq_len)
    n_bytes = bsz * seq_len
    for key, value in counts.items():
        assert est[key] == pytest.approx(value / n_bytes, rel=1e-9), key
    zero = {k for k in est if k not in counts and k not in ("byte_level", "chunk_level", "total")}
    assert all(est[k] == 0 for k in zero)
    assert est["total"] == pytest.approx(sum(counts.values()) / n_bytes, rel=1e-9)
    assert est["total"] == pytest.approx(est["byte_level"] + est["chunk_level"])
    assert train_flops_per_byte(est) == pytest.approx(3 * est["total"])


@pytest.mark.parametrize("window", [None, 8])
def test_flat_flops_match_brute_force(window, monkeypatch):
    torch.manual_seed(0)
    model = FlatByteLM(d_model=32, n_layers=2, n_heads=2, mlp_ratio=4.0, window=window).eval()
    x = torch.randint(0, 256, (2, 24))
    counts = brute_force_flops(model, lambda: model(x), monkeypatch)
    est = flat_flops(32, 2, 24, window=window)
    for key, value in counts.items():
        assert est[key] == pytest.approx(value / x.numel(), rel=1e-9), key
    assert est["total"] == pytest.approx(sum(counts.values()) / x.numel(), rel=1e-9)


def test_causal_keys():
    assert causal_keys(4, None) == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert causal_keys(5, 2) == pytest.approx((1 + 2 + 2 + 2 + 2) / 5)
    assert causal_keys(3, 10) == causal_keys(3, None)


def test_chunk_level_scales_with_rate():
    cfg = ModelConfig()
    lo, hi = hourglass_flops(cfg, 512, 0.1), hourglass_flops(cfg, 512, 0.2)
    assert lo["byte_level"] == hi["byte_level"]
    assert lo["main"] == pytest.approx(hi["main"] / 2)  # linear part is proportional to the rate
    assert lo["main_attn"] < hi["main_attn"] / 2  # attention grows faster than the rate


# ---- the reference: the analytical counts training used before the walk, verbatim ----------------

def ref_block_linear_flops(dim, mlp_ratio):
    hidden = int(dim * mlp_ratio)
    return 2.0 * (3 * dim * dim + dim * dim + 2 * dim * hidden)


def ref_mean_keys(seq_len, window):
    if seq_len <= 0:
        return 0.0
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2.0
    return (window * (window + 1) / 2.0 + (seq_len - window) * window) / seq_len


def ref_attention_flops(dim, keys):
    return 4.0 * dim * keys


def ref_boundary_rule_flops(chunker, dim):
    if chunker == "rl":
        return 2.0 * dim
    if chunker == "hnet":
        return 2.0 * 2 * dim * dim
    if chunker == "gumbel":
        return 2.0 * (dim * dim + dim)
    if chunker == "dynamic_pooling":  # a hidden layer 4 wide; the pooled means are sums, not charged
        return 2.0 * (dim * 4 * dim + 4 * dim)
    return 0.0


def ref_ngram_tables(cfg):
    return len(cfg.ngram_sizes) if getattr(cfg, "ngram_vocab", 0) else 0


def ref_hourglass_flops(cfg, seq_len, rate=None, rate2=None):
    rate = cfg.target_rate if rate is None else rate
    n_chunks = rate * seq_len
    two_stage = getattr(cfg, "stages", 1) == 2
    rate2 = (cfg.stage2_target_rate if rate2 is None else rate2) if two_stage else 1.0
    n_super = rate2 * n_chunks
    byte_keys = ref_mean_keys(seq_len, cfg.window)
    chunk_keys = (n_chunks + 1) / 2.0
    db, dc = cfg.d_byte, cfg.d_chunk
    out = {
        "ngram": float(ref_ngram_tables(cfg) * db),
        "encoder": cfg.encoder_layers * ref_block_linear_flops(db, cfg.mlp_ratio),
        "encoder_attn": cfg.encoder_layers * ref_attention_flops(db, byte_keys),
        "early_head": 2.0 * db * VOCAB_SIZE,
        "policy": ref_boundary_rule_flops(cfg.chunker.kind, db),
        "value_head": 2.0 * ((db + 1) * db + db) if getattr(cfg, "value_head", False) else 0.0,
        "down": rate * 2.0 * db * dc,
        "main": rate * rate2 * cfg.main_layers * ref_block_linear_flops(dc, cfg.mlp_ratio),
        "main_attn": rate * rate2 * cfg.main_layers * ref_attention_flops(dc, (n_super + 1) / 2.0),
        "stage2": rate * (2 * cfg.stage2_layers * ref_block_linear_flops(dc, cfg.mlp_ratio) + 2.0 * dc)
        if two_stage else 0.0,
        "stage2_attn": rate * 2 * cfg.stage2_layers * ref_attention_flops(dc, chunk_keys) if two_stage else 0.0,
        "up": rate * 2.0 * dc * db,
        "smoothing": rate * 2.0 * n_chunks * db if cfg.chunker.kind == "hnet" else 0.0,
        "decoder": cfg.decoder_layers * ref_block_linear_flops(db, cfg.mlp_ratio),
        "decoder_attn": cfg.decoder_layers * ref_attention_flops(db, byte_keys),
        "head": 2.0 * db * VOCAB_SIZE,
    }
    chunk_parts = ("down", "main", "main_attn", "stage2", "stage2_attn", "up", "smoothing")
    out["chunk_level"] = sum(out[k] for k in chunk_parts)
    out["byte_level"] = sum(v for k, v in out.items() if k not in chunk_parts and k != "chunk_level")
    out["total"] = out["byte_level"] + out["chunk_level"]
    return out


def ref_flat_flops(d_model, n_layers, seq_len, window=None, mlp_ratio=4.0, ngram_tables=0):
    out = {
        "ngram": float(ngram_tables * d_model),
        "body": n_layers * ref_block_linear_flops(d_model, mlp_ratio),
        "body_attn": n_layers * ref_attention_flops(d_model, ref_mean_keys(seq_len, window)),
        "head": 2.0 * d_model * VOCAB_SIZE,
    }
    out["total"] = sum(out.values())
    return out


def ref_chunk_cost_flops(cfg, seq_len):
    def slope(r, h=1e-3):
        return (ref_hourglass_flops(cfg, seq_len, r + h)["chunk_level"]
                - ref_hourglass_flops(cfg, seq_len, r - h)["chunk_level"]) / (2 * h)

    a = slope(0.0)
    return a, slope(1.0) - a


def ref_config_forward_flops_per_byte(cfg, rate=None, vocab_size=VOCAB_SIZE, rate2=None):
    m, seq = cfg.model, cfg.train.seq_len
    if m.arch == "flat":
        return ref_flat_flops(m.d_chunk, m.flat_layers, seq, None, m.mlp_ratio, ref_ngram_tables(m))["total"]
    if m.arch == "bpe_token":
        rate = m.target_rate if rate is None else rate
        n_tok = max(1, int(seq * rate))
        per_token = ref_flat_flops(m.d_chunk, m.flat_layers, n_tok, None, m.mlp_ratio)["total"]
        return rate * (per_token + 2.0 * m.d_chunk * (vocab_size - VOCAB_SIZE))
    f = ref_hourglass_flops(m, seq, rate, rate2)
    k = cfg.objective.group_size
    shared = f["encoder"] + f["encoder_attn"] + f["early_head"]
    return shared + k * (f["total"] - shared)


def ref_counterfactual_flops_per_byte(cfg, rate=None, rate2=None):
    f = ref_hourglass_flops(cfg.model, cfg.train.seq_len, rate, rate2)
    shared = f["encoder"] + f["encoder_attn"] + f["early_head"]
    return cfg.objective.group_size * (f["total"] - shared)


def ref_tokenizer_phase_flops_per_byte(cfg):
    f = ref_hourglass_flops(cfg.model, cfg.train.seq_len)
    shared = sum(f[k] for k in ("ngram", "encoder", "encoder_attn", "early_head"))
    return 3.0 * (shared + cfg.objective.group_size * f["policy"])


def ref_step_train_flops_per_byte(cfg, chunks_per_byte=None, supertokens_per_chunk=None, vocab_size=VOCAB_SIZE,
                                  counterfactual=False):
    total = 3.0 * ref_config_forward_flops_per_byte(cfg, chunks_per_byte, vocab_size, supertokens_per_chunk)
    if counterfactual:
        total += ref_counterfactual_flops_per_byte(cfg, chunks_per_byte, supertokens_per_chunk)
    return total


# ---- (a) the walk equals the reference, bit for bit ----------------------------------------------
# Exact equality, not approx: the FLOPs meter stops training and sets its learning rate on these
# floats, so the walk multiplies and sums in the order the reference did.

RATES = [None, 0.0, 0.05, 0.2, 0.3717, 1.0]
CHUNKERS = ["rl", "hnet", "gumbel", "dynamic_pooling", "fixed", "uniform", "whitespace", "entropy", "bpe"]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_walk_equals_the_reference_for_every_rule(chunker):
    for window, value_head, ngram, cvocab in [(16, False, 0, 0), (64, True, 64, 32), (2048, False, 64, 0)]:
        cfg = ModelConfig(**TINY, chunker=chunker, window=window, value_head=value_head, ngram_vocab=ngram,
                          chunk_vocab=cvocab)
        model = HourglassLM(cfg)
        for seq_len in (64, 512):
            for rate in RATES:
                ref = ref_hourglass_flops(cfg, seq_len, rate)
                assert model_flops(model, seq_len, rate) == ref  # same keys, same floats
                assert hourglass_flops(cfg, seq_len, rate) == ref  # the config's model, built on meta
            assert ModelCost(model, seq_len).chunk_cost() == ref_chunk_cost_flops(cfg, seq_len)


def test_walk_equals_the_reference_with_two_stages():
    for layers in (0, 1, 3):
        cfg = ModelConfig(**TINY, chunker="rl", stages=2, stage2_layers=layers, stage2_target_rate=0.4)
        model = HourglassLM(cfg)
        for rate in RATES:
            for rate2 in (None, 0.0, 0.25, 0.61, 1.0):
                assert model_flops(model, 256, rate, rate2) == ref_hourglass_flops(cfg, 256, rate, rate2)
        assert ModelCost(model, 256).chunk_cost() == ref_chunk_cost_flops(cfg, 256)


@pytest.mark.parametrize("overrides", [
    [], ["model.chunker=rl", "objective.recipe=reference"], ["objective.group_size=4", "model.chunker=rl",
                                                             "objective.recipe=reference"],
    ["model.chunker=rl", "objective.recipe=reference", "model.stages=2"], ["model.chunker=hnet"],
    ["model.ngram_vocab=512", "model.chunk_vocab=256"], ["model.chunker=rl", "model.value_head=true"],
    ["model.arch=flat"], ["model.arch=flat", "model.ngram_vocab=512"], ["model.arch=bpe_token"],
    ["model.arch=bpe_token", "model.flat_layers=3"]])
def test_config_costs_equal_the_reference(overrides):
    hourglass = "arch" not in str(overrides)
    for preset in ("test", "small"):
        cfg = load_config(preset, overrides=overrides)
        for rate in (None, 0.05, 0.3):
            for rate2 in (None, 0.5):
                for vocab in (VOCAB_SIZE, 300, 4096):
                    cost = run_cost(cfg, vocab_size=vocab)
                    want = ref_config_forward_flops_per_byte(cfg, rate, vocab, rate2)
                    assert cost.forward_per_byte(rate, rate2) == want
                    for cf in ((False, True) if hourglass else (False,)):
                        assert cost.step_train_per_byte(rate, rate2, cf) == \
                            ref_step_train_flops_per_byte(cfg, rate, rate2, vocab, cf)
        if hourglass:
            assert run_cost(cfg).tokenizer_phase_per_byte() == ref_tokenizer_phase_flops_per_byte(cfg)
            assert run_cost(cfg).counterfactual_per_byte(0.2) == ref_counterfactual_flops_per_byte(cfg, 0.2)


@pytest.mark.parametrize("window,tables", [(None, 0), (16, 0), (None, 3)])
def test_flat_walk_equals_the_reference(window, tables):
    model = FlatByteLM(d_model=48, n_layers=3, n_heads=2, mlp_ratio=3.0, window=window,
                       ngram_sizes=tuple(range(2, 2 + tables)), ngram_vocab=16 if tables else 0)
    for seq_len in (24, 512):
        ref = ref_flat_flops(48, 3, seq_len, window, 3.0, tables)
        assert model_flops(model, seq_len) == ref
        assert flat_flops(48, 3, seq_len, window, 3.0, tables) == ref


@pytest.mark.parametrize("vocab", [VOCAB_SIZE, 300, 4096])
def test_bpe_token_walk_counts_its_output_layer_over_its_vocabulary(vocab):
    cfg = load_config("test", overrides=["model.arch=bpe_token", "model.flat_layers=2"])
    model = BPETokenLM.unfitted(cfg.model, vocab)  # a placeholder tokenizer of that size
    assert model.vocab_size == vocab
    cost = ModelCost(model, cfg.train.seq_len, group_size=4)  # no shared encoder: K does not apply
    for rate in (0.05, 0.25, 0.5):
        assert cost.forward_per_byte(rate) == ref_config_forward_flops_per_byte(cfg, rate, vocab)
        f = cost.forward(rate)
        assert f["head"] == rate * 2.0 * cfg.model.d_chunk * vocab


def test_the_trainers_cost_is_its_models(tmp_path):
    from rltok.training.trainer import Trainer
    from test_boundary_learning import corpus

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.threads=1", "model.chunker=rl",
                                         "objective.recipe=reference", "objective.rate_control=none",
                                         "objective.compute_price=0.5"])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    assert trainer.cost.model is trainer.model and trainer.objective.cost is trainer.cost
    assert trainer.meter.cost.model is trainer.model
    a, c = ref_chunk_cost_flops(cfg.model, cfg.train.seq_len)
    price = trainer.objective.price
    nats_per_flop = 0.5 * math.log(2.0) / 1e6
    assert (price.compute, price.compute_per_rate) == (a * nats_per_flop, c * nats_per_flop)


@pytest.mark.parametrize("overrides", [["model.chunker=uniform"], ["model.arch=flat", "model.flat_window=16"]])
def test_both_attention_counts_of_a_windowed_model(overrides):
    """What the kernel computes (the whole window's blocks, masked pairs included) is at least the
    causal pairs, and more for a windowed model; forward_per_byte charges the causal pairs."""
    cost = run_cost(load_config("test", overrides=overrides))
    causal, kernel = cost.forward_per_byte(0.2), cost.forward_per_byte(0.2, attention="kernel")
    assert kernel > causal == cost.forward_per_byte(0.2, attention="causal")
    assert kernel == cost.forward(0.2, attention="kernel")["total"]


# ---- (b) the profiler's count of one forward pass --------------------------------------------------
# torch's FlopCounterMode counts every matrix product (mm, addmm, bmm, attention). Its attention
# formula charges the full (queries x keys) product of each kernel call, whatever the mask: that
# is attention="kernel". What the profiler does not see, and the walk counts: the n-gram tables'
# adds (lookups, then a sum). What the walk does not see: nothing that is a matrix product.

def profiled_flops(run) -> float:
    from torch.utils import flop_counter

    # torch has no formula for the CPU flash kernel that SDPA dispatches to here; give it torch's own
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                lambda q, k, v, *args, out_shape=None, **kw: flop_counter.sdpa_flop_count(q, k, v)}
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
        run()
    return float(counter.get_total_flops())


def fixed_boundaries(bsz: int, seq_len: int, every: int = 5) -> torch.Tensor:
    t = torch.arange(seq_len)
    return ((t + 1) % every == 0).expand(bsz, seq_len).clone()  # same count per row: nothing padded


@pytest.mark.parametrize("chunker,extra", [
    ("fixed", {}), ("rl", {"value_head": True, "ngram_vocab": 32}), ("hnet", {}), ("gumbel", {}),
    ("dynamic_pooling", {}), ("rl", {"stages": 2, "stage2_layers": 1}), ("rl", {"chunk_vocab": 16, "pack_chunks": False})])
@pytest.mark.parametrize("window,seq_len", [(16, 64), (16, 40), (64, 40)])  # blocked, dense mask, plain causal
def test_hourglass_walk_matches_the_profiler(chunker, extra, window, seq_len):
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, window=window, chunker=chunker, **extra)
    model = HourglassLM(cfg).eval()
    bsz = 3
    x = torch.randint(0, 256, (bsz, seq_len))
    b, below = fixed_boundaries(bsz, seq_len), ()
    if cfg.stages == 2:  # every other chunk closes a supertoken (the first one is forced)
        n = int(model.score(x, b).n_chunks[0])
        below = ((torch.arange(n) % 2 == 1).expand(bsz, n).clone(),)
    out = model.score(x, b, below)
    n_chunks = int(out.n_chunks[0])
    rate = n_chunks / seq_len
    rate2 = float(out.n_chunks2[0]) / n_chunks if cfg.stages == 2 else None
    profiled = profiled_flops(lambda: model.score(x, b, below))
    kernel = model_flops(model, seq_len, rate, rate2, attention="kernel")
    causal = model_flops(model, seq_len, rate, rate2)
    n_bytes = bsz * seq_len
    assert (kernel["total"] - kernel["ngram"]) * n_bytes == pytest.approx(profiled, rel=1e-9)
    # the two counts differ in attention only: the kernel also computes the pairs its mask drops
    for key in causal:
        if key.endswith("_attn") or key in ("total", "byte_level", "chunk_level"):
            assert kernel[key] >= causal[key] - 1e-9, key
        else:
            assert kernel[key] == causal[key], key


@pytest.mark.parametrize("window", [None, 8])
def test_flat_walk_matches_the_profiler(window):
    model = FlatByteLM(d_model=32, n_layers=2, n_heads=2, mlp_ratio=4.0, window=window).eval()
    x = torch.randint(0, 256, (2, 40))
    profiled = profiled_flops(lambda: model(x))
    assert model_flops(model, 40, attention="kernel")["total"] * x.numel() == pytest.approx(profiled, rel=1e-9)
    causal = model_flops(model, 40)
    assert causal["body"] * x.numel() + causal["head"] * x.numel() < profiled  # attention: fewer pairs used


def test_bpe_token_walk_matches_the_profiler():
    from rltok.data.bpe import fit_bpe_to_rate

    text = b"the cat sat on the mat and the dog sat on the log " * 40
    tok = fit_bpe_to_rate(text, 0.25, vocab_size=270).tokenizer
    model = BPETokenLM(tok, d_model=32, n_layers=2, n_heads=2).eval()
    row = torch.tensor(list(text[:96]))
    x = row.expand(2, -1).clone()  # equal rows: equal token counts, no padding
    n = int(model.encode(x[:1])[2][0])
    profiled = profiled_flops(lambda: model(x))
    # the forward reads tokens 0..n-2 (the last token's prediction would leave the window); the
    # walk's cost per token at n - 1 tokens is what it runs
    rate = (n - 1 + 0.5) / 96  # int(96 * rate) = n - 1
    per_token = model_flops(model, 96, rate, attention="kernel")["total"] / rate
    assert per_token * (n - 1) * 2 == pytest.approx(profiled, rel=1e-9)


# ---- (c) a rule the package does not know -----------------------------------------------------------

class ToyRule(Chunker):
    """A boundary every byte whose two-layer score is positive; defined here, not in src/."""

    def __init__(self, dim: int):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(dim, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_):
        s = self.score(h).squeeze(-1)
        b = (s > 0) if b is None else b.bool()
        return Boundaries(b=b | forced, free=~forced, scores=torch.sigmoid(s))


class PlainRule(nn.Module):
    """The same rule as a bare module, without the Chunker base class."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 3)

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_):
        s = self.proj(h)[..., 0]
        b = (s > 0) if b is None else b.bool()
        return Boundaries(b=b | forced, free=~forced, scores=torch.sigmoid(s))

    def chunk_flops(self, level, dim):  # what a Stage asks every rule
        return 0.0


@pytest.mark.parametrize("rule,per_byte", [(ToyRule, 2.0 * (32 * 8 + 8 * 1)), (PlainRule, 2.0 * 32 * 3)])
def test_a_rule_defined_here_is_costed_by_its_layers(rule, per_byte):
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, window=16, chunker="fixed")
    model = HourglassLM(cfg).eval()
    model.chunker = rule(cfg.d_byte)
    assert model_flops(model, 64)["policy"] == per_byte
    # and it is what the profiler sees it run
    x = torch.randint(0, 256, (2, 64))
    b = fixed_boundaries(2, 64)
    rate = int(model.score(x, b).n_chunks[0]) / 64
    profiled = profiled_flops(lambda: model.score(x, b))
    assert model_flops(model, 64, rate, attention="kernel")["total"] * x.numel() == pytest.approx(profiled, rel=1e-9)


def test_an_unknown_model_is_costed_by_its_linear_layers():
    model = nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 256))
    assert model_flops(model, 128) == {"total": 2.0 * (16 * 32 + 32 * 256)}
    with pytest.raises(ValueError, match="attention"):
        model_flops(model, 128, attention="fused")


def test_cost_of_a_config_is_built_once_on_the_meta_device():
    cfg = load_config("small")
    a, b = run_cost(cfg), run_cost(cfg)
    assert a.model is b.model and next(a.model.parameters()).device.type == "meta"
    assert (a.seq_len, a.group_size) == (cfg.train.seq_len, 1)


def test_the_flops_module_has_one_way_to_cost_a_config():
    """The config-level functions are gone: a config is costed by building its model (run_cost)."""
    from rltok.model import flops

    for name in ("cost_of_config", "unfitted_model", "hourglass_flops", "flat_flops", "chunk_cost_flops",
                 "config_forward_flops_per_byte", "step_train_flops_per_byte", "counterfactual_flops_per_byte",
                 "tokenizer_phase_flops_per_byte", "block_linear_flops", "attention_flops", "mean_keys"):
        assert not hasattr(flops, name), name
