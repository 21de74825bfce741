"""A local Dask cluster for the scale-out tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def local_cluster() -> Iterator[Any]:
    """A 2-worker Dask cluster on 127.0.0.1 (processes, one thread each, HTTP on a free port, never
    the default 8787 another test's cluster may hold under `-n 2`). Start it
    after the environment the workers need is set: they inherit it."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # the scheduler serves HTTP anyway: on a free port
        worker_dashboard_address=None,
    ) as cluster:
        yield cluster
