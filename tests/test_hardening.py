"""Hardening against hostile input and a hostile environment: what the CLI does with hub datasets,
full disks, closed pipes, odd paths, bad flags and settings. Each case ends with exit 0 or one
`error:` line (exit 2), never a traceback, and never costs a checkpoint."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli  # noqa: F401
from rltok.cli import main

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(400))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.seq_len=64"]


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.txt"
    p.write_bytes(TEXT)
    return p


# ---- hub datasets run no code ----------------------------------------------------------------------

def test_hub_datasets_never_run_a_loading_script(monkeypatch):
    datasets = pytest.importorskip("datasets")
    from rltok.data.sources import open_hub_dataset

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(k) or [])
    open_hub_dataset("someone/a-dataset")
    open_hub_dataset("json:/nowhere/*.json")
    assert len(calls) == 2 and all(k.get("trust_remote_code") is False for k in calls)


def test_the_datasets_floor_runs_no_dataset_scripts_by_default():
    """datasets 2.16-2.19 ran a dataset's own script by default; 3.0 stopped."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    floors = [re.fullmatch(r"datasets>=(\d+)\.(\d+).*", d) for deps in extras.values() for d in deps
              if d.startswith("datasets")]
    assert floors and all(m and (int(m[1]), int(m[2])) >= (3, 0) for m in floors)


# ---- a full disk at a checkpoint, for real ---------------------------------------------------------

def cli_process(argv, cwd, preexec_fn=None, stdout=None, stderr=None, timeout=240):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "rltok.cli", *map(str, argv)], cwd=cwd, preexec_fn=preexec_fn,
                          stdout=subprocess.PIPE if stdout is None else stdout,
                          stderr=subprocess.PIPE if stderr is None else stderr,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=timeout)


def file_size_limit(limit: int):
    """preexec_fn: files may grow to `limit` bytes (`ulimit -f`); past it a write fails with
    EFBIG instead of the process being killed by SIGXFSZ."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def assert_failed_checkpoints_kept_the_good_one(done, run: Path, good_step: int, failed_periodic: int) -> None:
    from rltok.training.checkpoint import list_checkpoints, verify_checkpoint

    err = done.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    assert done.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: cannot write the checkpoint of step"), err
    assert f"resume from step {good_step}" in last, last
    assert err.count("failed (") == failed_periodic and "training continues" in err, err
    ckpts = list_checkpoints(run)
    assert [p.name for p in ckpts] == [f"step_{good_step:07d}"]
    verify_checkpoint(ckpts[-1])
    assert not list((run / "checkpoints").glob(".tmp_*"))


def test_a_file_size_limit_at_checkpoints_warns_keeps_the_good_one_and_ends_in_one_error(tmp_path, data_file):
    run = tmp_path / "run"
    # the good checkpoint needs no limit: trained in this process, only the limited resume is a new one
    assert main(["train", *FAST, "--data", str(data_file), "--out", str(run), "--steps", "2"]) == 0
    # the weights (~0.4 MB) fit under the limit, the trainer state (~0.9 MB) does not
    done = cli_process(["train", "--resume", "--out", run, "--steps", "5", "train.checkpoint_every=1"], tmp_path,
                       preexec_fn=file_size_limit(600_000))
    assert_failed_checkpoints_kept_the_good_one(done, run, good_step=2, failed_periodic=2)
    assert "step 5/5" in done.stderr.decode(), "training went on to the end"


@pytest.fixture
def small_filesystem(tmp_path):
    """A 2 MB tmpfs: one checkpoint of the test preset (~1.3 MB) fits, a second one does not."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and a container that allows mount): "
                    f"{made.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_filesystem_at_checkpoints_warns_keeps_the_good_one_and_ends_in_one_error(
        tmp_path, data_file, small_filesystem, capsys):
    import subprocess

    run = small_filesystem / "run"
    # in this process (the file-size test above runs the same ending in a process of its own)
    code, _, err = run_cli(capsys, "train", *FAST, "--data", data_file, "--out", run, "--steps", "6",
                           "train.checkpoint_every=2", "train.log_every=1")
    done = subprocess.CompletedProcess([], code, b"", err.encode())
    assert_failed_checkpoints_kept_the_good_one(done, run, good_step=2, failed_periodic=1)
    assert "step 6/6" in err, "training went on to the end"


