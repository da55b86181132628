"""Faults a user meets at the command line, each refused with one `error:` line (exit 2) or
handled quietly: a run folder in use by another process, resuming a run from its own config,
unknown or missing evaluation splits, an unwritable run folder, and the prompt's rough edges
(--help without torch, a closed pipe, option spellings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli  # noqa: F401
from rltok.cli import main

TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(400))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def _own_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.txt"
    p.write_bytes(TEXT)
    return p


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---- 1. one live process per run folder -----------------------------------------------------------

# The holder loads the lock's own module by its file: through its package (rltok.training) it
# would load torch and the trainer, seconds of start-up for nothing the lock uses.
HOLD = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("run_lock", sys.argv[2])
    run_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_lock)
    lock = run_lock.RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    sys.stdin.read()
""")


def hold_lock(run_dir: Path) -> subprocess.Popen:
    module = Path(SRC) / "rltok" / "training" / "run_lock.py"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), str(module)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_folder_in_use_is_refused_and_left_untouched(tmp_path, data_file, capsys):
    run = tmp_path / "r"
    train = ["train", *FAST, "--data", data_file, "--out", run, "--steps", "2"]
    assert run_cli(capsys, *train)[0] == 0
    before = snapshot(run)
    holder = hold_lock(run)
    try:
        for argv in (train, [*train, "--resume"]):
            line = assert_user_error(capsys, argv, "is in use by", f"pid {holder.pid}")
            assert str(run) in line
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.communicate()
    # the holder was killed: its lock file stays, but the kernel dropped the lock
    assert (run / ".lock").exists()
    code, _, err = run_cli(capsys, *train[:-2], "--steps", "3", "--resume")
    assert code == 0, err


def test_two_trainers_in_one_process_cannot_share_a_folder(tmp_path):
    from rltok.config import ConfigError, load_config
    from rltok.training.trainer import Trainer

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'r'}", "train.device=cpu",
                                         f"data.train={tmp_path / 'data.txt'}"])
    (tmp_path / "data.txt").write_bytes(TEXT)
    first = Trainer(cfg, quiet=True)
    with pytest.raises(ConfigError, match="is in use by pid"):
        Trainer(cfg, quiet=True)
    first.lock.release()
    Trainer(cfg, quiet=True).lock.release()


# ---- 2. --resume continues the run it names ----------------------------------------------------

def final_state(run: Path) -> tuple[dict, dict]:

    from rltok.training.loading import load_checkpoint

    model = load_checkpoint(run)[0]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {k: v.clone() for k, v in model.state_dict().items()}, {k: last[k] for k in ("step", "loss", "val_bpb")}


def test_resume_continues_from_the_runs_own_config_bit_for_bit(tmp_path, data_file, capsys):
    import torch

    # warm-up longer than the run: the learning rate does not depend on max_steps
    setup = [*FAST, "--data", data_file, "train.warmup_steps=50", "train.log_every=3", "train.eval_every=3",
             "train.checkpoint_every=3", "model.dropout=0.1"]
    assert run_cli(capsys, "train", *setup, "--out", tmp_path / "full", "--steps", "11")[0] == 0
    assert run_cli(capsys, "train", *setup, "--out", tmp_path / "r1", "--steps", "6")[0] == 0
    code, _, err = run_cli(capsys, "train", "--resume", "--out", tmp_path / "r1", "train.max_steps=11")
    assert code == 0, err
    assert "resumed from" in err and "step 6" in err
    (w_full, rec_full), (w_res, rec_res) = final_state(tmp_path / "full"), final_state(tmp_path / "r1")
    assert rec_res == rec_full and rec_full["step"] == 11
    assert w_full.keys() == w_res.keys()
    for k in w_full:
        assert torch.equal(w_full[k], w_res[k]), k


