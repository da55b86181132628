"""Tuning the BPE-token reference: model.bpe_vocab, depth overrides in compare, the FLOPs of any
vocabulary and depth, and the comparison table's depth / width / vocab columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_model_config
from rltok.analysis.compare import markdown_table, matched_flat_layers, method_config, method_overrides, summarize
from rltok.config import ConfigError, load_config
from rltok.data.bpe import fit_bpe_to_rate, train_bpe, truncate_bpe
from rltok.data.sources import Corpus
from rltok.model.factory import build_model
from rltok.model.flops import run_cost, train_flops_per_byte
from rltok.training.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox jumps\n" % (i, i * 7) for i in range(1200))


def train_bytes() -> torch.Tensor:
    return torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)


def test_bpe_vocab_gives_exactly_that_vocabulary_deterministically():
    a = build_model(tiny_model_config(arch="bpe_token", flat_layers=1, bpe_vocab=300, max_seq_len=256),
                    train_bytes=train_bytes())
    b = build_model(tiny_model_config(arch="bpe_token", flat_layers=1, bpe_vocab=300, max_seq_len=256),
                    train_bytes=train_bytes())
    assert a.vocab_size == 300 == a.tokenizer.get_vocab_size()
    assert a.head.weight.shape[0] == 300 and a.embed.weight.shape[0] == 300
    assert torch.equal(a.tokenizer_json, b.tokenizer_json)
    # the same sample as the rate fit: training at 300 is the rate fit's tokenizer cut to 300
    fit = fit_bpe_to_rate(TEXT, 0.2, vocab_size=300)
    assert fit.vocab_size == 300 and fit.reachable and fit.target_rate == fit.rate
    with pytest.warns(UserWarning, match="unreachable"):
        big = fit_bpe_to_rate(TEXT, 0.01).tokenizer  # the largest vocabulary
    assert big.get_vocab_size() > 300
    assert truncate_bpe(big, 300).get_vocab() == fit.tokenizer.get_vocab()


def test_bpe_vocab_zero_is_the_rate_fit_and_the_chunker_honours_it():
    with pytest.warns(UserWarning):
        default = build_model(tiny_model_config(arch="bpe_token", flat_layers=1, max_seq_len=256),
                              train_bytes=train_bytes())
    with pytest.warns(UserWarning):
        fitted = fit_bpe_to_rate(TEXT, 0.2).tokenizer
    assert default.tokenizer.to_str() == fitted.to_str()
    hourglass = build_model(tiny_model_config(chunker="bpe", bpe_vocab=280), train_bytes=train_bytes())
    assert hourglass.chunker.tokenizer.get_vocab_size() == 280


def test_bpe_sample_bytes_bounds_the_fit_and_the_model_records_it(tmp_path):
    """model.bpe_sample_bytes is the merges' sample; the bytes the tokenizer read are recorded
    in the model's fit_facts and survive save / load (config.json, not the weights)."""
    from rltok.model.pretrained import CONFIG

    cfg = tiny_model_config(arch="bpe_token", flat_layers=1, bpe_vocab=300, bpe_sample_bytes=20_000)
    small = build_model(cfg, train_bytes=train_bytes())
    block = len(TEXT) // 20  # the sample is whole random blocks
    assert 20_000 <= small.fit_facts()["tokenizer_fit_bytes"] < 20_000 + block
    default = build_model(tiny_model_config(arch="bpe_token", flat_layers=1, bpe_vocab=300), train_bytes=train_bytes())
    assert default.fit_facts()["tokenizer_fit_bytes"] == fit_bpe_to_rate(TEXT, 0.2, vocab_size=300).train_bytes
    assert not torch.equal(small.tokenizer_json, default.tokenizer_json)  # a smaller sample, other merges
    assert "tokenizer_fit_bytes" not in small.state_dict()  # the weights are unchanged
    small.save_pretrained(tmp_path / "m")
    loaded = type(small).from_pretrained(tmp_path / "m")
    assert loaded.fit_facts() == small.fit_facts()
    # a folder written before fit_facts existed still loads, recording nothing
    meta = json.loads((tmp_path / "m" / CONFIG).read_text())
    del meta["fit_facts"]
    (tmp_path / "m" / CONFIG).write_text(json.dumps(meta))
    assert type(small).from_pretrained(tmp_path / "m").fit_facts() == {}
    # the bpe rule of a hierarchy fits on the same sample; byte models fit nothing
    rule = build_model(tiny_model_config(chunker="bpe", bpe_vocab=280, bpe_sample_bytes=20_000),
                       train_bytes=train_bytes())
    assert rule.fit_facts() == small.fit_facts()
    assert build_model(tiny_model_config(arch="flat", flat_layers=1)).fit_facts() == {}


def test_bpe_vocab_validation():
    assert load_config("test").model.bpe_vocab == 0
    assert load_config("test", overrides=["model.bpe_vocab=256"]).model.bpe_vocab == 256
    for bad in (-1, 1, 255):
        with pytest.raises(ConfigError, match="bpe_vocab"):
            load_config("test", overrides=[f"model.bpe_vocab={bad}"])
    with pytest.raises(ValueError, match="256"):  # the trainer's own minimum
        train_bpe(TEXT, 10)
    with pytest.raises(ValueError, match="needs more merges"):  # the sample cannot supply it
        fit_bpe_to_rate(TEXT, 0.2, vocab_size=60_000)


