"""Names a rewrite would leave undefined: the engine's last check before a file is written.

A rewrite that parses can still fail at its first run: an import moved below the statement
that uses it, a name whose import was dropped while a use was kept. Pyflakes' undefined-name
analysis (module scope, deferred function bodies, ``del``, conditional bindings) is run on
the original and on the rewrite; a name undefined in the rewrite but not in the original is
the rewrite's fault. The engine then leaves the file as it is and reports an internal error
(``codemod.engine``), as it does for an output that does not parse.
"""
from __future__ import annotations

import ast
from typing import Optional

from pyflakes import checker, messages

#: The pyflakes messages that mean a NameError at run time.
_UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal)


def undefined_names(text: str) -> Optional[dict[str, int]]:
  """``{name: first line}`` of the names ``text``'s code uses where no binding reaches them
  (per pyflakes); None when CPython cannot parse it, or its nesting is too deep to check."""
  try:
    tree = ast.parse(text)
    found = checker.Checker(tree, filename='<rewrite>').messages
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  out: dict[str, int] = {}
  for m in found:
    if isinstance(m, _UNDEFINED):
      out.setdefault(m.message_args[0], m.lineno)
  return out


def introduced(original: str, new: str) -> list[tuple[str, int]]:
  """``[(name, line in new)]``: the names ``new`` leaves undefined that ``original`` did not,
  in line order; empty when either cannot be checked."""
  after = undefined_names(new)
  if not after:
    return []
  before = undefined_names(original)
  if before is None:
    return []
  return sorted(((name, line) for name, line in after.items() if name not in before),
                key=lambda item: item[1])


def problem(original: str, new: str) -> Optional[str]:
  """The error text for a rewrite that leaves names undefined (``line N: `x` undefined``,
  each such name), or None."""
  names = introduced(original, new)
  if not names:
    return None
  return ', '.join(f'line {line}: `{name}`' for name, line in names) + \
      ' would be undefined (a NameError when it runs)'
