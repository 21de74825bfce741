"""``browser``: a page opened in headless Chromium from the system packages (Debian's
``chromium``, which ``make browser`` installs when it is missing): the DOM once the page has
loaded, the console messages it logged, the requests it made to the network (from Chromium's net
log), and a screenshot decoded to pixels.

Chromium itself asks Google's servers for updates and accounts whatever its flags say; those
requests are the browser's, not the page's. A request made for a page opened from a file has the
page's site, ``file://``, in its network isolation key: those are the page's requests. Every
host name resolves to nothing (``--host-resolver-rules``), so nothing leaves the machine.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

#: How long one Chromium run may take (it takes about a second).
TIMEOUT_S = 120


@dataclass(frozen=True)
class Visit:
    dom: str  # the serialized DOM after the page loaded (--dump-dom)
    console: list[str]  # console messages and uncaught errors, as Chromium logs them
    requests: list[str]  # URLs the page asked the network stack for


def chromium() -> str:
    """The system's Chromium; a test that needs it fails (never skips) without it."""
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: run `make browser` (Debian's chromium package)")
    return path


def _argv(profile: Path) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def visit(page: Path, work: Path) -> Visit:
    """Open ``page`` (a file) in Chromium; ``work`` holds its profile and net log."""
    net = work / "netlog.json"
    r = _run(
        [
            *_argv(work / "profile-visit"),
            "--enable-logging=stderr",
            "--v=0",
            f"--log-net-log={net}",
            "--dump-dom",
            page.absolute().as_uri(),
        ]
    )
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    return Visit(r.stdout, console, page_requests(net))


def page_requests(netlog: Path) -> list[str]:
    """The URLs of the requests a page opened from a file made (see the module's docstring)."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    jobs = [e.get("params", {}) for e in log["events"] if e["type"] == start]
    assert jobs, "the net log holds no request at all: is it Chromium's net log?"
    return [p["url"] for p in jobs if p.get("network_isolation_key", "").startswith("file://")]


def screenshot(page: Path, png: Path, work: Path, width: int, height: int) -> None:
    """``page`` as a ``width`` x ``height`` PNG at ``png`` (the top of the page)."""
    _run(
        [
            *_argv(work / "profile-shot"),
            f"--window-size={width},{height}",
            f"--screenshot={png.absolute()}",
            page.absolute().as_uri(),
        ]
    )
    assert png.stat().st_size > 0


def count_pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixels of an 8-bit RGB or RGBA PNG (Chromium's screenshots) are exactly ``rgb``."""
    width, channels, rows = _decode(png.read_bytes())
    want = bytes(rgb)
    return sum(
        1 for row in rows for x in range(0, width * channels, channels) if row[x : x + 3] == want
    )


def _decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, channels, rows) of a non-interlaced 8-bit RGB/RGBA PNG, rows unfiltered."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], b""
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + size
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        _unfilter(kind, line, prev, bpp)
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        return
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prev[i]
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            corner = prev[i - bpp] if i >= bpp else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
            line[i] = (line[i] + pred) & 0xFF
        else:
            raise AssertionError(f"PNG filter type {kind}")
