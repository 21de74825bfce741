"""Which stored chunks a reader took from the data files themselves (``chunkread.FileValue``,
opened by ``chunkstream``) rather than through TensorStore."""

from __future__ import annotations

import pytest

from ckpt_cli.core.format import chunkstream
from ckpt_cli.core.format.chunkread import Place


def spy_file_values(monkeypatch: pytest.MonkeyPatch) -> list[Place]:
    """The places of every ``FileValue`` opened from now on (the list grows as they open)."""
    opened: list[Place] = []
    real = chunkstream.FileValue

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, place: Place) -> None:
            opened.append(place)
            super().__init__(place)

    monkeypatch.setattr(chunkstream, "FileValue", Spy)
    return opened
