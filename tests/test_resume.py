"""Exact resume: a run stopped at step N and resumed matches the uninterrupted run bit for bit
on CPU (losses, metrics.jsonl, final weights, optimiser state); SIGINT/SIGTERM checkpoint and
stop cleanly; the run folder never mixes two trajectories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rltok.training.checkpoint import list_checkpoints
from rltok.training.loading import load_checkpoint
from rltok.config import ConfigError, load_config
from rltok.data.sources import Corpus
from rltok.training.trainer import TIMING_KEYS, Trainer, lr_at

TEXT = b"".join(b"%d the quick brown fox, %x lazy dogs; \xff\xfe binary \x00 bytes\n" % (i, i * 7) for i in range(600))


@pytest.fixture(scope="module")
def corpus():
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return Corpus(train=data[:cut].clone(), val=data[cut:].clone(), source="synthetic")


def make_cfg(out: Path, *extra: str):
    # dropout > 0 exercises the global torch RNG; a policy window > 1 the sequential sampler
    window = [] if any(e.startswith("model.chunker=") for e in extra) else ["model.chunker.window=3"]
    return load_config("test", overrides=[f"train.out_dir={out}", "train.max_steps=20", "train.device=cpu",
                                          "train.threads=1", "model.dropout=0.1", *window,
                                          "train.log_every=3", "train.checkpoint_every=10", *extra])


def trajectory(history: list[dict]) -> list[dict]:
    """Everything logged except wall-clock throughput."""
    return [{k: v for k, v in rec.items() if k not in TIMING_KEYS} for rec in history]


def assert_same_state(a: Trainer, b: Trainer):
    ma, mb = a.model.state_dict(), b.model.state_dict()
    assert ma.keys() == mb.keys()  # no buffer missing or extra on either side
    for name in ma:
        assert torch.equal(ma[name], mb[name]), name
    sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for kk in sa[k]:
            assert torch.equal(sa[k][kk], sb[k][kk]), (k, kk)
    assert torch.equal(a.sampler.gen.get_state(), b.sampler.gen.get_state())
    assert torch.equal(a.boundary_gen.get_state(), b.boundary_gen.get_state())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("full")
    trainer = Trainer(make_cfg(out), corpus=corpus, quiet=True)
    result = trainer.fit()
    return trainer, result, out


@pytest.mark.parametrize("stop", [7, 10])  # between logs/checkpoints, and on a checkpoint step
def test_resume_matches_uninterrupted_run_bit_for_bit(tmp_path, corpus, uninterrupted, stop):
    full, full_result, full_dir = uninterrupted
    first = Trainer(make_cfg(tmp_path), corpus=corpus, quiet=True)
    assert first.fit(stop_at=stop).step == stop
    assert list_checkpoints(tmp_path)[-1].name == f"step_{stop:07d}"
    resumed = Trainer(make_cfg(tmp_path), corpus=corpus, resume=True, quiet=True)
    assert resumed.step == stop
    result = resumed.fit()
    assert result.step == 20
    assert_same_state(full, resumed)
    assert trajectory(result.history) == trajectory(full_result.history)
    on_disk = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert trajectory(on_disk) == trajectory(full_result.history)
    assert result.val == full_result.val
    final_full, final_resumed = load_checkpoint(full_dir)[0], load_checkpoint(tmp_path)[0]
    for p, q in zip(final_full.parameters(), final_resumed.parameters()):
        assert torch.equal(p, q)


def test_resume_with_grad_accum_and_fixed_chunker(tmp_path, corpus):
    extra = ("train.grad_accum=2", "model.chunker=fixed", "train.max_steps=8")
    full = Trainer(make_cfg(tmp_path / "a", *extra), corpus=corpus, quiet=True)
    full_result = full.fit()
    Trainer(make_cfg(tmp_path / "b", *extra), corpus=corpus, quiet=True).fit(stop_at=5)
    resumed = Trainer(make_cfg(tmp_path / "b", *extra), corpus=corpus, resume=True, quiet=True)
    assert trajectory(resumed.fit().history) == trajectory(full_result.history)
    assert_same_state(full, resumed)


def test_crash_after_checkpoint_resumes_with_one_consistent_metrics_file(tmp_path, corpus, uninterrupted):
    """The process dies after step 15 (metrics logged up to step 15, plus a torn line), with the
    last checkpoint at step 10: the resumed run rewrites steps 11-15 instead of duplicating them."""
    _, full_result, _ = uninterrupted
    Trainer(make_cfg(tmp_path), corpus=corpus, quiet=True).fit(stop_at=15)
    for c in list_checkpoints(tmp_path):
        if c.name == "step_0000015":  # as if killed before this one was written
            os.rename(c, c.with_name(".tmp_step_0000015_999999999"))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"loss": 1.0, "st')
    # a record every log_every steps and at every evaluation (eval_every=10)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()[:-1]] == [3, 6, 9,
                                                                                                          10, 12, 15]
    resumed = Trainer(make_cfg(tmp_path), corpus=corpus, resume=True, quiet=True)
    assert resumed.step == 10
    result = resumed.fit()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [3, 6, 9, 10, 12, 15, 18, 20]
    assert trajectory(json.loads(x) for x in lines) == trajectory(full_result.history) == trajectory(result.history)
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir())  # stale tmp cleaned


def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path, corpus, uninterrupted):
    full, full_result, _ = uninterrupted
    Trainer(make_cfg(tmp_path), corpus=corpus, quiet=True).fit(stop_at=15)
    weights = tmp_path / "checkpoints" / "step_0000015" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.warns(UserWarning, match="falling back"):
        resumed = Trainer(make_cfg(tmp_path), corpus=corpus, resume=True, quiet=True)
    assert resumed.step == 10
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[0].startswith("corrupt_step_0000015") and names[1:] == ["step_0000010"]
    assert trajectory(resumed.fit().history) == trajectory(full_result.history)
    assert_same_state(full, resumed)


def _as_old_format(ckpt: Path, names: list[str]) -> None:
    """Turn a checkpoint into the format rltok wrote before the shared one: optimiser state keyed
    by integer ids (the optimiser's parameter order), config.json without the metadata keys, no
    model card; the manifest re-written to match."""
    import hashlib

    state = torch.load(ckpt / "trainer.pt", weights_only=False)
    opt = state["optimizer"]
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in opt["param_groups"]]
    state["optimizer"] = {"state": {index[n]: v for n, v in opt["state"].items()}, "param_groups": groups}
    torch.save(state, ckpt / "trainer.pt")
    full = json.loads((ckpt / "config.json").read_text())
    sections = ("model", "objective", "data", "train")
    (ckpt / "config.json").write_text(json.dumps({k: v for k, v in full.items() if k in sections}))
    (ckpt / "README.md").unlink()
    files = sorted(p.name for p in ckpt.iterdir() if p.name != "manifest.json")
    (ckpt / "manifest.json").write_text(json.dumps(
        {"step": state["step"], "files": {n: hashlib.sha256((ckpt / n).read_bytes()).hexdigest() for n in files}}))


def test_optimizer_state_is_keyed_by_name_and_old_integer_keyed_checkpoints_resume_exactly(tmp_path, corpus,
                                                                                          uninterrupted):
    full, full_result, _ = uninterrupted
    first = Trainer(make_cfg(tmp_path), corpus=corpus, quiet=True)
    first.fit(stop_at=10)
    ckpt = list_checkpoints(tmp_path)[-1]
    opt = torch.load(ckpt / "trainer.pt", weights_only=False)["optimizer"]
    by_id = {id(p): n for n, p in first.model.named_parameters()}
    names = [by_id[id(p)] for g in first.opt.param_groups for p in g["params"]]  # the optimiser's order
    assert [n for g in opt["param_groups"] for n in g["params"]] == names
    assert set(opt["state"]) <= set(names) and "head.weight" in opt["state"]
    assert torch.equal(opt["state"]["head.weight"]["exp_avg"], first.opt.state[first.model.head.weight]["exp_avg"])
    _as_old_format(ckpt, names)
    assert load_checkpoint(tmp_path)[3] == ckpt  # evaluates as before
    resumed = Trainer(make_cfg(tmp_path), corpus=corpus, resume=True, quiet=True)
    assert resumed.step == 10
    assert trajectory(resumed.fit().history) == trajectory(full_result.history)
    assert_same_state(full, resumed)


def test_optimizer_state_of_other_parameter_groups_is_refused_clearly(tmp_path, corpus):
    from rltok.training.checkpoint import CheckpointError

    Trainer(make_cfg(tmp_path, "train.max_steps=2"), corpus=corpus, quiet=True).fit()
    with pytest.raises(CheckpointError, match="does not match the model's optimiser .*2 parameter groups, "
                                              "the optimiser 4"):
        Trainer(make_cfg(tmp_path, "train.max_steps=4", "objective.policy_lr_mult=2.0"), corpus=corpus, resume=True,
                quiet=True)


def test_fresh_run_into_an_existing_run_folder_is_refused(tmp_path, corpus):
    Trainer(make_cfg(tmp_path, "train.max_steps=2"), corpus=corpus, quiet=True).fit()
    with pytest.raises(ConfigError, match="already holds a run .*--resume"):
        Trainer(make_cfg(tmp_path, "train.max_steps=2"), corpus=corpus, quiet=True)


def test_resume_with_a_different_model_is_refused(tmp_path, corpus):
    Trainer(make_cfg(tmp_path, "train.max_steps=2"), corpus=corpus, quiet=True).fit()
    with pytest.raises(ConfigError, match="model config differs .*d_chunk 64 -> 128"):
        Trainer(make_cfg(tmp_path, "model.d_chunk=128"), corpus=corpus, resume=True, quiet=True)


def test_resume_without_checkpoint_starts_fresh_and_finished_run_stays_put(tmp_path, corpus):
    trainer = Trainer(make_cfg(tmp_path, "train.max_steps=4"), corpus=corpus, resume=True, quiet=True)
    assert trainer.step == 0 and trainer.fit().step == 4
    again = Trainer(make_cfg(tmp_path, "train.max_steps=4"), corpus=corpus, resume=True, quiet=True)
    result = again.fit()
    assert result.step == 4 and [r["step"] for r in result.history] == [3, 4]
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_0000004"]


def test_lr_schedule_is_a_function_of_the_step():
    """Warm-up, then cosine decay: the value at each step is fixed by the step alone, so a resumed
    run follows the uninterrupted one's schedule."""
    tc = load_config("test", overrides=["train.max_steps=200", "train.warmup_steps=20"]).train
    assert lr_at(0, tc) == tc.lr / tc.warmup_steps and lr_at(tc.warmup_steps - 1, tc) == tc.lr
    assert lr_at(tc.warmup_steps, tc) == tc.lr and lr_at(tc.max_steps, tc) == pytest.approx(tc.lr * tc.min_lr_ratio)
    middle = tc.warmup_steps + (tc.max_steps - tc.warmup_steps) // 2  # cosine: half-way down at half the decay
    assert lr_at(middle, tc) == pytest.approx(tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) / 2))
    quarter = tc.warmup_steps + (tc.max_steps - tc.warmup_steps) // 4  # and above the straight line before it
    assert lr_at(quarter, tc) == pytest.approx(tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * (2 + 2 ** 0.5) / 4))
    decay = [lr_at(s, tc) for s in range(tc.warmup_steps, tc.max_steps + 1)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finishes_the_step_checkpoints_and_stops(tmp_path, corpus, uninterrupted, monkeypatch, sig):
    full, full_result, _ = uninterrupted
    trainer = Trainer(make_cfg(tmp_path), corpus=corpus, quiet=True)
    real_step = trainer.train_step

    def step_then_signal():
        out = real_step()
        if trainer.step == 4:  # arrives in the middle of step 5
            os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
    before = signal.getsignal(sig)
    assert trainer.fit().step == 5
    assert signal.getsignal(sig) is before  # handlers restored
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_0000005"]
    resumed = Trainer(make_cfg(tmp_path), corpus=corpus, resume=True, quiet=True)
    assert trajectory(resumed.fit().history) == trajectory(full_result.history)
    assert_same_state(full, resumed)


def test_sigterm_to_the_cli_checkpoints_and_resume_continues(tmp_path):
    """End to end: `rltok train` gets SIGTERM mid-run, exits 0 with a checkpoint; `--resume`
    runs on to max_steps, and metrics.jsonl holds each logged step once."""
    data = tmp_path / "data.txt"
    data.write_bytes(TEXT)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rltok.cli", "train", "--preset", "test", "--data", str(data), "--out", str(out),
           "train.max_steps=60", "train.log_every=1", "train.threads=1", "train.device=cpu", "train.eval_every=1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "received SIGTERM" in stderr and "interrupted: saved" in stderr
    stopped = int(list_checkpoints(out)[-1].name.removeprefix("step_"))
    assert 2 <= stopped < 60
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {stopped}" in resumed.stderr
    assert json.loads(resumed.stdout)["step"] == 60
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 61))


def test_warmup_frac_is_a_share_of_the_planned_steps(tmp_path, corpus):
    """train.warmup_frac sets the warm-up from the run's length: the trainer resolves it from
    max_steps, so two runs of different lengths warm up over the same share."""
    for steps in (40, 400):
        cfg = make_cfg(tmp_path / str(steps), f"train.max_steps={steps}", "train.warmup_frac=0.05")
        Trainer(cfg, corpus=corpus, quiet=True)
        assert cfg.train.warmup_steps == round(0.05 * steps)
    assert load_config("test").train.warmup_for(1000) == load_config("test").train.warmup_steps  # off: as given
    with pytest.raises(ConfigError, match="warmup_frac"):
        load_config("test", overrides=["train.warmup_frac=1.5"])
