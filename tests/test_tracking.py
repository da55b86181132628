"""Metric sinks: a short run with train.tensorboard=true writes TensorBoard event files, and one
with train.wandb=<project> under WANDB_MODE=offline a local W&B run; both hold exactly the
numbers of metrics.jsonl, under the same keys, at the same steps. Without the package either is
one `error:` line before anything trains."""

from __future__ import annotations

import json
import shutil
import struct
import sys
import time
from pathlib import Path

import pytest
import torch

from rltok.cli import main
from rltok.config import ConfigError, load_config
from rltok.data.sources import Corpus
from rltok.training.tracking import scalars
from rltok.training.trainer import Trainer

TEXT = b"".join(b"%d the quick brown fox, %x lazy dogs and some spaces\n" % (i, i * 7) for i in range(300))
COMMON = ["train.max_steps=4", "train.device=cpu", "train.threads=1", "train.log_every=1", "train.eval_every=2",
          "train.checkpoint_every=1000", "train.eval_batches=1", "train.peak_flops=1e12"]


def corpus() -> Corpus:
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return Corpus(train=data[:cut].clone(), val=data[cut:].clone(), source="synthetic")


def train(out: Path, *extra: str, stop_at: int | None = None, resume: bool = False) -> list[dict]:
    cfg = load_config("test", overrides=[f"train.out_dir={out}", *COMMON, *extra])
    Trainer(cfg, corpus=corpus(), resume=resume, quiet=True).fit(stop_at=stop_at)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def by_step(records: list[dict]) -> dict[int, dict]:
    """Each record's numbers (what the sinks log: not the strings, such as peak_source), by step."""
    return {r["step"]: scalars(r) for r in records}


def test_tensorboard_event_files_hold_the_jsonl_records(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # a crash after step 3 whose checkpoint was never written: the run resumes from step 2 and
    # logs step 3 again, and the resumed writer hides what the first one logged from step 3 on
    extra = ("train.tensorboard=true", "train.checkpoint_every=2")
    train(tmp_path, *extra, stop_at=3)
    shutil.rmtree(tmp_path / "checkpoints" / "step_0000003")
    records = train(tmp_path, *extra, resume=True)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got: dict[int, dict] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert [e.step for e in events] == sorted({e.step for e in events}), tag  # each step once
        for event in events:
            got.setdefault(event.step, {})[tag] = event.value
    want = by_step(records)
    assert [r["step"] for r in records] == [1, 2, 3, 4] and "val_bpb" in want[2] and "loss" in want[1]
    assert got.keys() == want.keys()
    for step in want:
        assert got[step].keys() == want[step].keys(), step
        assert got[step] == pytest.approx(want[step], rel=1e-6), step  # TensorBoard stores float32


def wandb_records(path: Path, block: int = 32768):
    """The records of a W&B transaction log (.wandb): a 7-byte header (':W&B', magic, version),
    then LevelDB log format: 32 KiB blocks of chunks with a (crc32, length, type) header,
    type 1 a whole record, 2/3/4 its first/middle/last part."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # preallocated space
            break
        parts += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            yield parts
            parts = b""


def key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_the_jsonl_records(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto.wandb_internal_pb2 import Record

    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "cfg",
                       "WANDB_CACHE_DIR": tmp_path / "cache", "WANDB_DATA_DIR": tmp_path / "data"}.items():
        monkeypatch.setenv(var, str(value))
    run = tmp_path / "run"
    records = train(run, "train.wandb=rltok-test")
    [log] = (run / "wandb").glob("offline-run-*/run-*.wandb")
    want = by_step(records)
    # wandb's service process writes the log; on a loaded machine its last records can land a
    # moment after run.finish() returns, so read until they are all there (or time out)
    deadline = time.monotonic() + 30
    while True:
        got, config = {}, None
        for raw in wandb_records(log):
            rec = Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") == "history":
                row = {key(item): json.loads(item.value_json) for item in rec.history.item}
                got[row["_step"]] = {k: v for k, v in row.items() if not k.startswith("_")}
            elif rec.WhichOneof("record_type") == "run":
                config = {key(item): json.loads(item.value_json) for item in rec.run.config.update}
        if (len(got) >= len(want) and config is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == want  # same keys, values exact (JSON numbers both ways)
    assert config["train"]["wandb"] == "rltok-test" and config["resumed_from_step"] == 0


@pytest.mark.parametrize("key,package", [("train.tensorboard=true", "tensorboard"), ("train.wandb=proj", "wandb")])
def test_a_missing_tracking_package_is_one_error_line_before_training(tmp_path, monkeypatch, capsys, key, package):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ImportError
    if package == "tensorboard":
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'api'}", *COMMON, key])
    with pytest.raises(ConfigError, match=f"needs the {package} package: pip install 'rltok\\[track\\]'"):
        Trainer(cfg, corpus=corpus(), quiet=True)
    data = tmp_path / "data.txt"
    data.write_bytes(TEXT)
    assert main(["train", "--preset", "test", "--data", str(data), "--out", str(tmp_path / "cli"), *COMMON, key]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and package in err[0]
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()
