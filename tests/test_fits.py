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
