"""The global ``--s3-endpoint`` reaches every reader and writer of every command.

Every command of the Typer app is run with an ``s3://`` path on each side it takes one (its
source and its destination), the flag naming one endpoint where nothing listens and
``CKPT_S3_ENDPOINT`` another: the run must fail with exit 3 naming the flag's endpoint, never
the environment's (a command that dropped the flag would fall back to the environment, or to
AWS itself). A command of the registry without its rows fails
``test_every_command_is_covered[<command>]``, naming what to add.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.error_cases import registry_names
from tests.support.paths import FIXTURES, REPO
from tests.support.remote_servers import dead_endpoint

URL = "s3://ckpt-nowhere/run"


@dataclass(frozen=True)
class Paths:
    tmp: Path
    good: Path
    spec: Path
    tensors: Path


@dataclass(frozen=True)
class Case:
    command: str
    side: str  # which argument is the s3:// one: "source", "destination", "root", "like"
    args: Callable[[Paths], list[str]]

    @property
    def id(self) -> str:
        return f"{self.command}-{self.side}"


CASES = [
    Case("ls", "root", lambda p: ["ls", URL]),
    Case("du", "root", lambda p: ["du", URL]),
    Case("inspect", "root", lambda p: ["inspect", URL]),
    Case("verify", "root", lambda p: ["verify", URL]),
    Case("diff", "source", lambda p: ["diff", URL, str(p.good)]),
    Case("diff", "destination", lambda p: ["diff", str(p.good), URL]),
    Case("digest", "root", lambda p: ["digest", URL]),
    Case("trend", "root", lambda p: ["trend", URL]),
    Case("doctor", "source", lambda p: ["doctor", URL, "--like", str(p.good)]),
    Case("doctor", "like", lambda p: ["doctor", str(p.good), "--like", URL]),
    Case("prune", "root", lambda p: ["prune", URL, "--keep-last", "1", "--dry-run"]),
    Case("pin", "root", lambda p: ["pin", URL, "500"]),
    Case("unpin", "root", lambda p: ["unpin", URL, "500"]),
    Case("reshard", "source", lambda p: ["reshard", URL, str(p.tmp / "o"), "--mesh", "data=1"]),
    Case("reshard", "destination", lambda p: ["reshard", str(p.good), URL, "--mesh", "data=1"]),
    Case("reshard", "like", lambda p: ["reshard", str(p.good), str(p.tmp / "o"), "--like", URL]),
    Case("migrate", "source", lambda p: ["migrate", URL, str(p.tmp / "o"), "--spec", str(p.spec)]),
    Case("migrate", "destination", lambda p: ["migrate", str(p.good), URL, "--spec", str(p.spec)]),
    Case("average", "source", lambda p: ["average", URL, str(p.tmp / "o"), "--steps", "1,2"]),
    Case("average", "destination", lambda p: ["average", str(p.good), URL, "--steps", "400,500"]),
    Case("cp", "source", lambda p: ["cp", URL, str(p.tmp / "o")]),
    Case("cp", "destination", lambda p: ["cp", str(p.good), URL]),
    Case("export", "source", lambda p: ["export", URL, str(p.tmp / "o")]),
    # export writes local directories only; import reads local safetensors files only.
    Case("import", "destination", lambda p: ["import", str(p.tensors), URL]),
]


def _one_tensor_file(path: Path) -> Path:
    """A valid one-tensor safetensors file (the format's bytes: header length, header, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    header += " " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(8))
    return path


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    good = tmp_path / "good"
    shutil.copytree(FIXTURES / "seed_mlp", good)
    spec = tmp_path / "widen.yaml"
    shutil.copy(REPO / "examples" / "widen_64_to_128.yaml", spec)
    return Paths(tmp_path, good, spec, _one_tensor_file(tmp_path / "one.safetensors"))


@pytest.fixture
def endpoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(the flag's endpoint, the environment's): two ports where nothing listens."""
    with dead_endpoint() as flag, dead_endpoint() as env:
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("CKPT_S3_ENDPOINT", env)
        # Keys for the dead endpoints: the failure must be the connection, not the credentials.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "options")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "options")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        # One attempt: which endpoint a request went to is the question, not the backoff.
        monkeypatch.setenv("CKPT_REQUEST_ATTEMPTS", "1")
        yield flag, env


def storage_gap(command: str, cases: list[Case] = CASES) -> str | None:
    """Why ``command`` is not covered (None when it is): it has no case in ``CASES``."""
    if any(c.command == command for c in cases):
        return None
    return (
        f"ckpt {command}: no --s3-endpoint case (add to CASES in "
        "tests/commands/test_storage_options.py a run with s3:// on each side it takes)"
    )


@pytest.mark.parametrize("command", registry_names())
def test_every_command_is_covered(command: str) -> None:
    gap = storage_gap(command)
    assert gap is None, gap


def test_every_case_names_a_registered_command() -> None:
    assert {c.command for c in CASES} <= set(registry_names())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_flag_reaches_every_side_of_every_command(
    cli: Any, paths: Paths, endpoints: tuple[str, str], case: Case
) -> None:
    flag, env = endpoints
    r = cli("--s3-endpoint", flag, *case.args(paths))
    assert r.code == 3, (r.code, r.stdout, r.stderr)
    assert f"connection refused at {flag}" in r.stderr, r.stderr
    assert env not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (paths.tmp / "o").exists() or not any((paths.tmp / "o").iterdir())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_flag_gives_a_json_error_document(
    cli: Any, paths: Paths, endpoints: tuple[str, str], case: Case
) -> None:
    flag, _ = endpoints
    r = cli("--s3-endpoint", flag, *case.args(paths), "--json")
    assert r.code == 3, (r.code, r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "unreachable", doc
    assert flag in doc["error"]["message"], doc
