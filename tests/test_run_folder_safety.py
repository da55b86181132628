"""Nothing outside the folder a command was given is written, and whatever it reads from a folder
it was handed is read within bounds: links where a run keeps its own files are refused, never
followed; a fresh run leaves other people's folders alone; the run folder's lock holds whatever
the environment says; deeply nested or enormous values in any handed file, and damaged result
records, end in one error line or a warning, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import assert_user_error, corpus_folder, run_cli

TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(400))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.seq_len=64"]
DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_TOML = "train = " + "[" * 5_000 + "]" * 5_000 + "\n"
HUGE_INT = "1" * 100_000


@pytest.fixture(autouse=True)
def _own_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of two checkpoints (steps 1 and 2) and its data file."""
    from rltok.cli import main

    root = tmp_path_factory.mktemp("safety")
    data = root / "data.txt"
    data.write_bytes(TEXT)
    run = root / "run"
    argv = ["train", *FAST, "--data", data, "--out", run, "--steps", "2", "train.checkpoint_every=1"]
    assert main([str(a) for a in argv]) == 0
    return run, data


@pytest.fixture
def run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained[0], copy, symlinks=True)
    return copy


def resume(run: Path, steps: int = 3) -> list:
    return ["train", "--resume", "--out", run, "--steps", steps]


# ---- links in a run folder are refused, never followed ------------------------------------------

@pytest.mark.parametrize("name", [".lock", "config.json", "metrics.jsonl", "metrics.jsonl.tmp"])
def test_a_linked_file_in_a_run_folder_is_refused_and_its_target_untouched(run, tmp_path, capsys, name):
    victim = tmp_path / "precious.txt"
    victim.write_text("a user's own file\n")
    if (run / name).exists():
        (run / name).unlink()
    (run / name).symlink_to(victim)
    assert_user_error(capsys, resume(run), "symbolic link", name)
    assert victim.read_text() == "a user's own file\n"


def test_a_linked_checkpoints_folder_is_refused(run, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "checkpoints", elsewhere)
    (run / "checkpoints").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    assert_user_error(capsys, resume(run, 5), "symbolic link", "checkpoints")
    assert sorted(p.name for p in elsewhere.iterdir()) == before


def test_a_linked_lock_of_a_fresh_run_is_refused(tmp_path, trained, capsys):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep")
    out = tmp_path / "fresh"
    out.mkdir()
    (out / ".lock").symlink_to(victim)  # a folder "of a run": it holds a lock
    assert_user_error(capsys, ["train", *FAST, "--data", trained[1], "--out", out, "--steps", "1"], "symbolic link")
    assert victim.read_text() == "keep"


def test_the_run_files_are_opened_without_following_links(tmp_path):
    """Beneath the folder check, each write itself refuses a link (a link planted after the check)."""
    from rltok.config import ConfigError
    from rltok.config.files import open_own, write_own

    victim = tmp_path / "v"
    victim.write_text("keep")
    (tmp_path / "link").symlink_to(victim)
    for how in ("w", "a", "r+"):
        with pytest.raises(ConfigError, match="symbolic link"):
            open_own(tmp_path / "link", how)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_own(tmp_path / "link", "x")
    assert victim.read_text() == "keep"


# ---- a fresh run leaves a folder of other files alone -----------------------------------------------

def test_a_fresh_run_refuses_a_folder_that_is_not_a_run_unless_told_to_overwrite(tmp_path, trained, capsys):
    project = tmp_path / "myproj"
    project.mkdir()
    (project / "config.json").write_text('{"mine": 1}')
    (project / "metrics.jsonl").write_text('{"my": "numbers"}\n')
    argv = ["train", *FAST, "--data", trained[1], "--out", project, "--steps", "1"]
    assert_user_error(capsys, argv, "--out", "not a run's", "config.json", "--overwrite")
    assert (project / "config.json").read_text() == '{"mine": 1}'
    assert (project / "metrics.jsonl").read_text() == '{"my": "numbers"}\n'
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "metrics.jsonl"]
    code, _, err = run_cli(capsys, *argv, "--overwrite")
    assert code == 0, err
    assert json.loads((project / "config.json").read_text())["train"]["max_steps"] == 1


