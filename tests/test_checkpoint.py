"""Checkpoints: atomic writes that survive SIGKILL, corruption refused with a clear message,
fallback to the previous valid checkpoint, pruning and stale-folder cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rltok.training.checkpoint import (CheckpointError, clean_stale, list_checkpoints, resolve_checkpoint,
                                       save_checkpoint)
from rltok.training.loading import load_checkpoint
from rltok.config import load_config
from rltok.model import HourglassLM


@pytest.fixture(scope="module")
def cfg():
    return load_config("test")


@pytest.fixture
def model(cfg):
    torch.manual_seed(0)
    return HourglassLM(cfg.model)


def save_steps(run: Path, model, cfg, steps=(10, 20), keep_last=3):
    for s in steps:
        with torch.no_grad():  # distinct weights per step, so a fallback is observable
            model.head.weight.fill_(float(s))
        save_checkpoint(run, s, model, cfg, {"step": s}, keep_last=keep_last)


def test_roundtrip(tmp_path, model, cfg):
    path = save_checkpoint(tmp_path, 7, model, cfg, {"step": 7, "x": torch.arange(3)})
    # a checkpoint is what save_pretrained writes, plus the trainer state and the manifest
    assert path.name == "step_0000007" and sorted(p.name for p in path.iterdir()) == [
        "README.md", "config.json", "manifest.json", "model.safetensors", "trainer.pt"]
    loaded, cfg2, state, ckpt = load_checkpoint(tmp_path, with_trainer_state=True)
    assert ckpt == path and cfg2 == cfg and state["step"] == 7 and torch.equal(state["x"], torch.arange(3))
    for (name, p), q in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p, q), name
    # any path inside the checkpoint resolves to it
    assert resolve_checkpoint(path / "model.safetensors") == path


def _flip_byte(p: Path):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


CORRUPTIONS = {
    "flipped byte in weights": (lambda c: _flip_byte(c / "model.safetensors"), "model.safetensors is corrupt"),
    "truncated weights": (lambda c: os.truncate(c / "model.safetensors", 100), "model.safetensors is corrupt"),
    "deleted weights": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
    "flipped byte in trainer state": (lambda c: _flip_byte(c / "trainer.pt"), "trainer.pt is corrupt"),
    "deleted manifest": (lambda c: (c / "manifest.json").unlink(), "no manifest"),
    "garbled manifest": (lambda c: (c / "manifest.json").write_bytes(b"{\"files\": \xff"), "not valid JSON"),
    "manifest without files": (lambda c: (c / "manifest.json").write_text('{"step": 20}'), "does not list"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_checkpoint_is_refused_and_run_folder_falls_back(tmp_path, model, cfg, kind):
    save_steps(tmp_path, model, cfg)
    newest = tmp_path / "checkpoints" / "step_0000020"
    damage, message = CORRUPTIONS[kind]
    damage(newest)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(newest)
    with pytest.warns(UserWarning, match="falling back to .*step_0000010"):
        loaded, _, state, ckpt = load_checkpoint(tmp_path, with_trainer_state=True)
    assert ckpt.name == "step_0000010" and state["step"] == 10
    assert torch.all(loaded.head.weight == 10.0)


def test_a_checkpoint_that_matches_its_checksums_but_cannot_be_decoded_falls_back_too(tmp_path, model, cfg):
    """Damaged before its manifest was written (the checksums describe the damaged file): the
    manifest cannot tell, the decoder can, and a run folder falls back past it all the same."""
    import json

    from rltok.training.checkpoint import sha256_file

    save_steps(tmp_path, model, cfg)
    newest = tmp_path / "checkpoints" / "step_0000020"
    os.truncate(newest / "model.safetensors", 100)
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = sha256_file(newest / "model.safetensors")
    (newest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(newest)  # a checkpoint named on its own is that one or an error
    with pytest.warns(UserWarning, match="unreadable checkpoint.*falling back to .*step_0000010"):
        loaded, _, state, ckpt = load_checkpoint(tmp_path, with_trainer_state=True)
    assert ckpt.name == "step_0000010" and state["step"] == 10
    assert torch.all(loaded.head.weight == 10.0)


def test_no_valid_checkpoint_at_all(tmp_path, model, cfg):
    save_steps(tmp_path, model, cfg)
    for c in list_checkpoints(tmp_path):
        _flip_byte(c / "model.safetensors")
    with pytest.raises(CheckpointError, match="no valid checkpoint under"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no checkpoints under"):
        load_checkpoint(tmp_path / "checkpoints")


def test_undecodable_file_with_matching_checksum_is_still_refused(tmp_path, model, cfg):
    """Second line of defence: a file that matches its manifest but does not parse."""
    ckpt = save_checkpoint(tmp_path, 1, model, cfg)
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    import hashlib

    manifest["files"]["model.safetensors"] = hashlib.sha256(b"not a safetensors file").hexdigest()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot read model.safetensors"):
        load_checkpoint(ckpt)


def test_keep_last_k(tmp_path, model, cfg):
    save_steps(tmp_path, model, cfg, steps=(1, 2, 3, 4, 5), keep_last=2)
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_0000004", "step_0000005"]
    save_steps(tmp_path / "all", model, cfg, steps=(1, 2, 3, 4), keep_last=0)
    assert len(list_checkpoints(tmp_path / "all")) == 4


def test_checkpoints_sort_by_step_number(tmp_path, model, cfg):
    save_steps(tmp_path, model, cfg, steps=(9_999_999, 10_000_000), keep_last=1)
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_10000000"]


def test_resave_same_step_replaces_it(tmp_path, model, cfg):
    save_steps(tmp_path, model, cfg, steps=(5,))
    with torch.no_grad():  # the second save of step 5 holds other weights and another state
        model.head.weight.fill_(-1.0)
    save_checkpoint(tmp_path, 5, model, cfg, {"step": 5, "second": True})
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_0000005"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000005"]
    loaded, _, state, _ = load_checkpoint(tmp_path, with_trainer_state=True)
    assert torch.equal(loaded.head.weight, torch.full_like(loaded.head.weight, -1.0)) and state["second"] is True


def test_failed_write_leaves_no_partial_folder(tmp_path, model, cfg, monkeypatch):
    import rltok.training.checkpoint as ck

    save_steps(tmp_path, model, cfg, steps=(1,))

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, 2, model, cfg, {"step": 2})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000001"]


def test_stale_folders_are_cleaned(tmp_path, model, cfg):
    save_steps(tmp_path, model, cfg, steps=(1, 2))
    root = tmp_path / "checkpoints"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    (root / f".tmp_step_0000003_{dead_pid}").mkdir()
    (root / f".tmp_step_0000003_{os.getppid()}").mkdir()  # a live writer: left alone
    os.rename(root / "step_0000002", root / f".old_step_0000002_{dead_pid}")  # killed mid re-save
    clean_stale(tmp_path)
    names = sorted(p.name for p in root.iterdir())
    assert names == [f".tmp_step_0000003_{os.getppid()}", "step_0000001", "step_0000002"]
    assert resolve_checkpoint(tmp_path).name == "step_0000002"


# ---- SIGKILL while writing -------------------------------------------------------------------

# The child saves step 1, then starts step 2 with one write made slow (after doing half of
# it), announces WRITING and waits to be killed. Each child is a process of its own, forked from
# a server that imported the checkpoint code once (conftest's `forks`: a fresh interpreter per
# child cost seconds of imports); it gets its run folder, kill point and connection as RUN, POINT
# and CONN.
CHILD = r"""
import os, sys, time
import rltok.model.pretrained as mp
import rltok.training.checkpoint as ck
from rltok.config import load_config
from rltok.model import HourglassLM

