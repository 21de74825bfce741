"""The text primitives every renderer uses: the layout (nothing cut, nothing too wide, nothing
padded) and the fast tree/table lines (structure, alignment, no markup when not colouring)."""

from __future__ import annotations

import pytest

from ckpt_cli.commands._text import painter, plural, table, table_lines, tree_lines, wrap


def plain(text: str, style: str) -> str:
    return text


HEADERS = ["leaf", "status", "dtype", "shape", "note"]
ROWS = [
    [
        ("opt_state.0.mu.Dense_0.kernel", ""),
        ("different", ""),
        ("float32", ""),
        ("[16,64]", ""),
        ("compared as float64 (float32 vs bfloat16) after the cast of the rule", ""),
    ],
    [("step", ""), ("equal", ""), ("int32", ""), ("[]", ""), ("", "")],
]


def test_plural() -> None:
    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
    assert plural(1, "leaf", "leaves") == "1 leaf" and plural(3, "leaf", "leaves") == "3 leaves"


def test_wrap_breaks_at_spaces_only() -> None:
    text = "a message with a-very-long-name.that.does.not.fit and more words"
    lines = wrap(text, 20, first="- ", indent="  ")
    assert lines[0].startswith("- ") and all(x.startswith("  ") for x in lines[1:])
    assert " ".join(" ".join(lines).split()) == "- " + text
    assert "a-very-long-name.that.does.not.fit" in [w for x in lines for w in x.split()]
    assert all(len(x) <= 20 for x in lines if "a-very-long" not in x)
    assert wrap(text, None) == [text]


@pytest.mark.parametrize("width", [None, 200, 100, 80, 60, 40, 30])
def test_table_never_cuts_and_fits(width: int | None) -> None:
    lines = table(HEADERS, ROWS, plain, width=width, wrap_column=4)
    assert lines
    assert all(x == x.rstrip() for x in lines)
    if width is not None:
        longest_name = max(len(r[0][0]) for r in ROWS)
        assert all(len(x) <= max(width, longest_name) for x in lines), lines
    for row in ROWS:
        for text, _ in row[:4]:
            assert any(text in x for x in lines), text
    note = ROWS[0][4][0]
    assert note in " ".join(" ".join(lines).split())


def test_table_shapes() -> None:
    wide = table(HEADERS, ROWS, plain, width=None)
    assert len(wide) == 3  # one line per row
    wrapped = table(HEADERS, ROWS, plain, width=100, wrap_column=4)
    assert len(wrapped) > 3 and wrapped[1].startswith("opt_state.0.mu.Dense_0.kernel  different")
    spilled = table(HEADERS, ROWS, plain, width=60, wrap_column=4)
    assert spilled[0].split() == ["leaf", "status", "dtype", "shape"]
    assert spilled[2].strip().startswith("note:")
    blocks = table(HEADERS, ROWS, plain, width=35)
    assert blocks[0] == "opt_state.0.mu.Dense_0.kernel"
    assert any(x.strip().startswith("status:") for x in blocks)


# --- lines ---
def test_tree_lines_structure() -> None:
    plain = painter(False)
    lines = tree_lines(
        "root",
        [(("a", "x"), "1"), (("a", "y", "z"), "2"), (("b",), "3")],
        plain,
    )
    assert lines == [
        "root",
        "├── a",
        "│   ├── x  1",
        "│   └── y",
        "│       └── z  2",
        "└── b  3",
    ]


def test_table_lines_align_and_right_justify() -> None:
    lines = table_lines(
        ["name", "n"],
        [[("long_name", ""), ("5", "")], [("x", ""), ("123", "")]],
        painter(False),
        right=frozenset({1}),
    )
    assert lines == ["name         n", "long_name    5", "x          123"]


def test_painter_escapes_markup_when_colouring() -> None:
    paint = painter(True)
    assert paint("[x]", "cyan") == "[cyan]\\[x][/]"
    assert painter(False)("[x]", "cyan") == "[x]"
