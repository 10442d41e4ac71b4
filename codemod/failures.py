"""Rule isolation: a rule family that raises is named, with the site it was at.

A crash in one rule must not lose the file's other results silently: the engine
reports the file with the family that failed and where (``path:line:col``),
leaves it byte-identical, and goes on with the other files.
"""
from __future__ import annotations

import os


class RuleFailure(Exception):
  """A rule family raised while planning or rewriting a site (a bug in that rule)."""

  def __init__(self, family: str, line: int, col: int, error: BaseException):
    super().__init__(f'{family}: {type(error).__name__}: {error}')
    self.family, self.line, self.col, self.error = family, line, col, error


_RULES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'rules') + os.sep


def family_of(error: BaseException, default: str = 'plan') -> str:
  """The rule family whose code raised ``error``: the innermost frame of its traceback in
  ``codemod/rules/<family>.py`` (``default`` when none is: the fix's own family, for a
  fix function that raised)."""
  found = default
  tb = error.__traceback__
  while tb is not None:
    filename = tb.tb_frame.f_code.co_filename
    if filename.startswith(_RULES_DIR):
      found = os.path.splitext(filename[len(_RULES_DIR):])[0]
    tb = tb.tb_next
  return found


def failure(error: BaseException, node, names, default: str = 'plan') -> RuleFailure:
  """``error``, raised at ``node``, as the :class:`RuleFailure` of its family."""
  if isinstance(error, RuleFailure):
    return error
  line, col = names.pos(node) if node is not None else (1, 1)
  return RuleFailure(family_of(error, default), line or 1, col or 1, error)