def test_a_fresh_run_still_starts_in_an_empty_folder_and_again_in_its_own(tmp_path, trained, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    argv = ["train", *FAST, "--data", trained[1], "--out", out, "--steps", "1", "train.checkpoint_every=5"]
    assert run_cli(capsys, *argv)[0] == 0
    shutil.rmtree(out / "checkpoints")  # a run that never reached a checkpoint: started again
    assert run_cli(capsys, *argv)[0] == 0


@pytest.mark.parametrize("command", ["compare", "scaling"])
def test_an_empty_out_is_refused_by_every_command_that_writes(tmp_path, capsys, command):
    readme = tmp_path / "README.md"
    readme.write_text("mine")
    if command == "compare":
        argv = ["compare", "--data", corpus_folder(tmp_path), "--methods", "flat", "--out", ""]
    else:
        grid = tmp_path / "grid.json"
        grid.write_text(json.dumps({"corpora": [str(corpus_folder(tmp_path))], "budgets": [1e8],
                                    "families": [{"method": "flat", "sizes": [5e3]}]}))
        argv = ["scaling", "--grid", grid, "--out", "", "--fit-only"]
    assert_user_error(capsys, argv, "--out is empty")
    assert readme.read_text() == "mine"


# ---- the lock holds whatever the environment says ----------------------------------------------------

@pytest.mark.parametrize("env, message", [
    ({"RANK": "1"}, "RANK=1"),
    ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1"),
    ({"WORLD_SIZE": "2"}, "RANK"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "below WORLD_SIZE"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
    ({"RANK": "-1"}, "RANK"),
])
def test_distributed_variables_that_disagree_are_one_error_line(run, capsys, monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = (run / "metrics.jsonl").read_bytes()
    assert_user_error(capsys, resume(run), message)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_a_stray_rank_never_skips_the_lock(run, capsys, monkeypatch):
    """A second trainer beside a live one is refused whatever RANK says (RANK=0 and WORLD_SIZE=1
    are one process: it locks)."""
    from rltok.training.run_lock import RunLock

    holder = RunLock(run).acquire()
    try:
        for env in ({"RANK": "0"}, {"RANK": "0", "WORLD_SIZE": "1"}, {"RANK": "1"}):
            for k in ("RANK", "WORLD_SIZE"):
                monkeypatch.delenv(k, raising=False)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            code, _, err = run_cli(capsys, *resume(run))
            assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    finally:
        holder.release()


def test_a_trainer_never_fit_lets_go_of_its_lock_when_dropped(tmp_path):
    """A Trainer holds its run folder's lock from its construction; dropped without fit(), its lock
    file is closed and the folder free, with no ResourceWarning about an unclosed file."""
    import gc
    import warnings

    from rltok.config import load_config
    from rltok.training.run_lock import RunLock
    from rltok.training.trainer import Trainer

    (tmp_path / "data.txt").write_bytes(TEXT)
    cfg = load_config("test", overrides=[f"data.train={tmp_path / 'data.txt'}", f"train.out_dir={tmp_path / 'run'}",
                                         "train.device=cpu", "train.threads=1"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(cfg, quiet=True)
        assert trainer.lock.held
        del trainer
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    RunLock(tmp_path / "run").acquire().release()  # free again


# ---- handed files are read within bounds ---------------------------------------------------------------

@pytest.mark.parametrize("suffix, text", [(".json", DEEP_JSON), (".toml", DEEP_TOML),
                                          (".json", '{"train": {"max_steps": ' + HUGE_INT + "}}"),
                                          (".toml", "[train]\nmax_steps = " + HUGE_INT + "\n")])
def test_a_deep_or_huge_config_file_is_one_error_line(tmp_path, capsys, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    line = assert_user_error(capsys, ["train", "--config", path, "--print-config"], "config file")
    assert "nested too deeply" in line or "number too long" in line


@pytest.mark.parametrize("suffix, text", [(".json", DEEP_JSON), (".toml", DEEP_TOML),
                                          (".json", '{"budgets": [' + HUGE_INT + "]}")])
def test_a_deep_or_huge_grid_is_one_error_line(tmp_path, capsys, suffix, text):
    grid = tmp_path / f"grid{suffix}"
    grid.write_text(text)
    assert_user_error(capsys, ["scaling", "--grid", grid, "--out", tmp_path / "o", "--fit-only"], "grid")


@pytest.mark.parametrize("budget", ["nan", "inf", "1e308"])
def test_a_grid_budget_that_no_run_can_finish_is_one_error_line(tmp_path, capsys, budget):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'budgets = [{budget}]\ncorpora = ["{corpus_folder(tmp_path)}"]\n'
                    '[[families]]\nmethod = "flat"\nsizes = [5e3]\n')
    assert_user_error(capsys, ["scaling", "--grid", grid, "--out", tmp_path / "o"], "budgets")
    assert not (tmp_path / "o").exists()


def test_a_flops_budget_no_run_can_finish_is_one_error_line(capsys):
    assert_user_error(capsys, ["train", *FAST, "train.flops_budget=1e308", "--print-config"], "train.flops_budget")


@pytest.mark.parametrize("text", [DEEP_JSON, '{"model": {"d_byte": ' + HUGE_INT + "}}"])
def test_a_deep_or_huge_run_config_is_one_error_line_on_resume(run, capsys, text):
    (run / "config.json").write_text(text)
    assert_user_error(capsys, resume(run), "config")


@pytest.mark.parametrize("command", ["eval", "segment", "export"])
def test_a_deep_checkpoint_config_is_one_error_line(run, tmp_path, capsys, command):
    for ckpt in (run / "checkpoints").iterdir():
        (ckpt / "config.json").write_text(DEEP_JSON)
        manifest = json.loads((ckpt / "manifest.json").read_text())
        import hashlib

        manifest["files"]["config.json"] = hashlib.sha256(DEEP_JSON.encode()).hexdigest()
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
    argv = {"eval": ["eval", "-c", run, "--max-windows", "1"], "segment": ["segment", "-c", run, "hello"],
            "export": ["export", "-c", run, "-o", tmp_path / "exported"]}[command]
    assert_user_error(capsys, argv, "nested too deeply")


@pytest.mark.parametrize("text", [DEEP_JSON, '{"files": ' + HUGE_INT + "}", ""])
def test_a_bad_newest_manifest_falls_back_to_the_older_checkpoint(run, capsys, text):
    newest = sorted((run / "checkpoints").iterdir())[-1]
    (newest / "manifest.json").write_text(text)
    with pytest.warns(UserWarning, match="falling back to .*step_0000001"):
        code, out, err = run_cli(capsys, "eval", "-c", run, "--max-windows", "1")
    assert code == 0, err
    with pytest.warns(UserWarning, match="falling back"):
        code, _, err = run_cli(capsys, *resume(run))
    assert code == 0, err
    assert "resumed from" in err and "step_0000001" in err


def test_a_deep_or_huge_metrics_line_is_skipped(run, tmp_path, capsys):
    with open(run / "metrics.jsonl", "a") as f:
        f.write(DEEP_JSON + "\n" + '{"step": ' + HUGE_INT + "}\n")
    code, _, err = run_cli(capsys, "export", "-c", run, "-o", tmp_path / "exported")
    assert code == 0, err
    assert "| validation bits per byte |" in (tmp_path / "exported" / "README.md").read_text()  # from the good records
    code, _, err = run_cli(capsys, *resume(run))
    assert code == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # every line parses
    assert records[-1]["step"] == 3 and [r["step"] for r in records] == sorted(r["step"] for r in records)


# ---- result records: atomic with fsync, and a damaged one is reported, not fatal ----------------------

def test_result_records_are_written_atomically_and_synced(tmp_path, monkeypatch):
    from rltok.analysis.scaling import _write_json

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    _write_json(tmp_path / "r.json", {"bpb": 1.0})
    assert json.loads((tmp_path / "r.json").read_text()) == {"bpb": 1.0}
    assert len(synced) >= 2  # the file, then its folder (the rename)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


SCALING_GRID = {"budgets": [1e8], "preset": "test", "max_eval_windows": 2, "n_boot": 20,
                "families": [{"method": "flat", "sizes": [5e3]}]}


@pytest.mark.parametrize("damage", ["", "[]", '{"family": "fl'])
def test_a_damaged_scaling_record_is_reported_not_fatal(tmp_path, capsys, damage):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**SCALING_GRID, "corpora": [str(corpus_folder(tmp_path, "salad"))]}))
    out = tmp_path / "study"
    (out / "salad").mkdir(parents=True)
    bad = out / "salad" / "C1e08__flat__N9999__s0.json"
    bad.write_text(damage)
    with pytest.warns(UserWarning, match=bad.name):
        code, _, err = run_cli(capsys, "scaling", "--grid", grid, "--out", out, "--fit-only")
    assert code == 0, err
    with pytest.warns(UserWarning, match=bad.name):
        code, _, err = run_cli(capsys, "scaling", "--grid", grid, "--out", out)  # runs its point, fits
    assert code == 0, err
    assert (out / "salad" / "fits.json").exists()


def test_a_damaged_compare_record_is_run_again_and_reported(tmp_path, capsys):
    data = corpus_folder(tmp_path)
    out = tmp_path / "cmp"
    argv = ["compare", "--data", data, "--methods", "flat", "--preset", "test", "--budget-bytes", "4000",
            "--max-eval-windows", "2", "--split", "val", "--out", out, "train.device=cpu"]
    out.mkdir()
    (out / "flat_s0.json").write_text("[]")
    (out / "other_s1.json").write_text("")
    with pytest.warns(UserWarning) as warned:
        code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    said = " ".join(str(w.message) for w in warned)
    assert "flat_s0.json" in said and "running it again" in said and "other_s1.json" in said
    assert json.loads((out / "flat_s0.json").read_text())["method"] == "flat"


# ---- every command on every model family, with stdout closed, with a tracker that cannot start ----------

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.parametrize("argv", [["eval", "--max-windows", "1"], ["segment", "hello"], ["generate", "-n", "3", "hi"]])
def test_a_command_with_stdout_closed_ends_cleanly(trained, argv):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "rltok.cli", argv[0], "-c", str(trained[0]), *argv[1:]]
    done = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *cmd], stderr=subprocess.PIPE, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr and "unclosed" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def families(trained, tmp_path_factory):
    from rltok.cli import main

    root = tmp_path_factory.mktemp("families")
    runs = {}
    for arch in ("flat", "bpe_token"):
        runs[arch] = root / arch
        argv = ["train", *FAST, f"model.arch={arch}", "--data", trained[1], "--out", runs[arch], "--steps", "1"]
        assert main([str(a) for a in argv]) == 0
    return runs


