"""The fast tree/table renderer: structure, alignment, and no markup when not colouring."""

from __future__ import annotations

from ckpt_cli.commands.render.lines import painter, table_lines, tree_lines


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
