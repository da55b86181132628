"""Data-parallel training: 2 gloo processes on CPU (launched with torchrun) reproduce a single
process that holds the whole global batch — same loss at every step and the same final
parameters within 1e-5 relative — with DDP (also through the CLI, with gradient accumulation
and a resume in between) and with FSDP2. RL chunker with sampled boundaries (policy_window=2:
the sequential sampler), so the shared data and boundary noise and the global batch-relative
baseline and rate mean are all exercised; also K=2 segmentations per sequence with the
group-relative baseline; and Lagrange rate control with a FLOPs budget (both fed by the global
rate). On prepared shards each rank reads only its own windows (training and validation): disjoint
blocks of the global batch that together are exactly what one process with the whole batch reads.
One torchrun runs every case (a launch costs seconds of start-up per rank)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import wait_for_ranks

from rltok.training.loading import load_checkpoint
from rltok.config import load_config
from rltok.data.prepare import prepare
from rltok.training.trainer import Trainer

from dist_worker import GROUP, PRICED, SETTLED

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

STEPS = 6
COMMON = [f"train.max_steps={STEPS}", "train.grad_accum=2", "train.log_every=1", "train.eval_every=3",
          "train.checkpoint_every=3", "train.device=cpu", "train.threads=1", "train.warmup_steps=2",
          "model.policy_window=2", "train.lr=3e-3"]
GLOBAL_BATCH = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(run: Path) -> list[float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    return [r["loss"] for r in recs]


def assert_params_close(a: dict, b: dict, tol: float = 1e-5) -> float:
    worst = 0.0
    assert a.keys() == b.keys()
    for k in a:
        if not a[k].is_floating_point():
            assert torch.equal(a[k], b[k]), k
            continue
        # relative to the tensor's norm, floored: a near-zero tensor (the policy's history table
        # starts at 0) would turn float32 round-off in the all-reduce into a large ratio
        rel = ((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-2)).item()
        worst = max(worst, rel)
        assert rel <= tol, (k, rel)
    return worst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    data = root / "corpus.txt"
    data.write_bytes(b"".join(b"line %d: the quick brown fox %x jumps over lazy dogs\n" % (i, i * 31)
                              for i in range(400)))
    src = root / "src"
    src.mkdir()
    rng = random.Random(0)
    for i in range(40):
        words = " ".join(rng.choice(["def", "x", "=", "return", "(", ")", ":", "\n", "    "]) for _ in range(rng.randint(50, 300)))
        (src / f"f{i:02d}.py").write_text(words)
    prepare(str(src), root / "prep", shard_bytes=1500, progress=False)  # many shards: windows cross them
    # the 2-rank runs hold half the global batch per rank
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           str(Path(__file__).with_name("dist_worker.py")), str(root), str(data),
           *COMMON, f"train.batch_size={GLOBAL_BATCH // 2}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # its own session, so a hung run can be killed with all its workers
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    # meanwhile, the single-process reference with the whole global batch
    torch.set_num_threads(1)
    cfg = load_config("test", overrides=[*COMMON, f"data.train={data}", f"train.out_dir={root / 'single'}",
                                         f"train.batch_size={GLOBAL_BATCH}"])
    Trainer(cfg, quiet=True).fit()
    Trainer(load_config("test", overrides=[*COMMON, f"data.train={data}", f"train.out_dir={root / 'single_group'}",
                                           f"train.batch_size={GLOBAL_BATCH}", *GROUP]), quiet=True).fit()
    Trainer(load_config("test", overrides=[*COMMON, f"data.train={data}", f"train.out_dir={root / 'single_priced'}",
                                           f"train.batch_size={GLOBAL_BATCH}", *PRICED]), quiet=True).fit()
    Trainer(load_config("test", overrides=[*COMMON, f"data.train={data}", f"train.out_dir={root / 'single_settled'}",
                                           f"train.batch_size={GLOBAL_BATCH}", *SETTLED]), quiet=True).fit()
    # and on the shards, recording the windows it reads
    from dist_worker import trained_reading_shards

    _, reads = trained_reading_shards(load_config("test", overrides=[*COMMON, f"data.train={root / 'prep'}",
                                                                     f"train.out_dir={root / 'shards_single'}",
                                                                     f"train.batch_size={GLOBAL_BATCH}"]))
    (root / "shards_single_reads.json").write_text(json.dumps(reads))
    out = wait_for_ranks(proc)
    return root, out


def weights(run: Path) -> dict:
    return load_checkpoint(run)[0].state_dict()


@pytest.mark.parametrize("name", ["ddp", "ddp_resume", "fsdp", "ddp_group", "ddp_priced", "ddp_settled",
                                  "fsdp_settled"])
def test_two_ranks_match_one_process(runs, name):
    root, _ = runs
    single = root / {"ddp_group": "single_group", "ddp_priced": "single_priced",
                     "ddp_settled": "single_settled", "fsdp_settled": "single_settled"}.get(name, "single")
    ref, got = losses(single), losses(root / name)
    for a, b in zip(got, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (got, ref)
    worst = assert_params_close(weights(root / name), weights(single))
    print(f"{name}: worst parameter relative error {worst:.2e}, "
          f"worst loss relative error {max(abs(a - b) / abs(b) for a, b in zip(got, ref)):.2e}")


def test_rank_zero_alone_writes_and_reports(runs):
    root, out = runs
    ddp_dir = root / "ddp"
    cfg = json.loads((ddp_dir / "config.json").read_text())
    assert cfg["train"]["batch_size"] == GLOBAL_BATCH // 2
    assert out.count("x 2 ranks (DDP, gloo)") == 1  # one start-up line: rank 0's
    assert out.count('"step": 6') == 1  # the CLI's summary line, printed once
    rec = json.loads((ddp_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["bytes"] == STEPS * 2 * GLOBAL_BATCH * 64  # global bytes: steps x accum x global batch x seq_len
    # a measured peak on a shared machine may be beaten: then MFU is missing (with a note), never > 100%
    assert (rec["mfu"] is None or 0 < rec["mfu"] < 1) and rec["peak_source"] == "measured" and "val_bpb" in rec
    assert sorted(p.name for p in (ddp_dir / "checkpoints").iterdir()) == ["step_0000003", "step_0000006"]


def test_optimizer_state_is_keyed_by_name_under_fsdp_and_ddp_as_in_one_process(runs, tmp_path):
    """trainer.pt holds the optimiser state keyed by parameter name in one process and under DDP
    (the same names, groups and tensor shapes); under FSDP it is in the checkpoint's dcp/ folder
    (torch.distributed.checkpoint, every rank's shards, keyed by name), which one process loads
    into its own model and optimiser: the same state, to the 2-rank tolerance."""
    from rltok.training import distributed
    from rltok.training.checkpoint import SHARDED, list_checkpoints, verify_checkpoint

    root, _ = runs

    def optimizer_of(run: Path) -> dict:
        return torch.load(list_checkpoints(run)[-1] / "trainer.pt", weights_only=False)["optimizer"]

    def hyper(group: dict) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in group.items() if k != "params"}

    single = optimizer_of(root / "single")
    names = [n for g in single["param_groups"] for n in g["params"]]
    assert names and all(isinstance(n, str) for n in names) and set(single["state"]) <= set(names)
    assert not (list_checkpoints(root / "single")[-1] / SHARDED).exists()

    # FSDP: no optimiser state in trainer.pt; the shards load into a single process's optimiser
    ckpt = list_checkpoints(root / "fsdp")[-1]
    verify_checkpoint(ckpt)  # the manifest covers dcp/'s files
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert any(f.startswith(SHARDED + "/") for f in manifest["files"]), manifest
    assert optimizer_of(root / "fsdp") is None
    torch.set_num_threads(1)
    cfg = load_config("test", overrides=[*COMMON, f"train.out_dir={tmp_path / 'load'}", "data.train=stdlib",
                                         "data.max_bytes=20000", f"train.batch_size={GLOBAL_BATCH}"])
    trainer = Trainer(cfg, quiet=True)
    distributed.load_sharded_state(trainer.model, trainer.opt, ckpt / SHARDED)
    from_dcp = distributed.optimizer_state_by_name(trainer.model, trainer.opt)
    assert_params_close(trainer.model.state_dict(), weights(root / "fsdp"), tol=0.0)  # the same weights
    for name, got in (("fsdp", from_dcp), ("ddp_resume", optimizer_of(root / "ddp_resume"))):
        assert [g["params"] for g in got["param_groups"]] == [g["params"] for g in single["param_groups"]], name
        # the hyperparameters (torch.distributed.checkpoint hands betas back as a list, not a tuple)
        assert [hyper(g) for g in got["param_groups"]] == [hyper(g) for g in single["param_groups"]], name
        assert got["state"].keys() == single["state"].keys(), name
        for p, s in single["state"].items():
            assert got["state"][p].keys() == s.keys(), (name, p)
            for k, v in s.items():
                assert got["state"][p][k].shape == v.shape and got["state"][p][k].device.type == "cpu", (name, p, k)
    assert_params_close({f"{p}.{k}": v for p, s in from_dcp["state"].items() for k, v in s.items()},
                        {f"{p}.{k}": v for p, s in single["state"].items() for k, v in s.items()}, tol=1e-4)


def test_fsdp_resume_continues_exactly(runs):
    """An FSDP run stopped at step 3 and resumed from its sharded state (dcp/) ends bit for bit
    where the same run without the stop ends."""
    root, _ = runs
    assert losses(root / "fsdp") == losses(root / "fsdp_straight")
    a, b = weights(root / "fsdp"), weights(root / "fsdp_straight")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_ranks_read_disjoint_windows_from_shards_and_match_one_process(runs):
    root, _ = runs
    single = json.loads((root / "shards_single_reads.json").read_text())
    ranks = [json.loads((root / f"shards_reads{r}.json").read_text()) for r in range(2)]
    # every rank read its own half of each global batch, no window of the other rank's
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == len(single["train"]) == STEPS * 2
    for step, (mine, theirs, whole) in enumerate(zip(ranks[0]["train"], ranks[1]["train"], single["train"])):
        assert len(mine) == len(theirs) == GLOBAL_BATCH // 2
        assert mine + theirs == whole, step
    assert ranks[0]["val"][0] + ranks[1]["val"][0] == single["val"][0] and ranks[0]["val"][0]
    # and the two ranks train as the one process does
    ref, got = losses(root / "shards_single"), losses(root / "shards")
    for a, b in zip(got, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (got, ref)
    assert_params_close(weights(root / "shards"), weights(root / "shards_single"))