def test_segment_shows_the_tokens_of_a_bpe_token_model(families, capsys):
    code, out, err = run_cli(capsys, "segment", "-c", families["bpe_token"], "--color", "never", "hello world")
    assert code == 0, err
    assert out.strip().replace("|", "") == "hello world" and "chunks over 11 bytes" in err


def test_segment_of_a_flat_model_and_generate_of_a_bpe_token_model_say_why_not(families, capsys):
    assert_user_error(capsys, ["segment", "-c", families["flat"], "hello"], "FlatByteLM", "model.arch=flat")
    assert_user_error(capsys, ["generate", "-c", families["bpe_token"], "-n", "3", "hi"], "BPETokenLM",
                      "model.arch=bpe_token")


def test_resuming_a_run_whose_wandb_cannot_start_is_one_error_line(run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))  # no login
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there: never the network
    code, _, err = run_cli(capsys, *resume(run), "train.wandb=someproject")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "train.wandb=someproject" in errors[0] and "wandb login" in errors[0]
    assert not (run / "checkpoints" / "step_0000003").exists()


# ---- what an interrupt or a full disk says ---------------------------------------------------------------

def test_a_short_write_at_the_final_checkpoint_says_the_disk_may_be_full(tmp_path, trained, capsys, monkeypatch):
    import rltok.training.trainer as trainer_mod

    def short_write(*a, **k):  # what torch.save raises when the disk fills under it
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 55104 vs 55056")

    monkeypatch.setattr(trainer_mod, "save_checkpoint", short_write)
    code, _, err = run_cli(capsys, "train", *FAST, "--data", trained[1], "--out", tmp_path / "r", "--steps", "1")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "is the disk full?" in errors[0] and "bytes free there" in errors[0]
    assert "unexpected pos" in errors[0]  # torch's own words stay, after the explanation


