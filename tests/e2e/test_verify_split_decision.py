"""``ckpt verify --deep --workers 2`` takes reshard's split decision at verify's rates: a small
local checkpoint stays in one process and says why (JSON ``scale``, a note in the text),
``--force-split`` splits it, and in a bucket a checkpoint big enough by the estimate (the
documented ``CKPT_SPLIT_RATE``: the single-process rate the estimate assumes) splits with no
``--force-split``; every run finds the same."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from ckpt_cli.core.split import RATE_ENV
from tests.support.paths import FIXTURES
from tests.support.storage_fixtures import S3

SRC = FIXTURES / "seed_mlp"
WORKERS = ("--workers", "2", "--unit-bytes", "4KiB")


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("ok", "summary", "nonfinite", "problems"):
        assert a[key] == b[key], key
    assert a["checked"]["bytes_decoded"] == b["checked"]["bytes_decoded"] > 0


def test_a_small_checkpoint_is_verified_in_one_process_unless_forced(cli: Any) -> None:
    single = cli("verify", SRC, "--deep", "--json")
    assert single.code == 0 and single.json()["scale"] is None
    declined = cli("verify", SRC, "--deep", *WORKERS, "--json")
    assert declined.code == 0, declined.stderr
    scale = declined.json()["scale"]
    assert scale["split"] is False and scale["units"] == 0 and scale["workers"] == 2, scale
    assert "in one process" in scale["reason"] and "--force-split" in scale["reason"]
    assert not multiprocessing.active_children()  # the early-started workers are gone
    forced = cli("verify", SRC, "--deep", *WORKERS, "--force-split", "--json")
    assert forced.code == 0, forced.stderr
    scale = forced.json()["scale"]
    assert scale["split"] is True and scale["reason"] is None and scale["units"] > 3, scale
    _same(single.json(), declined.json())
    _same(single.json(), forced.json())
    text = cli("verify", SRC, "--deep", *WORKERS)
    assert text.code == 0 and "not split: " in text.stderr and "--force-split" in text.stderr


def test_in_a_bucket_a_big_enough_estimate_splits(
    cli: Any, s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = s3.fixture("seed_mlp")
    single = cli("verify", src, "--deep", "--json")
    assert single.code == 0, single.stderr
    declined = cli("verify", src, "--deep", *WORKERS, "--json")
    assert declined.code == 0, declined.stderr
    scale = declined.json()["scale"]
    assert scale["split"] is False and "40.0 MiB/s" in scale["reason"], scale  # a bucket's rate
    # 61 KiB at 1 KiB a second: about a minute alone, well above 4 x the workers' start-up.
    monkeypatch.setenv(RATE_ENV, str(1 / 1024))
    split = cli("verify", src, "--deep", *WORKERS, "--json")
    assert split.code == 0, split.stderr
    scale = split.json()["scale"]
    assert scale["split"] is True and scale["units"] > 3 and scale["workers"] == 2, scale
    _same(single.json(), declined.json())
    _same(single.json(), split.json())


def test_a_bad_rate_in_the_environment_is_a_usage_error(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RATE_ENV, "fast")
    r = cli("verify", SRC, "--deep", *WORKERS, "--json")
    assert r.code == 2 and r.json()["error"]["code"] == "usage", r.stdout
    assert [line for line in r.stderr.splitlines() if line.startswith("ckpt: error:")] == [
        f"ckpt: error: {RATE_ENV}='fast': give the single-process rate in MiB a second, "
        "a positive number"
    ]
    assert not multiprocessing.active_children()
