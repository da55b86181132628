"""Following the config from the build enters no file more than twice.

The measure. While an entry point runs (training's `build`, the Trainer, a budget run of
`rltok compare`), a profile hook records every call to a function in rltok's source that receives
a configuration object among its arguments: an instance of a class defined in rltok.config (the
Config, one of its sections, a rule's or estimator's settings), `self` included. That is where
the config travels. The config's own package (rltok/config/) is where it lives, not a place it is
taken to, and is left out. The files of those calls in order, consecutive calls in one file merged,
are the path's stays; the number of stays in a file is how often the path enters it. A file
entered three times means the reader following the config goes back and forth between it and
others: the cost path once entered model/flops.py five times (costing the config on its own
beside the built model). Calls that receive only numbers or built objects are not followed.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

import rltok
from rltok.config import load_config

sys.path.insert(0, str(Path(__file__).parent))
from behaviour_cases import corpus  # noqa: E402

SRC = Path(rltok.__file__).resolve().parent
CONFIG_PACKAGE = SRC / "config"
MAX_ENTRIES = 2


def is_config(obj) -> bool:
    return type(obj).__module__.startswith("rltok.config")


def stays(entry) -> list[str]:
    """The files (relative to src/rltok) the config is followed through while `entry()` runs."""
    seq: list[str] = []

    def profile(frame, event, _arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if SRC not in path.parents or CONFIG_PACKAGE in path.parents:
            return
        code = frame.f_code
        args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(is_config(frame.f_locals.get(name)) for name in args):
            return
        room = path.relative_to(SRC).as_posix()
        if not seq or seq[-1] != room:
            seq.append(room)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        entry()
    finally:
        sys.setprofile(old)
    return seq


def assert_few_entries(seq: list[str]) -> Counter:
    entries = Counter(seq)
    assert seq, "the tracer followed nothing: the measure is broken"
    again = {room: n for room, n in entries.items() if n > MAX_ENTRIES}
    assert not again, (f"{len(entries)} files in {len(seq)} stays; entered more than {MAX_ENTRIES} times: {again}\n"
                       + " > ".join(seq))
    return entries


def config(*overrides: str, out_dir=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # older spellings of the objective's keys
        return load_config("test", overrides=[*overrides, *([f"train.out_dir={out_dir}"] if out_dir else [])])


_REF = ["model.chunker=rl", "objective.recipe=reference"]
BUILD_CASES = {
    "lexicon": [],
    "compute_price": [*_REF, "objective.rate.kind=none", "objective.rate.compute_price=0.5"],  # asks chunk_cost
    "two_stage": [*_REF, "model.stages=2"],
    "bpe": ["model.chunker=bpe"],
    "flat_ngram": ["model.arch=flat", "model.ngram_vocab=512"],
    "bpe_token": ["model.arch=bpe_token"],
}


@pytest.mark.parametrize("case", list(BUILD_CASES))
def test_build_follows_the_config_through_each_file_at_most_twice(case):
    from rltok.training.build import build

    cfg, data = config(*BUILD_CASES[case]), corpus()
    entries = assert_few_entries(stays(lambda: build(cfg, data)))
    # the cost is asked of the built model once, not worked out again from the config
    assert entries["model/flops.py"] == 1


def test_the_trainer_follows_the_config_through_each_file_at_most_twice(tmp_path):
    from rltok.training.trainer import Trainer

    cfg, data = config(*_REF, out_dir=tmp_path), corpus()
    assert_few_entries(stays(lambda: Trainer(cfg, corpus=data, quiet=True)))


@pytest.mark.parametrize("method", ["rl", "bpe_token"])
def test_a_budget_run_plans_and_builds_through_each_file_at_most_twice(method, tmp_path, monkeypatch):
    """compare plans the budget from the model's cost, then builds the trainer once: the config
    passes model/flops.py once (the plan and the trainer share the cost)."""
    from rltok.analysis import compare
    from rltok.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "fit", lambda self, stop_at=None: None)  # the build, not the training
    c = corpus()
    data = tmp_path / "salad.txt"
    data.write_bytes(bytes(c.train.numpy()) + bytes(c.val.numpy()))
    cfg = compare.method_config(method, ["train.threads=1"], str(data), tmp_path / "run", 0, "test")
    done = {}
    entries = assert_few_entries(stays(lambda: done.setdefault("t", compare._train_to_budget(cfg, 1e9))))
    assert entries["model/flops.py"] == 1
    trainer = done["t"].trainer
    assert trainer.cfg is done["t"].plan.config and trainer.cost is trainer.objective.cost
    trainer.lock.release()


def test_sizing_a_reference_follows_the_config_through_each_file_at_most_twice(tmp_path):
    from rltok.analysis import compare

    assert_few_entries(stays(lambda: compare.method_config("flat", [], "x", tmp_path, 0, "test")))
