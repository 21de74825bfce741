"""What ``ckpt``'s shell completion answers, asked the way each shell asks."""

from __future__ import annotations

import os
import subprocess

from tests.support.interrupts import CKPT


def complete(shell: str, line: str) -> list[str]:
    """What ``ckpt``'s completion function answers for ``line`` (the cursor at its end)."""
    env = {**os.environ, "_CKPT_COMPLETE": f"complete_{shell}"}
    if shell == "bash":
        words = line.split(" ")
        env.update({"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    else:
        env["_TYPER_COMPLETE_ARGS"] = line
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    proc = subprocess.run([CKPT], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()
