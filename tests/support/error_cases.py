"""Every error class of every command, each with a way to provoke it: the matrix the JSON-error
and schema tests run. The commands are the registry's (``ckpt_cli.commands.COMMANDS``): a
command registered without its cases is a failing test that says what to add here
(``coverage_gaps``), never a command silently skipped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tests.support.world import World

#: error code -> exit code (README "Exit codes"; docs/reference/json.md has the class of each code).
EXIT = {
    "usage": 2,
    "not-found": 3,
    "not-a-checkpoint": 3,
    "invalid-metadata": 3,
    "refused": 3,
    "locked": 3,
    "unreachable": 3,
}
CLASSES = tuple(EXIT)


@dataclass(frozen=True)
class Case:
    command: str
    error: str
    label: str
    args: Callable[[World], list[str]]
    phrase: str  # on stderr, without --json
    lock: bool = False  # hold the prune lock of World.good meanwhile
    write_lock: bool = False  # hold the write lock of World.tmp / "claimed" meanwhile

    @property
    def id(self) -> str:
        return f"{self.command}-{self.error}-{self.label}"


def _s3(command: str, *rest: str) -> Callable[[World], list[str]]:
    """The command against a bucket behind an endpoint where nothing listens."""

    def args(w: World) -> list[str]:
        fill = {"tmp": w.tmp, "good": w.good, "spec": w.spec}
        tail = [part.format(**fill) for part in rest]
        return ["--s3-endpoint", w.dead_endpoint, command, w.dead_url, *tail]

    return args


def _one_tensor_file(w: World) -> str:
    """A valid one-tensor safetensors file (the format's bytes, written by hand)."""
    import json
    import struct

    path = w.tmp / "one.safetensors"
    if not path.exists():
        header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
        header += " " * (-len(header) % 8)
        path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(8))
    return str(path)


def _bad_pattern_spec(w: World) -> str:
    """A migrate spec whose one pattern RE2 cannot take."""
    path = w.tmp / "bad_pattern.yaml"
    path.write_text("rules: [{op: drop, match: '('}]\n")
    return str(path)


def _damaged_record(w: World) -> str:
    """seed_mlp whose step 500 carries a digest record cut in the middle."""
    import shutil

    root = w.tmp / "bad_record"
    if not root.exists():
        shutil.copytree(w.good, root)
        (root / "500" / "default" / "_CKPT_DIGESTS.json").write_text('{"format": "ckpt-dig')
    return str(root)


def _differing_step(w: World) -> str:
    """A destination root whose step 500 is committed and not the source's."""
    import shutil

    root = w.tmp / "differs"
    if not root.exists():
        shutil.copytree(w.good / "500", root / "500")
        meta = root / "500" / "_CHECKPOINT_METADATA"
        meta.write_text(meta.read_text() + " ")
    return str(root)


NOT_FOUND = "does not exist"


NOT_CKPT = "not an Orbax checkpoint"


NO_OPTION = "No such option"


BAD_JSON = "not valid JSON"


REFUSED_CONN = "connection refused"


EXISTS = "already exists"


LOCKED = "another prune of"


#: pin/unpin refused while a prune holds the root: what is happening, and to retry them.
BEING_PRUNED = "is being pruned by another process"


WRITER_LOCKED = "another ckpt writer is writing into"