def test_depth_and_vocab_overrides_win_over_the_matched_depth(tmp_path):
    method = "bpe_token@model.bpe_vocab=1024,model.flat_layers=3"
    assert method_overrides(method) == ["model.arch=bpe_token", "model.bpe_vocab=1024", "model.flat_layers=3"]
    cfg = method_config(method, [], "stdlib", tmp_path, 0, "test")
    assert cfg.model.arch == "bpe_token" and cfg.model.flat_layers == 3 and cfg.model.bpe_vocab == 1024
    matched = matched_flat_layers(load_config("test", overrides=["data.train=stdlib"]))
    assert matched != 3  # else the override would win vacuously
    plain = method_config("bpe_token", [], "stdlib", tmp_path, 0, "test")
    assert plain.model.flat_layers == matched and plain.model.bpe_vocab == 0
    small = method_config("bpe_token@model.bpe_vocab=4096,model.flat_layers=3", [], "stdlib", tmp_path, 0, "small")
    assert small.model.flat_layers == 3 == small.model.main_layers


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("vocab", [300, 4096])
def test_bpe_token_flops_count_every_layer_and_the_vocab_head(layers, vocab):
    cfg = load_config("test", overrides=["model.arch=bpe_token", f"model.flat_layers={layers}"])
    m, rate = cfg.model, 0.25
    n_tok = int(cfg.train.seq_len * rate)
    d, hidden = m.d_chunk, int(m.d_chunk * m.mlp_ratio)
    block = 2.0 * (4 * d * d + 2 * d * hidden)  # q, k, v, out and the MLP's two layers
    attention = 4.0 * d * (n_tok + 1) / 2  # QK^T and AV over the causal keys
    per_token = layers * (block + attention) + 2.0 * d * vocab  # and the output layer, d x V per token
    assert run_cost(cfg, vocab_size=vocab).forward_per_byte(rate) == pytest.approx(rate * per_token)


def test_trainer_counts_a_tuned_bpe_token_model(tmp_path):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=3", "train.log_every=1",
                                         "train.eval_every=100", "train.threads=1", "model.arch=bpe_token",
                                         "model.bpe_vocab=300", "model.flat_layers=2"])
    data = train_bytes()
    trainer = Trainer(cfg, corpus=Corpus(data[:50_000], data[50_000:], "src"), quiet=True)
    assert trainer.model.vocab_size == 300 and len(trainer.model.body.blocks) == 2
    trainer.fit()
    step_bytes = cfg.train.batch_size * cfg.train.seq_len
    expected = sum(train_flops_per_byte({"total": run_cost(cfg, vocab_size=300).forward_per_byte(r["chunks_per_byte"])})
                   * step_bytes for r in trainer.history)
    assert trainer.flops_spent == pytest.approx(expected, rel=1e-6)
    shape = trainer.model.shape_facts()
    assert shape == {"depth": 2, "width": cfg.model.d_chunk, "bpe_vocab": 300, "ngram_rows": None,
                     "chunk_vocab_rows": None}


def test_model_shape_of_byte_models():
    cfg = load_config("test", overrides=["model.ngram_vocab=64", "model.chunk_vocab=128"])
    shape = build_model(cfg.model).shape_facts()
    assert shape == {"depth": "1+1+1", "width": f"{cfg.model.d_byte}/{cfg.model.d_chunk}", "bpe_vocab": None,
                     "ngram_rows": 64 * len(cfg.model.ngram_sizes), "chunk_vocab_rows": 128}
    flat = load_config("test", overrides=["model.arch=flat", "model.flat_layers=4"])
    assert build_model(flat.model).shape_facts() == {"depth": 4, "width": flat.model.d_chunk, "bpe_vocab": None,
                                                     "ngram_rows": 0, "chunk_vocab_rows": 0}


def run(method, bpb, **extra):
    r = {"method": method, "seed": 0, "bpb": bpb, "rate": 0.25, "bytes_per_chunk": 4.0, "space_align": None,
         "train_flops_per_byte": 1e6, "train_flops": 1e12, "budget_flops": 1e12, "train_bytes": 1e6,
         "train_bytes_per_s": 5e3, "params": 2_000_000, "state_mb": 30.0, "peak_mem_mb": 500.0}
    return {**r, **extra}


def table_row(table: str, method: str) -> list[str]:
    header = table.splitlines()[0].split("|")[1:-1]
    line = next(x for x in table.splitlines() if x.startswith(f"| {method} |"))
    return dict(zip((h.strip() for h in header), (c.strip() for c in line.split("|")[1:-1])))