run, point = RUN, POINT
cfg = load_config("test")
model = HourglassLM(cfg.model)
ck.save_checkpoint(run, 1, model, cfg, {"step": 1})

def hang():
    CONN.send("WRITING")
    time.sleep(120)

if point == "weights":
    real = mp.save_file  # the model folder's writer (rltok.model.pretrained)
    def slow(state, path, metadata=None):
        real(state, path, metadata=metadata)
        os.truncate(path, os.path.getsize(path) // 2)
        hang()
    mp.save_file = slow
elif point == "trainer":
    def slow(obj, path):
        open(path, "wb").write(b"\x80\x02partial")
        hang()
    ck.torch.save = slow
elif point == "manifest":
    def slow(path, data):
        open(path, "wb").write(data[: len(data) // 2])
        hang()
    ck._write_synced = slow
elif point == "rename":  # re-saving a step: killed between moving the old copy out and the new in
    ck.save_checkpoint(run, 2, model, cfg, {"step": 2})
    real = os.rename
    def slow(src, dst):
        real(src, dst)
        if ".old_" in str(dst):
            hang()
    ck.os.rename = slow
ck.save_checkpoint(run, 2, model, cfg, {"step": 2})
CONN.send("FINISHED")
"""


def _kill_while_writing(forks, run: Path, point: str) -> None:
    said, conn = forks.Pipe(duplex=False)
    proc = forks.Process(target=exec, args=(CHILD, {"RUN": str(run), "POINT": point, "CONN": conn}))
    proc.start()
    conn.close()
    try:
        try:
            line = said.recv() if said.poll(120) else "nothing in 120 s"
        except EOFError:  # the child ended without a word
            proc.join(30)
            line = f"nothing: the child ended with exit code {proc.exitcode}"
        assert line == "WRITING", line
        proc.kill()  # SIGKILL: no handler, no cleanup
    finally:
        proc.kill()
        proc.join(30)
        said.close()


@pytest.mark.parametrize("point", ["weights", "trainer", "manifest", "rename"])
def test_sigkill_while_writing_leaves_previous_checkpoint_loadable(forks, tmp_path, point):
    _kill_while_writing(forks, tmp_path, point)
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers, "the kill should have interrupted a write"
    # the previous checkpoint is what a reader gets, without any repair step
    _, _, state, ckpt = load_checkpoint(tmp_path, with_trainer_state=True)
    assert ckpt.name == "step_0000001" and state["step"] == 1
    # the next writer tidies up; an interrupted re-save gets its old copy back
    clean_stale(tmp_path)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    expected = ["step_0000001", "step_0000002"] if point == "rename" else ["step_0000001"]
    assert names == expected
    assert load_checkpoint(tmp_path)[3].name == expected[-1]


LOOP_CHILD = r"""
import sys
import rltok.training.checkpoint as ck
from rltok.config import load_config
from rltok.model import HourglassLM

cfg = load_config("test", overrides=["model.d_byte=256", "model.d_chunk=512", "model.n_heads_byte=4",
                                     "model.n_heads_chunk=4", "model.main_layers=4"])
model = HourglassLM(cfg.model)
step = int(sys.argv[2])
while True:
    step += 1
    ck.save_checkpoint(sys.argv[1], step, model, cfg, {"step": step}, keep_last=2)
    print(step, flush=True)
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_of_a_save_loop(tmp_path):
    """Kill a process that checkpoints a ~20 MB model in a loop at random moments; every time
    the newest complete checkpoint loads."""
    import random

    rng = random.Random(0)
    last = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", LOOP_CHILD, str(tmp_path), str(last)],
                                stdout=subprocess.PIPE, text=True)
        first = proc.stdout.readline()  # at least one save completed
        assert first.strip().isdigit(), first
        time.sleep(rng.uniform(0.0, 1.0))
        proc.kill()
        proc.wait(30)
        done = [int(x) for x in [first, *proc.stdout.read().split()]]
        proc.stdout.close()
        _, _, state, ckpt = load_checkpoint(tmp_path, with_trainer_state=True)
        assert state["step"] >= done[-1] >= last
        last = state["step"]


# ---- one format, one loader ------------------------------------------------------------------

def test_checkpoint_folder_is_an_export_folder_and_both_load_everywhere(tmp_path, model, cfg):
    from rltok.model.pretrained import save_pretrained
    from rltok.training.loading import from_pretrained

    ckpt = save_checkpoint(tmp_path / "run", 3, model, cfg, {"step": 3})
    exported = save_pretrained(model, tmp_path / "exported", cfg)
    model_files = sorted(p.name for p in exported.iterdir())
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*model_files, "manifest.json", "trainer.pt"])
    assert (ckpt / "model.safetensors").read_bytes() == (exported / "model.safetensors").read_bytes()
    meta = json.loads((ckpt / "config.json").read_text())
    assert meta["model_type"] == "rltok" and meta["architecture"] == "HourglassLM"
    assert meta["results"] == {"step": 3}  # no metrics.jsonl in this run folder
    # from_pretrained takes the checkpoint folder and the run folder; load_checkpoint the export
    for where in (ckpt, tmp_path / "run"):
        loaded, full, got_meta = from_pretrained(where, return_config=True)
        assert full == cfg and got_meta["results"] == {"step": 3} and not loaded.training
        for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(a, b), k
    loaded, cfg2, state, folder = load_checkpoint(exported)
    assert state is None and folder == exported and cfg2 == cfg
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k