def test_resume_with_a_changed_config_is_refused_unless_allowed(tmp_path, data_file, capsys):
    run = tmp_path / "r"
    assert run_cli(capsys, "train", *FAST, "--data", data_file, "--out", run, "--steps", "2")[0] == 0
    before = snapshot(run)
    assert_user_error(capsys, ["train", "--resume", "--out", run, "model.d_chunk=96", "train.max_steps=4"],
                      "model.d_chunk (", "--allow-config-change")
    other = tmp_path / "other.txt"
    other.write_bytes(TEXT[::-1])
    assert_user_error(capsys, ["train", "--resume", "--out", run, "--data", other, "train.max_steps=4"],
                      "data.train (")
    assert_user_error(capsys, ["train", "--resume", "--out", run, "--preset", "tiny"], "model.")
    assert snapshot(run) == before
    # the same data again, or only keys a resume may change: fine
    code, _, err = run_cli(capsys, "train", "--resume", "--out", run, "--data", data_file, "train.max_steps=3",
                           "train.log_every=1")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--resume", "--out", run, "--data", other, "train.max_steps=4",
                           "--allow-config-change")
    assert code == 0, err


# ---- 3. evaluation splits are checked and recorded ---------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny rl-chunker checkpoint trained on a single file, and that file."""
    root = tmp_path_factory.mktemp("trained")
    data = root / "data.txt"
    data.write_bytes(TEXT)
    assert main(["train", *FAST, "--data", str(data), "--out", str(root / "run"), "--steps", "2",
                 "train.seq_len=64"]) == 0
    return root / "run", data


def test_unknown_split_is_refused_with_the_valid_ones(trained, capsys):
    run, data = trained
    assert_user_error(capsys, ["eval", "-c", run, "--split", "tset"], "unknown split 'tset'", "val", "all")


def test_a_split_the_source_lacks_is_an_error_or_an_explicit_fallback(trained, capsys, tmp_path):
    run, data = trained
    assert_user_error(capsys, ["eval", "-c", run, "--data", data, "--split", "test"],
                      "has no 'test' split", "--fallback-to-val")
    code, out, err = run_cli(capsys, "eval", "-c", run, "--data", data, "--split", "test", "--fallback-to-val")
    assert code == 0, err
    result = json.loads(out)
    assert result["split"] == "val" and result["split_requested"] == "test"
    assert "evaluating on 'val'" in err
    # a split folder has its test split; every result names the split it used
    folder = tmp_path / "splits"
    folder.mkdir()
    for name in ("train", "val", "test"):
        (folder / f"{name}.txt").write_bytes(TEXT[:4000])
    code, out, err = run_cli(capsys, "eval", "-c", run, "--data", folder, "--split", "test")
    assert code == 0, err
    assert json.loads(out)["split"] == "test"


def test_compare_on_a_single_file_names_the_split_it_used():
    from rltok.data.corpus import available_splits, resolve_split

    assert "test" not in available_splits("stdlib")
    assert resolve_split("stdlib", "test", fallback=True) == "val"
    with pytest.raises(Exception, match="has no 'test' split"):
        resolve_split("stdlib", "test")
    assert resolve_split("stdlib", "val") == "val"


def test_compare_report_on_a_single_file_is_not_labelled_test(data_file, capsys, tmp_path):
    code, out, err = run_cli(capsys, "compare", "--data", data_file, "--methods", "fixed", "--budget-bytes", "4000",
                             "--preset", "test", "--out", tmp_path / "cmp", "train.device=cpu", "train.threads=1",
                             "train.eval_batches=1", "train.seq_len=64")
    assert code == 0, err
    assert "(val split)" in out and "test split" not in out and "| val bpb |" in out
    assert "no 'test' split: evaluating on 'val'" in err
    assert json.loads((tmp_path / "cmp" / "fixed_s0.json").read_text())["split"] == "val"


# ---- 4. disk faults on the run folder -----------------------------------------------------------

def assert_error_line(code: int, err: str, *messages) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    for m in messages:
        assert m in errors[0], errors[0]
    return errors[0]


def test_out_under_a_regular_file_is_one_error_line(tmp_path, data_file, capsys):
    (tmp_path / "afile").write_text("x")
    assert_user_error(capsys, ["train", *FAST, "--data", data_file, "--out", tmp_path / "afile" / "run", "--steps", "1"],
                      "cannot use run folder", "afile")


