"""Typed configuration: a section per component (sections.py), named presets (presets.py), and the
loader that applies a preset, a file and `key=value` overrides (loading.py)."""

from rltok.config.loading import (REMOVED_KEYS, Config, _read_config_file, apply_dict, apply_override,
                                  load_config)
from rltok.config.presets import PRESET_NOTES, PRESETS
from rltok.config.sections import (BOS, CHUNKERS, EOS, PAD, PROBE_REWARDS, RECIPES, VOCAB_SIZE, ConfigError,
                                   DataConfig, ModelConfig, ObjectiveConfig, TrainConfig)

__all__ = ["BOS", "CHUNKERS", "Config", "ConfigError", "DataConfig", "EOS", "ModelConfig", "ObjectiveConfig", "PAD",
           "PRESETS", "PRESET_NOTES", "PROBE_REWARDS", "RECIPES", "REMOVED_KEYS", "TrainConfig", "VOCAB_SIZE",
           "_read_config_file", "apply_dict", "apply_override", "load_config"]
