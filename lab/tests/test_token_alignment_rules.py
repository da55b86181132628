"""The instrument that scores simple causal rules on Python lexical alignment
(lab/scripts/token_alignment_rules.py): its rules cut where they say they cut."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rltok.model.chunkers import WhitespaceChunker
from rltok.data.python_tokens import token_alignment, token_ends

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "token_alignment_rules.py"
_spec = importlib.util.spec_from_file_location("token_alignment_rules", _PATH)
rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rules)

SNIPPET = b"x = 1\ndef f(a, b):\n    return a.b\n\nclass C:\n    pass\n"


def snippet() -> torch.Tensor:
    return torch.tensor(list(SNIPPET)).view(1, -1)


def test_whitespace_rule_is_the_comparisons_whitespace_chunker():
    x = snippet()
    forced = torch.zeros_like(x, dtype=torch.bool)
    want = WhitespaceChunker().forward(None, forced, idx=x).b
    assert torch.equal(rules.whitespace_rule(x), want)


def test_class_runs_start_every_unit_of_plain_code():
    """On code with no strings, comments or two-byte operators, a chunk ends on exactly the first
    byte of every lexical unit."""
    m = token_alignment(snippet(), rules.class_runs(snippet()))
    assert m["token_start_precision"] == 1.0 and m["token_start_recall"] == 1.0


def test_no_class_cut_inside_a_string_when_code_only():
    x = torch.tensor(list(b'x = "a b, c"\ny = 2\n')).view(1, -1)
    inside = rules.inside_text_units(x)
    assert inside[0, 5:11].all() and not inside[0, 4] and not inside[0, :4].any()
    assert token_alignment(x, rules.class_runs(x) & ~inside)["token_start_precision"] == 1.0


def test_pointwise_mutual_information_of_a_deterministic_pair():
    train = np.array(list(b"ab" * 5000), dtype=np.int64)
    pmi = rules.ContextCounts(train, 1).pmi(np.array(list(b"abab"), dtype=np.int64))
    assert math.isnan(pmi[0])
    assert pmi[1] == pytest.approx(math.log(2), abs=0.01)  # p(b | a) = 1 against p(b) = 1/2



def test_bpe_rule_with_gpt2_pretokens_ends_tokens_where_python_units_end():
    """GPT-2's pre-tokens never cross a name, a number or an operator run, and a leading space
    joins the next word: on code every BPE token ends where a Python unit ends, except inside
    indentation, where the last space of the run joins the word after it."""
    code = b"x = foo(bar)\nif x:\n    y = 10\n"
    x = torch.tensor(list(code * 4)).view(1, -1)
    b, fit = rules.bpe_rule([code * 200], x, 0.3, "gpt2")
    assert fit.vocab_size > 256 and b.any()
    e = token_ends(code * 4)
    misses = (b[0] & ~e).nonzero().flatten()
    assert len(misses) > 0 and all(code[(int(t) + 1) % len(code)] == ord(" ") for t in misses)
    assert all(code[int(t) % len(code)] == ord(" ") for t in misses)


def test_class_runs_with_blanks_joining_left_cut_no_blank():
    x = snippet()
    b = rules.class_runs(x, blanks_start=False)
    blank = (x == ord(" ")) | (x == ord("\t"))
    assert not (b & blank).any() and torch.equal(b, rules.class_runs(x) & ~blank)
    assert token_alignment(x, b)["token_start_precision"] == 1.0


def test_score_counts_the_cuts_inside_strings():
    x = torch.tensor(list(b'x = "a b, c"\ny = 2\n')).view(1, -1)
    inside = rules.inside_text_units(x)
    s = rules.score(x, rules.class_runs(x), inside)
    b = rules.class_runs(x)[:, 1:-1]
    assert s["cuts_inside_text"] == round((b & inside[:, 1:-1]).sum().item() / b.sum().item(), 4) > 0
    assert rules.score(x, rules.class_runs(x) & ~inside, inside)["cuts_inside_text"] == 0
