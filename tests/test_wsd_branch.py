"""The "wsd" learning-rate schedule (warm-up, constant, linear cool-down) and branching: a run
keeps its state from just before its cool-down, and a run to a larger budget that goes on from
there ends with the same weights, bit for bit, as a run trained to that budget from scratch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import corpus_folder
from rltok.analysis.compare import run_one
from rltok.config import ConfigError, load_config
from rltok.data.sources import Corpus
from rltok.training import run_folder
from rltok.training.checkpoint import list_checkpoints, read_trainer_state
from rltok.training.loading import load_checkpoint
from rltok.training.trainer import Trainer, cooldown_left, lr_at

TEXT = b"".join(b"%d the quick brown fox, %x lazy dogs; binary bytes\n" % (i, i * 7) for i in range(600))
WSD = ["train.lr_schedule=wsd", "train.warmup_steps=3", "train.warmup_frac=0", "train.device=cpu", "train.threads=1"]


def test_wsd_is_warm_up_then_constant_then_a_linear_cool_down():
    tc = load_config("test", overrides=["train.lr_schedule=wsd", "train.cooldown_frac=0.25", "train.max_steps=100",
                                        "train.warmup_steps=10"]).train
    lrs = [lr_at(s, tc) for s in range(101)]
    assert lrs[:10] == [tc.lr * (s + 1) / 10 for s in range(10)]  # the warm-up, as the cosine's
    assert set(lrs[10:76]) == {tc.lr}  # constant until the last quarter of the steps
    assert lrs[76] < tc.lr and lrs[100] == pytest.approx(tc.lr * tc.min_lr_ratio)
    assert lrs[88] == pytest.approx(tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 12 / 25))  # linear
    assert all(a >= b for a, b in zip(lrs[75:], lrs[76:]))
    # under a budget the share of it spent decides, as for the cosine
    assert lr_at(50, tc, progress=0.7) == tc.lr and lr_at(50, tc, progress=0.88) == pytest.approx(lrs[88])
    assert cooldown_left(50, tc, 0.75) is None and cooldown_left(50, tc, 0.8) == pytest.approx(0.8)
    assert cooldown_left(5, tc, 0.9) is None  # the warm-up comes first
    cosine = load_config("test").train
    assert cosine.lr_schedule == "cosine" and cooldown_left(50, cosine, 0.99) is None


@pytest.mark.parametrize("override, match", [
    ("train.lr_schedule=linear", "train.lr_schedule must be cosine or wsd"),
    ("train.cooldown_frac=0", r"train.cooldown_frac must be in \(0, 1\]"),
    ("train.cooldown_frac=1.5", r"train.cooldown_frac must be in \(0, 1\]"),
    ("train.cooldown_fraction=0.3", "cooldown_fraction"),
])
def test_bad_schedule_keys_are_one_clear_error(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("test", overrides=[override])


@pytest.fixture(scope="module")
def corpus():
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return Corpus(train=data[:cut].clone(), val=data[cut:].clone(), source="synthetic")


def budget_cfg(out: Path, budget: float, *extra: str):
    return load_config("test", overrides=[f"train.out_dir={out}", f"train.flops_budget={budget}", "train.max_steps=400",
                                          "train.log_every=1", "train.checkpoint_every=2", "train.keep_checkpoints=1",
                                          *WSD, *extra])


def test_the_state_before_the_cool_down_is_kept_apart_from_the_rotating_checkpoints(tmp_path, corpus, capsys):
    cfg = budget_cfg(tmp_path, 1.5e9)
    trainer = Trainer(cfg, corpus=corpus)
    history = trainer.fit().history
    kept = list_checkpoints(run_folder.branch_root(tmp_path))
    assert len(kept) == 1 and len(list_checkpoints(tmp_path)) == 1  # keep_checkpoints=1 left it alone
    step = int(kept[0].name.removeprefix("step_"))
    lrs = {r["step"]: r["lr"] for r in history}  # record k: the rate step k trained at
    assert lrs[step] == cfg.train.lr > lrs[step + 1]  # the state before the cool-down's first step
    assert all(lrs[k] == cfg.train.lr for k in range(cfg.train.warmup_steps, step + 1))
    state = read_trainer_state(kept[0])
    assert state["step"] == step and state["branch_point"] is True
    assert f"the cool-down begins; the state before it is kept in {kept[0]}" in capsys.readouterr().err
    # a cosine run keeps none
    Trainer(budget_cfg(tmp_path / "cos", 1.5e9, "train.lr_schedule=cosine"), corpus=corpus, quiet=True).fit()
    assert not run_folder.branch_root(tmp_path / "cos").exists()


def weights(run: Path) -> list[torch.Tensor]:
    return list(load_checkpoint(run)[0].state_dict().values())


@pytest.mark.parametrize("method", ["flat", "rl"])  # a flat model; a hierarchy with learned cuts
def test_a_branched_run_ends_bit_identical_to_a_run_from_scratch(tmp_path, method):
    data = str(corpus_folder(tmp_path, "salad"))
    small, large = 1.5e9, 3e9

    def run(name, budget, **kw):
        return run_one(method, 0, data, tmp_path / name, budget, WSD, "test", "test", 2, **kw)

    first = run("small", small)
    scratch = run("scratch", large)
    branched = run("branched", large, branch_from=tmp_path / "small" / f"{method}_s0")
    assert branched["bpb"] == scratch["bpb"] and branched["steps"] == scratch["steps"]
    for p, q in zip(weights(tmp_path / "scratch" / f"{method}_s0"), weights(tmp_path / "branched" / f"{method}_s0")):
        assert torch.equal(p, q)
    assert branched["train_flops"] == scratch["train_flops"]
    assert first["train_flops"] * 0.5 < branched["train_flops"] - branched["own_flops"] < first["train_flops"]
    assert "branch_checkpoint" not in scratch and Path(branched["branch_checkpoint"]).parent.parent.name == "branch"
    # the branched run's history is its whole trajectory: the smaller run's records up to the branch first
    steps = [r["step"] for r in map(json.loads, (tmp_path / "branched" / f"{method}_s0" / "metrics.jsonl")
                                    .read_text().splitlines())]
    at = int(Path(branched["branch_checkpoint"]).name.removeprefix("step_"))
    assert steps == sorted(steps) and steps[0] < at < steps[-1] == scratch["steps"]


def test_branching_is_refused_where_it_would_not_end_as_a_run_from_scratch(tmp_path):
    data = str(corpus_folder(tmp_path, "salad"))
    run_one("flat", 0, data, tmp_path / "small", 1.5e9, WSD, "test", "test", 2)
    parent = tmp_path / "small" / "flat_s0"

    def branch(name, budget=3e9, base=WSD, **kw):
        return run_one("flat", 0, data, tmp_path / name, budget, base, "test", "test", 2, branch_from=parent, **kw)

    with pytest.raises(ConfigError, match="budget may only grow"):
        branch("shrink", budget=1e9)
    with pytest.raises(ConfigError, match="warm-up differs"):
        branch("warm", base=[*WSD, "train.warmup_steps=4"])
    with pytest.raises(ConfigError, match="warm-up differs"):  # a warm-up that follows the budget
        branch("frac", base=[*WSD, "train.warmup_frac=0.2"])
    with pytest.raises(ConfigError, match=r"train.lr \(0.002 -> 0.001\)"):
        branch("lr", base=[*WSD, "train.lr=1e-3"])
    with pytest.raises(ConfigError, match="lr_schedule=wsd"):
        branch("cosine", base=[*WSD, "train.lr_schedule=cosine"])
    for name in ("shrink", "warm", "frac", "lr", "cosine"):  # each refused before it trained, leaving nothing
        assert not list_checkpoints(tmp_path / name / "flat_s0")
    with pytest.raises(ConfigError, match="holds no branch checkpoint"):
        run_one("flat", 0, data, tmp_path / "x", 3e9, WSD, "test", "test", 2, branch_from=tmp_path)
    # a checkpoint taken inside the cool-down (the run's last) cannot serve a larger budget
    last = list_checkpoints(parent)[-1]
    with pytest.raises(ConfigError, match="inside its run's cool-down"):
        run_one("flat", 0, data, tmp_path / "late", 3e9, WSD, "test", "test", 2, branch_from=last)
    # the warm-up given as a share of a fixed budget's steps is the same at every budget
    rec = run_one("flat", 0, data, tmp_path / "frac_small", 1.5e9, [*WSD, "train.warmup_frac=0.2"], "test", "test", 2,
                  warmup_at=1.5e9)
    assert rec["config"]["train"]["warmup_steps"] == 3  # 0.2 x the 14 steps 1.5e9 plans
    rec = run_one("flat", 0, data, tmp_path / "frac_large", 3e9, [*WSD, "train.warmup_frac=0.2"], "test", "test", 2,
                  warmup_at=1.5e9, branch_from=tmp_path / "frac_small" / "flat_s0")
    assert rec["config"]["train"]["warmup_steps"] == 3 and rec["own_flops"] < rec["train_flops"]


def test_a_tokenizer_phase_refuses_branching(tmp_path):
    saved = load_config("test", overrides=[*WSD, "train.flops_budget=1e9", "model.chunker=uniform"])
    state = {"step": 1, "branch_point": True, "objective": {"flops_spent": 1.0}}
    assert run_folder.branch_refusal(saved, state, saved) is None
    phased = load_config("test", overrides=[*WSD, "train.flops_budget=1e9", "model.chunker=uniform",
                                            "objective.tokenizer_phase=0.1"])
    assert "tokenizer_phase" in run_folder.branch_refusal(phased, state, phased)


def test_a_resume_may_grow_the_budget_only_before_the_cool_down(tmp_path, corpus):
    cfg = budget_cfg(tmp_path, 1.5e9, "train.keep_checkpoints=0")
    Trainer(cfg, corpus=corpus, quiet=True).fit()
    saved = run_folder.saved_config(tmp_path)
    with pytest.raises(ConfigError, match="flops_budget may grow only when .*inside its run's cool-down.*branch"):
        run_folder.resume_config(tmp_path, saved, None, None, ["train.flops_budget=3e9"])
    # the run folder's newest checkpoint taken before the cool-down: the budget may grow
    early = tmp_path / "early"
    Trainer(budget_cfg(early, 1.5e9), corpus=corpus, quiet=True).fit(stop_at=4)
    grown = run_folder.resume_config(early, run_folder.saved_config(early), None, None, ["train.flops_budget=3e9"])
    assert grown.train.flops_budget == 3e9
    with pytest.raises(ConfigError, match="train.flops_budget"):  # a cosine run's budget stays
        cos = tmp_path / "cos"
        Trainer(budget_cfg(cos, 1.5e9, "train.lr_schedule=cosine"), corpus=corpus, quiet=True).fit(stop_at=4)
        run_folder.resume_config(cos, run_folder.saved_config(cos), None, None, ["train.flops_budget=3e9"])


def test_a_compare_rerun_reuses_a_record_only_from_the_same_sweep(tmp_path, monkeypatch):
    """A rerun skips finished runs; one with other data, budget or settings into the same --out
    is refused, naming what differs, instead of tabulating the old runs under the new command."""
    import json

    from rltok.analysis import compare

    data = str(corpus_folder(tmp_path, "salad"))
    out = tmp_path / "cmp"
    out.mkdir()
    cfg = compare.method_config("uniform", [], data, out / "runs" / "uniform_s0", 0, "test")
    record = {"method": "uniform", "seed": 0, "data": data, "split": "test", "budget_flops": 1e9, "eval_context": 1,
              "bpb": 3.0, "config": json.loads(json.dumps(cfg.to_dict()))}
    (out / "uniform_s0.json").write_text(json.dumps(record))
    monkeypatch.setattr(compare, "run_one", lambda *a, **k: pytest.fail("a finished run was trained again"))
    sweep = dict(methods=["uniform"], seeds=[0], out=out, base=[], preset="test", log=lambda *_: None)
    assert compare.run_sweep(data, budget_flops=1e9, **sweep)[0]["bpb"] == 3.0
    with pytest.raises(ConfigError, match=r"budget_flops \(1000000000.0 -> 2000000000.0\)"):
        compare.run_sweep(data, budget_flops=2e9, **sweep)
    with pytest.raises(ConfigError, match="model.d_byte"):
        compare.run_sweep(data, budget_flops=1e9, **{**sweep, "base": ["model.d_byte=48"]})