# ---- a closed pipe or a closed stderr never costs a checkpoint --------------------------------------

def assert_trained_to(run: Path, step: int) -> None:
    from rltok.training.checkpoint import list_checkpoints, verify_checkpoint

    ckpts = list_checkpoints(run)
    assert ckpts and ckpts[-1].name == f"step_{step:07d}", ckpts
    verify_checkpoint(ckpts[-1])


def test_train_into_a_pipe_whose_reader_has_gone_finishes_and_checkpoints(tmp_path, data_file):
    """`rltok train ... 2>&1 | head -0`: stdout and stderr both into a pipe nobody reads."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        done = cli_process(["train", *FAST, "--data", data_file, "--out", tmp_path / "run", "--steps", "4",
                            "train.log_every=1"], tmp_path, stdout=write, stderr=write)
    finally:
        os.close(write)
    assert done.returncode == 0
    assert_trained_to(tmp_path / "run", 4)


def test_train_piped_into_head_finishes_and_checkpoints(tmp_path, data_file):
    """`rltok train ... 2>&1 | head -3`: the reader goes after three lines."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "rltok.cli", "train", *FAST, "--data", str(data_file), "--out",
                             str(tmp_path / "run"), "--steps", "12", "train.log_every=1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": SRC})
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=240) == 0
    assert_trained_to(tmp_path / "run", 12)


def test_train_with_stderr_closed_finishes_and_checkpoints(tmp_path, data_file):
    """`rltok train ... 2>&-`: no stderr at all."""
    import os

    done = cli_process(["train", *FAST, "--data", data_file, "--out", tmp_path / "run", "--steps", "3"], tmp_path,
                       preexec_fn=lambda: os.close(2))
    assert done.returncode == 0, done.stdout
    assert_trained_to(tmp_path / "run", 3)


# ---- --resume continues the run it names, on the data it names, on its schedule ---------------------

