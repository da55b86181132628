"""Run under torchrun by tests/test_distributed.py (not a test module itself).

    torchrun --nproc_per_node 2 tests/dist_worker.py OUT DATA [override ...]

Every rank takes part in: a DDP run stopped halfway and resumed (OUT/ddp_resume), an FSDP2 run
stopped halfway and resumed (OUT/fsdp) and the same run uninterrupted (OUT/fsdp_straight), a DDP
run with K segmentations per sequence (OUT/ddp_group), one with Lagrange rate control and a FLOPs
budget (OUT/ddp_priced), one whose policy starts late and settles half-way (OUT/ddp_settled; under
FSDP2 with a resume after it settled, OUT/fsdp_settled), a DDP run on the prepared shards in OUT/prep
(OUT/shards; each rank writes the windows it read to OUT/shards_reads<rank>.json), and a DDP run
through the CLI (OUT/ddp). Rank 0 writes the checkpoints and metrics that the test compares with a
single-process run.
"""

import faulthandler
import json
import sys
from pathlib import Path

import torch

from rltok.training import distributed
from rltok.cli import main
from rltok.config import load_config
from rltok.data.shards import ByteStream
from rltok.training.trainer import Trainer


# K=2 segmentations per sequence with the group-relative baseline (a group's rows stay on one
# rank). Not with the critic: its bias regresses batch-centred returns, so its true gradient is
# zero and Adam's first steps (about lr x sign(g)) turn rounding noise into different updates.
GROUP = ["objective.baseline=group", "objective.group_size=2", "model.policy_window=1"]
# the Lagrange price and the FLOPs spent come from the global rate: every rank must agree
PRICED = ["objective.rate_control=lagrange", "model.target_rate=0.3", "train.flops_budget=1e12"]
# a warm start of 2 steps, then the policy learns, then settles half-way: in the warm start and once
# settled its head gets no gradient, on every rank at the same steps
SETTLED = ["objective.policy_start_step=2", "objective.policy_until=0.5"]


def trained_reading_shards(cfg):
    """Train `cfg` on prepared shards, recording the windows it reads: (trainer, {"val": the reads
    made when the trainer is built, "train": those of training})."""
    reads = []
    gather = ByteStream.gather

    def recording_gather(self, starts, length):
        reads.append([int(s) for s in starts])
        return gather(self, starts, length)

    ByteStream.gather = recording_gather
    try:
        trainer = Trainer(cfg, quiet=True)
        val = list(reads)
        reads.clear()
        trainer.fit()
    finally:
        ByteStream.gather = gather
    return trainer, {"val": val, "train": reads}


def run() -> None:
    out, data, *overrides = sys.argv[1:]
    faulthandler.dump_traceback_later(180, exit=True)  # a hang shows where each rank waits
    torch.set_num_threads(1)
    base = [f"data.train={data}", *overrides]
    # 1. DDP stopped at step 3 and resumed in a new Trainer
    cfg = load_config("test", overrides=[*base, f"train.out_dir={out}/ddp_resume"])
    Trainer(cfg, quiet=True).fit(stop_at=3)
    resumed = Trainer(load_config("test", overrides=[*base, f"train.out_dir={out}/ddp_resume"]), resume=True, quiet=True)
    assert resumed.step == 3
    resumed.fit()
    # 2. parameters, gradients and optimiser state sharded with FSDP2, also stopped and resumed
    fsdp = [*base, f"train.out_dir={out}/fsdp", "train.fsdp=true"]
    trainer = Trainer(load_config("test", overrides=fsdp), quiet=True)
    assert distributed.is_fsdp(trainer.model) and trainer.wrapped is trainer.model
    trainer.fit(stop_at=3)
    resumed = Trainer(load_config("test", overrides=fsdp), resume=True, quiet=True)
    assert resumed.step == 3
    resumed.fit()
    straight = [*base, f"train.out_dir={out}/fsdp_straight", "train.fsdp=true"]
    Trainer(load_config("test", overrides=straight), quiet=True).fit()
    # 3. group-relative baseline
    Trainer(load_config("test", overrides=[*base, f"train.out_dir={out}/ddp_group", *GROUP]), quiet=True).fit()
    # 3b. Lagrange rate control and a FLOPs budget
    Trainer(load_config("test", overrides=[*base, f"train.out_dir={out}/ddp_priced", *PRICED]), quiet=True).fit()
    # 3c. a policy that settles half-way
    Trainer(load_config("test", overrides=[*base, f"train.out_dir={out}/ddp_settled", *SETTLED]), quiet=True).fit()
    # 3d. the same under FSDP2, stopped after the policy settled and resumed
    fsdp_settled = [*base, f"train.out_dir={out}/fsdp_settled", "train.fsdp=true", *SETTLED]
    Trainer(load_config("test", overrides=fsdp_settled), quiet=True).fit(stop_at=4)
    Trainer(load_config("test", overrides=fsdp_settled), resume=True, quiet=True).fit()
    # 3e. prepared shards: the windows each rank reads, validation (when the trainer is built) and training
    trainer, reads = trained_reading_shards(load_config("test", overrides=[f"data.train={out}/prep", *overrides,
                                                                           f"train.out_dir={out}/shards"]))
    Path(out, f"shards_reads{trainer.dist.rank}.json").write_text(json.dumps(reads))
    # 4. DDP through the command line, as a user launches it (last: its
    # exit destroys the process group, and re-creating one under torchrun is not reliable)
    rc = main(["train", "--preset", "test", "--out", f"{out}/ddp", *base])
    assert rc == 0, rc
    distributed.shutdown()


if __name__ == "__main__":
    run()
