"""ckpt: list, inspect, verify, prune, migrate and reshard Orbax checkpoints."""

from ckpt_cli._version import __version__

__all__ = ["__version__"]
