"""The registries the objective is built from, by config name. Adding an estimator or a reward
is one class (estimator.BoundaryEstimator / rewards.Reward) and one entry here or in REWARDS."""

from __future__ import annotations

from rltok.config import ObjectiveConfig
from rltok.objective.estimator import BoundaryEstimator
from rltok.objective.flips_estimator import Flips
from rltok.objective.rewards import REWARDS, make_reward  # noqa: F401  (REWARDS: the reward registry)
from rltok.objective.score_function import ScoreFunction

# objective.estimator -> class
ESTIMATORS: dict[str, type[BoundaryEstimator]] = {e.name: e for e in (ScoreFunction, Flips)}

LEXICON_CONCENTRATION = 100.0  # the Dirichlet process' weight of the base model (never tuned)


def build_estimator(cfg: ObjectiveConfig, lexicon=None) -> BoundaryEstimator:
    """The estimator objective.estimator names, with its reward (objective.reward) and, for the
    flips, the lexicon whose code length it credits."""
    return ESTIMATORS[cfg.estimator.kind](cfg, make_reward(cfg.reward.kind), lexicon)


def build_lexicon(cfg, device=None):
    """The lexicon prior of a Config (objective.lexicon_*, base mean length 1 / model.target_rate)."""
    from rltok.objective.lexicon import ChunkLexicon

    lex = cfg.objective.estimator.lexicon
    return ChunkLexicon(lex.size, LEXICON_CONCENTRATION, 1.0 / cfg.model.target_rate, lex.decay,
                        device=device)