@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_resume_of_a_folder_that_holds_no_run_is_an_error(tmp_path, capsys, make, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "typo"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    expected = {"missing": "no such folder", "empty": "no config.json and no checkpoints/", "file": "is a file"}
    assert_user_error(capsys, ["train", "--resume", "--out", target], "--resume", expected[make])
    assert not (target / "checkpoints").exists() and not (tmp_path / "runs").exists()


def test_data_paths_are_stored_absolute_and_compared_as_paths(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_bytes(TEXT)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", *FAST, "--data", "corpus/", "--out", "run", "--steps", "2")[0] == 0
    import json

    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["train"] == str(folder)
    # the same folder spelled otherwise is the same data; resuming from elsewhere finds it
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    for spelling in (str(folder), "../corpus", "../corpus/", "../corpus/."):
        code, _, err = run_cli(capsys, "train", "--resume", "--out", "../run", "--data", spelling, "--steps", "2")
        assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--resume", "--out", "../run", "--steps", "3")
    assert code == 0 and "data changed" not in err, err


def lrs(run: Path) -> dict[int, float]:
    import json

    return {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("choice", ["keep", "restart"])
def test_raising_max_steps_on_resume_says_what_the_schedule_does(tmp_path, data_file, capsys, choice):
    run = tmp_path / "run"
    base = [*FAST, "train.warmup_steps=1", "train.log_every=1", "train.lr=0.001", "train.min_lr_ratio=0.1"]
    assert run_cli(capsys, "train", *base, "--data", data_file, "--out", run, "--steps", "6")[0] == 0
    before = lrs(run)[6]
    code, _, err = run_cli(capsys, "train", "--resume", "--out", run, "--steps", "10", "train.log_every=1",
                           f"train.schedule_on_resume={choice}")
    assert code == 0, err
    assert "train.max_steps changed from 6 to 10 at step 6" in err and f"schedule_on_resume={choice}" in err, err
    after = lrs(run)
    if choice == "keep":  # no jump: from the last value, down to the minimum by the new end
        assert "no jump" in err and after[7] <= before * 1.0001, (before, after)
    else:
        assert "restarts" in err and after[7] > 0.9 * 0.001
    assert abs(after[10] - 0.0001) < 0.00002 or after[10] < after[7], after
    assert all(after[s] >= after[s + 1] for s in range(7, 10)), after


def test_a_warm_up_share_keeps_its_length_when_a_resume_raises_max_steps(tmp_path, data_file, capsys):
    """train.warmup_frac was resolved against the steps first planned: a resume to a longer run
    moves the decay on from where it was, not back into a longer warm-up at the peak."""
    run = tmp_path / "run"
    base = [*FAST, "train.warmup_frac=0.5", "train.log_every=1", "train.lr=0.002", "train.min_lr_ratio=0.1"]
    assert run_cli(capsys, "train", *base, "--data", data_file, "--out", run, "--steps", "6")[0] == 0
    before = lrs(run)[6]
    code, _, err = run_cli(capsys, "train", "--resume", "--out", run, "--steps", "12", "train.log_every=1")
    assert code == 0 and "no jump" in err, err
    after = lrs(run)
    assert before < 0.002 and after[7] <= before * 1.0001, (before, after)  # was: the peak, 0.002, again


def test_under_a_flops_budget_the_warm_up_share_is_of_the_steps_it_buys(tmp_path):
    from rltok.config import load_config
    from rltok.training.trainer import Trainer

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'run'}", "train.flops_budget=3e9",
                                         "train.warmup_frac=0.1", "train.max_steps=100000", "train.threads=1"])
    trainer = Trainer(cfg, quiet=True)
    planned = trainer._budget_steps()
    assert 10 < planned < 100 and trainer.cfg.train.warmup_steps == round(0.1 * planned)  # not 10,000
    trainer.fit()
    assert abs(trainer.step - planned) <= 0.2 * planned  # what it ran is what the warm-up was planned on


def test_one_row_per_step_is_refused_where_the_batch_baseline_would_zero_the_policys_gradient(tmp_path):
    from rltok.config import ConfigError, load_config
    from rltok.training.trainer import Trainer

    one = [f"train.out_dir={tmp_path / 'a'}", "train.batch_size=1", "train.max_steps=1"]
    with pytest.raises(ConfigError, match="no gradient"):
        Trainer(load_config("test", overrides=one), quiet=True)
    for fine in ("objective.estimator.baseline=none", "model.arch=flat"):  # nothing to zero
        Trainer(load_config("test", overrides=[*one[1:], f"train.out_dir={tmp_path / fine}", fine]), quiet=True)


# ---- results that are not results ---------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    data = root / "data.txt"
    data.write_bytes(TEXT)
    assert main(["train", *FAST, "--data", str(data), "--out", str(root / "run"), "--steps", "2"]) == 0
    return root / "run", data


def test_eval_of_a_model_with_non_finite_weights_is_an_error(trained, tmp_path, capsys):
    import torch

    from rltok.training.loading import load_checkpoint
    from rltok.model.pretrained import save_pretrained

    model, cfg, _, _ = load_checkpoint(trained[0])
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    save_pretrained(model, tmp_path / "nan", cfg)
    for argv in (["eval", "-c", tmp_path / "nan"], ["segment", "-c", tmp_path / "nan", "hello"],
                 ["generate", "-c", tmp_path / "nan", "-n", "2", "hi"]):
        assert_user_error(capsys, argv, "non-finite weights")


