"""The compiled kernels (``ckpt_cli/_kernels.c``, built at install, optional), loaded with ctypes.

A kernel is plain C with no Python API: ctypes holds no GIL during the call, so threads run it
at once. Where the library was not built (no compiler at install), cannot be loaded, or
``CKPT_KERNELS=0`` is set, ``function`` returns None and the caller runs numpy, with the same
results (each kernel's tests say how close).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
from pathlib import Path
from typing import Any

_NAME = "_kernels"


@functools.cache
def _library(path: str) -> Any:
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def function(name: str, argtypes: list[Any], restype: Any = None) -> Any:
    """The C function ``name`` with its argument types set, or None (not built, not loadable,
    not in this build, or turned off with ``CKPT_KERNELS=0``)."""
    if os.environ.get("CKPT_KERNELS") == "0":
        return None
    package = Path(__file__).resolve().parents[1]  # ckpt_cli/
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package / f"{_NAME}{suffix}"
        if not path.is_file():
            continue
        lib = _library(str(path))
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is None:
            return None
        fn.argtypes = argtypes
        fn.restype = restype
        return fn
    return None