CASES: list[Case] = [
    # ls
    Case("ls", "not-found", "path", lambda w: ["ls", str(w.missing)], NOT_FOUND),
    Case("ls", "not-a-checkpoint", "junk", lambda w: ["ls", str(w.junk)], NOT_CKPT),
    Case("ls", "usage", "option", lambda w: ["ls", str(w.good), "--bogus"], NO_OPTION),
    Case("ls", "invalid-metadata", "root", lambda w: ["ls", str(w.bad_root)], BAD_JSON),
    Case("ls", "unreachable", "s3", _s3("ls"), REFUSED_CONN),
    # du
    Case("du", "not-found", "path", lambda w: ["du", str(w.missing)], NOT_FOUND),
    Case("du", "not-a-checkpoint", "junk", lambda w: ["du", str(w.junk)], NOT_CKPT),
    Case("du", "usage", "option", lambda w: ["du", str(w.good), "--by", "file"], "Invalid value"),
    Case("du", "unreachable", "s3", _s3("du"), REFUSED_CONN),
    # inspect
    Case("inspect", "not-found", "path", lambda w: ["inspect", str(w.missing)], NOT_FOUND),
    Case(
        "inspect", "not-found", "step", lambda w: ["inspect", str(w.good), "-s", "7"], "not found"
    ),
    Case("inspect", "not-a-checkpoint", "junk", lambda w: ["inspect", str(w.junk)], NOT_CKPT),
    Case("inspect", "usage", "option", lambda w: ["inspect", str(w.good), "--bogus"], NO_OPTION),
    Case(
        "inspect",
        "usage",
        "pattern",
        lambda w: ["inspect", str(w.good), "--filter", "("],
        "not a valid pattern",
    ),
    Case(
        "inspect",
        "usage",
        "step-of-item",
        lambda w: ["inspect", str(w.good / "500" / "default"), "--step", "400"],
        "--step does not apply",
    ),
    Case("inspect", "invalid-metadata", "item", lambda w: ["inspect", str(w.bad_item)], BAD_JSON),
    Case("inspect", "unreachable", "s3", _s3("inspect"), REFUSED_CONN),
    # verify
    Case("verify", "not-found", "path", lambda w: ["verify", str(w.missing)], NOT_FOUND),
    Case("verify", "not-found", "step", lambda w: ["verify", str(w.good), "-s", "7"], "not found"),
    Case("verify", "not-a-checkpoint", "junk", lambda w: ["verify", str(w.junk)], NOT_CKPT),
    Case("verify", "usage", "option", lambda w: ["verify", str(w.good), "--bogus"], NO_OPTION),
    Case(
        "verify",
        "usage",
        "levels",
        lambda w: ["verify", str(w.good), "--deep", "--sample", "5%"],
        "not both",
    ),
    Case("verify", "unreachable", "s3", _s3("verify"), REFUSED_CONN),
    # trend
    Case("trend", "not-found", "path", lambda w: ["trend", str(w.missing)], NOT_FOUND),
    Case("trend", "not-found", "steps", lambda w: ["trend", str(w.good), "--steps", "7"], "not a"),
    Case("trend", "not-a-checkpoint", "junk", lambda w: ["trend", str(w.junk)], NOT_CKPT),
    Case("trend", "usage", "option", lambda w: ["trend", str(w.good), "--bogus"], NO_OPTION),
    Case(
        "trend",
        "usage",
        "steps",
        lambda w: ["trend", str(w.good), "--steps", "5-2"],
        "is empty",
    ),
    Case("trend", "invalid-metadata", "item", lambda w: ["trend", str(w.bad_item)], BAD_JSON),
    Case("trend", "unreachable", "s3", _s3("trend"), REFUSED_CONN),
    # diff
    Case("diff", "not-found", "path", lambda w: ["diff", str(w.missing), str(w.good)], NOT_FOUND),
    Case(
        "diff", "not-a-checkpoint", "junk", lambda w: ["diff", str(w.junk), str(w.good)], NOT_CKPT
    ),
    Case("diff", "usage", "option", lambda w: ["diff", str(w.good), str(w.good), "-x"], NO_OPTION),
    Case(
        "diff",
        "usage",
        "tolerance",
        lambda w: ["diff", str(w.good), str(w.good), "--atol", "-1"],
        "must not be negative",
    ),
    Case(
        "diff",
        "invalid-metadata",
        "item",
        lambda w: ["diff", str(w.bad_item), str(w.good)],
        BAD_JSON,
    ),
    Case("diff", "unreachable", "s3", _s3("diff", "{good}"), REFUSED_CONN),
    # digest
    Case("digest", "not-found", "path", lambda w: ["digest", str(w.missing)], NOT_FOUND),
    Case("digest", "not-a-checkpoint", "junk", lambda w: ["digest", str(w.junk)], NOT_CKPT),
    Case("digest", "usage", "option", lambda w: ["digest", str(w.good), "--bogus"], NO_OPTION),
    Case("digest", "invalid-metadata", "item", lambda w: ["digest", str(w.bad_item)], BAD_JSON),
    Case("digest", "unreachable", "s3", _s3("digest"), REFUSED_CONN),
    # doctor
    Case(
        "doctor",
        "not-found",
        "path",
        lambda w: ["doctor", str(w.missing), "--like", str(w.good)],
        NOT_FOUND,
    ),
    Case(
        "doctor",
        "not-a-checkpoint",
        "junk",
        lambda w: ["doctor", str(w.junk), "--like", str(w.good)],
        NOT_CKPT,
    ),
    Case("doctor", "usage", "option", lambda w: ["doctor", str(w.good), "--bogus"], NO_OPTION),
    Case(
        "doctor",
        "usage",
        "no-target",
        lambda w: ["doctor", str(w.good)],
        "--target MODULE:FUNCTION or --like PATH",
    ),
    Case(
        "doctor",
        "invalid-metadata",
        "item",
        lambda w: ["doctor", str(w.bad_item), "--like", str(w.good)],
        BAD_JSON,
    ),
    Case(
        "doctor",
        "refused",
        "target",
        lambda w: ["doctor", str(w.good), "--target", "no_such_module_here:f"],
        "cannot import no_such_module_here",
    ),
    Case("doctor", "unreachable", "s3", _s3("doctor", "--like", "{good}"), REFUSED_CONN),
    # prune
    Case(
        "prune",
        "not-found",
        "path",
        lambda w: ["prune", str(w.missing), "--keep-last", "1", "--dry-run"],
        NOT_FOUND,
    ),
    Case(
        "prune",
        "not-a-checkpoint",
        "junk",
        lambda w: ["prune", str(w.junk), "--keep-last", "1", "--dry-run"],
        NOT_CKPT,
    ),
    Case(
        "prune",
        "usage",
        "option",
        lambda w: ["prune", str(w.good), "--keep-last", "1", "--bogus"],
        NO_OPTION,
    ),
    Case("prune", "usage", "no-rule", lambda w: ["prune", str(w.good)], "no retention rule"),
    Case(
        "prune",
        "invalid-metadata",
        "root",
        lambda w: ["prune", str(w.bad_root), "--keep-last", "1", "--dry-run"],
        BAD_JSON,
    ),
    Case("prune", "unreachable", "s3", _s3("prune", "--keep-last", "1"), REFUSED_CONN),
    Case(
        "prune",
        "refused",
        "no-confirmation",
        lambda w: ["prune", str(w.good), "--keep-last", "1"],
        "refusing to delete without confirmation",
    ),
    Case(
        "prune",
        "locked",
        "lock-held",
        lambda w: ["prune", str(w.good), "--keep-last", "1", "--yes"],
        LOCKED,
        lock=True,
    ),
    # reshard
    Case(
        "reshard",
        "not-found",
        "path",
        lambda w: ["reshard", str(w.missing), str(w.tmp / "out"), "--mesh", "data=1"],
        NOT_FOUND,
    ),
    Case(
        "reshard",
        "not-a-checkpoint",
        "junk",
        lambda w: ["reshard", str(w.junk), str(w.tmp / "out"), "--mesh", "data=1"],
        NOT_CKPT,
    ),
    Case(
        "reshard",
        "usage",
        "option",
        lambda w: ["reshard", str(w.good), str(w.tmp / "out"), "--mesh", "data=1", "--bogus"],
        NO_OPTION,
    ),
    Case(
        "reshard",
        "usage",
        "mesh",
        lambda w: ["reshard", str(w.good), str(w.tmp / "out"), "--mesh", "data=x"],
        "expected NAME=SIZE",
    ),
    Case(
        "reshard",
        "invalid-metadata",
        "item",
        lambda w: ["reshard", str(w.bad_item), str(w.tmp / "out"), "--mesh", "data=1"],
        BAD_JSON,
    ),
    Case(
        "reshard",
        "unreachable",
        "s3",
        _s3("reshard", "{tmp}/out", "--mesh", "data=1"),
        REFUSED_CONN,
    ),
    Case(
        "reshard",
        "refused",
        "step-exists",
        lambda w: ["reshard", str(w.good), str(w.taken), "--mesh", "data=1"],
        EXISTS,
    ),
    # export
    Case(
        "export",
        "not-found",
        "path",
        lambda w: ["export", str(w.missing), str(w.tmp / "x")],
        NOT_FOUND,
    ),
    Case(
        "export",
        "not-a-checkpoint",
        "junk",
        lambda w: ["export", str(w.junk), str(w.tmp / "x")],
        NOT_CKPT,
    ),
    Case(
        "export",
        "usage",
        "option",
        lambda w: ["export", str(w.good), str(w.tmp / "x"), "--bogus"],
        NO_OPTION,
    ),
    Case(
        "export",
        "invalid-metadata",
        "item",
        lambda w: ["export", str(w.bad_item), str(w.tmp / "x")],
        BAD_JSON,
    ),
    Case("export", "unreachable", "s3", _s3("export", "{tmp}/x"), REFUSED_CONN),
    Case(
        "export",
        "refused",
        "dtype",
        lambda w: ["export", str(w.good), str(w.tmp / "x"), "--dtype", "int3"],
        "exports cast floating leaves",
    ),
    # import
    Case(
        "import",
        "not-found",
        "path",
        lambda w: ["import", str(w.missing), str(w.tmp / "out")],
        NOT_FOUND,
    ),
    Case(
        "import",
        "invalid-metadata",
        "no-file",
        lambda w: ["import", str(w.junk), str(w.tmp / "out")],
        "no .safetensors file",
    ),
    Case(
        "import",
        "usage",
        "mesh",
        lambda w: ["import", str(w.junk), str(w.tmp / "out"), "--mesh", "data=x"],
        "expected NAME=SIZE",
    ),
    Case(
        "import",
        "refused",
        "step-exists",
        lambda w: ["import", _one_tensor_file(w), str(w.taken), "--step", "500"],
        EXISTS,
    ),
    Case(
        "reshard",
        "locked",
        "writer",
        lambda w: ["reshard", str(w.good), str(w.tmp / "claimed"), "--mesh", "data=1"],
        WRITER_LOCKED,
        write_lock=True,
    ),
    Case(
        "import",
        "locked",
        "writer",
        lambda w: ["import", _one_tensor_file(w), str(w.tmp / "claimed")],
        WRITER_LOCKED,
        write_lock=True,
    ),
    # migrate
    Case(
        "migrate",
        "not-found",
        "path",
        lambda w: ["migrate", str(w.missing), str(w.tmp / "out"), "--spec", str(w.spec)],
        NOT_FOUND,
    ),
    Case(
        "migrate",
        "not-a-checkpoint",
        "junk",
        lambda w: ["migrate", str(w.junk), str(w.tmp / "out"), "--spec", str(w.spec)],
        NOT_CKPT,
    ),
    Case(
        "migrate",
        "usage",
        "option",
        lambda w: ["migrate", str(w.good), str(w.tmp / "o"), "--spec", str(w.spec), "--bogus"],
        NO_OPTION,
    ),
    Case(
        "migrate",
        "usage",
        "target",
        lambda w: [
            "migrate",
            str(w.good),
            str(w.tmp / "out"),
            "--spec",
            str(w.spec),
            "--target",
            "nocolon",
        ],
        "expected MODULE:FUNCTION",
    ),
    Case(
        "migrate",
        "usage",
        "spec-pattern",
        lambda w: ["migrate", str(w.good), str(w.tmp / "o"), "--spec", _bad_pattern_spec(w)],
        "is not a valid pattern",
    ),
    Case(
        "migrate",
        "invalid-metadata",
        "item",
        lambda w: ["migrate", str(w.bad_item), str(w.tmp / "out"), "--spec", str(w.spec)],
        BAD_JSON,
    ),
    Case(
        "migrate",
        "unreachable",
        "s3",
        _s3("migrate", "{tmp}/out", "--spec", "{spec}"),
        REFUSED_CONN,
    ),
    Case(
        "migrate",
        "refused",
        "step-exists",
        lambda w: ["migrate", str(w.good), str(w.taken), "--spec", str(w.spec)],
        EXISTS,
    ),
    Case(
        "migrate",
        "locked",
        "writer",
        lambda w: ["migrate", str(w.good), str(w.tmp / "claimed"), "--spec", str(w.spec)],
        WRITER_LOCKED,
        write_lock=True,
    ),
    # average
    Case(
        "average",
        "not-found",
        "path",
        lambda w: ["average", str(w.missing), str(w.tmp / "out"), "--steps", "400,500"],
        NOT_FOUND,
    ),
    Case(
        "average",
        "not-found",
        "step",
        lambda w: ["average", str(w.good), str(w.tmp / "out"), "--steps", "400,7"],
        "step 7 not found",
    ),
    Case(
        "average",
        "not-a-checkpoint",
        "junk",
        lambda w: ["average", str(w.junk), str(w.tmp / "out"), "--steps", "400,500"],
        NOT_CKPT,
    ),
    Case(
        "average",
        "usage",
        "option",
        lambda w: ["average", str(w.good), str(w.tmp / "o"), "--steps", "400,500", "--bogus"],
        NO_OPTION,
    ),
    Case(
        "average",
        "usage",
        "weights",
        lambda w: [
            "average",
            str(w.good),
            str(w.tmp / "o"),
            "--steps",
            "400,500",
            "--weights",
            "1,-1",
        ],
        "is not a positive number",
    ),
    Case(
        "average",
        "invalid-metadata",
        "item",
        lambda w: ["average", str(w.bad_item), str(w.tmp / "out"), "--steps", "400,500"],
        BAD_JSON,
    ),
    Case(
        "average",
        "unreachable",
        "s3",
        _s3("average", "{tmp}/out", "--steps", "400,500"),
        REFUSED_CONN,
    ),
    Case(
        "average",
        "refused",
        "step-exists",
        lambda w: ["average", str(w.good), str(w.taken), "--steps", "400,500"],
        EXISTS,
    ),
    Case(
        "average",
        "locked",
        "writer",
        lambda w: ["average", str(w.good), str(w.tmp / "claimed"), "--steps", "400,500"],
        WRITER_LOCKED,
        write_lock=True,
    ),
    # cp
    Case("cp", "not-found", "path", lambda w: ["cp", str(w.missing), str(w.tmp / "x")], NOT_FOUND),
    Case(
        "cp",
        "not-found",
        "step",
        lambda w: ["cp", str(w.good), str(w.tmp / "x"), "--step", "7"],
        "not found",
    ),
    Case(
        "cp", "not-a-checkpoint", "junk", lambda w: ["cp", str(w.junk), str(w.tmp / "x")], NOT_CKPT
    ),
    Case(
        "cp",
        "usage",
        "option",
        lambda w: ["cp", str(w.good), str(w.tmp / "x"), "--bogus"],
        NO_OPTION,
    ),
    Case(
        "cp",
        "usage",
        "steps",
        lambda w: ["cp", str(w.good), str(w.tmp / "x"), "--steps", "5-1"],
        "is empty",
    ),
    Case(
        "cp",
        "invalid-metadata",
        "record",
        lambda w: ["cp", _damaged_record(w), str(w.tmp / "x"), "--verify"],
        BAD_JSON,
    ),
    Case("cp", "unreachable", "s3", _s3("cp", "{tmp}/out"), REFUSED_CONN),
    Case(
        "cp",
        "refused",
        "step-differs",
        lambda w: ["cp", str(w.good), _differing_step(w)],
        "already exists and differs",
    ),
    Case(
        "cp",
        "locked",
        "writer",
        lambda w: ["cp", str(w.good), str(w.tmp / "claimed")],
        WRITER_LOCKED,
        write_lock=True,
    ),
    # pin
    Case("pin", "not-found", "path", lambda w: ["pin", str(w.missing), "500"], NOT_FOUND),
    Case("pin", "not-found", "step", lambda w: ["pin", str(w.good), "7"], "not found"),
    Case("pin", "not-a-checkpoint", "junk", lambda w: ["pin", str(w.junk), "500"], NOT_CKPT),
    Case("pin", "usage", "step", lambda w: ["pin", str(w.good), "abc"], "valid int"),
    Case("pin", "usage", "option", lambda w: ["pin", str(w.good), "500", "--bogus"], NO_OPTION),
    Case("pin", "unreachable", "s3", _s3("pin", "500"), REFUSED_CONN),
    Case(
        "pin",
        "refused",
        "unfinished",
        lambda w: ["pin", str(w.with_tmp), "3"],
        "unfinished save",
    ),
    Case(
        "pin", "locked", "lock-held", lambda w: ["pin", str(w.good), "500"], BEING_PRUNED, lock=True
    ),
    # unpin
    Case("unpin", "not-found", "path", lambda w: ["unpin", str(w.missing), "500"], NOT_FOUND),
    Case("unpin", "not-found", "step", lambda w: ["unpin", str(w.good), "7"], "not found"),
    Case("unpin", "not-a-checkpoint", "junk", lambda w: ["unpin", str(w.junk), "500"], NOT_CKPT),
    Case("unpin", "usage", "step", lambda w: ["unpin", str(w.good), "x"], "valid int"),
    Case("unpin", "unreachable", "s3", _s3("unpin", "500"), REFUSED_CONN),
    Case(
        "unpin",
        "locked",
        "lock-held",
        lambda w: ["unpin", str(w.good), "500"],
        BEING_PRUNED,
        lock=True,
    ),
]


