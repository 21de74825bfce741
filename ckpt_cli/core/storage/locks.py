"""Owner records for the locks ckpt takes on a root (``.ckpt-prune.lock``, ``.ckpt-write.lock``)
and the question every leftover raises: is its owner provably gone?

An owner is a command, a pid, a host, a start time, the host's boot id and the process's start
ticks (``/proc/PID/stat``): with them a pid that was reused is not taken for the owner.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ckpt_cli.core.storage.base import Location, Lock
from ckpt_cli.errors import CkptError


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Owner:
    command: str
    pid: int
    host: str
    since: str
    boot: str | None = None
    start: int | None = None

    @classmethod
    def me(cls, command: str) -> Owner:
        return cls(
            command,
            os.getpid(),
            socket.gethostname(),
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
            _boot_id(),
            _start_ticks(os.getpid()),
        )

    def to_text(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes) -> Owner | None:
        try:
            doc = json.loads(raw)
            return cls(
                str(doc["command"]),
                int(doc["pid"]),
                str(doc["host"]),
                str(doc["since"]),
                doc.get("boot"),
                doc.get("start"),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"{self.command} pid {self.pid} on {self.host}, since {self.since}"

    def is_this_process(self) -> bool:
        me = Owner.me(self.command)
        return (self.pid, self.host, self.start) == (me.pid, me.host, me.start)

    def provably_gone(self) -> bool:
        """True only when this host can tell for sure that the owner no longer runs."""
        if self.host != socket.gethostname():
            return False
        boot = _boot_id()
        if self.boot and boot and self.boot != boot:
            return True  # the machine rebooted since
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, someone else's
        return self.start is not None and _start_ticks(self.pid) not in (None, self.start)


def read_owner(loc: Location) -> Owner | None:
    try:
        return Owner.parse(loc.read_bytes(limit=4096))
    except CkptError:
        return None


def take_lock(
    lock_file: Location, command: str, *, record_required: bool = True
) -> tuple[Lock | None, Owner]:
    """Try the lock (``Location.try_lock``) recording this process as its owner."""
    owner = Owner.me(command)
    return lock_file.try_lock(owner.to_text(), record_required=record_required), owner


def holder_of(lock_file: Location) -> str:
    """Who holds a lock, for a message: 'pid N on HOST, since T' (older files: no command)."""
    try:
        doc = json.loads(lock_file.read_bytes(limit=4096))
        return f"pid {doc['pid']} on {doc['host']}, since {doc['since']}"
    except (CkptError, ValueError, KeyError, TypeError):
        return "holder unknown"


def holder_command(lock_file: Location, default: str) -> str:
    owner = read_owner(lock_file)
    return owner.command if owner is not None else default
