"""``ckpt cp`` between local directories: selection, plan, markers last, resume, refusals.

The bucket cases (S3 and GCS servers on 127.0.0.1, the kill mid-copy, the order of writes) are
in ``tests/commands/test_cp_bucket.py``.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.paths import FIXTURES


def tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path, with its bytes."""
    out = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert out, f"{root} holds no file"
    return out


def test_copy_a_run_is_byte_identical(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    dst = tmp_path / "copy"
    r = cli("cp", src, dst, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["ok"] is True
    assert [s["step"] for s in doc["steps"]] == [300, 400, 500]
    assert all(s["state"] == "new" for s in doc["steps"])
    want = tree(src)
    assert tree(dst) == want
    assert doc["outcome"]["copied_objects"] == len(want) == doc["total_objects"]
    assert doc["outcome"]["copied_bytes"] == sum(len(b) for b in want.values())
    # No tmp dir, owner record nor lock left behind.
    assert sorted(p.name for p in dst.iterdir()) == ["300", "400", "500"]


def test_rerun_copies_nothing_and_checks_everything(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    dst = tmp_path / "copy"
    assert cli("cp", src, dst).code == 0
    again = cli("cp", src, dst, "--json")
    assert again.code == 0, again.stderr
    out = again.json()["outcome"]
    assert out["copied_objects"] == 0
    assert out["skipped_objects"] == again.json()["total_objects"] > 0
    assert {s["status"] for s in out["steps"]} == {"already-there"}


def test_step_selection(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    cases = {
        ("--steps", "300-400"): ["300", "400"],
        ("--step", "500", "--step", "300"): ["300", "500"],
        ("--latest",): ["500"],
    }
    for i, (args, want) in enumerate(cases.items()):
        dst = tmp_path / f"c{i}"
        r = cli("cp", src, dst, *args)
        assert r.code == 0, (args, r.stderr)
        assert sorted(p.name for p in dst.iterdir()) == want, args
    at = cli("cp", f"{src}@400", tmp_path / "at")
    assert at.code == 0 and sorted(p.name for p in (tmp_path / "at").iterdir()) == ["400"]
    span = cli("cp", f"{src}@400-500", tmp_path / "span")
    assert span.code == 0 and sorted(p.name for p in (tmp_path / "span").iterdir()) == [
        "400", "500",
    ]  # fmt: skip
    both = cli("cp", f"{src}@400", tmp_path / "x", "--steps", "300-")
    assert both.code == 2 and "names its steps" in both.stderr
    step_dir = cli("cp", src / "300", tmp_path / "one")
    assert step_dir.code == 0 and (tmp_path / "one" / "300" / "commit_success.txt").is_file()
    assert filecmp.cmpfiles(src / "300", tmp_path / "one" / "300", ["_CHECKPOINT_METADATA"])[0]


def test_dry_run_writes_nothing_and_names_the_plan(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    dst = tmp_path / "copy"
    r = cli("cp", src, dst, "--steps", "400-", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert "outcome" not in doc and not dst.exists()
    files = [p for s in ("400", "500") for p in (src / s).rglob("*") if p.is_file()]
    assert doc["total_objects"] == len(files) > 0
    assert doc["total_bytes"] == sum(p.stat().st_size for p in files)
    assert [s["to_copy_objects"] for s in doc["steps"]] == [
        sum(1 for p in files if p.is_relative_to(src / s)) for s in ("400", "500")
    ]
    text = cli("cp", src, dst, "--dry-run")
    assert text.code == 0 and "3 steps" in text.stdout and not dst.exists()


def test_unfinished_source_steps_are_not_copied(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "with_tmp"
    r = cli("cp", src, tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert [s["step"] for s in doc["steps"]] == [1, 2]
    assert doc["skipped"] and all(s["reason"] == "unfinished save" for s in doc["skipped"])
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["1", "2"]


def test_errors_are_one_line(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    cases = [
        (["cp", src, tmp_path / "x", "--step", "7"], 3, "step 7 not found"),
        (["cp", src, tmp_path / "x", "--steps", "900-"], 3, "no committed step"),
        (["cp", src, tmp_path / "x", "--steps", "5-1"], 2, "is empty"),
        (["cp", src, tmp_path / "x", "--latest", "--step", "300"], 2, "both choose steps"),
        (["cp", src, src / "inside"], 2, "overlap"),
        (["cp", src / "500" / "default", tmp_path / "x"], 2, "item directory"),
        (["cp", src, src / "500"], 2, "overlap"),
    ]
    for args, code, phrase in cases:
        r = cli(*args)
        assert r.code == code, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and phrase in lines[0], (args, lines)
    assert not (tmp_path / "x").exists()


def test_a_different_committed_step_at_the_destination_is_refused(cli: Any, tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    meta = dst / "500" / "_CHECKPOINT_METADATA"
    meta.write_text(meta.read_text() + " ")
    before = tree(dst)
    r = cli("cp", src, dst)
    assert r.code == 3
    assert "already exists and differs" in r.stderr and "500" in r.stderr
    assert tree(dst) == before
    # Same size, other bytes: found by the checksum, still refused, still untouched.
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    data = sorted((dst / "400" / "default" / "d").iterdir())[0]
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(bytes(raw))
    before = tree(dst)
    r = cli("cp", src, dst, "--json")
    assert r.code == 3, r.stderr
    assert r.json()["error"]["code"] == "refused"
    assert tree(dst) == before


def test_resume_a_killed_local_copy(cli: Any, tmp_path: Path) -> None:
    """What a killed cp leaves locally (a tmp dir with ckpt's owner record and some files) is
    resumed: the files there are kept, the missing ones copied, then the rename."""
    from ckpt_cli.core.storage.locks import Owner

    src = FIXTURES / "seed_mlp"
    dst = tmp_path / "copy"
    tmp = dst / "500.orbax-checkpoint-tmp-123"
    files = sorted(
        p for p in (src / "500").rglob("*") if p.is_file() and p.name != "commit_success.txt"
    )
    assert len(files) > 4
    kept = files[: len(files) // 2]
    for p in kept:
        target = tmp / p.relative_to(src / "500")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, target)
    dead = Owner("cp", 2**22 + 7, "elsewhere", "2026-01-01T00:00:00+00:00")
    (tmp / ".ckpt-owner").write_text(dead.to_text())
    (tmp / "stray").write_text("not in the source")
    mtimes = {p: (tmp / p.relative_to(src / "500")).stat().st_mtime_ns for p in kept}
    r = cli("cp", src, dst, "--step", "500", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["steps"][0]["state"] == "resume"
    out = doc["outcome"]
    assert out["skipped_objects"] == len(kept)
    assert out["copied_objects"] == len(files) + 2 - len(kept)  # + both commit markers
    assert sorted(p.name for p in dst.iterdir()) == ["500"]
    assert tree(dst / "500") == tree(src / "500")
    for p, ns in mtimes.items():  # never written again
        assert (dst / "500" / p.relative_to(src / "500")).stat().st_mtime_ns == ns


def test_verify_refuses_a_step_unlike_its_record(cli: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "seed_mlp", src)
    assert cli("verify", src, "--record").code == 0
    clean = cli("cp", src, tmp_path / "ok", "--verify", "--json")
    assert clean.code == 0, clean.stderr
    assert clean.json()["outcome"]["verified_objects"] > 0
    assert clean.json()["outcome"]["unverified_items"] == []
    data = sorted((src / "500" / "default" / "d").iterdir())[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    dst = tmp_path / "bad"
    r = cli("cp", src, dst, "--verify")
    assert r.code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "step 500 not copied" in lines[0] and "recorded digest" in lines[0]
    # The other steps are whole; step 500 left nothing behind.
    assert sorted(p.name for p in dst.iterdir()) == ["300", "400"]
    doc = cli("cp", src, tmp_path / "bad2", "--verify", "--json")
    assert doc.code == 1
    body = json.loads(doc.stdout)
    assert body["ok"] is False and body["error"]["code"] == "digest-mismatch"
    assert [s["status"] for s in body["outcome"]["steps"]] == ["copied", "copied", "failed"]
    # Without --verify the bytes are copied as they are.
    assert cli("cp", src, tmp_path / "plain").code == 0


def test_verify_copies_a_values_only_record_and_names_its_item_unchecked(
    cli: Any, tmp_path: Path
) -> None:
    """A record of values only (what ``ckpt_cli.orbax`` writes at save time: no file
    checksums) makes no claim about the files: ``--verify`` copies the item, names it in
    ``unverified_items`` (it was refused as damaged before), and ``verify --deep`` of the copy
    checks its values."""
    import ckpt_cli
    from ckpt_cli.core.digest.records import DigestRecord, LeafDigest, write_digests
    from ckpt_cli.core.storage import LocalLocation

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "seed_mlp", src)
    item = src / "500" / "default"
    leaves = {
        leaf["name"]: LeafDigest(leaf["dtype"], tuple(leaf["shape"]), None, ld1=leaf["digest"])
        for leaf in ckpt_cli.digest(item).to_json()["items"][0]["leaves"]
    }
    write_digests(LocalLocation(str(item)), DigestRecord(leaves, {}, version=2))
    r = cli("cp", src, tmp_path / "dst", "--step", "500", "--verify", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["outcome"]["unverified_items"] == ["500/default"]
    assert r.json()["outcome"]["verified_objects"] == 0
    text = cli("cp", src, tmp_path / "text", "--step", "500", "--verify")
    assert text.code == 0, text.stderr
    assert "no recorded file checksums in 500/default" in text.stdout + text.stderr
    deep = cli("verify", tmp_path / "dst", "--deep", "--json")
    assert deep.code == 0, deep.stdout
    statuses = set(deep.json()["checked"]["digests"].values())
    assert statuses == {"checked"}, deep.json()["checked"]["digests"]
