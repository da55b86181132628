"""The analytical FLOP counter against a brute-force count on a real forward pass.

Linear layers are counted with forward hooks (in_features * out_features multiply-adds per
row); attention by wrapping scaled_dot_product_attention and counting the (query, key) pairs
its mask allows. Boundaries are fixed, so the chunk count — and hence the rate — is exact.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.config import ModelConfig
from rltok.model.flops import flat_flops, hourglass_flops, mean_keys, train_flops_per_byte
from rltok.model import FlatByteLM, HourglassLM
from rltok.model.layers import Attention

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


TINY = dict(d_byte=32, d_chunk=48, n_heads_byte=2, n_heads_chunk=2, encoder_layers=1,
            main_layers=2, decoder_layers=2, mlp_ratio=3.0)


@pytest.mark.parametrize("chunker,window,seq_len,value_head", [
    # window 16 of 64 bytes: the blocked kernel; 16 of 40: the dense mask; 64 of 40: plain causal
    ("fixed", 16, 64, False), ("fixed", 16, 40, False), ("fixed", 64, 40, False), ("rl", 16, 64, False),
    ("rl", 16, 64, True),
    ("hnet", 16, 64, False), ("gumbel", 16, 64, False)])
def test_hourglass_flops_match_brute_force(chunker, window, seq_len, value_head, monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, window=window, chunker=chunker, fixed_stride=5, value_head=value_head)
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


def test_mean_keys():
    assert mean_keys(4, None) == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert mean_keys(5, 2) == pytest.approx((1 + 2 + 2 + 2 + 2) / 5)
    assert mean_keys(3, 10) == mean_keys(3, None)


def test_chunk_level_scales_with_rate():
    cfg = ModelConfig()
    lo, hi = hourglass_flops(cfg, 512, 0.1), hourglass_flops(cfg, 512, 0.2)
    assert lo["byte_level"] == hi["byte_level"]
    assert lo["main"] == pytest.approx(hi["main"] / 2)  # linear part is proportional to the rate
    assert lo["main_attn"] < hi["main_attn"] / 2  # attention grows faster than the rate