@pytest.mark.parametrize("argv, flag", [
    (["segment", "--max-bytes", "-3", "hello"], "--max-bytes"),
    (["eval", "--batch-size", "0"], "--batch-size"), (["eval", "--max-windows", "-1"], "--max-windows"),
    (["eval", "--threads", "-2"], "--threads"), (["eval", "--threads", "100000"], "--threads"),
    (["eval", "--seed", "-1"], "--seed"), (["generate", "--top-p", "nan", "hi"], "--top-p"),
    (["generate", "-t", "inf", "hi"], "--temperature"), (["prepare", "x", "--val-fraction", "0.7"], "--val-fraction"),
    (["compare", "--data", "x", "--out", "o", "--budget-bytes", "0"], "--budget-bytes"),
    (["train", "--steps", "0"], "train.max_steps must be >= 1"), (["eval", "--batch-size", "many"], "--batch-size"),
    (["generate", "-n", "99999999999", "hi"], "--max-bytes"),
])
def test_numeric_flags_are_range_checked_in_one_line(capsys, argv, flag):
    assert_user_error(capsys, argv, flag)


@pytest.mark.parametrize("override, message", [
    ("model.n_heads_byte=0", "model.n_heads_byte must be >= 1"), ("train.betas=[2,0]", "train.betas"),
    ("train.seed=-1", "train.seed must be >= 0"), ("train.seed=1e23", "train.seed"),
    ("train.batch_size=1e8", "train.batch_size"), ("model.d_chunk=1e6", "model.d_chunk"),
    ("train.grad_clip=nan", "train.grad_clip must be a finite number"),
    ("train.weight_decay=nan", "train.weight_decay must be a finite number"), ("model.d_chunk=true", "expects int"),
    ("train.threads=100000", "train.threads must be <= 1024"), ("model.mlp_ratio=inf", "finite"),
    ("train.batch_size=1048576 train.seq_len=8192", "train.batch_size x train.seq_len"),
])
def test_settings_are_range_checked_in_one_line(capsys, override, message):
    assert_user_error(capsys, ["train", "--print-config", "--preset", "test", *override.split()], message)


def test_a_json_true_is_not_a_number(tmp_path, capsys):
    (tmp_path / "c.json").write_text('{"model": {"d_chunk": true}}')
    assert_user_error(capsys, ["train", "--print-config", "--config", tmp_path / "c.json"], "model.d_chunk",
                      "expects int")


# ---- a run folder with a name that is not UTF-8 -------------------------------------------------------

def test_a_run_folder_whose_name_is_not_utf8_trains_checkpoints_and_resumes(tmp_path, data_file, capsys):
    import os

    run = Path(os.fsdecode(bytes(tmp_path) + b"/r\xffun"))
    assert run_cli(capsys, "train", *FAST, "--data", data_file, "--out", run, "--steps", "2")[0] == 0
    code, _, err = run_cli(capsys, "train", "--resume", "--out", run, "--steps", "3")
    assert code == 0, err
    assert_trained_to(run, 3)
    assert run_cli(capsys, "eval", "-c", run, "--max-windows", "2")[0] == 0


# ---- export never overwrites a run; outputs are checked before the work -------------------------------

def test_export_into_a_run_or_a_checkpoint_is_refused(trained, capsys, tmp_path):
    run = trained[0]
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert_user_error(capsys, ["export", "-c", run, "-o", run], "is inside a run folder")
    assert_user_error(capsys, ["export", "-c", run, "-o", ckpt], "is inside a checkpoint")
    assert_user_error(capsys, ["export", "-c", ckpt, "-o", run / "sub"], "is inside a run folder")
    alone = tmp_path / "ckpt"
    import shutil

    shutil.copytree(ckpt, alone)
    assert_user_error(capsys, ["export", "-c", alone, "-o", alone], "is inside a checkpoint")
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def test_save_pretrained_never_writes_into_a_run_or_a_checkpoint(trained, tmp_path):
    """The Python API keeps the promise the export command makes: a run's config.json and a
    checkpoint's verified files are never replaced (both methods, and a fresh run's folder)."""
    from rltok.model.pretrained import PretrainedError, save_pretrained
    from rltok.training.loading import load_checkpoint

    run = trained[0]
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    model, cfg, _, _ = load_checkpoint(run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".lock").write_text("")
    for target in (run, ckpt, run / "sub", fresh):
        with pytest.raises(PretrainedError, match="is inside a"):
            save_pretrained(model, target, cfg)
        with pytest.raises(PretrainedError, match="is inside a"):
            model.save_pretrained(target, cfg)
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert not (run / "sub").exists() and sorted(f.name for f in fresh.iterdir()) == [".lock"]
    assert (save_pretrained(model, tmp_path / "mine", cfg) / "model.safetensors").is_file()


