"""Config keys removed because they changed nothing: configs, files and checkpoints that still
carry them load (the key is ignored with a note), a command-line override of one is an error."""

import json
import warnings

import pytest

from rltok.config import REMOVED_KEYS, Config, ConfigError, load_config

OLD = {"objective": {"value_weight": 0.1, "flip_weight": 1.0, "flip_center": True, "flip_normalize": True,
                     "flip_rate_start": 0.0, "flip_rate_anneal_steps": 0, "lexicon_concentration": 100.0,
                     "lexicon_lag": 0, "lexicon_collapse_blanks": False, "lexicon_context": "unigram",
                     "lexicon_credit": "flips", "gamma": 0.9}}


def test_every_removed_key_is_listed():
    assert set(REMOVED_KEYS) == {f"objective.{k}" for k in OLD["objective"] if k != "gamma"}


def test_an_old_config_dict_with_removed_keys_loads():
    with pytest.warns(UserWarning, match=r"objective\.lexicon_lag was removed .*; ignored"):
        cfg = Config.from_dict(OLD)
    assert cfg.objective.estimator.gamma == 0.9 and not hasattr(cfg.objective, "lexicon_lag")
    cfg.validate()


def test_an_old_config_file_with_removed_keys_loads(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config("test", file=str(path))
    assert cfg.objective.estimator.gamma == 0.9
    assert sum("was removed" in str(w.message) for w in caught) == len(REMOVED_KEYS)


def test_overriding_a_removed_key_says_it_was_removed():
    with pytest.raises(ConfigError, match=r"objective\.lexicon_lag' was removed"):
        load_config("test", overrides=["objective.lexicon_lag=1"])
    with pytest.raises(ConfigError, match="unknown config key"):  # a key that never existed: the usual error
        load_config("test", overrides=["objective.lexicon_lagg=1"])
