"""Benchmark ``ckpt ls`` and ``ckpt inspect`` against the Orbax API route a user has today.

Run from the repository root::

    .venv/bin/python bench/bench_ls_inspect.py [--steps 1000] [--leaves 10000]
                                               [--workdir DIR] [--repeat 3]

Checkpoints (built once with REAL Orbax and cached in the work directory, default
``bench/out/ls_inspect/``, which is git-ignored; delete a directory to rebuild it):

``root_<steps>steps/``
    A CheckpointManager root of ``--steps`` steps, ``0`` .. ``steps-1``. Saving that many steps
    with Orbax is slow, so only the first ``REAL_STEPS`` are saved by Orbax
    (``CheckpointManager`` with ``best_fn`` so that every step has a ``metrics`` item, a small
    ``StandardSave`` tree of a few leaves); every further step is a ``shutil.copytree`` of the last
    real step directory under the new step name, with ``init_timestamp_nsecs`` and
    ``commit_timestamp_nsecs`` of its ``_CHECKPOINT_METADATA`` moved 1 ms apart per step and its
    ``metrics/metrics`` loss rewritten, so that no two steps look alike. Orbax's own
    ``CheckpointManager(root).all_steps()`` is checked to return every step.
``item_<leaves>leaves/``
    A CheckpointManager root with one step (0) whose ``default`` item is a ``StandardSave`` of
    exactly ``--leaves`` small jax arrays: ``params.layers.layer_<i>.{kernel,bias}``, Adam-like
    ``opt_state.{mu,nu}`` mirrors of ``params``, ``step``, ``rng`` and, to round the count,
    ``extras.buf_<j>``.

Every timed command runs ``--repeat`` times in a fresh subprocess (import time counts, as a user
at a shell sees it) after one untimed warm-up run whose output is checked; the median is
reported. stdout goes to /dev/null in timed runs. The Orbax routes (``ORBAX_*`` below) are:

startup
    ``python -c "import orbax.checkpoint"``: the floor under every Orbax route.
ls (all_steps)
    ``ocp.CheckpointManager(root, options=CheckpointManagerOptions(read_only=True))`` (its
    constructor already reads every step's ``_CHECKPOINT_METADATA`` and ``metrics`` item), then
    ``all_steps()`` and ``latest_step()``, one line printed per step.
ls (+metadata)
    The same plus ``mgr.metadata(step)`` for every step, printing step, commit timestamp, item
    names and metrics: what ``ckpt ls`` shows apart from size and storage format, which Orbax's
    API does not expose. No item handler is registered, so no item tree is read (Orbax logs a
    warning per step, as a user would see).
inspect
    ``ocp.CheckpointManager(root, item_handlers=ocp.StandardCheckpointHandler(),
    options=read_only)`` (without a handler ``item_metadata`` returns None), ``latest_step()``,
    ``mgr.item_metadata(step)``, then ``jax.tree_util.tree_flatten_with_path`` over the result,
    printing each leaf's key path, dtype and shape.

It also checks, in a subprocess that runs ``ckpt_cli.app.main`` and then reads ``sys.modules``,
that ``ckpt --help``, ``ls`` and ``inspect`` import none of jax, jaxlib, orbax, flax or optax.
Results: a table on stdout and the same as JSON in ``bench/out/ls_inspect.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = REPO / "bench" / "out" / "ls_inspect"
RESULT_JSON = REPO / "bench" / "out" / "ls_inspect.json"
PYTHON = sys.executable
CKPT = str(Path(sys.executable).with_name("ckpt"))
REAL_STEPS = 5
FORBIDDEN_MODULES = ("jax", "jaxlib", "orbax", "flax", "optax")
MODULES_MARKER = "BENCH_LOADED_MODULES "

# Validates a warm-up run's stdout; raises SystemExit when it is wrong.
Check = Callable[[str], None]

ORBAX_IMPORT = "import orbax.checkpoint"

ORBAX_LS_STEPS = """\
import sys
import orbax.checkpoint as ocp

