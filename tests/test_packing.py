"""Packed chunks (model.pack_chunks, the default) compute what the padded layout computes: the
same outputs, losses and gradients up to float summation order, for every rule and stage; and
the chunk-level layers see only the real chunks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rltok.model import HourglassLM
from rltok.model.layers import Packing
from rltok.objective.loss import compute_loss
from rltok.config import ObjectiveConfig, RLChunkerSettings, ScoreFunctionSettings

from conftest import randomize_, tiny_model_config

VARIANTS = {
    "rl": dict(),
    "rl-window3": dict(chunker=RLChunkerSettings(window=3)),
    "hnet": dict(chunker="hnet"),
    "gumbel": dict(chunker="gumbel"),
    "dynamic_pooling": dict(chunker="dynamic_pooling"),
    "two-stage": dict(stages=2, stage2_layers=1),
    "chunk-vocab": dict(chunk_vocab=64, chunk_vocab_max_len=4),
}


def test_packing_round_trip():
    lengths = torch.tensor([3, 1, 4])
    p = Packing(lengths, 4, 8)
    x = torch.arange(8.0).view(1, 8, 1)
    padded = p.pad(x)
    assert padded[..., 0].tolist() == [[0, 1, 2, 0], [3, 0, 0, 0], [4, 5, 6, 7]]
    assert torch.equal(p.unpad(padded), x)


def pair(variant: str, seed: int = 0):
    """The same randomised weights, packed and padded."""
    cfg = tiny_model_config(**VARIANTS[variant], max_seq_len=64)
    packed = randomize_(HourglassLM(cfg), seed=seed)
    padded = HourglassLM(dataclasses.replace(cfg, pack_chunks=False))
    padded.load_state_dict(packed.state_dict())
    return packed, padded


def run(model, x, y, group_size=1):
    gen = torch.Generator().manual_seed(3)
    out = model(x, generator=gen, group_size=group_size)
    obj = ObjectiveConfig(estimator=ScoreFunctionSettings(baseline="group" if group_size > 1 else "batch"),
                          group_size=group_size)
    loss, _ = compute_loss(out, y, obj, model.cfg.target_rate, target_rate2=0.5 if len(model.stages()) > 1 else None)
    model.zero_grad()
    loss.backward()
    return out, loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("group_size", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_equals_padded(variant, group_size):
    packed, padded = pair(variant)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (4, 48), generator=g)
    y = torch.randint(0, 256, (4, 48), generator=g)
    out_a, loss_a, grads_a = run(packed, x, y, group_size)
    out_b, loss_b, grads_b = run(padded, x, y, group_size)
    n = out_a.n_chunks
    assert n.min() < n.max(), "rows with equal chunk counts would not exercise the packing"
    assert torch.equal(out_a.boundaries.b, out_b.boundaries.b)
    if out_a.boundaries2 is not None:
        assert torch.equal(out_a.boundaries2.b, out_b.boundaries2.b)
    torch.testing.assert_close(out_a.logits, out_b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunk_layers_see_only_real_chunks():
    packed, padded = pair("rl")
    x = torch.randint(0, 256, (4, 48), generator=torch.Generator().manual_seed(1))
    rows = {}
    for name, model in (("packed", packed), ("padded", padded)):
        hook = model.main.blocks[0].mlp.fc.register_forward_hook(
            lambda m, a, o, name=name: rows.__setitem__(name, a[0].shape[:-1].numel()))
        with torch.no_grad():
            out = model(x, generator=torch.Generator().manual_seed(3))
        hook.remove()
        n = out.n_chunks
    assert rows["packed"] == int(n.sum()) < rows["padded"] == 4 * int(n.max())


def test_packed_runs_under_bf16_autocast():
    packed, padded = pair("two-stage")
    x = torch.randint(0, 256, (4, 48), generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (packed, padded):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x, generator=torch.Generator().manual_seed(3))
        out.logits.float().sum().backward()
        outs.append(out.logits.float())
    torch.testing.assert_close(outs[0], outs[1], rtol=0.05, atol=0.05)