def test_read_only_run_folder_is_one_error_line(tmp_path, data_file, capsys, monkeypatch):
    from rltok.training import run_lock

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(run_lock, "open_own", refuse)
    assert_user_error(capsys, ["train", *FAST, "--data", data_file, "--out", tmp_path / "ro", "--steps", "1"],
                      "cannot use run folder", "Permission denied")


def test_config_write_failure_is_one_error_line(tmp_path, data_file, capsys, monkeypatch):
    from rltok.training import run_folder

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_folder, "start", full)
    code, _, err = run_cli(capsys, "train", *FAST, "--data", data_file, "--out", tmp_path / "r", "--steps", "1")
    assert_error_line(code, err, "No space left on device")


@pytest.mark.parametrize("where", ["weights", "trainer_state", "manifest"])
def test_a_full_disk_at_checkpoint_write_leaves_the_valid_checkpoint(tmp_path, data_file, capsys, monkeypatch, where):
    from rltok.model import pretrained
    from rltok.training import checkpoint

    run = tmp_path / "r"
    train = ["train", *FAST, "--data", data_file, "--out", run]
    assert run_cli(capsys, *train, "--steps", "2")[0] == 0
    before = snapshot(run / "checkpoints")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    target = {"weights": "save_file", "trainer_state": "torch", "manifest": "_write_synced"}[where]
    if target == "torch":
        monkeypatch.setattr(checkpoint.torch, "save", full)
    elif target == "save_file":  # the model folder's writer lives in the model layer
        monkeypatch.setattr(pretrained, target, full)
    else:
        monkeypatch.setattr(checkpoint, target, full)
    code, _, err = run_cli(capsys, *train, "--resume", "train.max_steps=4")
    assert_error_line(code, err, "cannot write the checkpoint of step 4", "No space left on device")
    monkeypatch.undo()
    assert snapshot(run / "checkpoints") == before  # nothing partial next to or in place of step 2
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000002"]
    checkpoint.verify_checkpoint(run / "checkpoints" / "step_0000002")


# ---- 6. the prompt's rough edges -----------------------------------------------------------------

def in_fresh_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC})


