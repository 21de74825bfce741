"""``ckpt digest`` on every fixture of the release matrix (fixtures/matrix/<release>/<case>,
written by Orbax 0.4.3 .. 0.12.8): the ``ld1`` digest of every array leaf of every item of
every committed step equals the specification's reference computed from the values, and those
values are the ones the release itself restored (their SHA-256 is the truth's).

The reference is the spec's vectorised numpy implementation (docs/reference/digest-spec.md,
"In numpy"), which tests/docs/test_digest_spec.py holds to the word-by-word one.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

import ckpt_cli
from tests.support.ldigest_reference import spec_numpy_reference
from tests.support.matrix import Fixture, all_fixtures, array_leaves

FIXTURES = all_fixtures()


LD1 = spec_numpy_reference()["ld1"]


def _sha256(x: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


@pytest.mark.parametrize("f", FIXTURES, ids=[f.id for f in FIXTURES])
def test_every_leaf_digest_is_the_reference_digest_of_the_restored_values(f: Fixture) -> None:
    ck = ckpt_cli.open(f.path)
    checked = 0
    for step, sd in f.steps().items():
        at = None if step == -1 else step
        for name, truth in sd["items"].items():
            if truth["kind"] == "json":
                continue
            item = ck.item(step=at, item=name)
            report = ckpt_cli.digest(str(item.ref.location))
            assert not report.problems, (step, name, report.problems)
            digests = report.digests()
            by_keypath = {leaf.keypath: leaf.name for leaf in item.leaves}
            for kp, leaf in array_leaves(truth).items():
                leaf_name = by_keypath[kp]
                values = np.asarray(item.read(leaf_name))
                assert _sha256(values) == leaf["sha256"], (step, name, leaf_name)
                assert digests[leaf_name] == LD1(values), (step, name, leaf_name)
                checked += 1
    assert checked, f"{f.id}: no array leaf"
