"""Run a command with a 2-worker Dask cluster on 127.0.0.1 (free ports), then stop the cluster.

The command sees the scheduler's address in ``DASK_SCHEDULER_ADDRESS``, which
``ckpt ... --executor dask`` reads when no ``--scheduler`` is given:

    python examples/with_dask_cluster.py ckpt verify demo_runs/exp7 --deep --executor dask
"""

from __future__ import annotations

import os
import subprocess
import sys

from distributed import LocalCluster


def main() -> int:
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address="127.0.0.1:0",  # the scheduler serves HTTP anyway: on a free port
    ) as cluster:
        env = {**os.environ, "DASK_SCHEDULER_ADDRESS": cluster.scheduler_address}
        print(f"dask cluster at {cluster.scheduler_address} (2 worker processes)", flush=True)
        return subprocess.run(sys.argv[1:], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
