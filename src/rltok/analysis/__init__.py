"""Instruments for research, beside the library: estimator diagnostics, a cut's true advantage,
lexicon costs, vocabulary inspection, heat maps. Nothing in the training path imports this."""
