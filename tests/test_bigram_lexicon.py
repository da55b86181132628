"""The bigram lexicon prior (rl/bigram_lexicon.py): each unit priced given the unit before it."""

import math

import pytest
import torch

from rltok.config import load_config
from rltok.objective.bigram_lexicon import BigramLexicon
from rltok.objective.lexicon import ChunkLexicon

TEXT = b"self.x = self.y\nself.y = self.x\n" * 8


def tensor(text: bytes) -> torch.Tensor:
    return torch.tensor(list(text)).view(1, -1)


def test_an_empty_bigram_lexicon_is_the_unigram_one():
    """No pair counts: p(w | v) = (0 + b p1(w)) / (0 + b) = p1(w)."""
    x = tensor(TEXT[:40])
    b = x == 46
    uni, bi = ChunkLexicon(size=1 << 12), BigramLexicon(size=1 << 12)
    for lex in (uni, bi):
        lex.byte_counts += torch.arange(256.0)  # same byte model in both
    assert torch.allclose(bi.costs(x, b), uni.costs(x, b))


def test_a_counted_pair_is_cheaper_than_the_same_unit_after_another():
    lex = BigramLexicon(size=1 << 14, decay=1.0, concentration=10.0)
    x = tensor(b"ab cd ab cd ab cd ef cd ")
    b = x == 32
    lex.update(x, b)
    c = lex.costs(x, b)
    ends = torch.nonzero(b[0])[:, 0].tolist()  # "ab ", "cd ", ..., "ef ", "cd "
    after_ab, after_ef = c[0, ends[1]].item(), c[0, ends[7]].item()  # "cd " after "ab " (x3) and after "ef " (x1)
    assert after_ab < after_ef
    # the pair's probability by hand: (n_vw + b p1(w)) / (n_v + b)
    p1 = math.exp(-lex.span_costs(x, torch.tensor([[3]]), torch.tensor([[5]])).item())
    assert after_ab == pytest.approx(-math.log((3 + 10.0 * p1) / (3 + 10.0)), rel=1e-4)


@pytest.mark.parametrize("lag", [0, 1])
def test_bigram_flip_deltas_are_single_flips_and_local(lag):
    lex = BigramLexicon(size=1 << 12, decay=1.0, lag=lag, collapse_blanks=True)
    x = tensor(TEXT[:48])
    lex.update(x, x == 46)
    b = torch.rand(x.shape, generator=torch.Generator().manual_seed(lag)) < 0.3
    base = lex.costs(x, b)
    d = lex.flip_deltas(x, b, rows_per_pass=7)
    for t in range(x.shape[1]):
        f = b.clone()
        f[0, t] = ~f[0, t]
        flipped = lex.costs(x, f)
        assert d[0, t].item() == pytest.approx((flipped.sum() - base.sum()).item(), abs=1e-3)
        changed = torch.nonzero((flipped != base)[0])[:, 0]
        assert len(changed) == 0 or changed.min() >= t  # a flip changes costs at or after itself only


def test_bigram_state_round_trip_and_kind_checks():
    lex = BigramLexicon(size=1 << 10)
    x = tensor(TEXT[:32])
    lex.update(x, x == 46)
    other = BigramLexicon(size=1 << 10)
    other.load_state_dict(lex.state_dict())
    assert torch.equal(other.costs(x, x == 46), lex.costs(x, x == 46))
    with pytest.raises(ValueError, match="bigram"):
        ChunkLexicon(size=1 << 10).load_state_dict(lex.state_dict())
    with pytest.raises(ValueError, match="unigram"):
        BigramLexicon(size=1 << 10).load_state_dict(ChunkLexicon(size=1 << 10).state_dict())


def test_training_with_the_bigram_lexicon_resumes_exactly(tmp_path):
    from rltok.training.trainer import Trainer
    from test_boundary_learning import corpus

    over = ["train.max_steps=4", "train.threads=1", "objective.recipe=lexicon", "objective.lexicon_context=bigram",
            "objective.lexicon_size=4096", "train.eval_every=1000", "train.log_every=1", "train.checkpoint_every=2"]
    full = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'a'}", *over]), corpus=corpus(), quiet=True)
    full.fit()
    Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over]), corpus=corpus(),
            quiet=True).fit(stop_at=2)
    resumed = Trainer(load_config("test", overrides=[f"train.out_dir={tmp_path / 'b'}", *over]), corpus=corpus(),
                      resume=True, quiet=True)
    resumed.fit()
    a, b = full.objective.lexicon, resumed.objective.lexicon
    assert isinstance(a, BigramLexicon) and a.pair_counts.sum() > 0
    assert torch.equal(a.pair_counts, b.pair_counts) and torch.equal(a.counts, b.counts)
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
