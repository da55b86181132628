"""A hierarchical model of any depth, built from per-level specs: three levels (bytes, chunks,
chunks of chunks) with fixed, uniform and learned rules at the inner levels. It trains, stays
causal, and its cached decoding agrees with the parallel pass."""

from functools import partial

import pytest
import torch
from conftest import randomize_, tiny_model_config

from rltok.config import FixedChunkerSettings, ObjectiveConfig
from rltok.model import HourglassLM
from rltok.model.hourglass import per_item
from rltok.model.chunkers import FixedChunker, RLPolicy, UniformChunker
from rltok.model.layers import Stack
from rltok.model.levels import LevelSpec, chunk_levels
from rltok.model.stage import ChunkStage
from rltok.objective.loss import compute_loss

# (byte-level config, the two chunk levels' specs). The second level of "fixed-uniform" is
# narrower than the first, so the chunks are projected between them.
DEPTH3 = {
    "rl-fixed-rl": (dict(chunker="rl"),
                    [LevelSpec(48, 2, 1, lambda _: FixedChunker(2)),
                     LevelSpec(48, 2, 1, partial(RLPolicy, target_rate=0.4), 0.4)]),
    "fixed-uniform-fixed": (dict(chunker=FixedChunkerSettings(stride=3)),
                            [LevelSpec(48, 2, 1, lambda _: UniformChunker(0.5), 0.5),
                             LevelSpec(32, 2, 1, lambda _: FixedChunker(2))]),
}
TEXT = b"the hourglass reads bytes, chunks of bytes, and chunks of chunks; "


def make_model(name: str, **kw) -> HourglassLM:
    byte_level, levels = DEPTH3[name]
    cfg = tiny_model_config(**{**dict(window=8, max_seq_len=64), **byte_level, **kw})
    model = randomize_(HourglassLM(cfg, levels=levels))
    with torch.no_grad():
        if isinstance(model.chunker, RLPolicy):  # policies that vary, near rate 0.3 and 0.6
            model.chunker.head.bias.fill_(-0.8)
        inner = model.main.main.chunker
        if isinstance(inner, RLPolicy):
            inner.head.bias.fill_(0.5)
    return model


def test_a_three_level_model_is_stages_nested_as_main_networks():
    model = make_model("fixed-uniform-fixed")
    one, two = model.main, model.main.main
    assert isinstance(one, ChunkStage) and isinstance(two, ChunkStage) and isinstance(two.main, Stack)
    assert [s.depth for s in model.stages()] == [0, 1, 2] and [s.dim for s in model.stages()] == [32, 48, 32]
    assert isinstance(one.chunker, UniformChunker) and isinstance(two.chunker, FixedChunker)
    # the checkpoint names extend those of two stages: stage2, then stage2.stage3, then its main
    names = {k.split(".blocks")[0] for k in model.state_dict()}
    assert {"stage2.encoder", "stage2.down.weight", "stage2.stage3.encoder", "stage2.stage3.main",
            "stage2.stage3.decoder"} <= names
    assert len(model.stacks()) == 7  # an encoder and a decoder per level, and the main network
    # the config describes its levels in one place, and a model built from them is the same model
    cfg = tiny_model_config(stages=2, stage2_layers=2)
    assert [(lv.width, lv.layers, lv.target_rate) for lv in chunk_levels(cfg)] == [(48, 2, cfg.stage2_target_rate)]
    torch.manual_seed(0)
    a = HourglassLM(cfg).state_dict()
    torch.manual_seed(0)
    b = HourglassLM(cfg, levels=chunk_levels(cfg)).state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_rule_that_reads_the_early_exit_runs_only_at_the_bytes():
    from rltok.model.chunkers import EntropyChunker

    with pytest.raises(ValueError, match="early-exit"):
        HourglassLM(tiny_model_config(), levels=[LevelSpec(48, 2, 1, lambda _: EntropyChunker(0.3))])


