"""Typed configuration: the sections (sections.py), the registries of components chosen by kind
(registry.py), plugins (plugins.py), presets (presets.py), and the loader (loading.py)."""

from rltok.config.loading import (LEGACY_KEYS, REMOVED_KEYS, Config, apply_dict, apply_override, load_config,
                                  with_settings)
from rltok.config.presets import PRESET_NOTES, PRESETS
from rltok.config.plugins import ENTRY_POINT_GROUP, PluginError, load_plugin, load_plugins
from rltok.config.registry import Registry, Section
from rltok.config.sections import (BOS, CHUNKERS, COST_ESTIMATORS, CREDIT_PRICES, EOS, ESTIMATORS, FAMILIES, PAD,
                                   RATES, RECIPES, REWARDS, VOCAB_SIZE, ConfigError, DataConfig,
                                   DynamicPoolingSettings, FixedChunkerSettings, FlipsSettings, GumbelChunkerSettings,
                                   HNetChunkerSettings, LagrangeRateSettings, LexiconSettings, ModelConfig,
                                   ObjectiveConfig, PenaltyRateSettings, RateSettings, RLChunkerSettings,
                                   ScoreFunctionSettings, TargetPriceSettings, TrainConfig)

__all__ = ["DynamicPoolingSettings", "FixedChunkerSettings", "FlipsSettings", "GumbelChunkerSettings",
           "HNetChunkerSettings", "LagrangeRateSettings", "LexiconSettings", "PenaltyRateSettings", "RateSettings",
           "RLChunkerSettings", "ScoreFunctionSettings", "TargetPriceSettings",
           "BOS", "CHUNKERS", "COST_ESTIMATORS", "CREDIT_PRICES", "ENTRY_POINT_GROUP", "PluginError",
           "load_plugin", "load_plugins", "Config", "ConfigError", "DataConfig", "EOS", "ESTIMATORS", "FAMILIES",
           "LEGACY_KEYS", "ModelConfig", "ObjectiveConfig", "PAD", "PRESETS", "PRESET_NOTES", "RATES", "RECIPES",
           "REMOVED_KEYS", "REWARDS", "Registry", "Section", "TrainConfig", "VOCAB_SIZE",
           "apply_dict", "apply_override", "load_config", "with_settings"]