mgr = ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(read_only=True))
print("latest", mgr.latest_step())
for step in mgr.all_steps():
    print(step)
mgr.close()
"""

ORBAX_LS_METADATA = """\
import sys
import orbax.checkpoint as ocp

mgr = ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(read_only=True))
print("latest", mgr.latest_step())
for step in mgr.all_steps():
    md = mgr.metadata(step)
    print(step, md.commit_timestamp_nsecs, sorted(md.item_handlers or {}), md.metrics)
mgr.close()
"""

ORBAX_INSPECT = """\
import sys
import jax
import orbax.checkpoint as ocp

mgr = ocp.CheckpointManager(sys.argv[1], item_handlers=ocp.StandardCheckpointHandler(),
                            options=ocp.CheckpointManagerOptions(read_only=True))
tree = mgr.item_metadata(mgr.latest_step())
for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    print(jax.tree_util.keystr(path), leaf.dtype, leaf.shape)
mgr.close()
"""

# Runs the CLI in-process, then reports which forbidden top-level packages it imported.
IMPORT_PROBE = f"""\
import json
import sys

from ckpt_cli.app import main

sys.argv = ["ckpt", *sys.argv[1:]]
code = 0
try:
    main()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else int(e.code is not None)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN_MODULES!r})
sys.stderr.write("\\n{MODULES_MARKER}" + json.dumps(loaded) + "\\n")
sys.exit(code)
"""


# --------------------------------------------------------------------------- building


def _loss(step: int) -> float:
    return round(2.0 / (1 + step) + 0.01 * (step % 7), 6)


def _small_tree(step: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(step)
    return {
        "params": {
            "dense": {
                "kernel": rng.standard_normal((4, 4), dtype=np.float32),
                "bias": np.zeros(4, np.float32),
            }
        },
        "step": np.int32(step),
    }


def build_root(path: Path, steps: int) -> None:
    """A CheckpointManager root of ``steps`` steps: REAL_STEPS saved by Orbax, the rest copies."""
    import orbax.checkpoint as ocp

    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    real = min(steps, REAL_STEPS)
    options = ocp.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    mgr = ocp.CheckpointManager(partial, options=options)
    for step in range(real):
        mgr.save(step, args=ocp.args.StandardSave(_small_tree(step)), metrics={"loss": _loss(step)})
    mgr.wait_until_finished()
    mgr.close()
    template = partial / str(real - 1)
    step_meta = json.loads((template / "_CHECKPOINT_METADATA").read_text())
    for step in range(real, steps):
        dst = partial / str(step)
        shutil.copytree(template, dst)
        offset = (step - real + 1) * 1_000_000  # 1 ms later per step
        patched = {
            **step_meta,
            "init_timestamp_nsecs": step_meta["init_timestamp_nsecs"] + offset,
            "commit_timestamp_nsecs": step_meta["commit_timestamp_nsecs"] + offset,
        }
        (dst / "_CHECKPOINT_METADATA").write_text(json.dumps(patched))
        (dst / "metrics" / "metrics").write_text(json.dumps({"loss": _loss(step)}))
    reader = ocp.CheckpointManager(partial, options=ocp.CheckpointManagerOptions(read_only=True))
    found = list(reader.all_steps())
    reader.close()
    if found != list(range(steps)):
        raise SystemExit(f"Orbax sees {len(found)} steps in {partial}, expected {steps}")
    partial.rename(path)


def _big_tree(leaves: int) -> dict[str, Any]:
    """Exactly ``leaves`` small arrays in a params / optimizer-state shaped tree."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_layers = (leaves - 2) // 6
    params = {
        "layers": {
            f"layer_{i}": {
                "kernel": rng.standard_normal((8, 8), dtype=np.float32),
                "bias": np.zeros(8, np.float32),
            }
            for i in range(n_layers)
        }
    }

    def zeros() -> dict[str, Any]:
        return {
            "layers": {
                name: {k: np.zeros_like(v) for k, v in layer.items()}
                for name, layer in params["layers"].items()
            }
        }

    tree: dict[str, Any] = {
        "params": params,
        "opt_state": {"mu": zeros(), "nu": zeros()},
        "step": np.int32(1000),
        "rng": np.array([0, 42], np.uint32),
    }
    extras = leaves - 2 - 6 * n_layers
    if extras:
        tree["extras"] = {f"buf_{j}": np.zeros(4, np.float32) for j in range(extras)}
    return tree


