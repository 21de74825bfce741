"""Where every thread of one ckpt command spends its time: its Python frames sampled.

Run from the repository root (any machine, the TPU host too)::

    .venv/bin/python bench/profile_threads.py migrate SRC OUT --spec cast.yaml
    PROF_MS=2 PROF_TOP=20 .venv/bin/python bench/profile_threads.py verify SRC --deep

Runs ``ckpt ARGS`` in this process with a thread that samples the Python frames of every other
thread each ``PROF_MS`` ms (5), and prints to stderr, per group of threads (a pool's threads
share their name's prefix: ``ckpt-read``, ``ckpt-stream``, ``MainThread``): its samples, the
innermost frames seen in at least 1 % of them, and its ``PROF_TOP`` (12) most frequent ckpt
frames (the innermost frame in ``ckpt_cli``: where ckpt waits on TensorStore, numpy or a
future). Then wall, user and system CPU, peak RSS and the command's exit code.

A sample needs the GIL, so threads busy in Python or holding the GIL are seen less often than
their time: compare the shares of a group, not absolute seconds. ``thread.py:_worker`` is a
pool thread with nothing to do. TensorStore's own threads are not Python threads and do not
show; the main thread waiting on their futures does. The sampled profile of a sharded
``migrate`` on the 13-core host found its read pool idle 45 % of the time while each block's
chunks were decoded one after another (``docs/explanation/performance.md``).
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import threading
import time
from types import FrameType
from typing import TextIO

PERIOD = float(os.environ.get("PROF_MS", "5")) / 1000
TOP = int(os.environ.get("PROF_TOP", "12"))


def group(name: str) -> str:
    """A pool thread's name without its number (``ckpt-read_3`` -> ``ckpt-read``)."""
    return name.rsplit("_", 1)[0] if name[-1:].isdigit() and "_" in name else name


def where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename.split('ckpt_cli/')[-1]}:{code.co_name}:{frame.f_lineno}"


class Sampler:
    """Counts, per thread group, the innermost frame and the innermost ckpt frame."""

    def __init__(self) -> None:
        self.samples: collections.Counter[str] = collections.Counter()
        self.inner: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ckpt: collections.Counter[tuple[str, str]] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(PERIOD):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, top in sys._current_frames().items():
                if ident != me:
                    self.take(group(names.get(ident, "?")), top)

    def take(self, name: str, top: FrameType) -> None:
        self.samples[name] += 1
        self.inner[name, where(top)] += 1
        frame: FrameType | None = top
        while frame is not None and "ckpt_cli" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None:
            self.ckpt[name, where(frame)] += 1

    def report(self, out: TextIO) -> None:
        for name, n in self.samples.most_common():
            print(f"== {name}: {n} samples ({n * PERIOD:.1f} thread-s sampled)", file=out)
            for (g, at), c in self.inner.most_common():
                if g == name and c >= n / 100:
                    print(f"   inner {c:6d} {at}", file=out)
            ours = [(at, c) for (g, at), c in self.ckpt.most_common() if g == name][:TOP]
            for at, c in ours:
                print(f"   ckpt  {c:6d} {at}", file=out)


def main() -> int:
    sampler = Sampler()
    sampler.thread.start()
    started = time.perf_counter()
    sys.argv = ["ckpt", *sys.argv[1:]]
    code: object = 0
    try:
        from ckpt_cli.app import main as ckpt_main

        ckpt_main()
    except SystemExit as e:
        code = e.code
    wall = time.perf_counter() - started
    sampler.stop.set()
    sampler.thread.join()
    sampler.report(sys.stderr)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"wall {wall:.2f} s, user {ru.ru_utime:.2f} s, system {ru.ru_stime:.2f} s, "
        f"peak RSS {ru.ru_maxrss // 1024} MiB, exit {code}",
        file=sys.stderr,
    )
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main())