@pytest.mark.parametrize("name", DEPTH3)
def test_a_three_level_model_trains(name):
    model = make_model(name)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.tensor(list(TEXT[:49])).view(1, -1).expand(4, -1)
    x, y = data[:, :-1], data[:, 1:]
    cfg = ObjectiveConfig()
    losses = []
    for step in range(8):
        out = model(x, torch.Generator().manual_seed(step))
        assert out.hierarchical and len(out.levels) == 2 and int(out.levels[1].boundaries.b.sum()) >= 4
        loss, metrics = compute_loss(out, y, cfg, 0.3)
        opt.zero_grad()
        loss.backward()
        deepest = model.main.main.encoder.blocks[0].mlp.fc.weight
        assert deepest.grad is not None and deepest.grad.abs().sum() > 0  # the deepest level learns
        opt.step()
        losses.append(float(metrics["ce_final"]))
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("name", DEPTH3)
def test_a_three_level_model_is_causal(name):
    """The prediction for byte t+1 (and every level's decisions up to t) never depends on bytes > t."""
    model = make_model(name).eval()
    x = torch.tensor([list(TEXT[:48])])
    with torch.no_grad():
        ref = model(x, torch.Generator().manual_seed(3), force_last=False)
        for t in (5, 20, 33):
            x2 = x.clone()
            x2[:, t + 1:] = torch.randint(0, 256, (1, 47 - t), generator=torch.Generator().manual_seed(t))
            out = model(x2, torch.Generator().manual_seed(3), force_last=False)
            assert (out.logits[0, :t + 1] - ref.logits[0, :t + 1]).abs().max() < 1e-5
            assert torch.equal(out.boundaries.b[0, :t + 1], ref.boundaries.b[0, :t + 1])
            for mine, theirs in zip(out.per_byte_levels(), ref.per_byte_levels()):
                assert torch.equal(mine[:t + 1], theirs[:t + 1])


@pytest.mark.parametrize("inner", ["uniform", "gumbel"])
def test_a_random_rule_above_bytes_decides_each_row_from_its_own_past(inner):
    """Above a content-dependent byte rule the rows' chunk counts differ and are padded to the
    longest: a rule drawing its own (B, M) noise there would tie a row's decisions to the other
    rows and to later bytes. Each draws the level's one draw per item instead."""
    from rltok.model.chunkers.straight_through import GumbelChunker

    rule = (lambda _: UniformChunker(0.5)) if inner == "uniform" else (lambda d: GumbelChunker(d, 0.5))
    cfg = tiny_model_config(chunker="rl", window=8, max_seq_len=64)
    model = randomize_(HourglassLM(cfg, levels=[LevelSpec(48, 2, 1, rule, 0.5), LevelSpec(48, 2, 1, lambda _: FixedChunker(2))]))
    with torch.no_grad():
        model.chunker.head.bias.fill_(-0.8)
    model.eval()
    x = torch.tensor([list(TEXT[:48]), list(TEXT[10:58])])
    with torch.no_grad():
        ref = model(x, torch.Generator().manual_seed(3), force_last=False)
        other = x.clone()
        other[1] = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(1))
        out = model(other, torch.Generator().manual_seed(3), force_last=False)
        assert (out.logits[0] - ref.logits[0]).abs().max() < 1e-5  # row 0 never sees row 1
        for t in (5, 20, 33):
            later = x.clone()
            later[:, t + 1:] = torch.randint(0, 256, (2, 47 - t), generator=torch.Generator().manual_seed(t))
            out = model(later, torch.Generator().manual_seed(3), force_last=False)
            assert (out.logits[:, :t + 1] - ref.logits[:, :t + 1]).abs().max() < 1e-5


