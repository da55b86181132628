"""Outside evaluation harnesses: the lm-evaluation-harness adapter (`import
rltok.harness.lm_eval_adapter` registers the model name "rltok"). It takes a model by name (a run
folder, a checkpoint, a model folder, a Hub repo id), so it sits above training, whose loader
(rltok.training.loading) reads all of those."""