def test_an_interrupt_at_a_checkpoint_step_says_it_was_interrupted(tmp_path, trained, capsys, monkeypatch):
    import signal

    from rltok.training.trainer import Trainer

    real = Trainer.train_step

    def step_then_signal(self):
        out = real(self)
        if self.step == 1:  # the step about to be counted as 2, a checkpoint step
            self.stop.handle(signal.SIGINT, None)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)
    argv = ["train", *FAST, "--data", trained[1], "--out", tmp_path / "r", "--steps", "4", "train.checkpoint_every=2"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "interrupted: saved" in err and "step_0000002" in err


def test_an_interrupted_study_says_what_is_kept_and_how_to_go_on(tmp_path, capsys, monkeypatch):
    import rltok.analysis.scaling_adapt as adapt

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(adapt, "run_points", interrupted)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**SCALING_GRID, "corpora": [str(corpus_folder(tmp_path, "salad"))]}))
    code, _, err = run_cli(capsys, "scaling", "--grid", grid, "--out", tmp_path / "study")
    assert code == 130
    assert "interrupted: the records of the finished points stay in" in err and "run the same command again" in err


def test_a_linked_spelling_of_the_same_data_is_no_change_on_resume(run, trained, tmp_path, capsys):
    link = tmp_path / "same_data.txt"
    link.symlink_to(trained[1])
    code, _, err = run_cli(capsys, *resume(run), "--data", link)
    assert code == 0, err
    other = tmp_path / "other.txt"
    other.write_bytes(TEXT[::-1])
    assert_user_error(capsys, [*resume(run, 4), "--data", other], "data.train")


