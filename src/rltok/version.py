"""The package's version, in a leaf module: code inside the package that records which rltok
wrote a file imports it from here, never from the package root (an upward import)."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's [project] version
