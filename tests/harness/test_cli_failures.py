"""``tests.support.cli.ckpt_failure``: what in a command's stderr is ckpt's own internal error,
and the leftover of another test that it is not."""

from __future__ import annotations

from tests.support.cli import ckpt_failure

#: What another test's asyncio loop, closed under a TensorStore future, prints from
#: TensorStore's thread (as seen in a clean-clone CI): asyncio's frames only.
FOREIGN = """Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/base_events.py", line 806, in call_soon_threadsafe
    self._check_closed()
  File "/usr/lib/python3.11/asyncio/base_events.py", line 519, in _check_closed
    raise RuntimeError('Event loop is closed')
RuntimeError: Event loop is closed
"""

OURS = """Exception in thread ckpt-read_0:
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
    self.run()
  File "/repo/ckpt_cli/core/format/ownreads.py", line 130, in _decode_rows
    place = done.buffer()
ValueError: boom
"""


def test_another_tests_leftover_is_not_ckpts() -> None:
    assert ckpt_failure("") is None
    assert ckpt_failure(FOREIGN) is None
    assert ckpt_failure("ckpt: error: /x does not exist (check the path)\n" + FOREIGN) is None


def test_a_traceback_through_ckpt_or_its_internal_error_is() -> None:
    found = ckpt_failure(FOREIGN + OURS)
    assert found is not None and "ownreads.py" in found and found.endswith("ValueError: boom")
    assert "Event loop" not in found
    line = "ckpt: internal error: KeyError: 'x' (rerun with CKPT_DEBUG=1)"
    assert ckpt_failure(FOREIGN + line + "\n") == line
