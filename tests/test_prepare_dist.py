"""Data parallel on prepared shards: 2 gloo ranks (torchrun, CPU) each read only their own windows
from the shards (training and validation), disjoint blocks of the global batch that together are
exactly what one process with the whole batch reads, and the run matches that process."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import wait_for_ranks

from rltok.training.loading import load_checkpoint
from rltok.config import load_config
from rltok.data.prepare import prepare
from rltok.data.shards import ByteStream
from rltok.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

STEPS = 4
GLOBAL_BATCH = 4
COMMON = [f"train.max_steps={STEPS}", "train.grad_accum=2", "train.log_every=1", "train.eval_every=2",
          "train.checkpoint_every=2", "train.device=cpu", "train.threads=1", "train.warmup_steps=2",
          "model.policy_window=2", "train.lr=3e-3"]

WORKER = textwrap.dedent("""
    import faulthandler, json, sys
    from pathlib import Path
    import torch
    from rltok.training import distributed
    from rltok.config import load_config
    from rltok.data.shards import ByteStream
    from rltok.training.trainer import Trainer

    out, data, *overrides = sys.argv[1:]
    faulthandler.dump_traceback_later(180, exit=True)
    torch.set_num_threads(1)
    reads = []
    gather = ByteStream.gather
    def recording_gather(self, starts, length):
        reads.append([int(s) for s in starts])
        return gather(self, starts, length)
    ByteStream.gather = recording_gather
    cfg = load_config("test", overrides=[f"data.train={data}", f"train.out_dir={out}/ddp", *overrides])
    trainer = Trainer(cfg, quiet=True)
    val = list(reads)
    reads.clear()
    trainer.fit()
    Path(out, f"reads{trainer.dist.rank}.json").write_text(json.dumps({"val": val, "train": reads}))
    distributed.shutdown()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_params_close(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():  # relative to the tensor's norm, floored (tensors that start at 0)
            assert ((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-2)).item() <= tol, k
        else:
            assert torch.equal(a[k], b[k]), k


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_read_disjoint_windows_from_shards_and_match_one_process(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(0)
    for i in range(40):
        words = " ".join(rng.choice(["def", "x", "=", "return", "(", ")", ":", "\n", "    "]) for _ in range(rng.randint(50, 300)))
        (src / f"f{i:02d}.py").write_text(words)
    data = tmp_path / "prep"
    prepare(str(src), data, shard_bytes=1500, progress=False)  # many shards: windows cross them
    (tmp_path / "worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(tmp_path / "worker.py"), str(tmp_path),
           str(data), *COMMON, f"train.batch_size={GLOBAL_BATCH // 2}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    # meanwhile, one process with the whole global batch, recording what it reads
    reads = []
    gather = ByteStream.gather

    def recording_gather(self, starts, length):
        reads.append([int(s) for s in starts])
        return gather(self, starts, length)

    monkeypatch.setattr(ByteStream, "gather", recording_gather)
    single = Trainer(load_config("test", overrides=[*COMMON, f"data.train={data}", f"train.out_dir={tmp_path / 'single'}",
                                                    f"train.batch_size={GLOBAL_BATCH}"]), quiet=True)
    single_val = list(reads)
    reads.clear()
    single.fit()
    wait_for_ranks(proc)

    ranks = [json.loads((tmp_path / f"reads{r}.json").read_text()) for r in range(2)]
    # every rank read its own half of each global batch, no window of the other rank's
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == len(reads) == STEPS * 2
    for step, (mine, theirs, whole) in enumerate(zip(ranks[0]["train"], ranks[1]["train"], reads)):
        assert len(mine) == len(theirs) == GLOBAL_BATCH // 2
        assert mine + theirs == whole, step
    assert ranks[0]["val"][0] + ranks[1]["val"][0] == single_val[0] and ranks[0]["val"][0]
    # and the two ranks train as the one process does
    ref, got = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(got) == STEPS
    for a, b in zip(got, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (got, ref)
    assert_params_close(load_checkpoint(tmp_path / "ddp")[0].state_dict(),
                        load_checkpoint(tmp_path / "single")[0].state_dict())
