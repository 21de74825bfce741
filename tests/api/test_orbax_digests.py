"""``ckpt_cli.orbax``'s pieces without a distributed run: partials cross the processes' exchange
(JSON) intact and merge in any order; a step saved without ``Composite`` is recorded in
``default``; a step the manager declines to save records nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ckpt_cli.core.digest.ld1 import digest_array


def test_partials_cross_the_exchange_and_merge_in_any_order() -> None:
    from ckpt_cli.orbax import (
        _partials_from_json,
        _partials_to_json,
        leaf_partials,
        merge_processes,
    )

    x = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)  # 20-byte rows
    boxes = [
        ("state", "w", (r, c), x[r : r + 3, c : c + n], x.shape, "float32")
        for r in (0, 3)
        for c, n in ((0, 3), (3, 2))  # column cuts split 8-byte words: fragments to join
    ]
    per_process = [leaf_partials(boxes[:1]), leaf_partials(boxes[1:])]
    assert per_process[0]["state"]["w"].fragments[0].size > 0
    crossed = [_partials_from_json(_partials_to_json(p)) for p in per_process]
    want = digest_array(x)
    assert merge_processes(crossed)["state"]["w"] == ("float32", (6, 5), want)
    assert merge_processes(crossed[::-1])["state"]["w"] == ("float32", (6, 5), want)


def test_a_save_without_composite_is_recorded_in_default(tmp_path: Path) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from ckpt_cli.core.digest.items import digest_path
    from ckpt_cli.orbax import DigestingCheckpointManager

    tree = {"w": jnp.arange(12.0).reshape(3, 4), "x": np.arange(5), "n": 3}
    written: list[str] = []
    options = ocp.CheckpointManagerOptions(save_interval_steps=2)
    manager = ocp.CheckpointManager(tmp_path, options=options)
    with DigestingCheckpointManager(manager, on_record=written.append) as mngr:
        assert mngr.save(2, args=ocp.args.StandardSave(tree))
        assert mngr.digested_bytes == 48 + 40 + 8
        assert not mngr.save(3, args=ocp.args.StandardSave(tree))  # declined: no digest
        assert mngr.digested_bytes == 0
    assert written == [str(tmp_path / "2" / "default" / "_CKPT_DIGESTS.json")]
    import json

    record = json.loads(Path(written[0]).read_text())["leaves"]
    leaves = digest_path(str(tmp_path), 2).items[0].leaves
    assert len(leaves) == 3
    assert {x.name: x.digest for x in leaves} == {k: v["ld1"] for k, v in record.items()}
