"""Amounts as people read them, for messages (the renderers use the same spelling)."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: binary units, one decimal; plain bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def short_repr(value: object, most: int = 40) -> str:
    """A value read from outside input, for a one-line message: a number of thousands of digits
    is named by its size (``repr`` of one raises past 4,300 digits), a long text is cut."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."