def build_item(path: Path, leaves: int) -> None:
    """A CheckpointManager root with one step whose item holds ``leaves`` jax arrays."""
    import jax
    import orbax.checkpoint as ocp

    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tree = jax.device_put(_big_tree(leaves))
    if len(jax.tree.leaves(tree)) != leaves:
        raise SystemExit(f"built a tree of {len(jax.tree.leaves(tree))} leaves, not {leaves}")
    mgr = ocp.CheckpointManager(partial)
    mgr.save(0, args=ocp.args.StandardSave(tree))
    mgr.wait_until_finished()
    mgr.close()
    partial.rename(path)


def ensure(path: Path, what: str, build: Callable[[Path, int], None], size: int) -> Path:
    if path.is_dir():
        print(f"using cached {what}: {path}", file=sys.stderr)
        return path
    print(f"building {what} with Orbax: {path} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    build(path, size)
    print(f"  built in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Timing:
    median: float
    samples: list[float]


def _run(cmd: list[str], capture: bool) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-5:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc


def measure(cmd: list[str], repeat: int, check: Check | None = None) -> Timing:
    """Median wall time of ``cmd`` over ``repeat`` fresh runs, after one checked warm-up run."""
    warm = _run(cmd, capture=True)
    if check is not None:
        check(warm.stdout)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        _run(cmd, capture=False)
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), samples)


def _expect(what: str, got: int, want: int) -> None:
    if got != want:
        raise SystemExit(f"{what}: got {got}, expected {want}")


def check_ckpt_ls(steps: int) -> Check:
    def check(out: str) -> None:
        doc = json.loads(out)
        _expect("ckpt ls: steps", len(doc["steps"]), steps)
        _expect(
            "ckpt ls: committed steps", sum(s["status"] == "committed" for s in doc["steps"]), steps
        )
        _expect("ckpt ls: latest step", doc["latest_step"], steps - 1)

    return check


def check_ckpt_inspect(leaves: int) -> Check:
    def check(out: str) -> None:
        _expect("ckpt inspect: leaves", json.loads(out)["totals"]["leaves"], leaves)

    return check


def check_orbax_ls(steps: int) -> Check:
    def check(out: str) -> None:
        lines = out.splitlines()
        _expect("orbax ls: latest step", int(lines[0].split()[1]), steps - 1)
        _expect("orbax ls: steps", len(lines) - 1, steps)

    return check


def check_orbax_inspect(leaves: int) -> Check:
    def check(out: str) -> None:
        _expect("orbax inspect: leaves", len(out.splitlines()), leaves)

    return check


