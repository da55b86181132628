"""The size ladder (rltok.model.sizing): one knob, non-embedding parameters N, to a shape per
family; `non_embedding_params` of each family; the flat model's windowed attention (model.flat_window)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rltok

from rltok.analysis.compare import method_overrides
from rltok.config import VOCAB_SIZE, ConfigError, load_config
from rltok.model.cost import causal_keys
from rltok.model.factory import build_model
from rltok.model.flat import FlatByteLM
from rltok.model.flops import model_flops
from rltok.model.hourglass import HourglassLM
from rltok.model.sizing import (ASPECT, TOLERANCE, Candidate, Family, built_model, choose, geometric_sizes, ladder,
                                method_spec)
from rltok.model.token_lm import BPETokenLM

# family -> base overrides (the hierarchy with its default, learned rule: a rule with layers)
FAMILIES = {"flat": [], "bpe_token": [], "hourglass": []}
SIZES = geometric_sizes(2e4, 2e6, 7)
# bytes to fit the BPE-token model's tokenizer on: the package's model code (~170 KB)
TEXT = torch.tensor(list(b"".join(p.read_bytes() for p in sorted(Path(rltok.__file__).parent.glob("model/*.py")))),
                    dtype=torch.uint8)


@pytest.fixture(scope="module")
def ladders():
    return {fam: ladder(fam, SIZES, base) for fam, base in FAMILIES.items()}


def test_geometric_sizes():
    assert geometric_sizes(1e4, 1e6, 3) == [10_000, 100_000, 1_000_000]
    assert geometric_sizes(5e4, 5e4, 1) == [50_000]
    with pytest.raises(ValueError):
        geometric_sizes(1e4, 1e3, 3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ladder_hits_its_targets_and_grows_in_size_and_flops(ladders, family):
    rungs = ladders[family]
    assert [r.target for r in rungs] == SIZES
    for r in rungs:
        assert abs(r.achieved / r.target - 1) <= 0.15, (family, r)
    achieved = [r.achieved for r in rungs]
    assert achieved == sorted(achieved) and len(set(achieved)) == len(achieved)
    flops = [model_flops(built_model(r.overrides), 512, 0.2)["total"] for r in rungs]
    assert all(a < b for a, b in zip(flops, flops[1:])), flops


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rungs_load_build_and_count_what_the_ladder_says(ladders, family):
    for rung in ladders[family][:2]:  # the small ones: built for real on the CPU
        cfg = load_config("tiny", overrides=[*FAMILIES[family], *rung.overrides])
        assert cfg.model.arch == family
        model = build_model(cfg.model, train_bytes=TEXT)  # the BPE-token model fits its tokenizer on it
        assert model.non_embedding_params() == rung.achieved
        out = model(TEXT[:64].view(1, -1).long())
        assert torch.isfinite(out.logits if out.logits is not None else out.byte_nll).all()


def test_rungs_as_compare_methods(ladders):
    rung = ladders["flat"][0]
    spec = method_spec("flat", rung.overrides)
    assert method_overrides(spec)[-len(rung.overrides):] == rung.overrides
    cfg = load_config("small", overrides=method_overrides(spec))
    assert (cfg.model.arch, cfg.model.d_chunk) == ("flat", int(rung.overrides[1].split("=")[1]))
    with pytest.raises(ValueError):
        method_spec("flat", ["model.ngram_sizes=3,4"])


def test_the_shape_rule_prefers_the_aspect_ratio_within_tolerance():
    shapes = [Candidate(32, 4, 100), Candidate(64, 2, 108), Candidate(128, 1, 100)]
    assert choose(shapes, 100) == Candidate(64, 2, 108)  # width/depth 32, within the tolerance
    assert choose([Candidate(32, 1, 100), Candidate(64, 2, 1000)], 500) == Candidate(64, 2, 1000)  # nearest N
    assert ASPECT == 32 and TOLERANCE <= 0.15


def test_ladder_keeps_the_base_overrides_and_a_given_vocabulary():
    [rung] = ladder("bpe_token", [1e5], ["model.bpe_vocab=4096"])
    assert not any(o.startswith("model.bpe_vocab") for o in rung.overrides)
    [rung] = ladder("bpe_token", [1e5])
    assert "model.bpe_vocab=2048" in rung.overrides
    with pytest.raises(ValueError):
        ladder("lstm", [1e5])


# ---- non_embedding_params: hand counts --------------------------------------------------------

def block_params(d: int, mlp_ratio: float = 4.0) -> int:
    """qkv + out projection + MLP in and out + two norms."""
    hidden = int(d * mlp_ratio)
    return 3 * d * d + d * d + 2 * d * hidden + 2 * d


def test_non_embedding_params_flat_by_hand():
    model = FlatByteLM(32, 2, 2, ngram_sizes=(3, 4), ngram_vocab=100)
    # blocks + final norm + the byte head (counted); embedding and n-gram tables are not
    assert model.non_embedding_params() == 2 * block_params(32) + 32 + 32 * VOCAB_SIZE
    assert model.num_params() - model.non_embedding_params() == 32 * VOCAB_SIZE + 2 * 100 * 32


def test_non_embedding_params_bpe_token_by_hand():
    cfg = load_config("tiny", overrides=["model.arch=bpe_token", "model.d_chunk=32", "model.n_heads_chunk=2",
                                         "model.flat_layers=3", "model.bpe_vocab=512"]).model
    model = BPETokenLM.unfitted(cfg)
    assert model.non_embedding_params() == 3 * block_params(32) + 32  # no embedding, no output layer
    assert BPETokenLM.unfitted(cfg, 1024).non_embedding_params() == model.non_embedding_params()


def test_non_embedding_params_hourglass_by_hand():
    cfg = load_config("tiny", overrides=["model.chunker=uniform", "model.d_byte=16", "model.n_heads_byte=1",
                                         "model.d_chunk=32", "model.n_heads_chunk=2", "model.main_layers=2",
                                         "model.ngram_vocab=64", "model.chunk_vocab=128"]).model
    model = HourglassLM(cfg)
    byte_level = 2 * (block_params(16) + 16)  # encoder and decoder, one block and a norm each
    heads = 2 * 16 * VOCAB_SIZE  # next byte and early exit, counted
    between = 2 * 16 * 32  # down and up
    assert model.non_embedding_params() == byte_level + 2 * block_params(32) + 32 + heads + between
    tables = 16 * VOCAB_SIZE + 64 * len(cfg.ngram_sizes) * 16 + 128 * 32
    assert model.num_params() - model.non_embedding_params() == tables


# ---- the flat model's attention window --------------------------------------------------------

def flat_pair(window: int, layers: int = 2) -> tuple[FlatByteLM, FlatByteLM]:
    """A full-attention flat model and the same weights with a window."""
    torch.manual_seed(0)
    full = FlatByteLM(32, layers, 2, max_seq_len=128)
    windowed = FlatByteLM(32, layers, 2, window=window, max_seq_len=128)
    windowed.load_state_dict(full.state_dict())
    return full.eval(), windowed.eval()


def test_flat_window_from_config():
    default = build_model(load_config("test", overrides=["model.arch=flat"]).model)
    assert all(b.attn.window is None for b in default.body.blocks)
    model = build_model(load_config("test", overrides=["model.arch=flat", "model.flat_window=16"]).model)
    assert all(b.attn.window == 16 for b in model.body.blocks)
    with pytest.raises(ConfigError):
        load_config("test", overrides=["model.flat_window=-1"])


def test_flat_window_flops_count_the_window():
    full, windowed = flat_pair(16)
    f_full, f_win = model_flops(full, 512), model_flops(windowed, 512)
    assert f_win["body_attn"] == pytest.approx(2 * 4 * 32 * causal_keys(512, 16))
    assert f_full["body_attn"] == pytest.approx(2 * 4 * 32 * causal_keys(512, None))
    assert f_win["body_attn"] < f_full["body_attn"] / 10
    assert f_win["body"] == f_full["body"] and f_win["head"] == f_full["head"]
    assert model_flops(windowed, 16)["total"] == model_flops(full, 16)["total"]  # the window covers it all
    # the kernel count charges the blocked kernel's 2 x window keys
    assert model_flops(windowed, 512, attention="kernel")["body_attn"] == pytest.approx(2 * 4 * 32 * 32)


@torch.no_grad()
def test_flat_window_changes_outputs_only_beyond_the_window():
    window = 8
    full, windowed = flat_pair(window)
    x = torch.randint(0, 256, (2, 64))
    a, b = full(x).logits, windowed(x).logits
    torch.testing.assert_close(b[:, :window], a[:, :window], rtol=1e-5, atol=1e-5)
    assert (b[:, window:] - a[:, window:]).abs().amax() > 1e-3


@torch.no_grad()
def test_windowed_flat_model_is_causal_with_a_bounded_reach():
    window, layers = 8, 2
    _, model = flat_pair(window, layers)
    x = torch.randint(0, 256, (1, 64))
    y = x.clone()
    p = 20
    y[0, p] = (x[0, p] + 1) % 256
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(b[:, :p], a[:, :p], rtol=0, atol=1e-6)  # nothing before the change moves
    assert (b[:, p] - a[:, p]).abs().amax() > 1e-4
    reach = p + layers * (window - 1)  # each layer looks window - 1 bytes further back
    torch.testing.assert_close(b[:, reach + 1:], a[:, reach + 1:], rtol=0, atol=1e-5)


def test_model_card_states_the_flat_window():
    _, shape, _ = FlatByteLM.card_facts({"flat_layers": 2, "d_chunk": 32, "flat_window": 16})
    assert ("attention", "sliding window 16") in shape
    _, shape, _ = FlatByteLM.card_facts({"flat_layers": 2, "d_chunk": 32})  # a config from before the key
    assert [k for k, _ in shape] == ["layers"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_counts_followed_in_depth_equal_the_built_models(family):
    fam = Family(family)
    for c in [c for c in fam.candidates(1e5) if c.width == 48 and c.depth in (1, 5, 7)]:
        assert c.n == fam.params(fam.overrides(c.width, c.depth)), c


def test_a_study_can_aim_at_another_aspect_and_byte_width():
    """`aspect` moves the rule's width/depth aim (wider, shallower shapes at 64); `byte_ratio`
    sets the hierarchy's byte width; the defaults are the rule's own; nonsense is refused."""
    targets = [7.5e4, 1.5e5, 3e5]
    base = ["model.chunker=uniform"]
    default = ladder("hourglass", targets, base)
    assert default == ladder("hourglass", targets, base, aspect=ASPECT, byte_ratio=0.5)
    wide = ladder("hourglass", targets, base, aspect=64)

    def shape(rung):
        cfg = load_config("tiny", overrides=[*base, *rung.overrides]).model
        return cfg.d_chunk, cfg.main_layers, cfg.d_byte

    assert [shape(r) for r in default][1:] == [(64, 2, 32), (80, 3, 48)]
    assert [shape(r) for r in wide][1:] == [(80, 1, 48), (96, 2, 48)]  # nearer width/depth 64, within 15% of N
    assert all(abs(r.achieved / r.target - 1) <= TOLERANCE for r in wide)
    wider_bytes = ladder("hourglass", targets, base, byte_ratio=0.75)
    assert all(shape(r)[2] >= round(0.75 * shape(r)[0] / 16) * 16 for r in wider_bytes)
    assert shape(wider_bytes[1])[2] > shape(default[1])[2]
    with pytest.raises(ValueError, match="byte_ratio"):
        ladder("flat", targets, byte_ratio=0.5)
    with pytest.raises(ValueError, match="byte_ratio"):
        ladder("hourglass", targets, base, byte_ratio=1.5)
    with pytest.raises(ValueError, match="aspect"):
        ladder("flat", targets, aspect=0)
