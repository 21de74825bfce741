"""The command lines of the gemma/Kauldron, MaxText, Flax NNX and TPU-chip sections of docs/how-to/frameworks.md run
as written on the checkpoints those frameworks wrote (``fixtures/frameworks/``): exit codes,
shown output, and the steps they write named and itemised as the page says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_examples import REPO, console_commands, first_mismatch, prepare_workdir

PAGE = REPO / "docs" / "how-to" / "frameworks.md"
READER_DIR = "/home/you/ckpt"  # where the page says the reader's checkout is
#: section -> files its commands leave, as the page describes them
WRITTEN = {
    "gemma and Kauldron": [
        "runs/kd-2/ckpt_4/default/_METADATA",
        "runs/kd-2/ckpt_4/ds_iter/commit_success.txt",
        "runs/kd-2/ckpt_4/timer/metadata",
        "runs/kd-back/ckpt_4/default/_METADATA",
        "runs/gemma-back/0/default/_METADATA",
    ],
    "MaxText": ["runs/mt-2/3/items/_METADATA", "runs/mt-back/3/items/_METADATA"],
    "Flax NNX": ["runs/nnx-2x4/1/model/_METADATA", "runs/nnx-2x4/1/optimizer/_METADATA"],
    # the step and the item export recorded, written back by import without --step/--item
    "A TPU chip": ["runs/tpu-2x2/3/state/_METADATA", "runs/tpu-back/3/state/_METADATA"],
}


@pytest.mark.slow
@pytest.mark.parametrize("section", sorted(WRITTEN))
def test_the_commands_of_the_section_run_as_written(tmp_path: Path, section: str) -> None:
    prepare_workdir(tmp_path)
    commands = console_commands(PAGE, section=section)
    assert len(commands) >= 6
    mismatch = first_mismatch(commands, tmp_path, READER_DIR)
    assert mismatch is None, mismatch
    for name in WRITTEN[section]:
        assert (tmp_path / name).is_file(), name
