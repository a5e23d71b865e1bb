"""The installed package's version, read once from its metadata (imports nothing from the package, so every layer
may import it: the package root, ``io`` for the version it writes into ``config.json``, the CLI and the reports)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("crate-transformer")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
