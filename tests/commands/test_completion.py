"""Shell completion: the scripts for bash, zsh and fish, and what the completion function
answers (commands, options, step numbers and item names of the root on the line)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.completion import complete
from tests.support.interrupts import CKPT
from tests.support.paths import FIXTURES

SEED = FIXTURES / "seed_mlp"
#: Typer detects the user's shell from the process tree (shellingham); the tests name it instead,
#: through the switch Typer's own tests use, so zsh and fish need not be installed.
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
COMPOSITE = FIXTURES / "composite_best"


def _values(shell: str, lines: list[str]) -> list[str]:
    return [v for v in _raw_values(shell, lines) if v]


def _raw_values(shell: str, lines: list[str]) -> list[str]:
    if shell == "zsh":  # _arguments '*: :(("value":"help"<newline>...))', or _files for none
        text = "\n".join(lines)
        if not text.startswith("_arguments"):
            return []
        body = text.split("((", 1)[1].rsplit("))", 1)[0]
        return [line.split('"')[1] for line in body.splitlines()]
    if shell == "fish":  # value<TAB>help
        return [line.split("\t")[0] for line in lines]
    return lines


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o default -F"), ("zsh", "#compdef ckpt"), ("fish", "complete --command")],
)
def test_show_completion_prints_the_script(shell: str, marker: str) -> None:
    env = {**os.environ, **NAMED_SHELL}
    proc = subprocess.run(
        [CKPT, "--show-completion", shell], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert marker in proc.stdout and "_CKPT_COMPLETE" in proc.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_install_completion_writes_the_script(shell: str, tmp_path: Path) -> None:
    env = {**os.environ, **NAMED_SHELL, "HOME": str(tmp_path), "SHELL": f"/bin/{shell}"}
    proc = subprocess.run(
        [CKPT, "--install-completion", shell], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "ckpt" in p.read_text()]
    assert written, list(tmp_path.rglob("*"))


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completes_commands_steps_and_items(shell: str) -> None:
    assert "verify" in _values(shell, complete(shell, "ckpt ve"))
    assert "--deep" in _values(shell, complete(shell, "ckpt verify --de"))
    assert _values(shell, complete(shell, f"ckpt verify {SEED} --step ")) == ["300", "400", "500"]
    assert _values(shell, complete(shell, f"ckpt inspect {SEED} --step 4")) == ["400"]
    assert _values(shell, complete(shell, f"ckpt inspect {COMPOSITE} --item ")) == [
        "extra",
        "state",
    ]
    # No root on the line: nothing made up.
    assert _values(shell, complete(shell, "ckpt inspect --step ")) == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_itself_completes_steps() -> None:
    """The script as bash sources it, its function called as bash calls it on TAB."""
    script = subprocess.run(
        [CKPT, "--show-completion", "bash"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **NAMED_SHELL},
    ).stdout
    probe = (
        f"{script}\n"
        f'COMP_WORDS=(ckpt verify {SEED} --step ""); COMP_CWORD=4\n'
        "_ckpt_completion ckpt\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{Path(CKPT).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", probe], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["300", "400", "500"], out.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completes_root_at_step_wherever_a_step_is_taken(shell: str) -> None:
    at = [f"{SEED}@300", f"{SEED}@400", f"{SEED}@500"]
    for command in ("inspect", "verify", "doctor", "reshard"):
        assert _values(shell, complete(shell, f"ckpt {command} {SEED}@")) == at, command
    assert _values(shell, complete(shell, f"ckpt inspect {SEED}@4")) == [f"{SEED}@400"]
    # The item of the step a ROOT@STEP names.
    items = _values(shell, complete(shell, f"ckpt verify {COMPOSITE}@2 --item "))
    assert items == ["extra", "state"]
