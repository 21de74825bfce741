"""Every size option of the app parses sizes the same way: K/M/G/T and KiB/MiB/GiB/TiB are
binary, KB/MB/GB/TB decimal, a plain number is bytes (``--sample`` also takes a percentage).

The options are found by introspecting the Typer app, and each value goes through the app's own
parsing of a command line (``make_context``: the options parsed, the command not run)."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main

from ckpt_cli.app import app
from ckpt_cli.commands._options import SizeParser, parse_sample
from ckpt_cli.core.verify.types import SampleSpec
from ckpt_cli.errors import OptionValueError, UsageError

COMMAND = typer.main.get_command(app)
SIZES = {
    "3": 3,
    "3B": 3,
    "3K": 3 << 10,
    "3KiB": 3 << 10,
    "3kib": 3 << 10,
    "3KB": 3000,
    "1.5M": 3 << 19,
    "1.5MiB": 3 << 19,
    "2MB": 2_000_000,
    "2G": 2 << 30,
    "2 GiB": 2 << 30,
    "2GB": 2_000_000_000,
    "1T": 1 << 40,
    "1TB": 10**12,
}


def _size_options() -> list[tuple[str, Any, Any]]:
    found = []
    for name, command in COMMAND.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if param.metavar in ("SIZE", "SIZE|N%"):
                found.append((name, command, param))
    return found


SIZE_OPTIONS = _size_options()


def _parse(command: Any, name: str, param: Any, value: str) -> Any:
    args = [
        "x" for p in command.params if p.param_type_name == "argument" and p.required
    ]  # the required arguments, never opened: the command does not run
    args += ["--spec", "x"] if name == "migrate" else []
    for p in command.params:  # required options (average's --steps), never used either
        if p.param_type_name == "option" and p.required and p is not param:
            args += [p.opts[0], "1"]
    ctx = command.make_context(name, [*args, param.opts[0], value])
    parsed = ctx.params[param.name]
    return parsed.bytes if isinstance(parsed, SampleSpec) else parsed


def test_the_size_options_are_found() -> None:
    flags = {(name, param.opts[0]) for name, _, param in SIZE_OPTIONS}
    assert {
        ("verify", "--sample"),
        ("verify", "--unit-bytes"),
        ("reshard", "--memory-limit"),
        ("reshard", "--max-chunk-bytes"),
        ("reshard", "--unit-bytes"),
        ("migrate", "--memory-limit"),
        ("migrate", "--max-chunk-bytes"),
        ("migrate", "--unit-bytes"),
    } <= flags


def test_no_size_option_escapes_the_size_parser() -> None:
    options = [
        (name, p)
        for name, c in COMMAND.commands.items()  # type: ignore[attr-defined]
        for p in c.params
        if p.param_type_name == "option"
    ]
    assert options
    looks_like_size = [
        (name, p.opts[0])
        for name, p in options
        if any(w in p.name for w in ("bytes", "limit", "size", "sample"))
    ]
    assert looks_like_size
    assert all(
        p.metavar in ("SIZE", "SIZE|N%")
        for name, p in options
        if (name, p.opts[0]) in set(looks_like_size)
    )


@pytest.mark.parametrize(("text", "expected"), sorted(SIZES.items()))
def test_every_size_option_parses_sizes_alike(text: str, expected: int) -> None:
    assert SIZE_OPTIONS
    got = {
        (name, param.opts[0]): _parse(cmd, name, param, text) for name, cmd, param in SIZE_OPTIONS
    }
    assert set(got.values()) == {expected}, got


def test_a_bad_size_is_a_usage_error_naming_the_option(cli: Any) -> None:
    assert SIZE_OPTIONS
    for name, command, param in SIZE_OPTIONS:
        with pytest.raises(OptionValueError, match=param.opts[0]):
            _parse(command, name, param, "12 parsecs")
    r = cli("reshard", "a", "b", "--mesh", "x=1", "--memory-limit", "12parsecs")
    assert r.code == 2
    assert r.stderr.startswith("ckpt: error: --memory-limit '12parsecs' is not a size")


def test_defaults_are_parsed_too() -> None:
    cmd = COMMAND.commands["reshard"]  # type: ignore[attr-defined]
    ctx = cmd.make_context("reshard", ["a", "b"])
    assert ctx.params["memory_limit"] == 1 << 30
    assert ctx.params["max_chunk_bytes"] == 64 << 20
    assert ctx.params["unit_bytes"] == 256 << 20
    assert SizeParser("--x")(5) == 5  # an int is taken as bytes


def test_parse_sample() -> None:
    assert parse_sample("5%") == SampleSpec(percent=5.0)
    assert parse_sample("2GiB") == SampleSpec(bytes=2 << 30)
    assert parse_sample("1500") == SampleSpec(bytes=1500)
    for bad in ("0%", "150%", "x", "-1"):
        with pytest.raises(UsageError):
            parse_sample(bad)


def test_a_writer_takes_its_executor_and_unit_size_from_its_runs_scale() -> None:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.commands._options import write_options
    from ckpt_cli.core.executor import ExecutorSpec
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.storage import StorageOptions

    scale = ScaleOptions.from_flags("local", 3, None, True, 1 << 20, 2)
    write = write_options(Run(StorageOptions(), scale=scale), 1 << 20, 8 << 20, True, "none", False)
    assert write.executor == ExecutorSpec("local", 3, None, force_split=True)
    assert (write.unit_bytes, write.memory_limit, write.zarr3, write.ocdbt) == (
        1 << 20,
        8 << 20,
        True,
        False,
    )
    # A run without scale flags (import) writes in this process, in the default units.
    alone = write_options(Run(StorageOptions()), 1 << 20, 8 << 20, None, "zstd", True)
    assert alone.executor == ExecutorSpec() and alone.unit_bytes == ScaleOptions().unit_bytes