@pytest.mark.parametrize("damage", ["unknown merge", "not utf-8"])
@pytest.mark.parametrize("command", ["segment", "eval"])
def test_a_corrupt_tokenizer_inside_the_weights_is_one_error_line(families, tmp_path, capsys, damage, command):
    import hashlib

    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "bpe"
    shutil.copytree(families["bpe_token"], run)
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    state = load_file(ckpt / "model.safetensors")
    text = state["tokenizer_json"].to(torch.uint8).numpy().tobytes()
    if damage == "unknown merge":
        tok = json.loads(text)
        tok["model"]["merges"].append(["zz", "q"])  # a merge of tokens the vocabulary lacks
        text = json.dumps(tok).encode()
    else:
        text = b"\xff\xfe" + text
    state["tokenizer_json"] = torch.tensor(list(text), dtype=torch.uint8).to(state["tokenizer_json"].dtype)
    save_file(state, ckpt / "model.safetensors")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    argv = ["segment", "-c", ckpt, "hello"] if command == "segment" else ["eval", "-c", ckpt, "--max-windows", "1"]
    assert_user_error(capsys, argv, "tokenizer")


# ---- fuzz: any damage to any file of a run folder -----------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

RUN_FILES = ["config.json", "metrics.jsonl", "CKPT/config.json", "CKPT/manifest.json", "CKPT/model.safetensors",
             "CKPT/trainer.pt", "CKPT/README.md"]
DAMAGE = ["truncate", "deep", "huge", "list", "string", "flip", "link", "empty"]


def damaged_bytes(data: bytes, how: str, cut: float) -> bytes:
    return {"truncate": data[: int(len(data) * cut)], "deep": DEEP_JSON.encode()[:200_001],
            "huge": b'{"step": ' + HUGE_INT.encode() + b"}", "list": b"[]", "string": b'"x"', "empty": b"",
            "flip": data[: int(len(data) * cut)] + bytes([data[int(len(data) * cut)] ^ 0xFF]) + data[int(len(data) * cut) + 1:]
            if data else b"\xff"}[how]


