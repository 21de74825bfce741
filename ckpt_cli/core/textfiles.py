"""Files people hand to ckpt (migrate specs, reshard rules): read within a size limit and parsed
as data only. YAML aliases are refused: an alias is the one way a few hundred bytes of YAML
expand into gigabytes (the "billion laughs"), and no spec needs one."""

from __future__ import annotations

from typing import Any

from ckpt_cli.errors import NotFoundError, RefusedError

#: A spec or rules file larger than this is not one (a real spec of 2,000 rules is ~150 KB).
MAX_SPEC_BYTES = 1 << 20


def read_limited(path: str, what: str, limit: int = MAX_SPEC_BYTES) -> bytes:
    """The bytes of ``path``, refusing more than ``limit`` (read no further: /dev/zero ends)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise NotFoundError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise RefusedError(f"{what} {path} is a directory, not a file") from None
    except OSError as e:
        raise RefusedError(f"{what} {path} cannot be read: {e.strerror}") from None
    if len(raw) > limit:
        raise RefusedError(
            f"{what} {path} is larger than {limit // 1024} KiB: not a spec ckpt reads",
            hint="a spec holds rules, not data; check the path",
        )
    return raw


def load_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load`` without aliases (``&anchor`` / ``*alias``): refused with one line."""
    import yaml

    class _NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise RefusedError(
                    f"{what}: YAML aliases (*{event.anchor}) are not accepted "
                    f"(line {event.start_mark.line + 1}): write the value out"
                )
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_NoAliases)
    except RecursionError:
        raise RefusedError(f"{what}: nested too deeply to be read") from None
    except ValueError as e:  # int() past 4,300 digits, raised by the constructor
        raise RefusedError(f"{what}: {' '.join(str(e).split())[:200]}") from None
