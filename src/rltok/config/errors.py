"""The error of the config layer, below everything that raises it (registries, plugins, sections)."""


class ConfigError(ValueError):
    """A user mistake in a configuration (unknown key, bad value)."""