def damage_file(path: Path, how: str, cut: float, victim: Path) -> None:
    data = path.read_bytes()
    if how == "link":
        path.unlink()
        path.symlink_to(victim)
        return
    path.write_bytes(damaged_bytes(data, how, cut))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(RUN_FILES), how=st.sampled_from(DAMAGE), cut=st.floats(0, 0.99),
       rehash=st.booleans())
def test_any_damage_to_any_run_file_is_exit_0_or_one_error_line(trained, tmp_path_factory, name, how, cut, rehash):
    import hashlib

    from rltok.cli import main

    tmp = tmp_path_factory.mktemp("fuzz")
    run = tmp / "run"
    shutil.copytree(trained[0], run)
    victim = tmp / "victim.txt"
    victim.write_text("outside the folder")
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    path = run / name.replace("CKPT", f"checkpoints/{ckpt.name}")
    damage_file(path, how, cut, victim)
    if rehash and name.startswith("CKPT/") and how != "link" and name != "CKPT/manifest.json":
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
    before = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not str(p.relative_to(tmp)).startswith("run"))
    for argv in (["eval", "-c", run, "--max-windows", "1"], ["segment", "-c", run, "hello"],
                 ["generate", "-c", run, "-n", "2", "hi"], ["export", "-c", run, "-o", run.parent / "exported"],
                 ["train", "--resume", "--out", run, "--steps", "3"]):
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([str(a) for a in argv])
        lines = err.getvalue().strip().splitlines()
        assert code in (0, 2), (argv, err.getvalue())
        if code == 2:
            assert lines and lines[-1].startswith("error: "), (argv, err.getvalue())
        assert victim.read_text() == "outside the folder", argv
    after = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                   if not str(p.relative_to(tmp)).startswith(("run", "exported")))
    assert after == before  # nothing written beside the folder but what export was asked to write


# ---- fuzz: any damage to an exported model folder -----------------------------------------------------------

EXPORT_FILES = ["config.json", "model.safetensors", "README.md", "manifest.json", "tokenizer"]
# wide: sizes within every setting's range (or a token id) that would take all of memory to build
EXPORT_DAMAGE = [*DAMAGE, "wide"]


@pytest.fixture(scope="module")
def exported(trained, families, tmp_path_factory):
    """`rltok export` of an hourglass run and of a BPE-token run (its tokenizer inside the weights)."""
    from rltok.cli import main

    root = tmp_path_factory.mktemp("exported")
    folders = {}
    for family, run in (("hourglass", trained[0]), ("bpe_token", families["bpe_token"])):
        folders[family] = root / family
        assert main(["export", "-c", str(run), "-o", str(folders[family])]) == 0
    return folders


def write_manifest(folder: Path) -> None:
    """A checkpoint's manifest over the folder's files (an export has none; a handed folder may)."""
    import hashlib

    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
             if p.is_file() and p.name != "manifest.json"}
    (folder / "manifest.json").write_text(json.dumps({"step": 1, "files": files}))


