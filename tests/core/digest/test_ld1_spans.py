"""ld1 over long runs of words: whole blocks hashed in groups (``_fold_blocks``) give the sums
that block-by-block hashing gives, whatever the group size, the first word and the length."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ckpt_cli.core.digest import ld1, ld1_fold

BW = ld1_fold.BLOCK_WORDS


def _block_by_block(words: np.ndarray, u0: int) -> tuple[int, int]:
    """The specification's sums, one block (or part of one) per step."""
    l1 = l2 = 0
    pos = 0
    while pos < words.size:
        j = (u0 + pos) % BW
        m = min(BW - j, words.size - pos)
        s1, s2 = ld1_fold._fold_span(words[pos : pos + m], u0 + pos)
        l1, l2 = l1 + s1, l2 + s2
        pos += m
    return l1 & ld1_fold.MASK, l2 & ld1_fold.MASK


@pytest.mark.parametrize("span", [1, 3, 32])
@pytest.mark.parametrize(
    ("u0", "n"),
    [(0, 70 * BW), (5, 70 * BW + 17), (BW - 1, 2 * BW + 2), (3 * BW, BW), (7, 100), (0, 0)],
)
def test_groups_of_blocks_give_the_block_by_block_sums(
    monkeypatch: pytest.MonkeyPatch, span: int, u0: int, n: int
) -> None:
    words = np.random.default_rng(n + u0).integers(0, 2**64 - 1, n, dtype=np.uint64)
    monkeypatch.setattr(ld1_fold, "_SPAN_BLOCKS", span)
    got = ld1_fold.fold_words(words.view(np.uint8), u0)
    assert got == _block_by_block(words, u0)
    if n:
        assert got != (0, 0)


def test_a_long_leaf_cut_anywhere_merges_to_the_whole() -> None:
    x = np.random.default_rng(1).standard_normal(40 * BW + 333).astype(np.float32)
    whole = ld1.digest_array(x)
    cuts = [0, 1, 4097, 3 * BW + 5, 20 * BW, x.size]
    parts = [ld1.partial((a,), x[a:b], x.shape) for a, b in itertools.pairwise(cuts)]
    assert len(parts) == len(cuts) - 1
    assert ld1.finish(ld1.merge(parts)) == whole
