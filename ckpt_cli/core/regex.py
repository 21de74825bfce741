"""Patterns people give ckpt (``--filter``, reshard rules, migrate spec ``match:``/``from:``)
compiled with RE2 (``google-re2``), which runs in time linear in the name: a pattern such as
``(.|.)*!`` cannot backtrack for hours the way it does in Python's ``re``.

RE2 takes Python's syntax minus backreferences (``\\1`` inside a pattern) and lookaround
(``(?=``, ``(?!``, ``(?<=``, ``(?<!``); ``\\z`` ends the text (``\\Z`` is Python-only). Such a
pattern is refused with one line (``PatternError``), never run by another engine. Templates
(``to: 'params.\\1'``) still take ``\\1`` and ``\\g<name>``: they are expanded, not matched.
"""

from __future__ import annotations

from typing import Any, Protocol


class PatternError(ValueError):
    """A pattern RE2 cannot compile; the message is RE2's, as text."""


class Match(Protocol):
    def group(self, *groups: int | str) -> Any: ...

    def groups(self, default: Any = None) -> tuple[Any, ...]: ...

    def expand(self, template: str) -> str: ...


class Regex:
    """One compiled RE2 pattern: ``search``/``match``/``fullmatch`` as in ``re``; equal, hashed
    and pickled by its source (plans carry rules to worker processes)."""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str) -> None:
        import re2

        options = re2.Options()
        options.log_errors = False  # RE2 would log the error on stderr besides raising it
        try:
            self._compiled = re2.compile(pattern, options)
        except re2.error as e:
            raise PatternError(_text(e)) from None
        self.pattern = pattern

    @property
    def groups(self) -> int:
        return int(self._compiled.groups)

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._compiled.groupindex)

    def search(self, text: str) -> Match | None:
        m: Match | None = self._compiled.search(text)
        return m

    def match(self, text: str) -> Match | None:
        m: Match | None = self._compiled.match(text)
        return m

    def fullmatch(self, text: str) -> Match | None:
        m: Match | None = self._compiled.fullmatch(text)
        return m

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Regex, (self.pattern,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Regex) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"


def _text(e: BaseException) -> str:
    arg = e.args[0] if e.args else str(e)
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def glob_regex(glob: str) -> str:
    """A shell glob as an RE2 pattern matching the whole name: ``*`` any run (dots included),
    ``?`` one character, ``[abc]``/``[!abc]`` a class; everything else literal."""
    import re2

    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + 1 if i < n and glob[i] in "!]" else i
            j = j + 1 if j < n and glob[j] == "]" else j
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal [
                out.append("\\[")
                continue
            body = glob[i:j].replace("\\", "\\\\")
            i = j + 1
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"[{body}]")
        else:
            out.append(re2.escape(c))
    return "^(?s:" + "".join(out) + ")\\z"
