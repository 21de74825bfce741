"""One exception hierarchy for the whole tool, and the exit codes it maps to.

Every error formats its own one-line message and may carry a hint naming the next thing to try
(pypa/build style). ``app.main`` is the only place that turns them into stderr lines and exit codes.
Each class has a stable ``code``: with ``--json`` an error is the document
``{"schema_version", "ok": false, "error": {"code", "message", "hint"}}`` (``to_json``), and
scripts match on the code. A subclass's code wins over its base's (``locked`` is a refusal).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

EXIT_OK = 0
EXIT_PROBLEMS = 1  # a check found problems (verify, diff)
EXIT_USAGE = 2  # bad command line
EXIT_FAILURE = 3  # expected failure: not a checkpoint, unreadable, refused
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C); SIGTERM exits 143: 128 + the signal, as shells do
EXIT_BUG = 70  # anything unexpected: a bug in ckpt

#: Codes of failures that are not CkptErrors.
CODE_INTERNAL = "internal"
CODE_INTERRUPTED = "interrupted"
CODE_USAGE = "usage"


class ErrorJSON(TypedDict):
    """What went wrong: a stable code (docs/json.md), the one-line message, the next step."""

    code: str
    message: str
    hint: str | None


class ErrorDocumentJSON(TypedDict):
    """A command that failed before it had a result (exit 2, 3, 70, 130 or 143)."""

    schema_version: int
    ok: Literal[False]
    error: ErrorJSON


class CkptError(Exception):
    """Base of every error ckpt reports to the user."""

    exit_code = EXIT_FAILURE
    code = "error"

    def __init__(
        self, message: str, *, hint: str | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: The JSON document of what the command computed before it failed (a refused prune's
        #: plan): with --json the error is reported inside that document.
        self.result = result

    def to_json(self) -> ErrorJSON:
        return {"code": self.code, "message": self.message, "hint": self.hint}

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message


class UsageError(CkptError, ValueError):
    """The command line asks for something impossible (conflicting or malformed options)."""

    exit_code = EXIT_USAGE
    code = CODE_USAGE


class SeveralItemsError(UsageError):
    """A step holds several items and none is the obvious one to read; ``items`` names them
    (``inspect`` then shows them all)."""

    def __init__(self, message: str, *, hint: str | None = None, items: tuple[str, ...] = ()):
        super().__init__(message, hint=hint)
        self.items = items


class OptionValueError(CkptError):
    """An option value its parser rejects (a size that is no size), raised while the command
    line is parsed. Deliberately not a ``ValueError``: Click's type conversion would turn that
    into a usage message of its own, and ckpt reports every error at its one boundary."""

    exit_code = EXIT_USAGE
    code = CODE_USAGE


class NotFoundError(CkptError, FileNotFoundError):
    """A path, step or item that does not exist."""

    code = "not-found"


class NotACheckpointError(CkptError, ValueError):
    """A path that exists but holds no Orbax checkpoint we recognise."""

    code = "not-a-checkpoint"


class InvalidMetadataError(CkptError, ValueError):
    """A metadata file that is damaged, truncated or describes something impossible."""

    code = "invalid-metadata"


#: What to do when the file system refuses a write for a reason of its own (not a bug in ckpt).
_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space there, or write elsewhere, and run again",
    errno.EDQUOT: "the disk quota is used up: free space there, or write elsewhere, and run again",
    errno.EROFS: "that file system is mounted read-only: write elsewhere",
    errno.EACCES: "check the permissions of that path, or use another one",
    errno.EPERM: "check the permissions of that path, or use another one",
}
#: How a message names the system's error: TensorStore's, and Python's (in the texts
#: ``shutil.Error`` collects).
_ERRNO_IN_TEXT = re.compile(r"\[os_error_code='?(\d+)'?\]|\[Errno (\d+)\]")


def os_errno(e: BaseException) -> int | None:
    """The system's error number behind ``e``: an ``OSError``'s own, or the first one its
    message carries (``[os_error_code='28']``, ``[Errno 28]``), or None."""
    if isinstance(e, OSError) and e.errno:
        return e.errno
    found = _ERRNO_IN_TEXT.search(str(e))
    return int(found.group(1) or found.group(2)) if found else None


class StorageError(CkptError, OSError):
    """The storage under a checkpoint failed to list, read or write."""

    code = "storage-error"

    @classmethod
    def from_error(cls, what: str, e: BaseException, cause: str | None = None) -> StorageError:
        """``WHAT: <why>``. A file system's refusal (a full disk, a read-only mount, no
        permission), told by an ``OSError`` or in a TensorStore message, is said in the
        system's words with the next thing to try; otherwise ``cause`` (default: the error's
        first line) is the why."""
        code = os_errno(e)
        if code is not None and code in _OS_HINTS:
            return cls(f"{what}: {os.strerror(code)}", hint=_OS_HINTS[code])
        if isinstance(e, OSError) and e.strerror:
            return cls(f"{what}: {e.strerror}")
        return cls(f"{what}: {cause or first_line(e)}")


def storage_refusal(e: BaseException) -> StorageError | None:
    """An error no writer mapped that is still the file system's refusal (a full disk, a
    read-only mount, no permission): a storage error, never a bug in ckpt. Else None."""
    code = os_errno(e)
    if code is None or code not in _OS_HINTS:
        return None
    where = getattr(e, "filename", None)
    return StorageError.from_error(
        f"cannot access {where}" if where else "a file system operation failed", e
    )


class UnreachableError(StorageError):
    """The store itself cannot be reached (connection refused, no answer): nothing more can be
    done there, so operations stop at once instead of failing entry by entry."""

    code = "unreachable"


class UnsupportedError(CkptError, NotImplementedError):
    """A layout or storage scheme this version does not handle."""

    code = "unsupported"


#: The top-level modules the ``orbax`` extra installs: a path that needs one (``--target``
#: calls the user's JAX code) says so through ``require_orbax_extra``, never a bare
#: ``No module named 'jax'`` (exit 70).
ORBAX_EXTRA_MODULES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax"})
ORBAX_EXTRA_HINT = "pip install 'ckpt-orbax[orbax]'"


def missing_extra_module(e: ImportError) -> str | None:
    """The module of the ``orbax`` extra whose absence ``e`` reports, or None."""
    name = (e.name or "").split(".")[0]
    return name if name in ORBAX_EXTRA_MODULES else None


def require_orbax_extra(what: str, *modules: str) -> None:
    """Import ``modules`` (default: jax), so that the caller's own ``import jax`` that follows
    finds it loaded. One of the ``orbax`` extra's missing, or failing to import: an
    ``UnsupportedError`` (exit 3) saying that ``what`` needs it and how to install it."""
    import importlib

    for module in modules or ("jax",):
        try:
            importlib.import_module(module)
        except ImportError as e:
            missing = missing_extra_module(e)
            if missing is not None:
                why = f"{missing}, which is not installed"
            elif module.split(".")[0] in ORBAX_EXTRA_MODULES:  # installed, but broken
                why = f"{module}, which cannot be imported ({first_line(e)})"
            else:
                raise
            raise UnsupportedError(f"{what} needs {why}", hint=ORBAX_EXTRA_HINT) from None


class RefusedError(CkptError):
    """A request ckpt will not carry out as asked: no confirmation, an unsafe change, or a plan
    that cannot work."""

    code = "refused"


class NonFiniteError(RefusedError):
    """A writer met NaN/Inf in the values it was to write (exit 3, nothing committed): a run
    that diverged is not silently averaged, exported, migrated or resharded
    (``--allow-nonfinite`` writes them as they are)."""

    code = "nonfinite"


class DigestMismatchError(CkptError):
    """A check found data that is not what its recorded digests say (``cp --verify``): exit 1,
    as a check that found problems."""

    exit_code = EXIT_PROBLEMS
    code = "digest-mismatch"


class SourceDigestError(CkptError):
    """A writer (``reshard``, ``migrate``, ``import``) computed the ``ld1`` of what it wrote and
    it differs from the digest carried from the source: the source is damaged, nothing is
    committed (exit 3)."""

    code = "source-digest-mismatch"


class LockedError(RefusedError):
    """Another ckpt process holds the lock of the same root."""

    code = "locked"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (TensorStore's run to many), else its type."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class InvalidSafetensorsError(InvalidMetadataError):
    """A safetensors file or index that breaks the format: refused before anything is written."""


class Interrupted(BaseException):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM (``kill``, ``timeout``, a scheduler).

    Raised by ``app.main``'s signal handler in the main thread, wherever it is (inside a
    TensorStore ``Future.result()`` too: TensorStore runs Python's signal handlers while it
    waits). A ``BaseException``, so the ``except Exception`` blocks that turn a failed read into
    a finding about the data let it through, while ``finally`` blocks clean up on its way.
    """

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
