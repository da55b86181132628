"""A run folder, checkpoint or model folder from elsewhere runs no code: every file the loaders
read is replaced, in turn, by a pickle that would write a marker file when unpickled (with the
manifest's checksums updated to match, since a checksum beside the file protects nothing), and
every command that reads such a folder is run on it. None may write the marker; each ends with
exit 0 or one `error:` line."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from rltok.cli import main

TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(400))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.seq_len=64"]


class Plant:
    """Unpickling this writes `marker`: what an attacker's pickle would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def poisoned_bytes(marker: Path, how: str) -> bytes:
    if how == "pickle":
        return pickle.dumps(Plant(marker))
    path = marker.with_name("poison.pt")
    torch.save({"step": 1, "numpy_rng": Plant(marker)}, path)  # a torch zip file with the plant inside
    data = path.read_bytes()
    path.unlink()
    return data


def rehash(ckpt: Path) -> None:
    """Update the manifest to the files as they are now."""
    manifest_path = ckpt / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {name: hashlib.sha256((ckpt / name).read_bytes()).hexdigest()
                         for name in manifest["files"] if (ckpt / name).is_file()}
    manifest_path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted")
    data = root / "data.txt"
    data.write_bytes(TEXT)
    run = root / "run"
    assert main(["train", *FAST, "--data", str(data), "--out", str(run), "--steps", "2"]) == 0
    assert main(["export", "-c", str(run), "-o", str(root / "model")]) == 0
    return run, root / "model"


def commands(folder: Path, out: Path, is_run: bool) -> list[list[str]]:
    cmds = [["eval", "-c", folder, "--max-windows", "2"], ["generate", "-c", folder, "-n", "3", "hi"],
            ["segment", "-c", folder, "hello"], ["export", "-c", folder, "-o", out / "exported"]]
    if is_run:
        cmds.append(["train", "--resume", "--out", folder, "--steps", "3"])
    return [[str(a) for a in c] for c in cmds]


def run_all(cmds, capsys, marker: Path) -> None:
    for argv in cmds:
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        err = capsys.readouterr().err
        assert not marker.exists(), f"{argv[0]} ran code from a planted pickle"
        assert code in (0, 2), f"{argv}: exit {code}\n{err}"
        if code == 2:
            assert err.strip().splitlines()[-1].startswith("error: "), err


CHECKPOINT_FILES = ("trainer.pt", "model.safetensors", "config.json", "README.md", "manifest.json")


def planted_copy(run: Path, tmp_path: Path, name: str, how: str) -> tuple[Path, Path, Path]:
    """A copy of `run` whose newest checkpoint holds, as file `name`, a pickle that would create a
    marker file when unpickled; the manifest's hashes are redone (unless the manifest is what is
    planted) so only the loader's refusal stops it. -> (the copy, its newest checkpoint, the marker)."""
    copy = shutil.copytree(run, tmp_path / "run")
    marker = tmp_path / "marker"
    ckpt = sorted((copy / "checkpoints").iterdir())[-1]
    (ckpt / name).write_bytes(poisoned_bytes(marker, how))
    if name != "manifest.json":
        rehash(ckpt)
    return copy, ckpt, marker


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_planted_pickle_in_a_checkpoint_file_runs_no_code(trained, tmp_path, capsys, name, how):
    run, ckpt, marker = planted_copy(trained[0], tmp_path, name, how)
    run_all(commands(run, tmp_path, is_run=True), capsys, marker)
    run_all(commands(ckpt, tmp_path, is_run=False), capsys, marker)


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl"])
def test_a_planted_pickle_in_a_run_folder_file_runs_no_code(trained, tmp_path, capsys, name):
    run = shutil.copytree(trained[0], tmp_path / "run")
    marker = tmp_path / "marker"
    (run / name).write_bytes(poisoned_bytes(marker, "pickle"))
    run_all(commands(run, tmp_path, is_run=True), capsys, marker)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "README.md"])
def test_a_planted_pickle_in_a_model_folder_runs_no_code(trained, tmp_path, capsys, name):
    model = shutil.copytree(trained[1], tmp_path / "model")
    marker = tmp_path / "marker"
    (model / name).write_bytes(poisoned_bytes(marker, "torch.save"))
    run_all(commands(model, tmp_path, is_run=False), capsys, marker)


def test_a_planted_sharded_metadata_runs_no_code(trained, tmp_path, capsys):
    """A checkpoint that claims FSDP's sharded state (no optimiser state in trainer.pt, a dcp/
    folder): its `.metadata` pickle is read by an unpickler that calls nothing."""
    run = shutil.copytree(trained[0], tmp_path / "run")
    marker = tmp_path / "marker"
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    state["optimizer"] = None
    torch.save(state, ckpt / "trainer.pt")
    (ckpt / "dcp").mkdir()
    (ckpt / "dcp" / ".metadata").write_bytes(poisoned_bytes(marker, "pickle"))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["dcp/.metadata"] = ""
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    rehash(ckpt)
    run_all([["train", "--resume", "--out", str(run), "--steps", "3"]], capsys, marker)


def test_trainer_state_holds_no_numpy_objects_and_old_ones_still_load(trained, tmp_path):
    """New trainer states load with the weights-only unpickler as they are; ones written before
    (the NumPy RNG key as an array) load through the NumPy reconstructors allowed for them."""
    import numpy as np

    from rltok.training.safe_load import load_tensors_only

    ckpt = sorted((trained[0] / "checkpoints").iterdir())[-1]
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    assert isinstance(state["numpy_rng"][1], list)
    state["numpy_rng"] = np.random.get_state()  # the older form
    torch.save(state, tmp_path / "old.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "old.pt", weights_only=True)
    assert isinstance(load_tensors_only(tmp_path / "old.pt")["numpy_rng"][1], np.ndarray)
