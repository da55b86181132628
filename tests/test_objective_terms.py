"""The objective is a list of terms: a new reward or rate control is one class and one registry
entry, defined here and trained with through BoundaryObjective without touching src/."""

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import rltok.objective
from rltok.config import RATES, REWARDS, RateSettings, load_config
from rltok.objective import build
from rltok.model.flops import run_cost
from rltok.objective.loss import BoundaryObjective, compute_loss
from rltok.objective.policy_gradient import masked_mean
from rltok.objective.rate import PriceTerm
from rltok.objective.rewards import Reward
from rltok.training.trainer import Trainer
from test_boundary_learning import corpus


class CutsCost(Reward):
    """Every boundary costs one nat of reward."""
    name = "cuts_cost"

    def __call__(self, ce_early, ce_final, b, targets):
        return -b.float()


@dataclass
class FlatTaxSettings(RateSettings):
    kind: str = "flat_tax"
    weight: float = 1.0  # nats per expected boundary


class FlatTax(PriceTerm):
    """A rate control that charges `weight` per expected boundary, whatever the target, and
    counts the steps it has seen (its own state)."""

    def __init__(self, settings):
        self.weight, self.steps = settings.weight, 0

    def __call__(self, stage):
        p = masked_mean(torch.sigmoid(stage.bd.logits.float()), stage.bd.free)
        return self.weight * p, {f"tax{stage.suffix}": p.detach()}

    def after_step(self, end):
        self.steps += 1

    def state_dict(self):
        return {"flat_tax_steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state.get("flat_tax_steps", 0)


@pytest.fixture
def toys():
    REWARDS.register(CutsCost.name, CutsCost)
    RATES.register("flat_tax", FlatTax, FlatTaxSettings)
    yield
    REWARDS.unregister(CutsCost.name)
    RATES.unregister("flat_tax")


def test_a_toy_reward_and_rate_control_train_through_the_objective(tmp_path, toys):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.threads=1", "model.chunker=rl",
                                         "objective.recipe=reference", "objective.reward=cuts_cost",
                                         "objective.rate=flat_tax", "objective.rate.weight=5"])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    steps = [trainer.train_step() for _ in range(6)]
    first, last = steps[0], steps[-1]
    for m in steps:
        assert m["reward"].item() == pytest.approx(-m["chunks_per_byte"].item(), abs=1e-6)  # the toy reward
        assert "tax" in m and "rate_loss" not in m  # the toy rate control, in place of the penalty
    assert last["tax"] < first["tax"]  # both push the rate down
    # the toy term owns its state: after_step reached it, and it travels with the objective's
    state = trainer.objective.state_dict()
    assert state["flat_tax_steps"] == 6
    again = BoundaryObjective(cfg, run_cost(cfg))
    again.load_state_dict(state)
    assert [t.steps for t in again.terms.all() if isinstance(t, FlatTax)] == [6]


def test_the_toy_reward_and_rate_control_compare_and_generate(tmp_path, toys):
    """The compare harness trains a method made of them at a FLOPs budget, and the model it trained
    generates: nothing in src/ had to learn their names."""
    from rltok.analysis.compare import method_slug, run_one
    from rltok.training.loading import load_checkpoint
    from conftest import corpus_folder

    data = corpus_folder(tmp_path)
    method = "rl_reference@objective.reward=cuts_cost,objective.rate=flat_tax,objective.rate.weight=5"
    row = run_one(method, 0, str(data), tmp_path / "cmp", budget_flops=1e9, preset="test", eval_split="test",
                  base=["train.threads=1"], max_eval_windows=2)
    assert row["bpb"] > 0 and row["budget_ratio"] == pytest.approx(1.0, abs=0.05)
    assert row["config"]["objective"]["rate"] == {"kind": "flat_tax", "compute_price": 0.0,
                                                  "cost_estimator": "exact", "weight": 5.0}
    model = load_checkpoint(tmp_path / "cmp" / f"{method_slug(method)}_s0")[0].eval()  # the run's folder
    assert len(model.generate(b"the ", 16, seed=0).output) == 16


@pytest.mark.parametrize("baseline", ["batch", "batch+value"])
def test_compute_loss_is_the_sum_of_its_terms(baseline):
    """With every policy term off but the estimator, the loss is the LM terms plus pg_weight times
    the estimator's surrogate (and with the critic VALUE_WEIGHT times its loss), added in that order."""
    from rltok.model.hourglass import HourglassLM
    from rltok.objective.score_function import VALUE_WEIGHT

    cfg = load_config("test", overrides=["model.chunker=rl", "objective.recipe=reference",
                                         f"objective.estimator.baseline={baseline}"])
    model = HourglassLM(cfg.model)
    x = torch.randint(0, 256, (4, 64))
    out = model(x, generator=torch.Generator().manual_seed(0))
    terms = build.terms_of_objective(cfg.objective, cfg.model.target_rate)
    loss, m = compute_loss(out, x.roll(-1, 1), terms)
    a = cfg.objective.alpha
    lm = (1 - a) * m["ce_final"] + a * m["ce_early"]
    want = lm + cfg.objective.pg_weight * m["pg_loss"] + cfg.objective.rate.weight * m["rate_loss"]
    if baseline == "batch+value":
        want = want + VALUE_WEIGHT * m["value_loss"]
        assert VALUE_WEIGHT == 0.1
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)


def test_the_objective_reads_no_config_outside_build_and_stays_short():
    src = Path(rltok.objective.__file__).parent
    lines = inspect.getsource(compute_loss).splitlines()
    assert len(lines) <= 30, len(lines)
    for path in src.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno < 80, f"{path.name}:{node.name}"
        if path.name not in ("build.py", "loss.py"):  # loss.py: the container's FLOPs calls take the config
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("objective", "model", "train"):
                    assert not (isinstance(node.value, ast.Name) and node.value.id == "cfg"), \
                        f"{path.name} reads cfg.{node.attr}"


def test_pg_weight_is_refused_where_no_term_reads_it():
    """The flips' normalised credits are not weighted by objective.pg_weight: under the lexicon recipe
    with a rate penalty nothing reads it, and setting it (say to 0, to switch learning off) would
    change nothing; where a closed-form chunk price or the score function reads it, it is taken."""
    from rltok.config import ConfigError
    from rltok.objective.rate import ClosedFormChunkPrice

    def built(*extra):
        cfg = load_config("test", overrides=["train.device=cpu", "objective.recipe=lexicon", *extra])
        return BoundaryObjective(cfg, run_cost(cfg))

    with pytest.raises(ConfigError, match=r"objective.pg_weight=0 changes nothing here.*policy_start_step"):
        built("objective.pg_weight=0")
    assert built().terms.policy.estimator.name == "flips"  # the default weight: nothing to refuse
    for price in ("objective.rate=lagrange", "objective.rate.compute_price=0.001"):
        terms = built(price, "objective.pg_weight=0.5").terms.all()
        assert [t.pg_weight for t in terms if isinstance(t, ClosedFormChunkPrice)] == [0.5]
    reference = built("objective.recipe=reference", "objective.pg_weight=0.5")
    assert reference.terms.policy.estimator.settings.pg_weight == 0.5
