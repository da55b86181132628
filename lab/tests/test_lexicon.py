"""The lexicon prior (objective/lexicon.py): a unigram model of chunk contents whose code length
the flips estimator adds to each flipped decision's credit; and its research variants and
instruments (analysis/lexicon_instruments.py)."""

import math

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok_lab.lexicon_instruments import LabLexicon
from rltok.objective.lexicon import ChunkLexicon
from rltok.training.trainer import Trainer
from conftest import straight_and_resumed
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


def test_units_one_byte_late():
    """lag 1: a boundary at t closes the unit that ended at t - 1, charged at t; a flip still
    changes costs only at or after itself (at f and at the next boundary), so the flips estimator's
    local credit stays exact."""
    lex = LabLexicon(size=1 << 16, decay=1.0, lag=1)
    x = tensor(b"ab ab ab")
    b = torch.tensor([[1, 0, 1, 0, 0, 1, 0, 0]])  # boundaries on the spaces: units "ab", " ab", " ab"
    assert lex.unit_ends(b).tolist() == [[False, True, False, False, True, False, False, False]]
    c = lex.costs(x, b)
    assert (c[0, [2, 5, 7]] > 0).all() and (c[0, [0, 1, 3, 4, 6]] == 0).all()
    lex.update(x, b)
    h = lex.hashes(x, lex.chunk_starts(lex.unit_ends(b)))
    assert h[0, 1] != h[0, 4] and lex.counts[h[0, 4]] == 1  # " ab" counted once; the open tail " ab" not
    x = tensor(TEXT[:40])
    b = x == 32
    b[0, 0] = True
    lex.update(x, b)
    spaces = torch.nonzero(b[0])[:, 0].tolist()
    f, nxt = spaces[3], spaces[4]
    flipped = b.clone()
    flipped[0, f] = False
    changed = torch.nonzero(lex.costs(x, b) != lex.costs(x, flipped))[:, 1].tolist()
    assert changed == [f, nxt]


