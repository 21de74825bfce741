"""A script that runs ``ckpt ARGS`` in a fresh interpreter and reports the heavy modules it imported
(a line ``HEAVY=[...]`` on stderr) and its exit code (``EXIT=N``)."""

from __future__ import annotations

PROBE = """
import json, sys
sys.argv = ["ckpt", *json.loads(sys.argv[1])]
from ckpt_cli.app import main
code = 0
try:
    main()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else int(e.code is not None)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "orbax", "flax", "keras"))
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
sys.stderr.write("EXIT=" + str(code) + "\\n")
"""
