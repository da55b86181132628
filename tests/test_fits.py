"""Training settings whose model or batch cannot fit in memory are one error line, before
anything is allocated; the presets' own sizes are far from the line."""

import pytest

from conftest import assert_user_error, corpus_folder, run_cli
from rltok.config.loading import load_config
from rltok.config.presets import PRESETS
from rltok.training import fits

GIB = 2**30


@pytest.fixture
def sixteen_gib(monkeypatch):
    # the same answer on any machine: memory is at most 16 GiB
    real = fits.host_memory()
    monkeypatch.setattr(fits, "host_memory", lambda: min(real or 16 * GIB, 16 * GIB))


@pytest.mark.parametrize("overrides", [["model.d_chunk=65536", "model.main_layers=64"],
                                       ["model.chunk_vocab=67108864"], ["model.ngram_vocab=67108864"],
                                       ["train.batch_size=1048576"], ["train.seq_len=8192", "train.batch_size=65536"]])
def test_settings_that_cannot_fit_are_one_error_line(overrides, sixteen_gib, capsys, tmp_path):
    data = corpus_folder(tmp_path) / "train.txt"
    line = assert_user_error(capsys, ["train", "--preset", "test", "--data", data, "--out", tmp_path / "run",
                                      "--steps", "1", "train.device=cpu", *overrides],
                             "needs at least", "more than the 16.0 GiB of memory")
    assert "iB" in line.split("needs at least")[1].split()[1]  # the estimate, with its unit


def test_a_run_that_fits_is_not_refused(sixteen_gib, capsys, tmp_path):
    data = corpus_folder(tmp_path) / "train.txt"
    code, _, err = run_cli(capsys, "train", "--preset", "test", "--data", data, "--out", tmp_path / "run",
                           "--steps", "1", "train.device=cpu")
    assert code == 0, err


def test_presets_are_estimated_far_below_a_gpu():
    for name in PRESETS:
        state, acts = fits.training_bytes(load_config(name))
        assert 0 < state + acts < 8 * GIB, name


@pytest.mark.parametrize("overrides, message", [
    (["model.arch=bpe_token", "model.bpe_vocab=4194304"], "more tokens than a BPE can learn"),
    # within what the setting allows, beyond what the data holds; its shape is costed without a
    # placeholder tokenizer of 4M tokens (that alone took ~20 s and 1.5 GB)
    (["model.arch=bpe_token", "model.bpe_vocab=4000000", "model.bpe_sample_bytes=8000000"], "needs more merges"),
    (["model.chunker=bpe", "model.bpe_vocab=1000000"], "needs more merges")])
def test_a_huge_bpe_vocabulary_is_one_error_line_before_a_tokenizer_is_trained(overrides, message, sixteen_gib,
                                                                               capsys, tmp_path, monkeypatch):
    import rltok.data.bpe as bpe

    def never(*args, **kwargs):
        raise AssertionError("a tokenizer was trained")

    monkeypatch.setattr(bpe, "train_bpe", never)
    data = corpus_folder(tmp_path) / "train.txt"
    assert_user_error(capsys, ["train", "--preset", "test", "--data", data, "--out", tmp_path / "run", "--steps", "1",
                               "train.device=cpu", *overrides], message, "model.bpe_vocab")


def test_a_bpe_vocabulary_the_sample_runs_out_of_is_one_error_line(capsys, tmp_path):
    data = corpus_folder(tmp_path) / "train.txt"  # a few words: merges run out at a few hundred tokens
    assert_user_error(capsys, ["train", "--preset", "test", "--data", data, "--out", tmp_path / "run", "--steps", "1",
                               "train.device=cpu", "model.arch=bpe_token", "model.bpe_vocab=5000"],
                      "stopped at", "model.bpe_vocab")


@pytest.mark.parametrize("command", ["compare", "scaling"])
def test_a_compare_or_scaling_run_that_cannot_fit_is_one_error_line_before_any_model(command, sixteen_gib, capsys,
                                                                                      tmp_path, monkeypatch):
    import json

    import rltok.training.build as build

    def never(*args, **kwargs):
        raise AssertionError("data was read or a model built")

    monkeypatch.setattr(build, "costed_model", never)
    monkeypatch.setattr(build, "load_data", never)
    data = corpus_folder(tmp_path)
    too_big = ["train.device=cpu", "train.batch_size=1048576"]
    if command == "compare":
        argv = ["compare", "--data", data, "--methods", "uniform", "flat", "--preset", "test", "--budget-bytes", "3000",
                "--out", tmp_path / "cmp", *too_big]
    else:
        grid = tmp_path / "grid.json"
        grid.write_text(json.dumps({"corpora": [str(data)], "budgets": [1e8], "seeds": [0], "preset": "test",
                                    "overrides": too_big, "families": [{"method": "flat", "sizes": [5e3]}]}))
        argv = ["scaling", "--grid", grid, "--out", tmp_path / "study"]
    code, _, err = run_cli(capsys, *argv)
    last = err.strip().splitlines()[-1]  # after the study's own progress lines
    assert code == 2 and "Traceback" not in err, err
    assert last.startswith("error: training this model needs at least") and "more than the 16.0 GiB" in last, err
