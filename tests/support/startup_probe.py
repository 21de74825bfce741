"""A script that runs ``ckpt ARGS`` in a fresh interpreter and reports the heavy modules it imported."""

from __future__ import annotations

PROBE = """
import json, sys
sys.argv = ["ckpt", *json.loads(sys.argv[1])]
from ckpt_cli.app import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "orbax", "flax", "keras"))
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
"""
