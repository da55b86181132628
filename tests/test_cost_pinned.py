"""Every FLOPs number, step count and budget of the cost path, pinned to the last bit.

The scaling study's records were planned and charged with these numbers: the cost of a step of
each model family (every boundary rule, two stages, K segmentations, the vocabulary pieces, the
flat and BPE-token references), the comparison harness' matched flat depth, budget per reference
byte and budget plans (steps, warm-up, cadence), the objective's planned compute and chunk
price, and the size ladders. The values were recorded from the code before costs came only from
built models (when rltok.model.flops still costed configs on its own), by running these same
computations there; the refactor keeps every one of them equal, not just close.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from rltok.analysis import compare
from rltok.config import load_config
from rltok.model import sizing
from rltok.model.flops import run_cost

sys.path.insert(0, str(Path(__file__).parent))
from behaviour_cases import corpus  # noqa: E402

_REF = ["model.chunker=rl", "objective.recipe=reference"]
COST_CASES = {
    "lexicon": [],
    "rl_reference": _REF,
    "two_stage": [*_REF, "model.stages=2"],
    "hnet": ["model.chunker=hnet"],
    "gumbel": ["model.chunker=gumbel"],
    "entropy": ["model.chunker=entropy"],
    "whitespace": ["model.chunker=whitespace"],
    "bpe": ["model.chunker=bpe"],
    "fixed": ["model.chunker=fixed"],
    "uniform": ["model.chunker=uniform"],
    "rl_group4_value": [*_REF, "objective.estimator.baseline=group+value", "objective.group_size=4"],
    "ngram_cvocab": ["model.ngram_vocab=512", "model.chunk_vocab=256"],
    "flips": ["objective.estimator=flips"],
    "unwindowed": [*_REF, "model.window=128"],
    "flat": ["model.arch=flat"],
    "flat_ngram_window": ["model.arch=flat", "model.ngram_vocab=512", "model.flat_window=16"],
    "bpe_token": ["model.arch=bpe_token", "model.bpe_vocab=300"],
}
COMPARE_BASES = [("test", []), ("test", ["model.window=128"]), ("small", []), ("tiny", []),
                 ("small", ["model.d_chunk=256", "model.n_heads_chunk=4"]),
                 ("test", ["model.main_layers=12", "model.d_byte=64", "model.encoder_layers=3",
                           "model.decoder_layers=3"]),
                 ("small", ["model.main_layers=10", "model.window=512", "train.seq_len=1024"])]
# (method, base overrides, budget, warmup_at)
PLAN_CASES = [("rl", [], 1e9, None), ("bpe", [], 1e9, None), ("whitespace", [], 3e9, None), ("flat", [], 1e9, None),
              ("bpe_token", ["model.bpe_vocab=300"], 1e9, None), ("rl_group4", [], 2e9, None),
              ("uniform", ["train.warmup_frac=0.1"], 1e9, 5e8),
              ("rl", ["train.lr_schedule=wsd", "train.warmup_frac=0", "train.warmup_steps=7"], 4e9, 1e9),
              ("fixed", ["train.lr_schedule=wsd", "train.warmup_frac=0.05"], 4e9, None)]


def config(overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # older spellings of the objective's keys
        return load_config("test", overrides=overrides)


def cost_numbers(cost, cfg) -> dict:
    r2 = 0.4 if cfg.model.stages == 2 else None
    out = {"forward": cost.forward_per_byte(), "forward_0.3": cost.forward_per_byte(0.3, r2),
           "forward_kernel_0.3": cost.forward_per_byte(0.3, r2, attention="kernel"),
           "step_0.3": cost.step_train_per_byte(0.3, r2),
           "step_cf_0.3": cost.step_train_per_byte(0.3, r2, counterfactual=True),
           "step_seq32": cost.at(32).step_train_per_byte()}
    if cfg.model.arch == "hourglass":
        out.update(tokenizer_phase=cost.tokenizer_phase_per_byte(), chunk_cost=cost.chunk_cost(),
                   slope=cost.cost_slope(0.25))
    return out


def vocab(cfg) -> int:
    return 300 if cfg.model.arch == "bpe_token" else 264

# recorded from the code before the change (see the module's docstring)
_SAME_AS_BPE = {'chunk_cost': (106624.0, 16384.00000000163),
 'forward': 108212.48000000001,
 'forward_0.3': 119284.48,
 'forward_kernel_0.3': 124559.36,
 'slope': 0.973550928531236,
 'step_0.3': 357853.44,
 'step_cf_0.3': 433857.92,
 'step_seq32': 322705.92,
 'tokenizer_phase': 129840.0}  # bpe, entropy, fixed, uniform, whitespace: the same cost
_SAME_AS_FLIPS = {'chunk_cost': (106624.0, 16384.00000000163),
 'forward': 108276.48000000001,
 'forward_0.3': 119348.48,
 'forward_kernel_0.3': 124623.36,
 'slope': 0.9730033745781813,
 'step_0.3': 358045.44,
 'step_cf_0.3': 434113.92,
 'step_seq32': 322897.92,
 'tokenizer_phase': 130032.0}  # flips, lexicon, rl_reference: the same cost
COSTS = {
    'bpe': _SAME_AS_BPE,
    'bpe_token': {'forward': 127641.6,
     'forward_0.3': 193075.19999999998,
     'forward_kernel_0.3': 197222.4,
     'step_0.3': 579225.6,
     'step_cf_0.3': 772300.7999999999,
     'step_seq32': 380160.0},
    'entropy': _SAME_AS_BPE,
    'fixed': _SAME_AS_BPE,
    'flat': {'forward': 673536.0,
     'forward_0.3': 673536.0,
     'forward_kernel_0.3': 721920.0,
     'step_0.3': 2020608.0,
     'step_cf_0.3': 2694144.0,
     'step_seq32': 1946880.0},
    'flat_ngram_window': {'forward': 645568.0,
     'forward_0.3': 645568.0,
     'forward_kernel_0.3': 673024.0,
     'step_0.3': 1936704.0,
     'step_cf_0.3': 2582272.0,
     'step_seq32': 1928064.0},
    'flips': _SAME_AS_FLIPS,
    'gumbel': {'chunk_cost': (106624.0, 16384.00000000163),
     'forward': 110324.48000000001,
     'forward_0.3': 121396.48,
     'forward_kernel_0.3': 126671.36,
     'slope': 0.9558011049723792,
     'step_0.3': 364189.44,
     'step_cf_0.3': 442305.92,
     'step_seq32': 329041.92,
     'tokenizer_phase': 136176.0},
    'hnet': {'chunk_cost': (106624.0, 24576.000000004366),
     'forward': 112472.32,
     'forward_0.3': 123749.12,
     'forward_kernel_0.3': 129024.0,
     'slope': 0.9550135501355106,
     'step_0.3': 371247.36,
     'step_cf_0.3': 451716.48,
     'step_seq32': 335239.68,
     'tokenizer_phase': 142128.0},
    'lexicon': _SAME_AS_FLIPS,
    'ngram_cvocab': {'chunk_cost': (106624.0, 16384.00000000163),
     'forward': 108404.48000000001,
     'forward_0.3': 119476.48,
     'forward_kernel_0.3': 124751.36,
     'slope': 0.9719101123595542,
     'step_0.3': 358429.44,
     'step_cf_0.3': 434625.92,
     'step_seq32': 323281.92,
     'tokenizer_phase': 130416.0},
    'rl_group4_value': {'chunk_cost': (106624.0, 16384.00000000163),
     'forward': 311969.92000000004,
     'forward_0.3': 356257.92,
     'forward_kernel_0.3': 370493.44,
     'slope': 0.33146524883843587,
     'step_0.3': 1068773.76,
     'step_cf_0.3': 1381751.68,
     'step_seq32': 930343.6799999999,
     'tokenizer_phase': 130608.0},
    'rl_reference': _SAME_AS_FLIPS,
    'two_stage': {'chunk_cost': (237666.56, 34552.21759996278),
     'forward': 134848.356352,
     'forward_0.3': 161583.5648,
     'forward_kernel_0.3': 167659.92959999997,
     'slope': 1.674170405717603,
     'step_0.3': 484750.6944,
     'step_cf_0.3': 603054.2592,
     'step_seq32': 402068.50252800004,
     'tokenizer_phase': 130032.0},
    'uniform': _SAME_AS_BPE,
    'unwindowed': {'chunk_cost': (106624.0, 16384.00000000163),
     'forward': 112980.48000000001,
     'forward_0.3': 124052.48,
     'forward_kernel_0.3': 132815.36,
     'slope': 0.9343775317310323,
     'step_0.3': 372157.44,
     'step_cf_0.3': 450577.92,
     'step_seq32': 326161.92,
     'tokenizer_phase': 137088.0},
    'whitespace': _SAME_AS_BPE,
}

MATCHED = {'small:': 1,
 'small:model.d_chunk=256,model.n_heads_chunk=4': 1,
 'small:model.main_layers=10,model.window=512,train.seq_len=1024': 2,
 'test:': 1,
 'test:model.main_layers=12,model.d_byte=64,model.encoder_layers=3,model.decoder_layers=3': 8,
 'test:model.window=128': 1,
 'tiny:': 1}

PER_BYTE = {'small:': 3478423.68,
 'small:model.d_chunk=256,model.n_heads_chunk=4': 4755623.040000001,
 'small:model.main_layers=10,model.window=512,train.seq_len=1024': 8343936.0,
 'test:': 324829.44000000006,
 'test:model.main_layers=12,model.d_byte=64,model.encoder_layers=3,model.decoder_layers=3': 2768033.2800000003,
 'test:model.window=128': 338941.44000000006,
 'tiny:': 7906137.600000001}

PLANS = {'bpe::1e+09:None': {'bytes_per_step': 256,
                     'checkpoint_every': 3,
                     'eval_every': 1,
                     'flops_budget': 1000000000.0,
                     'max_steps': 44,
                     'planned_fpb': 354196.5,
                     'planned_rate': 0.2890625,
                     'warmup_steps': 1},
 'bpe_token:model.bpe_vocab=300:1e+09:None': {'bytes_per_step': 256,
                                              'checkpoint_every': 5,
                                              'eval_every': 2,
                                              'flops_budget': 1000000000.0,
                                              'max_steps': 68,
                                              'planned_fpb': 233082.0,
                                              'planned_rate': 0.5498046875,
                                              'warmup_steps': 1},
 'fixed:train.lr_schedule=wsd,train.warmup_frac=0.05:4e+09:None': {'bytes_per_step': 256,
                                                                   'checkpoint_every': 15,
                                                                   'eval_every': 7,
                                                                   'flops_budget': 4000000000.0,
                                                                   'max_steps': 188,
                                                                   'planned_fpb': 330828.0,
                                                                   'planned_rate': 0.21875,
                                                                   'warmup_steps': 2},
 'flat::1e+09:None': {'bytes_per_step': 256,
                      'checkpoint_every': 3,
                      'eval_every': 1,
                      'flops_budget': 1000000000.0,
                      'max_steps': 36,
                      'planned_fpb': 421248.0,
                      'planned_rate': None,
                      'warmup_steps': 1},
 'rl::1e+09:None': {'bytes_per_step': 256,
                    'checkpoint_every': 4,
                    'eval_every': 2,
                    'flops_budget': 1000000000.0,
                    'max_steps': 48,
                    'planned_fpb': 324829.44000000006,
                    'planned_rate': 0.2,
                    'warmup_steps': 1},
 'rl:train.lr_schedule=wsd,train.warmup_frac=0,train.warmup_steps=7:4e+09:1000000000.0': {'bytes_per_step': 256,
                                                                                          'checkpoint_every': 16,
                                                                                          'eval_every': 8,
                                                                                          'flops_budget': 4000000000.0,
                                                                                          'max_steps': 192,
                                                                                          'planned_fpb': 324829.44000000006,
                                                                                          'planned_rate': 0.2,
                                                                                          'warmup_steps': 7},
 'rl_group4::2e+09:None': {'bytes_per_step': 64,
                           'checkpoint_every': 11,
                           'eval_every': 5,
                           'flops_budget': 2000000000.0,
                           'max_steps': 136,
                           'planned_fpb': 909797.7600000001,
                           'planned_rate': 0.2,
                           'warmup_steps': 2},
 'uniform:train.warmup_frac=0.1:1e+09:500000000.0': {'bytes_per_step': 256,
                                                     'checkpoint_every': 4,
                                                     'eval_every': 2,
                                                     'flops_budget': 1000000000.0,
                                                     'max_steps': 48,
                                                     'planned_fpb': 330828.0,
                                                     'planned_rate': 0.21875,
                                                     'warmup_steps': 1},
 'whitespace::3e+09:None': {'bytes_per_step': 256,
                            'checkpoint_every': 11,
                            'eval_every': 5,
                            'flops_budget': 3000000000.0,
                            'max_steps': 140,
                            'planned_fpb': 335029.3359375,
                            'planned_rate': 0.2314453125,
                            'warmup_steps': 2}}

OBJECTIVE = {'flat': 10345512960.0,
 'lexicon': 1663126732.8000002,
 'price': (0.036953062490011804, 0.005678261703147636),
 'rl_reference': 1663126732.8000002,
 'two_stage': 2071270753.56672}

LADDERS = {'bpe_token': [(30000.0,
                27792,
                ['model.arch=bpe_token',
                 'model.bpe_vocab=2048',
                 'model.d_chunk=48',
                 'model.n_heads_chunk=3',
                 'model.flat_layers=1']),
               (200000.0,
                221664,
                ['model.arch=bpe_token',
                 'model.bpe_vocab=2048',
                 'model.d_chunk=96',
                 'model.n_heads_chunk=6',
                 'model.flat_layers=2'])],
 'flat': [(30000.0,
           33184,
           ['model.arch=flat', 'model.d_chunk=32', 'model.n_heads_chunk=2', 'model.flat_layers=2']),
          (200000.0,
           175120,
           ['model.arch=flat', 'model.d_chunk=80', 'model.n_heads_chunk=5', 'model.flat_layers=2'])],
 'hourglass': [(30000.0,
                28113,
                ['model.arch=hourglass',
                 'model.d_chunk=32',
                 'model.n_heads_chunk=2',
                 'model.main_layers=1',
                 'model.d_byte=16',
                 'model.n_heads_byte=1',
                 'model.encoder_layers=1',
                 'model.decoder_layers=1']),
               (200000.0,
                193697,
                ['model.arch=hourglass',
                 'model.d_chunk=64',
                 'model.n_heads_chunk=4',
                 'model.main_layers=3',
                 'model.d_byte=32',
                 'model.n_heads_byte=2',
                 'model.encoder_layers=1',
                 'model.decoder_layers=1'])]}


# ---- how the numbers are asked of the code --------------------------------------------------------
def reference_budget_per_byte(base, preset):
    return compare.reference_budget(compare.method_config("rl", base, "x", Path("/tmp/x"), 0, preset), 1)


def objective_of(cfg):
    from rltok.objective.loss import BoundaryObjective

    return BoundaryObjective(cfg, run_cost(cfg))


def chunk_price_of(cfg):
    from rltok.objective.build import make_chunk_price

    return make_chunk_price(cfg.model, cfg.objective, cfg.train.seq_len, cost=run_cost(cfg))


@pytest.mark.parametrize("case", list(COST_CASES))
def test_the_cost_of_a_config_is_unchanged(case):
    cfg = config(COST_CASES[case])
    assert cost_numbers(run_cost(cfg, vocab_size=vocab(cfg)), cfg) == COSTS[case]


@pytest.mark.parametrize("case", ["lexicon", "two_stage", "bpe", "rl_group4_value", "flat_ngram_window"])
def test_the_built_model_costs_what_its_config_was_planned_at(case):
    from rltok.training.build import build

    cfg = config(COST_CASES[case])
    assert cost_numbers(build(cfg, corpus()).cost, cfg) == COSTS[case]


def test_compare_matched_depth_and_budget_per_reference_byte_are_unchanged():
    for preset, base in COMPARE_BASES:
        key = f"{preset}:{','.join(base)}"
        assert compare.matched_flat_layers(load_config(preset, overrides=[*base, "data.train=x"])) == MATCHED[key], key
        assert reference_budget_per_byte(base, preset) == PER_BYTE[key], key


def test_compare_budget_plans_are_unchanged(tmp_path, monkeypatch):
    from rltok.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "fit", lambda self, stop_at=None: None)  # the plan, not the training
    c = corpus()
    data = tmp_path / "salad.txt"
    data.write_bytes(bytes(c.train.numpy()) + bytes(c.val.numpy()))
    for i, (method, base, budget, warmup_at) in enumerate(PLAN_CASES):
        cfg = compare.method_config(method, base, str(data), tmp_path / f"run{i}", 0, "test")
        t = compare._train_to_budget(cfg, budget, warmup_at)
        tc = t.trainer.cfg.train
        got = {"planned_rate": t.plan.rate, "planned_fpb": t.plan.train_flops_per_byte,
               "bytes_per_step": t.plan.bytes_per_step,
               "max_steps": tc.max_steps, "flops_budget": tc.flops_budget, "warmup_steps": tc.warmup_steps,
               "eval_every": tc.eval_every, "checkpoint_every": tc.checkpoint_every}
        t.trainer.lock.release()
        key = f"{method}:{','.join(base)}:{budget:g}:{warmup_at}"
        assert got == PLANS[key], key


def test_the_objective_plans_and_prices_as_before():
    for name in ("lexicon", "rl_reference", "two_stage", "flat"):
        cfg = config(COST_CASES[name])
        assert objective_of(cfg).planned_flops(256, 64) == OBJECTIVE[name], name
    cfg = config([*_REF, "objective.rate.kind=none", "objective.rate.compute_price=0.5"])
    price = chunk_price_of(cfg)
    assert (price.compute, price.compute_per_rate) == OBJECTIVE["price"]


def test_the_size_ladders_are_unchanged():
    for fam, base in [("flat", []), ("bpe_token", []), ("hourglass", ["model.chunker=rl"])]:
        got = [(r.target, r.achieved, r.overrides) for r in sizing.ladder(fam, [3e4, 2e5], base, preset="test")]
        assert got == LADDERS[fam], fam
