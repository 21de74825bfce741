"""The loop of a restore process the tests feed: one JSON request per line on stdin, one JSON
answer per line on stdout (``{"ok": true, ...}`` or ``{"ok": false, "error": FIRST_LINE}``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def serve(answer: Callable[[dict[str, Any]], dict[str, Any]], hello: dict[str, Any]) -> int:
    print(json.dumps({"ok": True, "ready": True, **hello}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = {"ok": True, **answer(json.loads(line))}
        except Exception as e:
            text = str(e).strip().splitlines()
            out = {"ok": False, "error": f"{type(e).__name__}: {text[0] if text else ''}"[:500]}
        print(json.dumps(out, default=str), flush=True)
    return 0
