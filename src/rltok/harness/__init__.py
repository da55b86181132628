"""Evaluation that takes a model by name (a run, a checkpoint, a model folder, a Hub repo id), so it
sits above training's loader: `evaluate_run` and the lm-evaluation-harness adapter."""

from rltok.harness.run_eval import RunEvaluation, evaluate_run

__all__ = ["RunEvaluation", "evaluate_run"]