def test_blank_runs_are_one_unit_when_collapsed():
    """collapse_blanks: units that differ only in how long a run of spaces or tabs is share one row
    and one cost; splitting a run gives pieces that are all the one-blank unit; text with no
    repeated blank is costed exactly as without the option."""
    lex = LabLexicon(size=1 << 16, decay=1.0, collapse_blanks=True)
    x = tensor(b"\n    if\n        if")
    start, end = torch.tensor([[0, 7]]), torch.tensor([[6, 17]])  # "\n    if", "\n        if"
    rows = lex.rows(x, end, start)
    assert rows[0, 0] == rows[0, 1]
    assert lex.span_costs(x, start, end)[0, 0] == lex.span_costs(x, start, end)[0, 1]
    piece = lex.rows(x, torch.tensor([[3, 12, 15]]), torch.tensor([[3, 11, 14]]))  # " ", "  ", "  " inside runs
    assert (piece == lex.rows(x, torch.tensor([[1]]), torch.tensor([[1]]))).all()
    plain = LabLexicon(size=1 << 16, decay=1.0)
    assert lex.rows(x, end, start)[0, 0] != plain.rows(x, end, start)[0, 0]
    # split space by space an indentation run costs more than whole, once whole runs are counted
    code = tensor(CODE)
    whole = torch.zeros_like(code, dtype=torch.bool)
    whole[0, :-1] = (code[0, :-1] == 32) & (code[0, 1:] != 32)  # a cut at the last blank of each run
    lex.update(code, whole)
    split = whole | (code == 32)
    assert lex.costs(code, split).sum() > lex.costs(code, whole).sum() + 10
    y = tensor(b"def f(a, b):\n\treturn a.b(c) + 1 # x y z")
    s = torch.randint(0, y.shape[1], (1, 200), generator=torch.Generator().manual_seed(0))
    e = (s + torch.randint(0, 20, (1, 200), generator=torch.Generator().manual_seed(1))).clamp(max=y.shape[1] - 1)
    assert torch.equal(lex.rows(y, e, s), plain.rows(y, e, s))
    assert torch.allclose(LabLexicon(size=1 << 16, collapse_blanks=True).span_costs(y, s, e),
                          ChunkLexicon(size=1 << 16).span_costs(y, s, e))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_lab_lexicon_with_its_defaults_is_the_training_lexicon_bit_for_bit(seed):
    """The instruments' lexicon (analysis/lexicon_instruments.py) with lag 0, no blank collapsing
    and the unigram base takes the general path (spelled bytes, per-unit first byte); the training
    lexicon takes the short one. They cost, count and save exactly alike, so what the instruments
    measure is what training optimises, and `LabLexicon.of` shares a checkpoint's counts."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.cat([tensor(CODE[:80]), tensor(TEXT[:80])])
    train, lab = ChunkLexicon(size=1 << 12, decay=0.9), LabLexicon(size=1 << 12, decay=0.9)
    for _ in range(3):
        b = torch.rand(x.shape, generator=gen) < 0.25
        assert torch.equal(train.costs(x, b), lab.costs(x, b))
        train.update(x, b)
        lab.update(x, b)
    assert all(torch.equal(v, lab.state_dict()[k]) for k, v in train.state_dict().items())
    s = torch.randint(0, 80, (2, 50), generator=gen)
    e = (s + torch.randint(0, 16, (2, 50), generator=gen)).clamp(max=79)
    assert torch.equal(train.span_costs(x, s, e), lab.span_costs(x, s, e))
    view = LabLexicon.of(train)
    assert view.counts is train.counts and torch.equal(view.costs(x, b), train.costs(x, b))
    assert not hasattr(train, "lag") and not hasattr(train, "flip_deltas")


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
    with pytest.raises(ConfigError, match="for kind 'score_function'"):  # the lexicon is the flips' credit
        load_config("test", overrides=["objective.estimator.lexicon.weight=1"])
    with pytest.raises(ConfigError, match="lexicon.decay"):
        load_config("test", overrides=["objective.estimator=flips", "objective.estimator.lexicon.decay=0"])
    from rltok.objective.loss import build_lexicon

    lex = build_lexicon(load_config("test", overrides=["objective.recipe=lexicon"]))
    assert type(lex) is ChunkLexicon and lex.concentration == 100.0  # the training lexicon: no variants


def test_training_with_the_lexicon_resumes_exactly(tmp_path):
    over = ["train.max_steps=6", "train.threads=1", "objective.estimator=flips",
            "objective.estimator.lexicon.weight=1", "objective.estimator.lexicon.size=4096", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=3",
            "objective.policy_start_step=2"]
    full, resumed = straight_and_resumed(
        lambda out: load_config("test", overrides=[f"train.out_dir={out}", *over]), tmp_path, 3, corpus)
    assert "lexicon_bpb" in full.history[-1]
    assert torch.equal(full.objective.lexicon.counts, resumed.objective.lexicon.counts)


def test_recipes_set_their_keys_and_explicit_keys_win():
    tiny = load_config("tiny").objective
    est = tiny.estimator
    assert (tiny.recipe, est.kind, est.lexicon.weight, est.price.kind, est.model_pass) == \
        ("lexicon", "flips", 1.0, "target", False)
    ref = load_config("tiny", overrides=["objective.recipe=reference"]).objective
    assert ref.estimator.kind == "score_function" and not hasattr(ref.estimator, "lexicon")
    mixed = load_config("small", overrides=["objective.estimator.lexicon.weight=0.5"]).objective
    assert (mixed.recipe, mixed.estimator.kind, mixed.estimator.lexicon.weight) == ("lexicon", "flips", 0.5)
    assert load_config("nl-147m").objective.recipe == "reference"  # GPU scale: the published recipe
    with pytest.raises(ConfigError, match="recipe"):
        load_config("tiny", overrides=["objective.recipe=lexicn"])
    with pytest.raises(ConfigError, match="recipe=reference"):  # two stages: flips is one-stage only
        load_config("tiny", overrides=["model.stages=2"])


def _train_policy_on_credits(price) -> float:
    """300 steps of a free-logit policy on credits that favour a boundary everywhere (D ~ U(1, 2),
    not centred): the final mean boundary probability."""
    from rltok.objective.flips import draw_flips, local_expectation_loss

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
    from rltok.objective.controller import LagrangePrice

    assert _train_policy_on_credits(None) > 0.9  # nothing holds the rate
    assert abs(_train_policy_on_credits(LagrangePrice(0.2, lr=0.2, gain=5.0)) - 0.2) < 0.05


def test_lexicon_only_credit_runs_no_model_pass_and_counts_no_extra_flops(tmp_path):
    over = ["train.max_steps=4", "train.threads=1", "objective.recipe=lexicon", "objective.flip_model_pass=false",
            "objective.estimator.lexicon.size=4096", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=1000"]
    trainer = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'a'}", *over]), corpus=corpus(),
                      quiet=True)
    calls = []  # per model pass: whether it re-ran a counterfactual segmentation
    model_forward, model_rerun = trainer.model.forward, trainer.model.rerun
    trainer.model.forward = lambda *a, **k: calls.append(False) or model_forward(*a, **k)
    trainer.model.rerun = lambda *a, **k: calls.append(True) or model_rerun(*a, **k)
    trainer.fit()
    assert calls and not any(calls)  # forward ran, never re-run after the encoder
    assert trainer.history[-1]["flip_value"] != 0  # the lexicon still gives credit
    with_pass = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over[:-4],
                                                        "objective.estimator.model_pass=true", *over[-3:]]),
                        corpus=corpus(), quiet=True)
    with_pass.fit()
    assert trainer.flops_spent < 0.9 * with_pass.flops_spent
    with pytest.raises(ConfigError, match="lexicon.weight"):
        load_config("test", overrides=["objective.estimator=flips", "objective.estimator.model_pass=false"])


def test_the_lexicon_recipe_learns_to_cut_at_spaces(tmp_path):
    """End to end through the trainer: on fixed synthetic pseudo-code (words from a small vocabulary
    between spaces), the lexicon recipe's policy ends chunks at whitespace far above chance
    (boundaries independent of the bytes at rate 0.2 reach about 0.36). 400 steps reach 0.73-0.81
    over seeds 0-3 (800 steps: about 0.83). ~8 s on one CPU thread."""
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=400", "train.threads=1",
                                         "train.eval_every=400", "train.log_every=100", "train.checkpoint_every=1000",
                                         "objective.recipe=lexicon"])
    result = Trainer(cfg, corpus=corpus(), quiet=True).fit()
    assert result.val["space_align"] > 0.7, result.val
    assert abs(result.val["rate"] - 0.2) < 0.05, result.val  # the price holds the rate


CODE = b"class A:\n    def f(self):\n        if x:\n            return self.y\n        return  1\n"


@pytest.mark.parametrize("lag,collapse,base", [(0, False, "unigram"), (1, False, "unigram"), (0, True, "unigram"),
                                               (1, True, "unigram"), (0, False, "bigram"), (1, True, "bigram")])
def test_flip_deltas_are_each_single_flip_exactly(lag, collapse, base):
    """flip_deltas gives, for every position at once, what flipping that decision alone changes in
    the total code length (checked against re-costing each flipped segmentation)."""
    lex = LabLexicon(size=1 << 12, decay=1.0, lag=lag, collapse_blanks=collapse, base=base)
    x = tensor(CODE if collapse else TEXT[:80])
    lex.update(x, x == 32)
    b = torch.rand(x.shape, generator=torch.Generator().manual_seed(lag)) < 0.3
    b[0, 0] = True
    base = lex.costs(x, b).sum()
    brute = torch.zeros(x.shape)
    for t in range(x.shape[1]):
        f = b.clone()
        f[0, t] = ~f[0, t]
        brute[0, t] = lex.costs(x, f).sum() - base
    assert torch.allclose(lex.flip_deltas(x, b), brute, atol=1e-3)


def test_unit_posteriors_match_enumeration():
    """Forward-backward over unit ends: each unit's posterior probability equals the brute-force sum
    over every segmentation of the window into units of at most max_len bytes."""
    lex = LabLexicon(size=1 << 12, decay=1.0)
    lex.update(tensor(TEXT[:60]), tensor(TEXT[:60]) == 32)
    x = tensor(b"at the")
    n, max_len = x.shape[1], 3
    weights = {}
    for k in range(2 ** (n - 1)):  # unit ends at the bits of k, and always at the last byte
        ends = [i for i in range(n - 1) if (k >> i) & 1] + [n - 1]
        starts = [0] + [e + 1 for e in ends[:-1]]
        if any(e - s + 1 > max_len for s, e in zip(starts, ends)):
            continue
        logp = sum(-lex.span_costs(x, torch.tensor([[s]]), torch.tensor([[e]])).item() for s, e in zip(starts, ends))
        weights[tuple(zip(starts, ends))] = math.exp(logp)
    z = sum(weights.values())
    post = lex.unit_posteriors(x, max_len)
    for e in range(n):
        for k in range(max_len):
            want = sum(w for units, w in weights.items() if (e - k, e) in units) / z
            assert post[0, e, k].item() == pytest.approx(want, abs=1e-5)
    before = lex.counts.sum().item()
    lex.update_posterior(x, max_len)
    assert lex.counts.sum().item() == pytest.approx(before + post.sum().item(), rel=1e-5)  # decay 1: expected unit count added


def test_diagnose_measures_the_estimators_of_the_lexicon_objective(tmp_path, capsys):
    """`rltok diagnose --objective lexicon`: every estimator of the code length's gradient under the
    checkpoint's lexicon, at the reference's FLOPs (no model pass), and a clear error for a
    checkpoint trained without one."""
    from lab_cli import main

    over = ["train.max_steps=2", "train.threads=1", "objective.recipe=lexicon", "objective.estimator.lexicon.size=4096",
            "train.eval_every=1000", "train.checkpoint_every=2", "data.train=stdlib"]
    Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'lex'}", *over]), corpus=corpus(),
            quiet=True).fit()
    out = tmp_path / "snr.json"
    args = ["diagnose", "-c", str(tmp_path / "lex"), "--objective", "lexicon", "--batch", "8", "--seq-len", "64",
            "--estimates", "4", "--reference", "2", "--variants", "reference", "flips/4",
            "--out", str(out), "--threads", "1"]
    assert main(args) == 0
    import json

    res = json.loads(out.read_text())
    rows = res["variants"]
    assert res["objective"] == "lexicon" and set(rows) == {"reference", "flips/4"}
    assert rows["flips/4"]["train_flops_per_byte"] == rows["reference"]["train_flops_per_byte"]
    costs = tmp_path / "costs.json"
    assert main(["diagnose", "-c", str(tmp_path / "lex"), "--lexicon-costs", "--batch", "4", "--seq-len", "64",
                 "--out", str(costs), "--threads", "1"]) == 0
    classes = json.loads(costs.read_text())["classes"]
    assert sum(c["share"] for c in classes.values()) == pytest.approx(1.0)
    assert "| indentation |" in capsys.readouterr().out
    reference = [o for o in over if ".lexicon." not in o] + ["objective.recipe=reference"]  # no lexicon to size
    Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'ref'}", *reference]),
            corpus=corpus(), quiet=True).fit()
    capsys.readouterr()
    assert main(["diagnose", "-c", str(tmp_path / "ref"), "--objective", "lexicon"]) != 0
    assert "not trained with the lexicon prior" in capsys.readouterr().err
    assert main(["diagnose", "-c", str(tmp_path / "ref"), "--lexicon-costs"]) != 0
    assert "not trained with the lexicon prior" in capsys.readouterr().err


def test_lexicon_costs_by_class_are_the_flip_deltas_where_the_policy_cuts():
    """The per-class table is the exact flip deltas averaged over the policy's cuts (remove) and
    its non-cuts (add): checked with a stand-in policy that cuts at every space."""
    from types import SimpleNamespace

    from rltok_lab.lexicon_costs import format_lexicon_costs, lexicon_costs_by_class
    from rltok_lab.true_advantage import byte_classes

    class CutAtSpaces(torch.nn.Module):
        def forward(self, x, mode="sample", generator=None):
            free = torch.ones_like(x, dtype=torch.bool)
            free[:, 0] = free[:, -1] = False
            return SimpleNamespace(boundaries=SimpleNamespace(b=(x == 32) | ~free, free=free))

    lex = ChunkLexicon(size=1 << 12, decay=1.0)
    x = torch.cat([tensor(TEXT[:64]), tensor(TEXT[5:69])])
    lex.update(x, x == 32)
    res = lexicon_costs_by_class(CutAtSpaces(), lex, x)
    free = torch.ones_like(x, dtype=torch.bool)
    free[:, 0] = free[:, -1] = False
    d = LabLexicon.of(lex).flip_deltas(x, (x == 32) | ~free)  # a training lexicon, as a checkpoint holds
    cls = [byte_classes(r) for r in x]

    def at(c):
        return torch.tensor([[k == c for k in row] for row in cls]) & free

    ws = res["classes"]["whitespace"]
    assert ws["cut_rate"] == 1.0 and ws["remove_cut"] == pytest.approx(d[at("whitespace")].mean().item(), rel=1e-5)
    mid = res["classes"]["mid_word"]
    assert mid["cut_rate"] == 0.0 and mid["add_cut"] == pytest.approx(d[at("mid_word")].mean().item(), rel=1e-5)
    assert mid["add_cut"] > 0  # splitting a counted word costs
    assert res["rate"] == pytest.approx(((x == 32)[:, 1:-1]).float().mean().item())
    assert "| whitespace | " in format_lexicon_costs(res)


@pytest.mark.parametrize("price", [0.0, -6.0])
def test_best_segmentation_is_the_cheapest_by_enumeration(price):
    """Viterbi over unit ends: the least code length plus a price per unit, against every
    segmentation of a short window into units of at most max_len bytes."""
    lex = LabLexicon(size=1 << 12, decay=1.0)
    lex.update(tensor(TEXT[:60]), tensor(TEXT[:60]) == 32)
    x = tensor(b"at the ma")
    n, max_len = x.shape[1], 4
    best, best_ends = float("inf"), None
    for k in range(2 ** (n - 1)):
        ends = [i for i in range(n - 1) if (k >> i) & 1] + [n - 1]
        starts = [0] + [e + 1 for e in ends[:-1]]
        if any(e - s + 1 > max_len for s, e in zip(starts, ends)):
            continue
        c = sum(lex.span_costs(x, torch.tensor([[s]]), torch.tensor([[e]])).item() + price for s, e in zip(starts, ends))
        if c < best:
            best, best_ends = c, ends
    got = lex.best_segmentation(x, price, max_len)
    assert torch.nonzero(got[0])[:, 0].tolist() == best_ends
    if price < 0:
        assert got.sum() > lex.best_segmentation(x, 0.0, max_len).sum()  # a negative price buys more units
    # a cost on ending at the first chosen end moves the end (or drops it), never keeps it there
    e0 = best_ends[0]
    if e0 < n - 1:
        end_cost = torch.zeros(1, n)
        end_cost[0, e0] = 100.0
        assert not lex.best_segmentation(x, price, max_len, end_cost)[0, e0]


def test_a_bigram_base_spells_units_byte_to_byte():
    """base="bigram": an unseen unit's base probability is its first byte's unigram probability
    times each later byte's probability given the one before (smoothed towards the unigram), so a
    cut costs more between bytes that go together than between bytes that do not."""
    x = tensor(b"aaaa bbbb aaaa bbbb aaaa bbbb ")
    lex = LabLexicon(size=1 << 12, decay=1.0, base="bigram")
    lex.update(x, torch.zeros_like(x, dtype=torch.bool))  # counts bytes and byte pairs, no units
    p1 = (lex.byte_counts + 1) / (lex.byte_counts.sum() + 256)
    pairs = lex.byte_pair_counts
    p2 = (pairs + p1) / (pairs.sum(1, keepdim=True) + 1)
    a, b = ord("a"), ord("b")
    assert pairs[a, a] == 9 and pairs[a, b] == 0 and pairs[b, a] == 0
    unit = tensor(b"ab")
    log_p0 = p1[a].log() + p2[a, b].log() + math.log(lex.stop) + math.log1p(-lex.stop)
    got = lex.span_costs(unit, torch.tensor([[0]]), torch.tensor([[1]]))
    assert got.item() == pytest.approx(-log_p0.item(), rel=1e-4)  # no unit counted: p = a * P0 / a
    # splitting "aa" (a pair seen 9 times) costs more than splitting "a b"-like unseen pairs
    y = tensor(b"aabb")
    whole = lambda s, e: lex.span_costs(y, torch.tensor([[s]]), torch.tensor([[e]])).item()  # noqa: E731
    split_inside_run = whole(0, 0) + whole(1, 1) - whole(0, 1)
    split_between_runs = whole(0, 1) + whole(2, 3) - whole(0, 3)
    assert split_inside_run > split_between_runs
    unigram = ChunkLexicon(size=1 << 12, decay=1.0)
    unigram.update(x, torch.zeros_like(x, dtype=torch.bool))
    uw = lambda s, e: unigram.span_costs(y, torch.tensor([[s]]), torch.tensor([[e]])).item()  # noqa: E731
    assert uw(0, 0) + uw(1, 1) - uw(0, 1) == pytest.approx(uw(0, 1) + uw(2, 3) - uw(0, 3), rel=1e-4)  # same anywhere


def test_a_bigram_lexicon_state_does_not_load_into_a_unigram_one():
    big = LabLexicon(size=1 << 10, base="bigram")
    big.update(tensor(b"ab ab"), tensor(b"ab ab") == 32)
    other = LabLexicon(size=1 << 10, base="bigram")
    other.load_state_dict(big.state_dict())
    assert torch.equal(other.byte_pair_counts, big.byte_pair_counts)
    with pytest.raises(ValueError, match="bigram base"):
        ChunkLexicon(size=1 << 10).load_state_dict(big.state_dict())
