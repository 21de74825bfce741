"""Write docs/how-to/img/trend-page.png: the page ``ckpt trend --html`` writes for a
real training run that diverged (tests/support/trend_runs.py: a layer frozen by the optimizer's
mask, a gate kept at zero, a NaN put into ``params.Dense_0.kernel`` at step 5), as headless
Chromium from the system packages draws it (tests/support/browser.py; ``make browser`` installs
it).

Run from the repository root::

    python docs/gen_trend_page.py

It trains the run (about 15 s), writes the page with ``python -m ckpt_cli trend runs/exp7 --html``
in a temporary directory and screenshots
it whole, 1100 x 2450 pixels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "how-to" / "img" / "trend-page.png"
WIDTH, HEIGHT = 1100, 2450


def main() -> None:
    sys.path.insert(0, str(REPO))
    from tests.support import browser
    from tests.support.trend_runs import NAN_STEP, train

    # A fixed directory: the page names its root, and the picture should not change with it.
    work = Path(tempfile.gettempdir()) / "ckpt-trend-page"
    shutil.rmtree(work, ignore_errors=True)
    try:
        train(work / "runs" / "exp7", NAN_STEP)
        subprocess.run(
            [sys.executable, "-m", "ckpt_cli", "trend", "runs/exp7", "--html", "trend.html"],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        OUT.parent.mkdir(parents=True, exist_ok=True)
        browser.screenshot(work / "trend.html", OUT, work, WIDTH, HEIGHT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {OUT.relative_to(REPO)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