LONG = "x" * 300


@pytest.mark.parametrize("argv", [
    ["export", "-c", "{run}", "-o", "{tmp}/afile/out"], ["export", "-c", "{run}", "-o", "{tmp}/" + LONG],
    ["segment", "-c", "{run}", "hello", "--html", "{tmp}/afile/x.html"],
    ["segment", "-c", "{run}", "hello", "--html", "{tmp}/" + LONG],
    ["compare", "--data", "{data}", "--out", "{tmp}/afile/cmp", "--methods", "fixed"],
    ["train", *FAST, "--data", "{data}", "--out", "{tmp}/" + LONG, "--steps", "1"],
    ["train", "--resume", "--out", "{tmp}/" + LONG], ["eval", "-c", "{tmp}/" + LONG],
    ["prepare", "{data}", "--out", "{tmp}/" + LONG], ["prepare", "{data}", "--out", "{tmp}/afile/p"],
    ["generate", "-c", "{run}", "-f", "{tmp}/" + LONG],
])
def test_bad_output_paths_are_one_error_line(trained, capsys, tmp_path, argv):
    (tmp_path / "afile").write_text("x")
    run, data = trained
    assert_user_error(capsys, [a.format(run=run, tmp=tmp_path, data=data) for a in argv])


def test_presets_into_a_full_device_is_one_error_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        done = cli_process(["presets"], tmp_path, stdout=full)
    err = done.stderr.decode()
    assert done.returncode == 2 and err.strip().startswith("error: ") and len(err.strip().splitlines()) == 1, err


# ---- inputs are bounded and named for what they are ----------------------------------------------------

def test_inputs_that_are_not_files_say_what_they_are(trained, capsys, tmp_path):
    import os

    run = trained[0]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv, message in ((["generate", "-c", run, "-f", "/dev/zero"], "character device"),
                          (["segment", "-c", run, "-f", fifo], "named pipe"),
                          (["segment", "-c", run, "-f", tmp_path], "is a folder"),
                          (["train", "--print-config", "--config", tmp_path], "is a folder"),
                          (["train", "--print-config", "--config", "/dev/zero"], "not a regular file"),
                          (["eval", "-c", run, "--data", "/dev/zero"], "neither a file nor a folder")):
        assert_user_error(capsys, argv, message)


def test_stdin_past_its_limit_is_an_error_not_an_endless_read(trained, capsys, monkeypatch):
    import sys

    with open("/dev/zero") as zero:  # the command reads sys.stdin.buffer
        monkeypatch.setattr(sys, "stdin", zero)
        assert_user_error(capsys, ["segment", "-c", trained[0], "-f", "-"], "holds more than")


def test_export_and_compare_refuse_a_folder_of_a_users_own_files(tmp_path, data_file, capsys):
    for command, extra in (("export", ["-c", str(tmp_path / "no-run")]),
                           ("compare", ["--data", data_file, "--methods", "uniform", "--preset", "test"])):
        mine = tmp_path / command
        mine.mkdir()
        (mine / "README.md").write_text("MY README")
        (mine / "config.json" if command == "export" else mine / "summary.json").write_text('{"mine": 1}')
        code, _, err = run_cli(capsys, command, *extra, "--out", mine)
        assert code == 2 and "would replace" in err and "README.md" in err, err
        assert (mine / "README.md").read_text() == "MY README"  # untouched
