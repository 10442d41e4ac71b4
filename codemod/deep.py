"""Planning and rewriting code nested deeper than Python's default recursion limit.

CPython parses a 600-term sum or calls nested 150 deep, but LibCST's tree of it is as deep,
and walking it (metadata, the facts, the plan, the rewrite) takes a few Python frames per
level: past the default limit of 1000 the file failed with a RecursionError. A function
that raises one is run again on a thread with a large stack and a raised limit.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, TypeVar

T = TypeVar('T')

#: The stack of the retrying thread (bytes: reserved address space, touched as used) and its
#: recursion limit (frames). CPython itself refuses code nested past about 200 parentheses
#: or a sum of some 10,000 terms (``codemod.sources.parse``), well below this.
STACK_BYTES = 512 * 2**20
RECURSION_LIMIT = 100_000

_LOCK = threading.Lock()  # (the recursion limit is the interpreter's: one deep run at a time)
_STATE = threading.local()


def retry_deep(fn: Callable[[], T]) -> T:
  """``fn()``; on a RecursionError (also one a rule family's failure wraps), ``fn()`` again
  on a thread with a :data:`STACK_BYTES` stack and a :data:`RECURSION_LIMIT` recursion limit.

  Raises:
    Whatever ``fn`` raises (a RecursionError again only when even the deep thread
    overflows). Ctrl-C while waiting stops the wait (the thread is a daemon).
  """
  try:
    return fn()
  except Exception as e:  # noqa: BLE001 - only a recursion error is retried
    if getattr(_STATE, 'deep', False) or not _too_deep(e):
      raise
  return _run_deep(fn)


def _too_deep(error: BaseException) -> bool:
  """A RecursionError, or a rule family's failure on one (``RuleFailure.error``)."""
  return isinstance(error, RecursionError) or isinstance(getattr(error, 'error', None),
                                                         RecursionError)


def _run_deep(fn: Callable[[], T]) -> T:
  box: dict = {}

  def target() -> None:
    _STATE.deep = True
    try:
      box['value'] = fn()
    except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
      box['error'] = e
  with _LOCK:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
    try:
      previous = threading.stack_size(STACK_BYTES)
      try:
        thread = threading.Thread(target=target, name='optim-migrate-deep', daemon=True)
        thread.start()
      finally:
        threading.stack_size(previous)
      while thread.is_alive():
        thread.join(0.05)
    finally:
      sys.setrecursionlimit(limit)
  if 'error' in box:
    raise box['error']
  return box['value']
