"""ckpt: list, inspect, verify, prune, migrate and reshard Orbax checkpoints."""

__version__ = "0.1.0"
