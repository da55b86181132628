"""Bad input at the command line: every user mistake (data, config, run folder, checkpoint)
exits with code 2 and one line `error: ...`, never a traceback; messy but readable data
(binary, invalid UTF-8, empty or broken files, one enormous line) trains, with a counted
warning for what was skipped."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

import rltok.data.sources as data_mod
from rltok.cli import main
from rltok.data.corpus import load_corpus

TEXT = b"".join(b"row %d: plain words and punctuation.\n" % i for i in range(300))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1"]


@pytest.fixture(autouse=True)
def _own_cwd(tmp_path, monkeypatch):
    """Commands without --out write runs/default relative to the working directory: run them in a
    fresh one, so a run the developer made in the repository cannot answer before the data check."""
    monkeypatch.chdir(tmp_path)


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def assert_user_error(capsys, argv, message):
    code, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], lines[0]


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.txt"
    p.write_bytes(TEXT)
    return p


# ---- data --------------------------------------------------------------------------------------

def test_missing_path(tmp_path, capsys):
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "nope.txt"), *FAST], "data path not found")


def test_empty_data_argument(tmp_path, capsys):
    assert_user_error(capsys, ["train", "--data", "", *FAST], "empty data path")


def test_empty_folder(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".hidden").write_bytes(TEXT)  # hidden files are not data
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "d"), *FAST], "contains no files")


def test_glob_matching_nothing(tmp_path, capsys):
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "*.nothing"), *FAST], "matches no files")


def test_empty_file(tmp_path, capsys):
    (tmp_path / "e.txt").write_bytes(b"")
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "e.txt"), *FAST],
                      "holds no bytes: 1 file(s) read; skipped 1 empty")


def test_only_unreadable_files(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.gz").write_bytes(b"this is not gzip")
    (d / "b.xz").write_bytes(b"nor is this xz")
    assert_user_error(capsys, ["train", "--data", str(d), *FAST], "skipped 2 unreadable (first: ")


def test_too_small_corpus(tmp_path, capsys):
    (tmp_path / "t.txt").write_bytes(b"abc")
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "t.txt"), *FAST],
                      "too small to train on: 3 bytes read, 1 of them in the train split (2 needed)")


def messy_folder(root: Path) -> tuple[Path, int]:
    """A folder of awkward but usable files; returns it and the number of usable bytes."""
    d = root / "messy"
    d.mkdir()
    files = {
        "binary.bin": bytes(range(256)) * 40,
        "invalid_utf8.txt": b"caf\xe9 \xff\xfe\xc3( \xed\xa0\x80 " * 100,
        "one_line.txt": b"x" * 3_000_000,  # an enormous single line: bytes have no lines
        "text.txt": TEXT,
    }
    for name, content in files.items():
        (d / name).write_bytes(content)
    (d / "ok.gz").write_bytes(gzip.compress(TEXT))
    (d / "broken.gz").write_bytes(gzip.compress(TEXT)[:40])  # truncated archive
    (d / "empty.txt").write_bytes(b"")
    return d, sum(map(len, files.values())) + len(TEXT)


def test_messy_data_trains_and_skips_with_a_count(tmp_path, capsys, monkeypatch):
    d, usable = messy_folder(tmp_path)
    real = data_mod.expand_paths
    # a file that is listed but gone by the time it is read
    monkeypatch.setattr(data_mod, "expand_paths", lambda spec: real(spec) + [Path(spec) / "vanished.txt"])
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable \(first: .*broken.gz.*\), 1 empty"):
        corpus = load_corpus(str(d))
    # 5 readable documents, each split into a head and a tail (too few to hold out whole ones),
    # so 4 DOC_SEP on each side; the binary files hold 0xFF bytes of their own
    assert len(corpus.train) + len(corpus.val) == usable + 8 and corpus.skipped_files == 3
    with pytest.warns(UserWarning, match="2 unreadable"):
        code, err = run_cli(capsys, "train", "--data", str(d), "--out", str(tmp_path / "run"), "--steps", "2", *FAST)
    assert code == 0, err
    assert "(3 file(s) skipped)" in err


def test_real_process_prints_no_traceback(tmp_path):
    d, _ = messy_folder(tmp_path)
    base = [sys.executable, "-m", "rltok.cli", "train", *FAST, "--out", str(tmp_path / "run")]
    bad = subprocess.run(base + ["--data", str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == f"error: data path not found: {tmp_path / 'missing'}"
    good = subprocess.run(base + ["--data", str(d), "--steps", "2"], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert "Traceback" not in good.stderr
    assert "warning: " in good.stderr and "skipped 1 unreadable" in good.stderr and "1 empty" in good.stderr


# ---- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["train.max_step=5"], "unknown config key 'train.max_step'; did you mean 'train.max_steps'?"),
    (["trian.max_steps=5"], "did you mean 'train'?"),
    (["train.max_steps=lots"], "'train.max_steps' expects int, got 'lots'"),
    (["train.lr=fast"], "expects float"),
    (["train.lr=nan"], "train.lr must be a finite number"),
    (["model.dropout=1.5"], "model.dropout must be in [0, 1)"),
    (["train.checkpoint_every=0"], "train.checkpoint_every must be >= 1"),
    (["train=5"], "is a section"),
    (["max_steps"], "must look like section.key=value"),
    (["objective.recipe"], "'objective.recipe' must look like section.key=value"),  # read before the rest
    (["objective.recipe=lexicon", "objective.pg_weight=0"], "objective.pg_weight=0 changes nothing here"),
    (["plugins"], "'plugins' must look like section.key=value"),
    (["--steps", "0"], "train.max_steps must be >= 1"),
    (["train.device=gpu"], "unknown device 'gpu'"),
    (["train.seq_len=100000"], "exceeds model.max_seq_len"),
    (["--preset", "tset"], "unknown preset 'tset'; did you mean 'test'?"),
])
def test_config_mistakes(tmp_path, data_file, capsys, argv, message):
    assert_user_error(capsys, ["train", *FAST, "--data", str(data_file), "--out", str(tmp_path / "r"), *argv],
                      message)


@pytest.mark.parametrize("name,content,message", [
    ("missing.json", None, "config file not found"),
    ("bad.json", '{"train": {"max_steps": }', "is not valid JSON"),
    ("bad.toml", "[train\nmax_steps = 3", "is not valid TOML"),
    ("list.json", "[1, 2]", "must hold a mapping of sections, got list"),
    ("typo.toml", "[train]\nmax_stepz = 3\n", "did you mean 'train.max_steps'?"),
    ("section.json", '{"train": 3}', "config section 'train' must be a mapping"),
    ("path.json", '{"data": {"train": ["a", "b"]}}', "'data.train' expects str"),
])
def test_config_file_mistakes(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert_user_error(capsys, ["train", "--preset", "test", "--config", str(path)], message)


# ---- run folder and checkpoints ----------------------------------------------------------------

def test_existing_run_needs_resume_and_corrupt_checkpoints_are_refused(tmp_path, data_file, capsys):
    run = ["train", *FAST, "--data", str(data_file), "--out", str(tmp_path / "r"), "--steps", "2"]
    assert run_cli(capsys, *run)[0] == 0
    assert_user_error(capsys, run, "already holds a run (newest checkpoint: step_0000002); pass --resume")
    weights = tmp_path / "r" / "checkpoints" / "step_0000002" / "model.safetensors"
    weights.write_bytes(b"garbage")
    assert_user_error(capsys, [*run, "--resume"], "no valid checkpoint under")
    assert_user_error(capsys, ["eval", "-c", str(weights.parent)], "model.safetensors is corrupt")
    assert_user_error(capsys, ["eval", "-c", str(tmp_path / "none")], "checkpoint path not found")


def test_a_misspelt_component_setting_is_not_offered_the_components_kind():
    from rltok.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="valid: stride$"):
        load_config("test", overrides=["model.chunker=fixed", "model.chunker.windw=2"])
    with pytest.raises(ConfigError, match="did you mean 'model.chunker.stride'"):
        load_config("test", overrides=["model.chunker=fixed", "model.chunker.strid=2"])
    with pytest.raises(ConfigError, match="did you mean 'model.chunker.kind'"):
        load_config("test", overrides=["model.chunker=fixed", "model.chunker.knd=x"])