def test_table_states_depth_width_vocab_and_old_runs_show_dashes():
    results = [run("bpe_token@model.bpe_vocab=4096,model.flat_layers=3", 2.0, depth=3, width=192, bpe_vocab=4096,
                   ngram_rows=None, chunk_vocab_rows=None),
               run("rl+ngram+cvocab", 2.1, depth="1+3+1", width="96/192", bpe_vocab=None, ngram_rows=131072,
                   chunk_vocab_rows=32768),
               run("bpe_token", 2.2)]  # recorded before the columns existed
    table = markdown_table(summarize(results))
    new = table_row(table, "bpe_token@model.bpe_vocab=4096,model.flat_layers=3")
    assert (new["depth"], new["width"], new["vocab"]) == ("3", "192", "BPE 4096")
    byte = table_row(table, "rl+ngram+cvocab")
    assert (byte["depth"], byte["width"], byte["vocab"]) == ("1+3+1", "96/192", "131072 / 32768")
    old = table_row(table, "bpe_token")
    assert (old["depth"], old["width"], old["vocab"]) == ("–", "–", "–")
    assert old["params"] == "2.00M" and old["state MB"] == "30" and old["peak mem MB"] == "500"
    assert all(len(line.split("|")) == len(table.splitlines()[0].split("|")) for line in table.splitlines())


def test_a_rule_that_reads_ahead_is_marked_in_the_comparison_table():
    from rltok.analysis.compare import reads_ahead

    results = [run("bpe", 2.0, config={"model": {"arch": "hourglass", "chunker": {"kind": "bpe"}}}),
               run("uniform", 2.1, config={"model": {"chunker": "uniform"}}),
               run("flat", 2.2, config={"model": {"arch": "flat", "chunker": {"kind": "bpe"}}}),  # no cuts drawn
               run("old", 2.3),  # a record without its config
               run("plugin", 2.4, config={"model": {"arch": "not_loaded_here", "chunker": {"kind": "bpe"}}})]
    assert [reads_ahead(r) for r in results] == [True, False, False, False, False]
    table = markdown_table(summarize(results))
    assert "| bpe † |" in table and all(f"| {m} |" in table for m in ("uniform", "flat", "old", "plugin"))
    assert table.endswith("† its cuts read bytes after the one predicted (the rule cannot generate): its bpb is "
                          "not a causal model's.")
    assert "†" not in markdown_table(summarize(results[1:]))


def test_run_one_reports_the_bpe_token_models_forward_flops_at_its_trained_rate(tmp_path):
    """The BPE-token model reports no chunks in evaluation; its forward FLOPs per byte are read at
    the tokens per byte it drew in training, not at the hierarchical models' target rate."""
    from rltok.analysis.compare import run_one

    data = tmp_path / "data"
    data.mkdir()
    cut = len(TEXT) * 8 // 10
    (data / "train.txt").write_bytes(TEXT[:cut])
    (data / "val.txt").write_bytes(TEXT[cut:cut + 4000])
    (data / "test.txt").write_bytes(TEXT[cut + 4000:])
    method = "bpe_token@model.bpe_vocab=300,model.flat_layers=1"
    res = run_one(method, 0, str(data), tmp_path / "runs", budget_flops=3e9, preset="test", eval_split="test",
                  base=["train.threads=1"], max_eval_windows=4, eval_context=8)
    cfg = load_config("test", overrides=[f"data.train={data}", "model.arch=bpe_token", "model.bpe_vocab=300",
                                         "model.flat_layers=1"])
    assert res["train_chunks_per_byte"] > cfg.model.target_rate  # this text tokenises above 0.2
    assert res["forward_flops_per_byte"] == pytest.approx(
        run_cost(cfg, vocab_size=300).forward_per_byte(res["train_chunks_per_byte"]), rel=1e-9)
    assert res["attention_count"] == "causal"
    assert res["forward_flops_per_byte_kernel"] >= res["forward_flops_per_byte"]
    # scored: bytes 8.. of 4 windows, the same for every family; the tokenizer's sample beside the training bytes
    assert (res["eval_context"], res["eval_bytes"]) == (8, 4 * (cfg.train.seq_len + 1 - 8))
    assert res["tokenizer_fit_bytes"] == fit_bpe_to_rate(TEXT[:cut], 0.2, vocab_size=300).train_bytes


def test_the_comparison_plot_marks_the_token_models_training_validation_as_other_bytes(tmp_path, monkeypatch):
    """While training, the BPE-token model's validation scores its windows' whole tokens, not the
    byte models' bytes: its curve is marked so, and only its."""
    import matplotlib.figure

    from rltok.analysis.compare import plot

    curve = [{"train_flops": f, "val_bpb": 3.0 - f / 1e9} for f in (1e8, 5e8)]
    results = [{"method": m, "seed": 0, "curve": curve, "config": {"model": {"arch": arch}}}
               for m, arch in (("bpe_token", "bpe_token"), ("flat", "flat"))]
    saved = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), real(fig, *a, **k))[1])
    paths = plot(results, tmp_path, "t")
    assert paths[0].exists()
    labels = [t.get_text() for t in saved[0].axes[0].get_legend().get_texts()]
    assert labels == ["bpe_token *", "flat"]
    assert any("whole tokens" in t.get_text() for t in saved[0].texts)
