"""Hashed byte n-gram embeddings: causal, consistent hashes, counted FLOPs, saved and loaded."""

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config import ConfigError, load_config
from rltok.model.flops import run_cost
from rltok.training.loading import from_pretrained
from rltok.model import HourglassLM
from rltok.model.factory import build_model
from rltok.model.ngram_embed import NgramEmbedding


def test_equal_ngrams_share_a_row_per_n_and_tables_do_not_overlap():
    emb = NgramEmbedding((2, 3), rows=1 << 16, dim=4)
    h = emb.hashes(torch.tensor([list(b"abcXbc abc")]))[0]  # (T, 2): [bigram, trigram] rows
    assert h[2, 0] == h[5, 0] == h[9, 0]  # "bc" at 1..2, 4..5, 8..9
    assert h[2, 1] == h[9, 1] and h[2, 1] != h[5, 1]  # "abc" twice, "Xbc" differs
    assert (h[:, 0] < (1 << 16)).all() and (h[:, 1] >= (1 << 16)).all()  # each n has its own block
    # "before the sequence" is not byte 0: a lone byte 0 at the start differs from "\0\0"
    z = emb.hashes(torch.tensor([[0, 0]]))[0, :, 0]
    assert z[0] != z[1]
    many = torch.randint(0, 256, (64, 32))
    rows = emb.hashes(many)[:, 8:, 1].flatten()
    # random trigrams collide about as often as a random function would: n^2 / (2 rows) = 18 here
    assert rows.numel() - rows.unique().numel() < 2 * rows.numel() ** 2 / (2 * (1 << 16))


@pytest.mark.parametrize("arch", ["hourglass", "flat"])
def test_ngram_embeddings_keep_the_model_causal_and_learn(arch):
    cfg = tiny_model_config(ngram_vocab=512, ngram_sizes=(2, 4, 8), arch=arch, flat_layers=2)
    model = randomize_(build_model(cfg), scale=0.3)
    torch.nn.init.normal_(model.ngram_embed.table.weight)
    x = torch.randint(0, 256, (2, 48))
    b = torch.rand(2, 48, generator=torch.Generator().manual_seed(0)) < 0.3
    run = (lambda x: model.score(x, b)) if arch == "hourglass" else model
    ref = run(x).logits
    for t in (3, 20, 40):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(0, 256, (2, 48 - t - 1))
        assert torch.allclose(run(x2).logits[:, : t + 1], ref[:, : t + 1], atol=1e-5)
    # a byte's n-grams reach 7 bytes ahead of it even through a model without attention
    x3 = x.clone()
    x3[:, 10] = (x3[:, 10] + 1) % 256
    emb_change = (model.embed_bytes(x3) - model.embed_bytes(x)).abs().sum(-1)[0]
    assert (emb_change[10:18] > 0).all() and (emb_change[18:] == 0).all() and (emb_change[:10] == 0).all()
    ref.sum().backward()
    assert model.ngram_embed.table.weight.grad.abs().sum() > 0


def test_ngram_config_flops_and_round_trip(tmp_path):
    for bad in (["model.ngram_vocab=-1"], ["model.ngram_vocab=8", "model.ngram_sizes=0,3"],
                ["model.ngram_vocab=8", "model.ngram_sizes=17"], ["model.ngram_vocab=8", "model.arch=bpe_token"]):
        with pytest.raises(ConfigError):
            load_config("test", overrides=bad)
    cfg = load_config("test", overrides=["model.ngram_vocab=64", "model.ngram_sizes=3,5"])
    assert cfg.model.ngram_sizes == (3, 5)
    off = load_config("test")
    # a lookup is no matrix product: the n-gram term is the adds that sum the vectors
    assert run_cost(cfg).forward()["ngram"] == 2 * cfg.model.d_byte
    assert run_cost(cfg).forward_per_byte() - run_cost(off).forward_per_byte() == 2 * cfg.model.d_byte
    flat_on = load_config("test", overrides=["model.arch=flat", "model.ngram_vocab=64"])
    flat_off = load_config("test", overrides=["model.arch=flat"])
    assert run_cost(flat_on).forward_per_byte() - run_cost(flat_off).forward_per_byte() == 4 * cfg.model.d_chunk

    model = randomize_(HourglassLM(tiny_model_config(ngram_vocab=64, ngram_sizes=(3, 5))), scale=0.3).eval()
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m").eval()
    assert loaded.cfg.ngram_sizes == (3, 5)
    x = torch.randint(0, 256, (1, 40))
    b = torch.rand(1, 40, generator=torch.Generator().manual_seed(1)) < 0.3
    assert torch.equal(model.score(x, b).logits, loaded.score(x, b).logits)


def test_compare_adds_pieces_to_any_byte_method_and_reports_memory(tmp_path):
    import json

    from rltok.cli import main
    from rltok.analysis.compare import method_config, method_overrides, method_slug

    assert method_overrides("rl+ngram+cvocab@model.target_rate=0.3") == [
        "model.chunker=rl", "model.ngram_vocab=32768", "model.chunk_vocab=32768", "model.target_rate=0.3"]
    assert method_slug("rl+ngram@model.ngram_vocab=8") == "rl-ngram__model.ngram_vocab-8"
    with pytest.raises(ValueError, match="unknown piece"):
        method_overrides("rl+ngrams")
    flat = method_config("flat+ngram", [], "stdlib", tmp_path, 0, "test")
    assert flat.model.arch == "flat" and flat.model.ngram_vocab == 32768 and flat.model.flat_layers >= 1
    for bad in ("bpe_token+ngram", "flat+cvocab"):  # a token vocabulary already; no chunks
        with pytest.raises(ConfigError):
            method_config(bad, [], "stdlib", tmp_path, 0, "test")

    data = tmp_path / "corpus.txt"
    data.write_bytes(b"def f(x):\n    return x + 1\n\n" * 200)
    method = "whitespace+ngram+cvocab@model.ngram_vocab=256,model.chunk_vocab=128"
    rc = main(["compare", "--data", str(data), "--preset", "test", "--budget-bytes", "2000", "--split", "val",
               "--seeds", "0", "--methods", method, "--out", str(tmp_path / "cmp"), "train.threads=1"])
    assert rc == 0
    res = json.loads((tmp_path / "cmp" / f"{method_slug(method)}_s0.json").read_text())
    assert res["config"]["model"]["ngram_vocab"] == 256 and res["config"]["model"]["chunk_vocab"] == 128
    plain = build_model(load_config("test", overrides=["model.chunker=whitespace"]).model).num_params()
    d = res["config"]["model"]
    assert res["params"] == plain + 4 * 256 * d["d_byte"] + 128 * d["d_chunk"]
    assert res["state_mb"] == pytest.approx(16 * res["params"] / 2 ** 20)
    assert res["peak_mem_mb"] > res["state_mb"]  # the whole process's resident set on a CPU
    report = (tmp_path / "cmp" / "README.md").read_text()
    assert "state MB" in report and "peak mem MB" in report
