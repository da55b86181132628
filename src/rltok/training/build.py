"""Everything a config describes, built once, in the order training reads it: the data, the model with
what a step of it costs, and the objective (docs/ARCHITECTURE.md, "Built once").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from rltok.config import FAMILIES, Config
from rltok.data.corpus import load_corpus
from rltok.data.sources import Corpus
from rltok.data.windows import WindowSampler, rank_eval_windows
from rltok.model.factory import build_model
from rltok.model.flops import ModelCost, run_cost
from rltok.objective.loss import BoundaryObjective, LocalMean
from rltok.training import distributed as ddp
from rltok.training.fits import refuse_what_cannot_fit

__all__ = ["Built", "CostedModel", "build", "costed_model", "load_data"]


@dataclass
class CostedModel:
    """The model of a config and what a step of it costs: made before anything else, so that a
    harness can plan a run from it (rltok.analysis.compare.plan_budget) before the trainer exists."""

    model: torch.nn.Module
    cost: ModelCost  # asked of the model's modules (rltok.model.flops.run_cost)


@dataclass
class Built:
    corpus: Corpus
    model: torch.nn.Module
    cost: ModelCost  # what a step of the model costs (asked of its modules)
    objective: BoundaryObjective
    sampler: WindowSampler  # training windows; its generator is the data position
    val: tuple[torch.Tensor, torch.Tensor, bool]  # this rank's validation windows (x, y, shared)
    group_size: int  # segmentations drawn per sequence (1 for a model that draws none)


def load_data(cfg: Config) -> Corpus:
    """The training and validation bytes data.* names."""
    d = cfg.data
    return load_corpus(d.train, d.val, d.val_fraction, d.max_bytes, d.hf_text_field, prepare_above=d.prepare_above,
                       cache_dir=d.cache_dir)


def build(cfg: Config, corpus: Corpus | None = None, device: torch.device | str = "cpu",
          dist: ddp.DistInfo | None = None, costed: CostedModel | None = None) -> Built:
    """The data pipeline, the model and the objective of `cfg` (`corpus`: bytes already loaded;
    `dist`: this process's place in data parallelism). The model and its cost are `costed_model`'s,
    or `costed`, where a harness planned the run from them already."""
    tc, device = cfg.train, torch.device(device)
    dist = dist or ddp.DistInfo()
    if costed is None:  # before the data or the model takes any memory
        refuse_what_cannot_fit(cfg, device, dist.world_size)
    corpus = corpus or load_data(cfg)
    costed = costed or costed_model(cfg, corpus, dist)
    model, cost = costed.model.to(device), costed.cost  # the cost asks the module, wherever it lives
    # batch_size counts segmentations: with group_size K, K of them share each sequence
    k = cfg.objective.group_size if FAMILIES.component(cfg.model.arch).hierarchical else 1
    sampler = WindowSampler(corpus.train, tc.batch_size // k, tc.seq_len, seed=tc.seed, rank=dist.rank,
                            world_size=dist.world_size)
    # ranks evaluate equal shares (FSDP needs the same number of forwards on every rank); fewer
    # windows than ranks: every rank evaluates all of them and the sums are averaged
    val = rank_eval_windows(corpus.val, tc.seq_len, tc.eval_batches * tc.batch_size * dist.world_size, dist.rank,
                            dist.world_size)
    # the baseline and the rate loss' mean boundary probability are over the global batch
    objective = BoundaryObjective(cfg, cost, device,
                                  reduce=ddp.GlobalBatchMean(dist) if dist.enabled else LocalMean())
    return Built(corpus, model, cost, objective, sampler, val, k)


def costed_model(cfg: Config, corpus: Corpus, dist: ddp.DistInfo | None = None) -> CostedModel:
    """The model of `cfg` (its data-fitted parts fitted on `corpus`) and its cost. Seeds the global
    RNGs with train.seed first, so a config builds the same model (and what follows draws the same
    numbers)."""
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    model = fitted_model(cfg, corpus, dist or ddp.DistInfo())
    return CostedModel(model, run_cost(cfg, model))


def fitted_model(cfg: Config, corpus: Corpus, dist: ddp.DistInfo) -> torch.nn.Module:
    """The model; with data-fitted parts (BPE tokenizers) rank 0 fits them and the others
    receive its state, so every rank holds the same tokenizer."""
    m = cfg.model
    if not (dist.enabled and FAMILIES.component(m.arch).fitted_to_data(m)):
        return build_model(m, train_bytes=corpus.train)
    state = None
    if dist.is_main:
        model = build_model(m, train_bytes=corpus.train)
        state = {k: v.cpu() for k, v in model.state_dict().items()}
    state = ddp.broadcast_object(state, dist)
    if not dist.is_main:
        model = build_model(m, state_dict=state)
        model.load_state_dict(state)
    return model
