"""`rltok vocab`: chunk statistics, windowed segmentation without seams, the BPE comparison and
the command end to end."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import randomize_
from rltok.data.bpe import train_bpe
from rltok.training.checkpoint import save_checkpoint
from lab_cli import main
from rltok.config import ConfigError, load_config
from rltok.data.sources import DOC_SEP
from rltok.data.corpus import load_corpus
from rltok.model.chunkers import spacelike
from rltok.model.factory import build_model
from rltok_lab.vocab import (bpe_chunks, chunk_stats, learned_boundaries, learned_chunks, load_vocab_data,
                                  overlap_stats, vocab_report)
from rltok_lab.vocab_render import markdown

WORDS = [b"the", b"cat", b"sat", b"on", b"mat", b"a", b"dog", b"ran", b"to", b"it", b"and", b"was", b"def", b"x=1"]


def synthetic_text(n_bytes: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    out = bytearray()
    while len(out) < n_bytes:
        out += WORDS[int(torch.randint(len(WORDS), (1,), generator=g))]
        out += b"\n" if torch.rand(1, generator=g) < 0.1 else b" "
    return bytes(out[:n_bytes])


def test_chunk_stats_exact_numbers():
    chunks = [b"the", b" cat", b" sat on", b" the", b" ", b"ma", b"t.\n", b"the"]
    assert b"".join(chunks) == b"the cat sat on the mat.\nthe"
    s = chunk_stats(chunks, top=3)
    assert (s["chunks"], s["distinct"], s["bytes"]) == (8, 7, 27)
    assert s["rate"] == pytest.approx(8 / 27) and s["bytes_per_chunk"] == pytest.approx(27 / 8)
    assert s["multi_word"] == 1 / 8  # " sat on"
    assert s["whitespace_only"] == 1 / 8  # " "
    # "the" (first), " cat", " the" (next chunk opens with a space), "the" (last, after "\n");
    # not "ma" (the word goes on) nor "t.\n" (starts mid-word)
    assert s["whole_word"] == 4 / 8
    assert s["length_hist"][:8] == [1, 1, 3, 2, 0, 0, 1, 0] and sum(s["length_hist"]) == 8
    assert len(s["length_hist"]) == 32
    assert s["top"][0] == {"chunk": "the", "count": 2, "share": 0.25}
    assert [t["count"] for t in s["top"]] == [2, 1, 1]
    assert s["coverage_top_1k"] == 1.0 and s["coverage_top_10k"] == 1.0


def test_chunk_stats_long_chunks_invalid_utf8_and_empty():
    s = chunk_stats([b"x" * 40, b"y", b"\xff\xfe", b"\xff\xfe"])
    assert s["length_hist"][31] == 1 and s["length_hist"][0] == 1 and s["length_hist"][1] == 2
    assert s["whole_word"] == 0.0  # "xxx..y\xff\xfe.." is one long word
    assert s["top"][0] == {"chunk": "\\xff\\xfe", "count": 2, "share": 0.5}
    empty = chunk_stats([])
    assert empty["chunks"] == 0 and empty["rate"] is None and empty["coverage_top_1k"] is None


def test_coverage_of_the_top_distinct_chunks():
    chunks = [b"a"] * 500 + [b"%d" % i for i in range(1500)]  # 1501 distinct chunks
    s = chunk_stats(chunks)
    assert s["coverage_top_1k"] == pytest.approx((500 + 999) / 2000)
    assert s["coverage_top_10k"] == 1.0


def test_overlap_of_a_segmentation_with_itself_and_with_bytes():
    text = synthetic_text(3000)
    tok = train_bpe(text, 300, "line")
    tokens = bpe_chunks(tok, text)
    assert b"".join(tokens) == text
    same = overlap_stats(tokens, tokens, tok)
    assert same["in_bpe_vocab"] == same["same_span"] == same["boundary_recall"] == same["bpe_boundary_recall"] == 1.0
    single = [bytes([c]) for c in text]  # every byte is a token of any byte-level BPE
    o = overlap_stats(single, tokens, tok)
    assert o["in_bpe_vocab"] == 1.0 and o["bpe_boundary_recall"] == 1.0
    assert o["boundary_recall"] == pytest.approx((len(tokens) - 1) / (len(text) - 1))
    assert o["boundary_recall_chance"] == pytest.approx(o["boundary_recall"])


def _model(chunker="rl", **overrides):
    cfg = load_config("test", overrides=[f"model.chunker={chunker}"] + [f"{k}={v}" for k, v in overrides.items()])
    return build_model(cfg.model).eval(), cfg


def test_windows_leave_no_seams():
    """Overlapping windows give the same decisions as one pass over the whole text (the test
    preset's encoder sees 16 bytes back, the window overlap is seq_len // 4 = 16)."""
    text = synthetic_text(1000)
    model, cfg = _model("rl")
    randomize_(model, scale=0.3)
    x = torch.tensor(list(text)).unsqueeze(0)
    full = model(x, mode="greedy", force_last=False).boundaries.b[0]
    windowed = learned_boundaries(model, text, cfg.train.seq_len, mode="greedy", batch_size=5)
    assert 0 < int(full.sum()) < len(text)
    assert torch.equal(windowed, full)

    ws_model, _ = _model("whitespace")
    b = learned_boundaries(ws_model, text, 64)
    sp = spacelike(x[0])
    rule = sp & ~torch.cat([torch.tensor([True]), sp[:-1]])
    rule[0] = True  # the text's first byte is the one forced boundary left
    assert torch.equal(b, rule)


def test_fixed_stride_survives_the_windows():
    model, _ = _model("fixed", **{"model.fixed_stride": 5})
    chunks = learned_chunks(model, synthetic_text(700), 64)
    assert [len(c) for c in chunks[:2]] == [1, 4]  # forced first byte, then (t + 1) % 5 == 0
    assert {len(c) for c in chunks[2:-1]} == {5}


def test_sampled_chunks_rebuild_the_text_and_flat_models_are_refused():
    text = synthetic_text(2000) + b"\xff\x00\xc3"  # invalid UTF-8 is just bytes
    model, cfg = _model("rl")
    a = learned_chunks(model, text, cfg.train.seq_len, mode="sample", seed=3)
    assert b"".join(a) == text
    assert a == learned_chunks(model, text, cfg.train.seq_len, mode="sample", seed=3)
    assert 0.1 < len(a) / len(text) < 0.3  # an untrained policy sits at its target rate 0.2
    flat, _ = _model("rl", **{"model.arch": "flat"})
    with pytest.raises(ConfigError, match="no chunker"):
        learned_chunks(flat, text, 64)


def test_report_compares_with_a_bpe_at_the_same_rate():
    text = synthetic_text(4000, seed=1)
    model, cfg = _model("rl")
    r = vocab_report(model, text, cfg.train.seq_len, mode="sample", top=10, bpe_data=synthetic_text(8000, seed=2),
                     bpe_sample_bytes=8000)
    lr, bp = r["learned"], r["bpe"]
    assert lr["bytes"] == bp["bytes"] == len(text)
    assert bp["target_rate"] == lr["rate"] and bp["reachable"]
    assert abs(bp["rate"] - lr["rate"]) < 0.02, (bp["rate"], lr["rate"])
    assert len(lr["top"]) == len(bp["top"]) == 10
    assert set(r["overlap"]) >= {"in_bpe_vocab", "same_span", "boundary_recall", "bpe_boundary_recall"}
    assert all(0 <= v <= 1 for v in r["overlap"].values())
    md = markdown(r)
    assert "| metric | learned | BPE |" in md and "| multi-word chunks |" in md and "## Top 10 chunks" in md


@pytest.fixture(scope="module")
def run_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    cfg = load_config("test")
    torch.manual_seed(0)
    save_checkpoint(root / "run", 5, build_model(cfg.model), cfg)
    data = root / "corpus"
    data.mkdir()
    for split, seed, n in (("train", 0, 20_000), ("val", 1, 3000), ("test", 2, 5000)):
        (data / f"{split}.txt").write_bytes(synthetic_text(n, seed) + b"\xfe\xff")
    return root / "run", data


def test_cli_writes_consistent_json_and_markdown(run_and_data, tmp_path, capsys):
    run, data = run_and_data
    out_json, out_md = tmp_path / "v.json", tmp_path / "sub" / "v.md"
    rc = main(["vocab", str(run), "--data", str(data), "--max-bytes", "4000", "--mode", "sample", "--top", "12",
               "--bpe-sample-bytes", "20000", "--json", str(out_json), "--markdown", str(out_md), "--threads", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "learned" in printed and "top chunks" in printed
    r = json.loads(out_json.read_text())
    assert r["split"] == "test" and r["mode"] == "sample" and r["seq_len"] == 64 and r["bytes"] == 4000
    for side in ("learned", "bpe"):
        s = r[side]
        assert s["rate"] * s["bytes"] == pytest.approx(s["chunks"])
        assert sum(s["length_hist"]) == s["chunks"] and len(s["top"]) == 12
        assert sum(t["count"] for t in s["top"]) <= s["chunks"]
    assert r["bpe"]["fitted_on"] == "the train split" and r["bpe"]["pretokenize"] == "line"
    assert abs(r["bpe"]["rate"] - r["learned"]["rate"]) < 0.02
    md = out_md.read_text()
    assert md.startswith("# Learned vocabulary") and "| # | learned | count | share | BPE | count | share |" in md

    rc = main(["vocab", str(run), "--data", str(data), "--no-bpe", "--json", str(out_json), "--threads", "1"])
    assert rc == 0
    r = json.loads(out_json.read_text())
    assert "bpe" not in r and r["mode"] == "sample" and r["bytes"] == 5002  # the whole test split


def test_vocab_data_is_the_data_loaders_stream_with_separators(tmp_path):
    """Documents are separated by DOC_SEP as in training, for split folders, "all" and sources
    without a split (whose held-out documents are analysed and whose other documents fit the BPE)."""
    sep = bytes([DOC_SEP])
    folder = tmp_path / "splits"
    folder.mkdir()
    for name, seed in (("train.a", 0), ("train.b", 1), ("test.a", 2), ("test.b", 3)):
        (folder / f"{name}.txt").write_bytes(synthetic_text(500, seed))
    text, bpe_train = load_vocab_data(str(folder), "test", max_bytes=0)
    assert text == synthetic_text(500, 2) + sep + synthetic_text(500, 3)
    assert bpe_train == synthetic_text(500, 0) + sep + synthetic_text(500, 1)
    assert load_vocab_data(str(folder), "test", max_bytes=700)[0] == text[:700]
    assert load_vocab_data(str(folder), "train", max_bytes=0) == (bpe_train, None)

    docs = [synthetic_text(300, seed) for seed in range(30)]  # >= 20 documents: whole ones held out
    source = tmp_path / "docs"
    source.mkdir()
    for i, d in enumerate(docs):
        (source / f"{i:02d}.txt").write_bytes(d)
    whole, none = load_vocab_data(str(source), "all", max_bytes=0)
    assert whole == sep.join(docs) and none is None
    notes = []
    text, bpe_train = load_vocab_data(str(source), "test", max_bytes=0, val_fraction=0.1, log=notes.append)
    corpus = load_corpus(str(source), val_fraction=0.1)
    assert corpus.split == "documents"
    assert text == corpus.val.numpy().tobytes() and bpe_train == corpus.train.numpy().tobytes()
    assert text.count(sep) >= 1 and all(piece in docs for piece in text.split(sep))  # whole documents
    assert len(notes) == 1 and "whole held-out documents" in notes[0] and "tail" not in notes[0]
    few = tmp_path / "few"
    few.mkdir()
    for i in range(3):
        (few / f"{i}.txt").write_bytes(docs[i])
    notes = []
    text, _ = load_vocab_data(str(few), "test", max_bytes=0, val_fraction=0.1, log=notes.append)
    assert text == sep.join(d[len(d) - 30:] for d in docs[:3]) and "tail of every document" in notes[0]


def test_cli_errors_are_clear(run_and_data, tmp_path, capsys):
    run, data = run_and_data
    assert main(["vocab", str(tmp_path / "nowhere"), "--data", str(data)]) == 2
    assert "checkpoint path not found" in capsys.readouterr().err
    assert main(["vocab", str(run), "--data", str(tmp_path / "missing.txt")]) == 2
    assert "data path not found" in capsys.readouterr().err
    assert main(["vocab", str(run), "--data", str(data), "--top", "0"]) == 2


@pytest.mark.filterwarnings("ignore:target rate")  # a BPE fitted on 1.5 kB cannot reach 0.2
@pytest.mark.parametrize("rule", ["uniform", "entropy", "hnet", "gumbel", "bpe", "bpe_token"])
def test_every_boundary_rule_gives_chunks(rule):
    text = synthetic_text(1500, seed=4)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)  # fits the BPE of "bpe" and "bpe_token"
    if rule == "bpe_token":  # the BPE-token LM: no chunker, its tokens are its chunks
        cfg = load_config("test", overrides=["model.arch=bpe_token", "model.bpe_pretokenize=line"])
    else:
        cfg = load_config("test", overrides=[f"model.chunker={rule}"])
    model = build_model(cfg.model, train_bytes=data)
    chunks = learned_chunks(model.eval(), text, cfg.train.seq_len)
    # (an untrained gumbel rule thresholds p = 0.2 at eval: one chunk is right for it)
    assert b"".join(chunks) == text and 1 <= len(chunks) < 0.9 * len(text)


def test_markdown_cells_show_whitespace_and_survive_pipes_and_backticks():
    from rltok_lab.vocab_render import _md_code

    assert _md_code(" a|b\n") == "`␣a\\|b\\n`"
    assert _md_code("``") == "``` `` ```" and _md_code("\\xff") == "`\\xff`"


def test_a_two_stage_model_gives_its_first_level_chunks():
    """boundaries2 (supertokens over chunks) is ignored: the vocabulary is the byte-level chunks."""
    text = synthetic_text(1000, seed=5)
    model, cfg = _model("rl", **{"model.stages": 2})
    chunks = learned_chunks(model, text, cfg.train.seq_len, seed=1)
    assert b"".join(chunks) == text and 0.1 < len(chunks) / len(text) < 0.3
