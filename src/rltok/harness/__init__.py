"""Evaluation that takes a model by name (a run folder, a checkpoint, a model folder, a Hub repo
id), so it sits above training, whose loader (rltok.training.loading) reads all of those:
`evaluate_run` (a run or exported model on held-out windows; `rltok eval` and the comparison use
it) and the lm-evaluation-harness adapter (`import rltok.harness.lm_eval_adapter` registers the
model name "rltok")."""

from rltok.harness.run_eval import RunEvaluation, evaluate_run

__all__ = ["RunEvaluation", "evaluate_run"]
