"""The matrix tests' Orbax: one restore process per test worker, fed many outputs in turn."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERVER = Path(__file__).with_name("orbax_server.py")


class OrbaxRestorer:
    """A running ``orbax_server.py``: restores items and lists steps with the installed Orbax."""

    def __init__(self, server: Path = SERVER, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(server)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        hello = self._read()
        assert hello.get("ready"), hello

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the restore process died (exit {self.proc.poll()})")
        doc: dict[str, Any] = json.loads(line)
        return doc

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request, default=str) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def item(self, path: Path, kind: str = "pytree") -> dict[str, Any]:
        """The restored item (``leaves`` or ``value``); raises with Orbax's first line."""
        out = self.ask(op="item", path=str(path), kind=kind)
        if not out["ok"]:
            raise AssertionError(f"Orbax 0.12.8 cannot restore {path}: {out['error']}")
        return out

    def steps(self, root: Path, options: dict[str, Any] | None = None) -> list[int]:
        """``CheckpointManager(root).all_steps()``, with the naming ``options`` of its saver."""
        out = self.ask(op="steps", path=str(root), options=options or {})
        if not out["ok"]:
            raise AssertionError(f"Orbax 0.12.8 cannot list {root}: {out['error']}")
        steps: list[int] = out["steps"]
        return steps

    def step_items(
        self,
        root: Path,
        step: int,
        items: dict[str, str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """A step's items restored by the names a framework asks for: ``items`` (name ->
        ``pytree`` | ``json``) through ``CheckpointManager.restore``, or, without ``items``,
        every checkpointable the v1 API's ``load_checkpointables`` finds."""
        if items is None:
            out = self.ask(op="checkpointables", path=str(root), step=step)
        else:
            out = self.ask(
                op="manager", path=str(root), step=step, items=items, options=options or {}
            )
        if not out["ok"]:
            raise AssertionError(
                f"Orbax 0.12.8 cannot restore step {step} of {root}: {out['error']}"
            )
        got: dict[str, dict[str, Any]] = out["items"]
        return got

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def orbax() -> Iterator[OrbaxRestorer]:
    restorer = OrbaxRestorer()
    try:
        yield restorer
    finally:
        restorer.close()