def forbidden_imports(args: list[str]) -> list[str]:
    """Forbidden packages imported by ``ckpt ARGS``, run in-process in a fresh interpreter."""
    proc = subprocess.run(
        [PYTHON, "-c", IMPORT_PROBE, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    for line in reversed(proc.stderr.splitlines()):
        if line.startswith(MODULES_MARKER):
            loaded: list[str] = json.loads(line[len(MODULES_MARKER) :])
            return loaded
    raise SystemExit(f"import probe of ckpt {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


@dataclass(frozen=True)
class Row:
    operation: str
    ckpt_command: str
    orbax_route: str
    ckpt: Timing
    orbax: Timing

    @property
    def ratio(self) -> float:
        return self.orbax.median / self.ckpt.median

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "ckpt_command": self.ckpt_command,
            "orbax_route": self.orbax_route,
            "ckpt_s": round(self.ckpt.median, 4),
            "orbax_s": round(self.orbax.median, 4),
            "ratio_orbax_over_ckpt": round(self.ratio, 2),
            "ckpt_samples_s": [round(s, 4) for s in self.ckpt.samples],
            "orbax_samples_s": [round(s, 4) for s in self.orbax.samples],
        }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def print_table(rows: list[Row]) -> None:
    width = max(len(r.operation) for r in rows)
    print(f"{'operation':<{width}}  {'ckpt s':>8}  {'orbax s':>8}  {'orbax/ckpt':>10}")
    for r in rows:
        print(
            f"{r.operation:<{width}}  {r.ckpt.median:>8.3f}  {r.orbax.median:>8.3f}  "
            f"{r.ratio:>9.1f}x"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps in the ls root")
    parser.add_argument("--leaves", type=int, default=10000, help="leaves in the inspect item")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help="where the checkpoints are built and cached",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per command")
    args = parser.parse_args()
    if args.steps < 1 or args.leaves < 2 or args.repeat < 1:
        parser.error("need --steps >= 1, --leaves >= 2 and --repeat >= 1")
    return args


def main() -> None:
    args = parse_args()
    if not os.access(CKPT, os.X_OK):
        raise SystemExit(f"{CKPT} not found: install ckpt-orbax into this interpreter's venv")
    args.workdir.mkdir(parents=True, exist_ok=True)
    root = str(
        ensure(
            args.workdir / f"root_{args.steps}steps",
            f"a root of {args.steps} steps",
            build_root,
            args.steps,
        )
    )
    item = str(
        ensure(
            args.workdir / f"item_{args.leaves}leaves",
            f"an item of {args.leaves} leaves",
            build_item,
            args.leaves,
        )
    )

    imports = {
        " ".join(a): forbidden_imports(a)
        for a in (["--help"], ["ls", root, "--json"], ["inspect", item, "--json"])
    }
    for command, loaded in imports.items():
        print(
            f"ckpt {command}: imports of {'/'.join(FORBIDDEN_MODULES)}: "
            f"{', '.join(loaded) if loaded else 'none'}",
            file=sys.stderr,
        )

    n = args.repeat
    print(f"timing ({n} runs each after a warm-up) ...", file=sys.stderr, flush=True)
    ls_ckpt = measure([CKPT, "ls", root, "--json"], n, check_ckpt_ls(args.steps))
    inspect_ckpt = measure([CKPT, "inspect", item, "--json"], n, check_ckpt_inspect(args.leaves))
    rows = [
        Row(
            "startup: ckpt --help",
            "ckpt --help",
            "python -c 'import orbax.checkpoint'",
            measure([CKPT, "--help"], n),
            measure([PYTHON, "-c", ORBAX_IMPORT], n),
        ),
        Row(
            f"ls {args.steps} steps (orbax: all_steps)",
            "ckpt ls ROOT --json",
            ORBAX_LS_STEPS,
            ls_ckpt,
            measure([PYTHON, "-c", ORBAX_LS_STEPS, root], n, check_orbax_ls(args.steps)),
        ),
        Row(
            f"ls {args.steps} steps (orbax: +metadata)",
            "ckpt ls ROOT --json",
            ORBAX_LS_METADATA,
            ls_ckpt,
            measure([PYTHON, "-c", ORBAX_LS_METADATA, root], n, check_orbax_ls(args.steps)),
        ),
        Row(
            f"inspect {args.leaves} leaves",
            "ckpt inspect ITEMROOT --json",
            ORBAX_INSPECT,
            inspect_ckpt,
            measure([PYTHON, "-c", ORBAX_INSPECT, item], n, check_orbax_inspect(args.leaves)),
        ),
    ]

    print_table(rows)
    RESULT_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULT_JSON.write_text(
        json.dumps(
            {
                "steps": args.steps,
                "leaves": args.leaves,
                "repeat": n,
                "root": root,
                "item": item,
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                },
                "versions": {
                    d: _version(d) for d in ("ckpt-orbax", "orbax-checkpoint", "jax", "tensorstore")
                },
                "forbidden_imports": imports,
                "rows": [r.to_json() for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULT_JSON}", file=sys.stderr)
    if any(imports.values()):
        raise SystemExit("ckpt imported jax/orbax: see above")


if __name__ == "__main__":
    main()
