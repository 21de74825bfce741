"""Roots made for bucket tests and views of what a bucket holds, comparable with local runs."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.support.paths import REPO
from tests.support.prune_roots import copy_steps
from tests.support.remote_servers import (
    BUCKET,
    download,
    keys,
    local_files,
)
from tests.support.storage_fixtures import S3


def normalized(doc: Any, local: str, url: str) -> Any:
    """Paths mapped to the URL; volatile fields (timing, file mtimes) dropped."""
    if isinstance(doc, dict):
        if doc.get("time_source") == "mtime":
            doc = {k: v for k, v in doc.items() if k != "committed_at"}
        return {
            k: normalized(v, local, url)
            for k, v in doc.items()
            if k not in ("elapsed_s", "seconds")
        }
    if isinstance(doc, list):
        return [normalized(v, local, url) for v in doc]
    if isinstance(doc, str):
        return doc.replace(local, url)
    return doc


def listing_view(doc: Any) -> Any:
    """``ls`` on an object store tells the format from the listing (OCDBT hides the zarr
    version): compare the rest exactly (the commit time too: both read ``_CHECKPOINT_METADATA``,
    as prune does), and the format as far as the listing can tell it."""
    steps = []
    for step in doc["steps"]:
        step = dict(step)
        if step["time_source"] == "commit_marker":
            step.pop("committed_at")
            step.pop("time_source")
        step["formats"] = {
            k: v.split("+")[0] if v.startswith("ocdbt") else v for k, v in step["formats"].items()
        }
        steps.append(step)
    return {**doc, "steps": steps}


def tree(root: Path) -> dict[str, bytes]:
    out = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert out, f"{root} holds no file"
    return out


def bucket_tree(s3: S3, prefix: str, tmp: Path) -> dict[str, bytes]:
    return tree(download(s3.client, prefix, tmp / f"dl-{uuid.uuid4().hex[:6]}"))


#: name -> arguments after SRC DST; every writer must commit a step restorable by Orbax.
WRITERS = {
    "reshard": ["--mesh", "data=4,model=2", "--rules", str(REPO / "examples" / "mesh_4x2.yaml")],
}


NOW = datetime.now(timezone.utc)


def step_dirs(s3: S3, prefix: str) -> dict[str, set[str]]:
    """Step directory -> the object names directly in it (commit marker, tombstone...)."""
    out: dict[str, set[str]] = {}
    for k in keys(s3.client, prefix + "/"):
        rel = k[len(prefix) + 1 :]
        head, _, rest = rel.partition("/")
        out.setdefault(head, set()).add(rest)
    return out


def committed_steps(s3: S3, prefix: str) -> set[int]:
    return {
        int(d)
        for d, files in step_dirs(s3, prefix).items()
        if d.isdigit() and "commit_success.txt" in files
    }


def make_root(tmp_path: Path, steps: range) -> Path:
    return copy_steps(
        tmp_path / "run", steps, committed_at=lambda s: NOW - timedelta(hours=100 - s)
    )


def upload_gcs(src: Path, prefix: str) -> str:
    import tensorstore as ts

    from ckpt_cli.core.storage.stores import open_store

    kv = ts.KvStore.open(open_store("gs", BUCKET).kvstore_spec(prefix + "/")).result()
    futures = [kv.write(rel, p.read_bytes()) for rel, p in local_files(src)]
    for f in futures:
        f.result()
    return f"gs://{BUCKET}/{prefix}"
