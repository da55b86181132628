"""Built once, composed after: components are chosen by kind from registries, a new one is a class
and a registry entry (defined here, in the test file, without touching src/), and no code outside
the config layer compares a component's kind by name."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import corpus_folder
from rltok.config import CHUNKERS, REWARDS, Config, ConfigError, Section, load_config, load_plugin
from rltok.model.chunkers import Boundaries, Chunker

SRC = Path(__file__).resolve().parents[1] / "src" / "rltok"


# ---- a toy boundary rule: a chunk ends after every byte of a chosen class ---------------------

@dataclass
class VowelSettings(Section):
    kind: str = "vowel"
    letters: str = "aeiou"


class VowelChunker(Chunker):
    """A causal rule with a setting: a chunk ends after each of `letters`."""

    def __init__(self, letters: str):
        super().__init__()
        self.register_buffer("ends", torch.zeros(264, dtype=torch.bool), persistent=False)
        self.ends[list(letters.encode())] = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(settings.letters)

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        b = self.ends[idx] if b is None else b.bool()
        return Boundaries(b=b | forced, free=~forced)

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        b = self.ends[idx] if b is None else b.bool()
        return Boundaries(b=b | forced, free=~forced)


@pytest.fixture
def vowel_rule():
    CHUNKERS.register("vowel", VowelChunker, VowelSettings)
    yield
    CHUNKERS.unregister("vowel")


def test_a_toy_rule_trains_costs_compares_and_generates(vowel_rule, tmp_path):
    from rltok.analysis.compare import run_one
    from rltok.model.flops import run_cost
    from rltok.training.loading import load_checkpoint
    from rltok.training.trainer import Trainer

    data = corpus_folder(tmp_path)
    cfg = load_config("test", overrides=["model.chunker=vowel", "model.chunker.letters=aeo", f"data.train={data}",
                                         f"train.out_dir={tmp_path / 'run'}", "train.max_steps=4"])
    assert cfg.model.chunker.letters == "aeo"
    result = Trainer(cfg, quiet=True).fit()
    assert result.step == 4
    model, loaded, _, _ = load_checkpoint(result.run_dir)
    assert isinstance(model.chunker, VowelChunker) and loaded.model.chunker == cfg.model.chunker
    # cost: the same count as the built-in rule without a policy at the same rate
    assert run_cost(loaded).step_train_per_byte(0.3) == pytest.approx(
        run_cost(load_config("test", overrides=["model.chunker=uniform"])).step_train_per_byte(0.3))
    # generate: a causal rule decides one byte at a time
    gen = model.generate(b"the ", 24, temperature=1.0, seed=0)
    assert len(gen.output) == 24
    read = gen.prompt + gen.output
    cuts = [i for i, b in enumerate(gen.boundaries) if b and i > 0]
    assert cuts and all(read[i] in b"aeo" for i in cuts)  # the rule's own decisions, one byte at a time
    # compare: the harness trains it at a FLOPs budget beside a built-in rule
    rows = [run_one(m, 0, str(data), tmp_path / "cmp", budget_flops=1e9, preset="test", eval_split="test",
                    base=["train.threads=1"], max_eval_windows=2) for m in ("uniform", "uniform@model.chunker=vowel")]
    assert all(r["bpb"] > 0 for r in rows) and rows[1]["method"] == "uniform@model.chunker=vowel"
    assert rows[1]["budget_ratio"] == pytest.approx(1.0, abs=0.05)


def test_a_rule_of_another_kind_has_none_of_these_settings(vowel_rule):
    with pytest.raises(ConfigError, match="letters"):
        load_config("test", overrides=["model.chunker=fixed", "model.chunker.letters=x"])
    with pytest.raises(ConfigError, match="did you mean 'vowel'"):
        load_config("test", overrides=["model.chunker=vowl"])


def test_config_nests_components_and_round_trips():
    cfg = load_config("test", overrides=["model.chunker=fixed", "model.chunker.stride=3",
                                         "objective.estimator=flips", "objective.estimator.lexicon.weight=0.5",
                                         "objective.estimator.price=target", "objective.rate=lagrange"])
    d = cfg.to_dict()
    assert d["model"]["chunker"] == {"kind": "fixed", "stride": 3}
    assert d["objective"]["estimator"]["lexicon"]["weight"] == 0.5
    assert d["objective"]["estimator"]["price"]["kind"] == "target"
    assert d["objective"]["rate"]["kind"] == "lagrange"
    assert Config.from_dict(d).validate().to_dict() == d


def test_the_order_of_overrides_does_not_matter():
    a = load_config("test", overrides=["model.chunker.stride=3", "model.chunker=fixed"])
    b = load_config("test", overrides=["model.chunker=fixed", "model.chunker.stride=3"])
    assert a.model.chunker == b.model.chunker


def test_old_flat_keys_load_with_a_note_or_fail_naming_their_place():
    with pytest.warns(UserWarning, match="now model.chunker.window"):
        cfg = load_config("test", overrides=["model.policy_window=4"])
    assert cfg.model.chunker.window == 4
    with pytest.warns(UserWarning, match="ignored: it is now model.chunker.stride"):
        load_config("test", overrides=["model.fixed_stride=4"])  # the rl rule has no stride: as unused as before
    with pytest.raises(ConfigError, match="for kind 'rl'"):
        load_config("test", overrides=["model.chunker.stride=4"])  # a new key of another kind is a mistake
    load_plugin("rltok_lab.variants")  # the loss-slope price is the lab's
    old = {"model": {"chunker": "fixed", "fixed_stride": 7, "policy_window": 1},
           "objective": {"estimator": "flips", "flip_stride": 8, "lexicon_weight": 1.0, "flip_model_pass": False,
                         "flip_rate_control": True, "rate_price": "loss_slope", "gamma": 0.99,
                         "rate_control": "lagrange", "lagrange_lr": 0.3}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = Config.from_dict(old).validate()
    assert sum("older flat config layout" in str(w.message) for w in caught) == 1  # one line for the load
    assert cfg.model.chunker.stride == 7
    est = cfg.objective.estimator
    assert (est.kind, est.stride, est.lexicon.weight, est.model_pass, est.price.kind) == \
        ("flips", 8, 1.0, False, "loss_slope")
    assert cfg.objective.rate.kind == "lagrange" and cfg.objective.rate.lr == 0.3


def test_a_component_can_be_given_by_name_in_python():
    from rltok.config import ModelConfig, ObjectiveConfig

    assert ModelConfig(chunker="whitespace").chunker.kind == "whitespace"
    assert ObjectiveConfig(rate="none").rate.kind == "none"


# ---- no switchboard: nothing outside the config layer compares a component's kind by name -----

def component_names() -> set[str]:
    from rltok.config import CREDIT_PRICES, ESTIMATORS, FAMILIES, RATES

    return {n for r in (CHUNKERS, FAMILIES, ESTIMATORS, REWARDS, RATES, CREDIT_PRICES) for n in r.names()}


def kind_comparisons(text: str, names: set[str]) -> list[str]:
    """Lines that compare something with a component's name: `x == "rl"`, `x in ("flat", ...)`,
    `__class__.__name__`."""
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    literal = rf"""["']({alternatives})["']"""
    compared = [rf"(==|!=)\s*{literal}", rf"{literal}\s*(==|!=)", r"__class__\.__name__"]
    member = rf"\bin\s*[(\[{{][^)\]}}]*{literal}"  # `x in (...)`, not a loop's `for x in (...)`
    return [line.strip() for line in text.splitlines() if not line.strip().startswith("#") and (
        any(re.search(p, line) for p in compared) or (re.search(member, line) and not re.search(r"\bfor\b", line)))]


def test_no_kind_name_is_compared_outside_the_config_layer():
    names = component_names()
    found = {}
    for path in SRC.rglob("*.py"):
        if "config" in path.relative_to(SRC).parts:
            continue
        hits = kind_comparisons(path.read_text(), names)
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert not found, f"compare a component's kind by name (ask the component instead): {found}"


def test_the_kind_check_catches_what_it_should():
    names = {"rl", "flat", "lagrange"}
    assert kind_comparisons('if cfg.chunker == "rl":\n    x = 1', names)
    assert kind_comparisons("ok = m.arch in ('hourglass', 'flat')", names)
    assert kind_comparisons("if model.__class__.__name__ != 'HourglassLM':", names)
    assert not kind_comparisons('if kind == "error":', names)
    assert not kind_comparisons('for side in ("flat", "other"):', names)
