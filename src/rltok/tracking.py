"""Where log records go: `metrics.jsonl` in the run folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .config import Config


def read_metrics(path: Path, up_to_step: int | None = None) -> list[dict]:
    """Records of a metrics.jsonl, optionally only those at or before `up_to_step`. A torn last
    line (the process died while writing it) is dropped."""
    records = []
    if not path.is_file():
        return records
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and (up_to_step is None or rec.get("step", 0) <= up_to_step):
            records.append(rec)
    return records


def _write_metrics(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


class JsonlSink:
    """metrics.jsonl: one consistent trajectory. A resumed run drops the records written after
    its checkpoint (it is about to log those steps again); a fresh run starts empty."""

    def __init__(self, run_dir: Path, step: int):
        path = run_dir / "metrics.jsonl"
        self.history = read_metrics(path, step) if step else []
        _write_metrics(path, self.history)
        self.file = open(path, "a")

    def log(self, rec: dict) -> None:
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Trackers:
    """All sinks of a run, opened on rank 0 when training starts; `history` holds the records
    of the run so far (a resumed run's, up to its checkpoint)."""

    def __init__(self, run_dir: Path, cfg: Config, step: int):
        self.sinks = []
        try:
            jsonl = JsonlSink(run_dir, step)
            self.sinks.append(jsonl)
            self.history = jsonl.history
        except BaseException:
            self.close()
            raise

    def log(self, rec: dict) -> None:
        for sink in self.sinks:
            sink.log(rec)

    def close(self) -> None:
        for sink in reversed(self.sinks):
            sink.close()
        self.sinks = []
