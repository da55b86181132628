"""What the commands that read a trained model say to a user: the rate `segment` reports is the
rate everywhere else, `--color always` colours a pipe too, and a window, an escape or a path the
model cannot take is one error line, before anything runs."""

from __future__ import annotations

import re

import pytest
from conftest import assert_user_error

from rltok.cli import main
from rltok.cli.model_commands import _unescape
from rltok.config import ConfigError

TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(300))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.seq_len=64",
        "model.max_seq_len=128"]


@pytest.fixture(autouse=True)
def _own_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("messages")
    (root / "data.txt").write_bytes(TEXT)
    argv = ["train", *FAST, "--data", root / "data.txt", "--out", root / "run", "--steps", "1"]
    assert main([str(a) for a in argv]) == 0
    return root / "run"


def test_segment_reports_the_rate_of_the_decided_positions(run, capsys):
    text = "hello world, and more words"
    assert main(["segment", "-c", str(run), "--color", "never", "--mode", "greedy", text]) == 0
    out, err = capsys.readouterr()
    chunks = out.strip().split("|")
    n = len(text)
    assert "".join(chunks) == text
    ends = [len("".join(chunks[: i + 1])) - 1 for i in range(len(chunks))]  # the byte each chunk ends at
    interior = sum(0 < e < n - 1 for e in ends)  # the first and the last byte are left out, as eval does
    assert f"{len(chunks)} chunks over {n} bytes" in err
    assert f"rate {interior / (n - 2):.3f} over the {n - 2} positions the rule decides" in err


def test_segment_color_always_colours_a_pipe(run, capsys):
    assert main(["segment", "-c", str(run), "--color", "always", "hello world"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" in out  # ANSI styles although stdout is captured, not a terminal
    assert re.sub(r"\x1b\[[0-9;]*m", "", out) == "hello world\n"  # the text itself, unwrapped


def test_eval_window_longer_than_the_model_is_one_error_line(run, capsys):
    assert_user_error(capsys, ["eval", "-c", run, "--seq-len", "500", "--max-windows", "1"],
                   "a window of 500 bytes exceeds the model's max_seq_len=128")


def test_a_file_that_is_no_model_is_named(run, tmp_path, capsys):
    (tmp_path / "snippet.py").write_text("x = 1\n")
    assert_user_error(capsys, ["eval", "-c", tmp_path / "snippet.py"],
                   "snippet.py is not part of an rltok checkpoint, model or run folder")


@pytest.mark.parametrize("spec", ["hf:", "hf:@train", "hf: "])
def test_an_empty_hub_name_is_refused_before_anything_is_written(spec, tmp_path, capsys):
    assert_user_error(capsys, ["train", *FAST, "--data", spec, "--out", tmp_path / "r"], "names no dataset after 'hf:'")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key, suggestion", [("max_steps", "'train.max_steps'"), ("window", "'model.window'")])
def test_a_key_without_its_section_is_given_the_section(key, suggestion, capsys):
    assert_user_error(capsys, ["train", *FAST, f"{key}=3", "--print-config"], f"did you mean {suggestion}")


@pytest.mark.parametrize("text, expected", [(r"a\nb", b"a\nb"), (r"\x41\\z\t", b"A\\z\t"),
                                            ("\u00fc\\r", "\u00fc\r".encode())])
def test_stop_escapes(text, expected):
    assert _unescape(text) == expected


@pytest.mark.parametrize("text, message", [(r"\x3", r"unknown escape '\x3'"), (r"\d", r"unknown escape '\d'"),
                                           ("end\\", "a backslash at the end")])
def test_a_mistyped_stop_escape_is_refused(text, message, run, capsys):
    with pytest.raises(ConfigError, match=message.replace("\\", "\\\\")):
        _unescape(text)
    assert_user_error(capsys, ["generate", "-c", run, "x", "-n", "2", "--stop", text], message)
