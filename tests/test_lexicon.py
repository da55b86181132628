"""The lexicon prior (rl/lexicon.py): a unigram model of chunk contents whose code length the
flips estimator adds to each flipped decision's credit."""

import math

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok.rl.lexicon import ChunkLexicon
from rltok.train import Trainer
from test_boundary_learning import corpus

TEXT = b"the cat sat on the mat and the dog sat on the log " * 20


def tensor(text: bytes) -> torch.Tensor:
    return torch.tensor(list(text)).view(1, -1)


def test_chunk_starts_follow_the_boundaries():
    b = torch.tensor([[0, 1, 0, 0, 1, 1, 0]])
    assert ChunkLexicon.chunk_starts(b).tolist() == [[0, 0, 2, 2, 2, 5, 6]]


def test_same_string_same_row_and_costs_only_at_chunk_ends():
    lex = ChunkLexicon(size=1 << 16)
    x = tensor(b"ab ab ab")
    b = torch.tensor([[0, 0, 1, 0, 0, 1, 0, 0]])
    h = lex.hashes(x, lex.chunk_starts(b))
    assert h[0, 2] == h[0, 5]  # "ab " twice
    assert h[0, 7] != h[0, 2]  # "ab" (the window's tail) is another string
    c = lex.costs(x, b)
    assert (c[0, [2, 5, 7]] > 0).all() and (c[0, [0, 1, 3, 4, 6]] == 0).all()


def test_an_empty_lexicon_costs_the_base_model():
    """No counts: p(w) = P0(w) = geometric length x uniform bytes (add-one with no bytes seen)."""
    lex = ChunkLexicon(size=1 << 10, concentration=7.0, mean_len=4.0)
    x = tensor(b"abc")
    b = torch.tensor([[0, 0, 1]])
    expected = -(math.log(0.25) + 2 * math.log(0.75) + 3 * math.log(1 / 256))
    assert lex.costs(x, b)[0, 2].item() == pytest.approx(expected, rel=1e-5)


def test_counting_a_segmentation_makes_it_cheaper_than_random_cuts():
    lex = ChunkLexicon(size=1 << 16, concentration=10.0, decay=1.0)
    x = tensor(TEXT)
    words = x == 32
    before = lex.costs(x, words).sum()
    lex.update(x, words)
    after = lex.costs(x, words).sum()
    random_cuts = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) < words.float().mean()
    assert after < before / 3
    assert after < lex.costs(x, random_cuts).sum() / 3


def test_a_flip_changes_costs_only_at_the_chunk_ends_next_to_it():
    """What makes the flips estimator's local credit exact for the lexicon: removing the boundary
    at f changes the costs at f and at the next chunk end only."""
    lex = ChunkLexicon(size=1 << 16, decay=1.0)
    x = tensor(TEXT[:40])
    b = (x == 32)
    lex.update(x, b)
    f = int(torch.nonzero(b[0])[3])
    flipped = b.clone()
    flipped[0, f] = False
    nxt = int(torch.nonzero(b[0])[4])
    changed = torch.nonzero(lex.costs(x, b) != lex.costs(x, flipped))[:, 1].tolist()
    assert changed == [f, nxt]


def test_decay_and_state_round_trip():
    lex = ChunkLexicon(size=1 << 10, decay=0.5)
    x = tensor(b"ab ab ")
    b = x == 32
    lex.update(x, b)
    lex.update(x, b)
    assert lex.counts.sum().item() == pytest.approx(2 * 0.5 + 2)  # first step's two chunks halved
    other = ChunkLexicon(size=1 << 10, decay=0.5)
    other.load_state_dict(lex.state_dict())
    assert torch.equal(other.costs(x, b), lex.costs(x, b))
    with pytest.raises(ValueError, match="lexicon_size"):
        ChunkLexicon(size=1 << 11).load_state_dict(lex.state_dict())


def test_lexicon_config_validation():
    with pytest.raises(ConfigError, match="flips"):
        load_config("test", overrides=["objective.lexicon_weight=1"])
    with pytest.raises(ConfigError, match="lexicon"):
        load_config("test", overrides=["objective.estimator=flips", "objective.lexicon_decay=0"])


def test_training_with_the_lexicon_resumes_exactly(tmp_path):
    over = ["train.max_steps=6", "train.threads=1", "objective.estimator=flips", "objective.lexicon_weight=1",
            "objective.lexicon_size=4096", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=3",
            "objective.policy_start_step=2"]
    full = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'a'}", *over]), corpus=corpus(), quiet=True)
    full.fit()
    assert "lexicon_bpb" in full.history[-1]
    Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over]), corpus=corpus(),
            quiet=True).fit(stop_at=3)
    resumed = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over]), corpus=corpus(),
                      resume=True, quiet=True)
    resumed.fit()
    assert torch.equal(full.objective.lexicon.counts, resumed.objective.lexicon.counts)
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)


