"""Benchmark ``ckpt verify --deep`` of a Hugging Face folder against the route a user has today,
same run.

Run from the repository root::

    .venv/bin/python bench/bench_verify_safetensors.py              # 1 GiB in 2 shards
    .venv/bin/python bench/bench_verify_safetensors.py --mib 256 --shards 4

The folder is written by the ``safetensors`` library (``save_file``: float32 and float16
tensors of 64 MiB at most, an index as transformers writes it). Not bfloat16: the numpy route
cannot read it (``safetensors.numpy.load_file`` raises "data type 'bfloat16' not understood"),
which ckpt reads through ml_dtypes. Contenders, each in a fresh
process (wall time, CPU time = user + system, peak RSS of that process):

ckpt verify --deep
    headers, index, every tensor read in blocks of 32 MiB: NaN/Inf counts and ``ld1``.
numpy script (today)
    ``safetensors.numpy.load_file`` of each shard, then ``np.isnan``/``np.isinf`` of every
    tensor (a whole shard in memory at once; no digest, no structure check).

Results: a table on stdout and JSON in ``bench/out/verify_safetensors.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import REPO, run_rss

_TODAY = """
import sys, numpy as np
from safetensors.numpy import load_file
bad = 0
for path in sys.argv[1:]:
    for name, x in load_file(path).items():
        if x.dtype.kind == "f":
            y = x.astype(np.float32) if x.dtype.itemsize < 4 else x
            bad += int(np.isnan(y).sum() + np.isinf(y).sum())
print(bad)
"""


def make_folder(folder: Path, mib: int, shards: int) -> None:
    """``mib`` MiB of tensors of at most 64 MiB, float32 and float16, in ``shards`` files."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    per_shard = mib // shards
    weight_map = {}
    for s in range(shards):
        tensors, left, n = {}, per_shard << 20, 0
        while left > 0:
            size = min(left, 64 << 20)
            dtype = np.float32 if n % 2 == 0 else np.float16
            rows = size // (1024 * np.dtype(dtype).itemsize)
            name = f"model.layers.{s}.t{n}.weight"
            tensors[name] = rng.standard_normal((rows, 1024), np.float32).astype(dtype)
            left -= rows * 1024 * np.dtype(dtype).itemsize
            n += 1
        file = folder / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file.name))
        del tensors
    index = {"metadata": {"total_size": per_shard * shards << 20}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--make", help=argparse.SUPPRESS)  # the child that writes the folder
    args = parser.parse_args()
    if args.make:
        make_folder(Path(args.make), args.mib, args.shards)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-verify-st-"))
    try:
        # Written by a child: a child's peak RSS counts its parent's at fork (Linux keeps the
        # high-water mark across exec), so this process stays small.
        make = [sys.executable, __file__, "--mib", str(args.mib), "--shards", str(args.shards)]
        subprocess.run([*make, "--make", str(work / "hf")], check=True)
        files = sorted((work / "hf").glob("*.safetensors"))
        ckpt = [sys.executable, "-m", "ckpt_cli", "verify", str(work / "hf"), "--deep", "--json"]
        runs = {
            "ckpt verify --deep": run_rss(ckpt),
            "numpy script (today)": run_rss([sys.executable, "-c", _TODAY, *map(str, files)]),
        }
        doc = json.loads(runs["ckpt verify --deep"].out)
        assert doc["ok"] and doc["checked"]["bytes_decoded"] == args.mib << 20, doc["checked"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    today = runs["numpy script (today)"]
    print(
        f"{args.mib} MiB in {args.shards} shards; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'contender':<24}{'wall s':>8}{'CPU s':>8}{'peak RSS MiB':>14}{'CPU vs today':>14}")
    for name, r in runs.items():
        ratio = r.cpu_s / today.cpu_s if today.cpu_s else float("nan")
        print(f"{name:<24}{r.wall_s:>8.2f}{r.cpu_s:>8.2f}{r.rss_mib:>14.0f}{ratio:>13.2f}x")
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "verify_safetensors.json").write_text(
        json.dumps(
            {
                "mib": args.mib,
                "shards": args.shards,
                "cores": os.cpu_count(),
                "load": os.getloadavg()[0],
                "machine": platform.machine(),
                "runs": {
                    k: {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "rss_mib": r.rss_mib}
                    for k, r in runs.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
