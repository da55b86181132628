"""The learned chunk vocabulary: content hashes that are causal and consistent."""

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config import ConfigError, load_config
from rltok.model.generate import generate
from rltok.model import HourglassLM
from rltok.model.chunk_vocab import ChunkVocab


def test_equal_chunks_share_a_row_and_different_ones_rarely_do():
    cv = ChunkVocab(1 << 16, 8, max_len=8)
    idx = torch.tensor([list(b"the cat the dog the")])
    ends = torch.tensor([[3, 7, 11, 15, 18]])  # "the ", "cat ", "the ", "dog ", "the"
    h = cv.hashes(idx, ends)[0].tolist()
    assert h[0] == h[2] and h[0] != h[1] and h[1] != h[3] and h[4] != h[0]  # "the" (3 bytes) != "the "
    # long chunks hash their last max_len bytes and a capped length
    idx2 = torch.tensor([list(b"abcdefghijklmnopqrstuvwxyz")])
    assert cv.hashes(idx2, torch.tensor([[25]])).item() != cv.hashes(idx2, torch.tensor([[24]])).item()
    many = torch.randint(0, 256, (64, 32))
    ends = torch.arange(3, 32, 4).expand(64, -1)
    rows = cv.hashes(many, ends).flatten()
    assert rows.unique().numel() > 0.99 * rows.numel()  # random 4-byte chunks: almost no collisions


def test_chunk_vocab_keeps_the_model_causal_and_learns():
    model = randomize_(HourglassLM(tiny_model_config(chunk_vocab=512)), scale=0.3)
    torch.nn.init.normal_(model.chunk_vocab.table.weight)
    x = torch.randint(0, 256, (2, 48))
    b = torch.rand(2, 48, generator=torch.Generator().manual_seed(0)) < 0.3
    ref = model.score(x, b).logits
    for t in (5, 20, 40):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(0, 256, (2, 48 - t - 1))
        out = model.score(x2, b).logits
        assert torch.allclose(out[:, : t + 1], ref[:, : t + 1], atol=1e-5)
    ref.sum().backward()
    assert model.chunk_vocab.table.weight.grad.abs().sum() > 0


def test_chunk_vocab_config_and_cached_generation():
    """Cached decoding hashes each chunk as it closes, from the bytes it kept: the same logits as
    the parallel pass, chunks longer than max_len included."""
    with pytest.raises(ConfigError):
        load_config("test", overrides=["model.chunk_vocab=-1"])
    model = randomize_(HourglassLM(tiny_model_config(chunk_vocab=64, chunk_vocab_max_len=3, max_seq_len=64)))
    torch.nn.init.normal_(model.chunk_vocab.table.weight)
    model.eval()
    g = generate(model, b"the cat, the dog", 30, temperature=0, seed=0)
    data = g.prompt + g.output
    b = torch.tensor(g.boundaries)
    ends = torch.nonzero(b).flatten()
    assert (ends[1:] - ends[:-1]).max() > 3  # some chunk is longer than max_len
    with torch.no_grad():
        ref = model.score(torch.tensor([list(data[:-1])]), b.unsqueeze(0), force_last=False)
    assert ref.logits[0, len(g.prompt) - 1:, :256].argmax(-1).tolist() == list(g.output)
    st = model.start_decoding(1, 64)
    x = torch.tensor(list(data[:-1]))
    logits = [model.prefill(st, 0, x[:4], b[:4]).logits]
    logits += [model.step(st, x[t:t + 1], b[t:t + 1]).logits[0] for t in range(4, len(x))]
    assert (torch.stack(logits) - ref.logits[0, 3:]).abs().max() <= 1e-4