def registry_names() -> list[str]:
    """The registered commands, in the registry's order (what the matrix must cover)."""
    from ckpt_cli.commands import COMMANDS

    names = [c.name for c in COMMANDS]
    assert names, "the registry holds no command"
    return names


def coverage_gaps(
    command: str, not_applicable: dict[str, dict[str, str]], cases: list[Case] = CASES
) -> list[str]:
    """What the matrix lacks for ``command``: each error class with neither a case nor a reason
    it cannot arise, a class given both, a reason left empty; one line each, naming the fix."""
    covered = {c.error for c in cases if c.command == command}
    skipped = not_applicable.get(command, {})
    gaps = [
        f"ckpt {command}: no case provokes {error!r} (add a Case to tests/support/error_cases.py,"
        " or say why it cannot arise in test_json_errors.NOT_APPLICABLE)"
        for error in CLASSES
        if error not in covered and error not in skipped
    ]
    gaps += [
        f"ckpt {command}: {error!r} has a case and a reason it cannot arise"
        for error in sorted(covered & set(skipped))
    ]
    gaps += [
        f"ckpt {command}: {error!r} N/A without a reason"
        for error, why in skipped.items()
        if not why
    ]
    return gaps


@contextlib.contextmanager
def maybe_lock(case: Case, world: World) -> Iterator[None]:
    from ckpt_cli.core.storage import LocalLocation

    if case.write_lock:
        from ckpt_cli.core.write.claim import claim_root

        claimed = world.tmp / "claimed"
        claimed.mkdir(exist_ok=True)
        claim = claim_root(LocalLocation(str(claimed)), "reshard")
        try:
            yield
        finally:
            claim.release()
        return
    if not case.lock:
        yield
        return
    from ckpt_cli.core.prune.execute import prune_lock

    with prune_lock(LocalLocation(str(world.good))):
        yield