def _rewrite_weights(ckpt: Path, change) -> None:
    """Change the weights and re-write the manifest to match, so only strict loading can object."""
    import hashlib

    from safetensors.torch import load_file, save_file

    state = load_file(ckpt / "model.safetensors")
    change(state)
    save_file(state, ckpt / "model.safetensors", metadata={"format": "pt"})
    if (ckpt / "manifest.json").exists():
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["files"]["model.safetensors"] = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
        (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_strict_loading_names_missing_and_unexpected_keys(tmp_path, model, cfg):
    from rltok.model.pretrained import PretrainedError, save_pretrained
    from rltok.training.loading import from_pretrained

    extra = save_checkpoint(tmp_path / "a", 1, model, cfg)
    _rewrite_weights(extra, lambda s: s.__setitem__("head.extra", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"missing keys \[\], unexpected keys \['head.extra'\]"):
        load_checkpoint(extra)
    missing = save_pretrained(model, tmp_path / "b", cfg)
    _rewrite_weights(missing, lambda s: s.pop("head.weight"))
    with pytest.raises(PretrainedError, match=r"does not match its config.json: missing keys \['head.weight'\], "
                                              r"unexpected keys \[\]"):
        from_pretrained(missing)
    with pytest.raises(CheckpointError, match="missing keys"):  # PretrainedError is a CheckpointError too
        load_checkpoint(missing)
    shape = save_checkpoint(tmp_path / "c", 1, model, cfg)
    _rewrite_weights(shape, lambda s: s.__setitem__("head.weight", torch.zeros(3, 3)))
    with pytest.raises(CheckpointError, match="does not match its config.json.*size mismatch"):
        load_checkpoint(shape)


def test_checkpoint_without_manifest_is_not_taken_for_an_export(tmp_path, model, cfg):
    ckpt = save_checkpoint(tmp_path, 1, model, cfg)  # no trainer state: only the step name says "checkpoint"
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest"):
        load_checkpoint(ckpt)


def write_old_format_checkpoint(run: Path, step: int, model, cfg, trainer_state: dict | None) -> Path:
    """A checkpoint as rltok wrote them before the shared format: config.json without the
    metadata keys, no model card, step in the safetensors metadata, optimiser state (if any)
    keyed by integer ids."""
    import hashlib

    from safetensors.torch import save_file

    ckpt = run / "checkpoints" / f"step_{step:07d}"
    ckpt.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ckpt / "model.safetensors",
              metadata={"format": "pt", "step": str(step)})
    (ckpt / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    if trainer_state is not None:
        torch.save(trainer_state, ckpt / "trainer.pt")
    files = sorted(p.name for p in ckpt.iterdir())
    manifest = {"step": step, "files": {n: hashlib.sha256((ckpt / n).read_bytes()).hexdigest() for n in files}}
    (ckpt / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return ckpt


def test_old_format_checkpoint_loads_for_evaluation_and_export(tmp_path, model, cfg, capsys):
    from rltok.cli import main
    from rltok.training.loading import from_pretrained

    ckpt = write_old_format_checkpoint(tmp_path / "old", 5, model, cfg, {"step": 5})
    loaded, cfg2, state, folder = load_checkpoint(tmp_path / "old", with_trainer_state=True)
    assert folder == ckpt and cfg2 == cfg and state == {"step": 5}
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    _, _, meta = from_pretrained(ckpt, return_config=True)
    assert meta == {}
    assert main(["export", "-c", str(tmp_path / "old"), "--out", str(tmp_path / "exported")]) == 0
    capsys.readouterr()
    exported = sorted(p.name for p in (tmp_path / "exported").iterdir())
    assert exported == ["README.md", "config.json", "model.safetensors"]
    again = from_pretrained(tmp_path / "exported")
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
