"""Fixed-seed short training runs whose numbers pin what training computes.

Each case is a list of config overrides on the `test` preset: the CPU default recipe (lexicon),
the published recipe, two stages, every method of the comparison harness, the vocabulary pieces
and the rate controls. `python tests/behaviour_cases.py` runs them all on the code as it is and
writes tests/fixtures/behaviour.json; tests/test_behaviour.py reruns them and compares.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import sys
from pathlib import Path

import torch

STEPS = 12
FIXTURE = Path(__file__).parent / "fixtures" / "behaviour.json"

_REF = ["model.chunker=rl", "objective.recipe=reference"]
CASES: dict[str, list[str]] = {
    # the CPU presets' recipe and the published one
    "lexicon": ["objective.recipe=lexicon"],
    "reference": _REF,
    "two_stage": [*_REF, "model.stages=2"],
    # every method of the comparison harness
    "hnet": ["model.chunker=hnet"],
    "gumbel": ["model.chunker=gumbel"],
    "entropy": ["model.chunker=entropy"],
    "whitespace": ["model.chunker=whitespace"],
    "bpe": ["model.chunker=bpe"],
    "bpe_line": ["model.chunker=bpe", "model.bpe_pretokenize=line"],
    "fixed": ["model.chunker=fixed"],
    "uniform": ["model.chunker=uniform"],
    "flat": ["model.arch=flat"],
    "bpe_token": ["model.arch=bpe_token"],
    "rl_gamma1": [*_REF, "objective.gamma=1.0"],
    "rl_no_batch": [*_REF, "objective.baseline=none"],
    "rl_final_reward": [*_REF, "objective.reward=final"],
    "rl_w8": [*_REF, "model.policy_window=8"],
    "rl_no_rate": [*_REF, "objective.rate_weight=0"],
    "rl_group4": [*_REF, "objective.baseline=group", "objective.group_size=4"],
    "rl_value": [*_REF, "objective.baseline=batch+value"],
    "rl_group4_value": [*_REF, "objective.baseline=group+value", "objective.group_size=4"],
    # vocabulary pieces
    "lexicon_ngram_cvocab": ["objective.recipe=lexicon", "model.ngram_vocab=512", "model.chunk_vocab=256"],
    "flat_ngram": ["model.arch=flat", "model.ngram_vocab=512"],
    # rate controls and the other estimator settings the presets and recipes reach
    "reference_lagrange": [*_REF, "objective.rate_control=lagrange"],
    "reference_compute_price": [*_REF, "objective.rate_control=none", "objective.compute_price=0.5"],
    # the lab's variants (rltok_lab.variants, a plugin)
    "reference_price_as_reward": [*_REF, "plugins=rltok_lab.variants", "objective.rate_control=lagrange",
                                  "objective.cost_estimator=reward"],
    "flips_model_pass": ["objective.estimator=flips", "objective.flip_stride=4"],
    "lexicon_start_late": ["objective.recipe=lexicon", "objective.policy_start_step=5",
                           "objective.policy_lr_mult=2.0"],
    "whitespace_probe": [*_REF, "plugins=rltok_lab.variants", "objective.reward=whitespace_probe"],
    "unpacked": [*_REF, "model.pack_chunks=false"],
}


def corpus():
    """~20 kB of word salad from a fixed vocabulary, split 9:1."""
    from rltok.data.sources import Corpus

    rng = random.Random(0)
    words = ("the of and to in is was for on that with as by it from at this be are or an which "
             "def return self import class if else while None True False print value index data").split()
    text = []
    while sum(map(len, text)) < 20_000:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        text.append(line + (".\n" if rng.random() < 0.3 else ",    "))
    data = torch.frombuffer(bytearray("".join(text).encode()), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return Corpus(train=data[:cut], val=data[cut:], source="synthetic")


def state_digest(model: torch.nn.Module) -> dict:
    state = model.state_dict()
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    params = [p.detach().double() for p in model.parameters()]
    return {"param_sum": float(sum(p.sum() for p in params)),
            "param_sumsq": float(sum(p.square().sum() for p in params)),
            "sha256": sha.hexdigest()}


def run(case: str, out_dir) -> dict:
    from rltok.config import load_config
    from rltok.training.trainer import Trainer

    cfg = load_config("test", overrides=[
        f"train.out_dir={out_dir}", f"train.max_steps={STEPS}", "train.threads=1", "train.seed=0",
        "train.log_every=1", f"train.eval_every={STEPS}", "train.checkpoint_every=1000", *CASES[case]])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    trainer.peak_flops = 1e12  # skip the matmul timing: MFU is not pinned
    result = trainer.fit()
    hist = result.history
    assert [h["step"] for h in hist] == list(range(1, STEPS + 1))
    last = hist[-1]
    numbers = {"loss": [h["loss"] for h in hist], "rate": [h.get("rate") for h in hist],
               "val_bpb": last["val_bpb"], "val_rate": last.get("val_rate")}
    if "rate2" in last:
        numbers["rate2"] = [h["rate2"] for h in hist]
    return {**numbers, **state_digest(trainer.model)}


def machine() -> dict:
    """What bit-exact results depend on: the torch build, the instruction set its kernels use, and
    the processor model (the same instruction set on another vendor's cores rounds differently)."""
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "cpu_model": cpu_model()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    names = sys.argv[1:] or list(CASES)
    out = {"machine": machine(), "steps": STEPS, "cases": {}}
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            out["cases"][name] = run(name, d)
        print(name, out["cases"][name]["loss"][-1], flush=True)
    FIXTURE.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", FIXTURE)