def test_recipes_set_their_keys_and_explicit_keys_win():
    tiny = load_config("tiny").objective
    assert (tiny.recipe, tiny.estimator, tiny.lexicon_weight, tiny.flip_rate_control, tiny.flip_model_pass) == \
        ("lexicon", "flips", 1.0, True, False)
    ref = load_config("tiny", overrides=["objective.recipe=reference"]).objective
    assert (ref.estimator, ref.lexicon_weight, ref.flip_rate_control) == ("score_function", 0.0, False)
    mixed = load_config("small", overrides=["objective.lexicon_weight=0.5"]).objective
    assert (mixed.recipe, mixed.estimator, mixed.lexicon_weight) == ("lexicon", "flips", 0.5)
    assert load_config("nl-147m").objective.recipe == "reference"  # GPU scale: the published recipe
    with pytest.raises(ConfigError, match="recipe"):
        load_config("tiny", overrides=["objective.recipe=lexicn"])
    with pytest.raises(ConfigError, match="recipe=reference"):  # two stages: flips is one-stage only
        load_config("tiny", overrides=["model.stages=2"])


def _train_policy_on_credits(price) -> float:
    """300 steps of a free-logit policy on credits that favour a boundary everywhere (D ~ U(1, 2),
    not centred): the final mean boundary probability."""
    from rltok.rl.flips import draw_flips, local_expectation_loss

    gen = torch.Generator().manual_seed(0)
    logits = torch.full((16, 256), -1.386, requires_grad=True)  # p = 0.2
    opt = torch.optim.Adam([logits], lr=0.05)
    free = torch.ones(16, 256, dtype=torch.bool)
    for _ in range(300):
        flips = draw_flips(free, 4, gen)
        values = 1 + torch.rand(16, 256, generator=gen)
        loss = local_expectation_loss(logits, values, flips, center=False,
                                      price=0.0 if price is None else price.price)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if price is not None:
            price.update(torch.sigmoid(logits.detach()).mean())
    return torch.sigmoid(logits.detach()).mean().item()


def test_the_flip_price_holds_the_rate_against_a_strong_credit():
    from rltok.rl.controller import LagrangePrice

    assert _train_policy_on_credits(None) > 0.9  # nothing holds the rate
    assert abs(_train_policy_on_credits(LagrangePrice(0.2, lr=0.2, gain=5.0)) - 0.2) < 0.05


def test_lexicon_only_credit_runs_no_model_pass_and_counts_no_extra_flops(tmp_path):
    over = ["train.max_steps=4", "train.threads=1", "objective.recipe=lexicon", "objective.flip_model_pass=false",
            "objective.lexicon_size=4096", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=1000"]
    trainer = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'a'}", *over]), corpus=corpus(),
                      quiet=True)
    calls = []
    model_forward = trainer.model.forward
    trainer.model.forward = lambda *a, **k: calls.append(k.get("encoded") is not None) or model_forward(*a, **k)
    trainer.fit()
    assert calls and not any(calls)  # forward ran, never re-run after the encoder
    assert trainer.history[-1]["flip_value"] != 0  # the lexicon still gives credit
    with_pass = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over[:-4],
                                                        "objective.flip_model_pass=true", *over[-3:]]),
                        corpus=corpus(), quiet=True)
    with_pass.fit()
    assert trainer.flops_spent < 0.9 * with_pass.flops_spent
    with pytest.raises(ConfigError, match="lexicon_weight"):
        load_config("test", overrides=["objective.estimator=flips", "objective.flip_model_pass=false"])


def test_the_lexicon_recipe_learns_to_cut_at_spaces(tmp_path):
    """End to end through the trainer: on fixed synthetic pseudo-code (words from a small vocabulary
    between spaces), the lexicon recipe's policy ends chunks at whitespace far above chance
    (boundaries independent of the bytes at rate 0.2 reach about 0.36). ~20 s on one CPU thread."""
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=800", "train.threads=1",
                                         "train.eval_every=800", "train.log_every=100", "train.checkpoint_every=1000",
                                         "objective.recipe=lexicon"])
    result = Trainer(cfg, corpus=corpus(), quiet=True).fit()
    assert result.val["space_align"] > 0.7, result.val
    assert abs(result.val["rate"] - 0.2) < 0.05, result.val  # the price holds the rate
