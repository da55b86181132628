"""The flat byte model and the BPE-token model share PlainLM's set-up; their parameter names and
order are the ones saved checkpoints hold (fixed-seed numerics: tests/test_behaviour.py)."""

from __future__ import annotations

import torch

from rltok.config import load_config
from rltok.model.factory import build_model
from rltok.model.plain_lm import PlainLM

TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox\n" % (i, i * 7) for i in range(300))
BLOCK = ["norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight", "mlp.fc.weight", "mlp.proj.weight"]
BODY = [f"body.blocks.{i}.{k}" for i in range(2) for k in BLOCK] + ["body.norm.weight", "head.weight"]


def _model(*overrides: str):
    cfg = load_config("test", overrides=["model.flat_layers=2", *overrides])
    torch.manual_seed(0)
    return build_model(cfg.model, train_bytes=torch.frombuffer(bytearray(TEXT), dtype=torch.uint8))


def test_state_dict_keys_are_the_saved_ones():
    flat = _model("model.arch=flat", "model.ngram_vocab=64")
    tokens = _model("model.arch=bpe_token", "model.bpe_vocab=300")
    assert isinstance(flat, PlainLM) and isinstance(tokens, PlainLM)
    assert list(flat.state_dict()) == ["embed.weight", "ngram_embed.table.weight", *BODY]
    assert list(tokens.state_dict()) == ["tokenizer_json", "embed.weight", *BODY]