def damage_tokenizer(folder: Path, how: str, cut: float) -> None:
    """The BPE tokenizer's JSON inside model.safetensors, damaged."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    text = state["tokenizer_json"].to(torch.uint8).numpy().tobytes()
    tok = json.loads(text)
    if how == "wide":  # a token id of a billion: a vocabulary (and an embedding) of a billion rows
        tok["model"]["vocab"]["zz"] = 10**9
        text = json.dumps(tok).encode()
    elif how == "link":  # a merge of tokens the vocabulary lacks
        tok["model"]["merges"].append(["zz", "q"])
        text = json.dumps(tok).encode()
    else:
        text = damaged_bytes(text, how, cut)
    state["tokenizer_json"] = torch.tensor(list(text), dtype=torch.uint8)
    save_file(state, folder / "model.safetensors")


def widen_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    cfg["model"].update(d_chunk=4096, main_layers=64, flat_layers=64)  # ~13e9 parameters, 52 GB to build
    path.write_text(json.dumps(cfg))


@contextlib.contextmanager
def address_space_cap(extra: int = 4 << 30):
    """This process's address space capped a few GB above what it uses while hostile sizes are
    read: a loader that built such a model before checking would fail to allocate, not take the
    machine's memory. (Linux: elsewhere no cap.)"""
    import resource

    try:
        with open("/proc/self/status") as f:
            used = int(next(line for line in f if line.startswith("VmSize:")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def fuzz_exported(exported, tmp_path_factory, family, name, how, cut, manifest) -> None:
    import io

    from rltok.cli import main, user_errors
    from rltok.model.hourglass import HourglassLM
    from rltok.model.token_lm import BPETokenLM
    from rltok.training.loading import from_pretrained

    if name == "tokenizer":
        family = "bpe_token"
    elif how == "wide" and name != "config.json":
        how = "huge"
    tmp = tmp_path_factory.mktemp("fuzz_export")
    model = tmp / "model"
    shutil.copytree(exported[family], model)
    victim = tmp / "victim.txt"
    victim.write_text("outside the folder")
    if name == "manifest.json" or manifest == "before":  # before the damage: its checksums no longer match
        write_manifest(model)
    if name == "tokenizer":
        damage_tokenizer(model, how, cut)
    elif how == "wide":
        widen_config(model / name)
    else:
        damage_file(model / name, how, cut, victim)
    if manifest == "after" and name != "manifest.json":  # after it: the damage reaches the readers
        write_manifest(model)
    before = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    for argv in (["eval", "-c", model, "--max-windows", "1"], ["segment", "-c", model, "hello"],
                 ["generate", "-c", model, "-n", "2", "hi"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                address_space_cap() if how == "wide" else contextlib.nullcontext():
            code = main([str(a) for a in argv])
        lines = err.getvalue().strip().splitlines()
        assert code in (0, 2), (argv, err.getvalue())
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
        if code == 2:
            assert lines and lines[-1].startswith("error: "), (argv, err.getvalue())
    for load in (from_pretrained, {"hourglass": HourglassLM, "bpe_token": BPETokenLM}[family].from_pretrained):
        try:
            with address_space_cap() if how == "wide" else contextlib.nullcontext():
                load(model)
        except user_errors():  # what the command line shows as one error line
            pass
    assert victim.read_text() == "outside the folder"
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == before  # nothing written, in it or beside it


def test_a_model_folder_whose_config_outgrows_its_weights_is_refused_before_building(exported, tmp_path):
    """config.json sizes within every range, ~13e9 parameters, beside weights of 1e5: each matrix
    fits memory on its own, all of them do not, so building the model first would take the
    machine's memory; it is refused from the meta-device model's count. In a child process whose
    address space is capped, so that a regression fails the test and not the machine."""
    import resource
    import subprocess
    import sys

    model = tmp_path / "model"
    shutil.copytree(exported["hourglass"], model)
    widen_config(model / "config.json")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    done = subprocess.run([sys.executable, "-m", "rltok.cli", "eval", "-c", str(model), "--max-windows", "1"],
                          capture_output=True, text=True, preexec_fn=cap, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "describes a model of 12," in done.stderr and "more than the 103,585 values" in done.stderr, done.stderr


EXPORT_CASES = dict(family=st.sampled_from(["hourglass", "bpe_token"]), name=st.sampled_from(EXPORT_FILES),
                    how=st.sampled_from(EXPORT_DAMAGE), cut=st.floats(0, 0.99),
                    manifest=st.sampled_from(["none", "before", "after"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**EXPORT_CASES)
def test_any_damage_to_an_exported_model_folder_is_exit_0_or_one_error_line(exported, tmp_path_factory, family, name,
                                                                           how, cut, manifest):
    fuzz_exported(exported, tmp_path_factory, family, name, how, cut, manifest)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**EXPORT_CASES)
def test_any_damage_to_an_exported_model_folder_at_length(exported, tmp_path_factory, family, name, how, cut,
                                                          manifest):
    fuzz_exported(exported, tmp_path_factory, family, name, how, cut, manifest)