@pytest.mark.parametrize("argv", [["--help"], ["presets"], ["presets", "test"], ["train", "--help"]])
def test_help_and_presets_load_no_torch(argv):
    done = in_fresh_process(
        "import sys\nfrom rltok.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "assert code in (0, None), code\n"
        "print('torch loaded' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "no torch", done.stderr


def test_preset_parameter_counts_are_current():
    from rltok.cli import PRESET_PARAMS, count_params
    from rltok.config import PRESETS

    assert {name: count_params(name) for name in PRESETS} == PRESET_PARAMS


@pytest.mark.parametrize("argv", [["presets"], ["presets", "test"], ["train", "--print-config", "--preset", "test"]])
def test_output_to_a_closed_pipe_ends_quietly(argv, tmp_path):
    """`rltok presets | head -1`, made deterministic: the reader has gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "rltok.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC}, cwd=tmp_path)
    finally:
        os.close(write)
    assert done.stderr.strip() == "" or "use: rltok train" in done.stderr, done.stderr
    assert "Error" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


def test_prompt_file_and_file_are_both_spelled_on_generate_and_segment(trained, capsys, tmp_path):
    run, _ = trained
    prompt = tmp_path / "p.txt"
    prompt.write_bytes(b"row 1: plain words")
    for flag in ("--file", "--prompt-file", "-f"):
        code, out, err = run_cli(capsys, "segment", "-c", run, flag, prompt, "--color", "never")
        assert code == 0, err
        assert out.replace("|", "").strip() == "row 1: plain words"
        code, out, err = run_cli(capsys, "generate", "-c", run, flag, prompt, "-n", "4", "--echo", "--seed", "1")
        assert code == 0, err
        assert out.startswith("row 1: plain words")


# ---- a second interrupt ----------------------------------------------------------------------------
def test_a_second_sigint_aborts_a_step_but_not_a_checkpoint_being_written():
    import signal

    from rltok.training.signals import StopRequest

    said = []
    stop = StopRequest(said.append)
    stop.handle(signal.SIGINT, None)
    assert stop.requested
    with stop.saving_checkpoint():
        stop.handle(signal.SIGINT, None)  # waits for the checkpoint: no exception
    assert "still writing the checkpoint" in said[-1]
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)


def test_a_second_sigint_during_the_promised_checkpoint_lets_it_finish(tmp_path):
    import signal

    import torch

    from rltok.config import load_config
    from rltok.data.sources import Corpus
    from rltok.training.checkpoint import list_checkpoints
    from rltok.training.loading import load_checkpoint
    from rltok.training.trainer import Trainer

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'run'}", "train.max_steps=50",
                                         "train.checkpoint_every=1000", "train.threads=1"])
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    trainer = Trainer(cfg, corpus=Corpus(data[:15_000], data[15_000:], "t"), quiet=True)
    step, save = trainer.train_step, trainer.save

    def first_signal_at_step_3():
        if trainer.step == 2:
            trainer.stop.handle(signal.SIGINT, None)
        return step()

    def save_hit_by_a_second_signal(*a, **k):
        trainer.stop.handle(signal.SIGINT, None)  # Ctrl-C again while the checkpoint is written
        return save(*a, **k)

    trainer.train_step, trainer.save = first_signal_at_step_3, save_hit_by_a_second_signal
    trainer.fit()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_0000003"]
    load_checkpoint(tmp_path / "run", with_trainer_state=True)  # complete and loadable


@pytest.mark.parametrize("saved", [True, False], ids=["with_checkpoint", "none_yet"])
def test_an_interrupted_step_says_where_resume_starts(tmp_path, monkeypatch, capsys, data_file, saved):
    import rltok.training.trainer as trainer_mod

    run = tmp_path / "run"
    if saved:
        (run / "checkpoints" / "step_0000005").mkdir(parents=True)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_mod, "train", interrupted)
    assert main(["train", "--preset", "test", "--data", str(data_file), "--out", str(run)]) == 130
    err = capsys.readouterr().err
    assert "interrupted before a checkpoint of this step was written" in err
    assert ("continues from step 5" in err) if saved else ("starts from scratch" in err)


# ---- rough edges at the prompt ---------------------------------------------------------------------
def test_segment_shows_control_bytes_escaped_never_raw():
    from rltok.model.segment import render_pipes, show

    assert show(b"a\x1b[31mred\x00x\r") == "a\\x1b[31mred\\x00x\\r"
    assert show(b"tab\tand\nline \xff") == "tab\tand\nline \\xff"  # layout kept, invalid UTF-8 escaped
    assert "\x1b" not in render_pipes([b"\x1b[2J", b"ok"])


def test_saved_weights_get_the_mode_of_the_other_files(tmp_path):
    import torch

    from rltok.config import ModelConfig
    from rltok.model.hourglass import HourglassLM

    torch.manual_seed(0)
    model = HourglassLM(ModelConfig(d_byte=16, d_chunk=32, n_heads_byte=2, n_heads_chunk=2, main_layers=1,
                                    window=8, max_seq_len=64))
    folder = model.save_pretrained(tmp_path / "m")
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in Path(folder).iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~mask == modes["config.json"], modes


def test_a_negative_byte_count_names_the_flag(capsys):
    assert main(["generate", "-c", "nowhere", "hi", "-n", "-5"]) == 2
    assert capsys.readouterr().err.strip() == "error: -n/--max-bytes must be >= 0, got -5"


def test_the_default_corpus_reads_without_a_warning():
    import warnings

    from rltok.data.sources import read_documents

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        docs, report = read_documents("stdlib")  # its empty package __init__.py files are not listed
    assert docs and report.files >= len(docs)


def test_empty_files_of_a_users_folder_are_still_reported(tmp_path):
    from rltok.data.sources import read_documents

    (tmp_path / "a.txt").write_bytes(b"some text")
    (tmp_path / "b.txt").write_bytes(b"")
    with pytest.warns(UserWarning, match="1 empty"):
        read_documents(str(tmp_path))