def incremental(model, x: torch.Tensor, prefill: int, b=None, below=(), noise=None):
    """Logits for positions prefill-1 .. T-1 of x (T,) by cached decoding (`prefill` bytes read
    in parallel, then one per step), and the decisions of every level per byte. b, below (per
    byte) fix the decisions (the prefill's at least); noise (T, levels) are the steps' draws."""
    st = model.start_decoding(1, 64, generator=torch.Generator().manual_seed(1))
    first = model.prefill(st, 0, x[:prefill], None if b is None else b[:prefill], boundaries2=[d[:prefill] for d in below])
    outs = [first]
    for t in range(prefill, len(x)):
        step_b = None if noise is not None or b is None else b[t:t + 1]
        step_below = () if noise is not None else [d[t:t + 1] for d in below]
        outs.append(model.step(st, x[t:t + 1], step_b, step_below, None if noise is None else noise[t:t + 1]))
    logits = torch.stack([first.logits] + [o.logits[0] for o in outs[1:]])
    levels = [torch.cat([o.below[k] for o in outs]) for k in range(len(first.below))]
    return logits, torch.cat([o.boundaries for o in outs]), levels


@pytest.mark.parametrize("name", DEPTH3)
@pytest.mark.parametrize("prefill", [1, 13])
def test_cached_decoding_of_three_levels_equals_the_parallel_pass(name, prefill):
    model = make_model(name).eval()
    x = torch.tensor(list(TEXT[:40]))
    with torch.no_grad():
        ref = model(x.unsqueeze(0), torch.Generator().manual_seed(2), force_last=False)
    b, below = ref.boundaries.b[0], ref.per_byte_levels()
    assert len(below) == 2 and int(below[1].sum()) >= 2  # the deepest level closes items too
    logits, b_inc, below_inc = incremental(model, x, prefill, b, below)
    assert torch.equal(b_inc, b) and all(torch.equal(i, r) for i, r in zip(below_inc, below))
    assert (logits - ref.logits[0, prefill - 1:]).abs().max() <= 1e-4
    with torch.no_grad():  # and scoring the same decisions per item gives the same pass
        again = model.score(x.unsqueeze(0), b.unsqueeze(0), [lv.boundaries.b for lv in ref.levels], force_last=False)
    assert torch.equal(again.logits, ref.logits)


def test_three_levels_decode_from_the_forward_passes_draws():
    """Given the uniforms the forward pass draws (the bytes' window first, then each level's),
    every level decides byte by byte as it did."""
    model = make_model("rl-fixed-rl").eval()
    x = torch.tensor(list(TEXT[:40]))
    g = torch.Generator().manual_seed(2)
    noise = torch.stack([torch.rand(1, 40, generator=g) for _ in range(3)], dim=-1)[0]
    with torch.no_grad():
        ref = model(x.unsqueeze(0), torch.Generator().manual_seed(2), force_last=False)
    b, below = ref.boundaries.b[0], ref.per_byte_levels()
    logits, b_inc, below_inc = incremental(model, x, 5, b, below, noise=noise)
    assert torch.equal(b_inc, b) and all(torch.equal(i, r) for i, r in zip(below_inc, below))
    assert int(below[1][5:].sum()) >= 1
    assert (logits - ref.logits[0, 4:]).abs().max() <= 1e-4


def test_three_levels_generate_and_keep_every_levels_decisions():
    model = make_model("rl-fixed-rl").eval()
    g = model.generate(b"the prompt, ", 40, temperature=0, seed=0)
    data = g.prompt + g.output
    assert len(g.below) == 2 and g.boundaries2 == g.below[0] and len(g.below[1]) == len(data) - 1
    assert sum(g.below[1]) >= 2
    x = torch.tensor([list(data[:-1])])
    b = torch.tensor([g.boundaries])
    with torch.no_grad():  # greedy bytes: the argmax of the parallel pass with the decisions kept
        out = model.score(x, b, per_item(b, [torch.tensor([d]) for d in g.below]), force_last=False)
    assert out.logits[0, len(g.prompt) - 1:, :256].argmax(-1).tolist() == list(g.output)
    slid = make_model("rl-fixed-rl", max_seq_len=32).eval().generate(b"the prompt, ", 60, temperature=0, seed=0)
    assert len(slid.output) == 60 and all(len(d) == len(slid.boundaries) for d in slid.below)
