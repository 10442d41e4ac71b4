"""The text of a legacy def call (``"Adam(1e-3, beta1=0.9)"``), parsed, never evaluated.

One parser for the command line: ``convert-checkpoint --optimizer``
(``checkpoint_convert.parse_optimizer``, which then checks the arguments against
the migration table) and ``check --against`` (``equivalence_tests.cli``, which
compares a file's recorded def with ``--legacy``) read the text through
:func:`parse_call`. No jax import.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Optional


class DefTextError(ValueError):
  """Text that is not a def call; ``kind`` says what it is instead.

  Kinds: ``'syntax'`` (not Python; ``detail`` is the parser's message), ``'not_a_call'``
  (``detail`` is the bare name when it is one, e.g. ``Adam`` without parentheses).
  """

  def __init__(self, kind: str, detail: Optional[str] = None):
    super().__init__(f'{kind}: {detail}')
    self.kind, self.detail = kind, detail


@dataclasses.dataclass(frozen=True)
class DefCall:
  """A parsed def call.

  Attributes:
    name: the called name (``Adam`` for ``Adam(...)`` and for ``optim.Adam(...)``).
    dotted: it is called through an attribute (``optim.Adam(...)``).
    args: the positional arguments, as expressions (``ast.Starred`` for ``*x``).
    keywords: ``(keyword, expression)`` of the keyword arguments, in order (keyword None
      for ``**x``).
    text: the text, stripped (``ast.get_source_segment`` reads argument spellings from it).
  """
  name: Optional[str]
  dotted: bool
  args: tuple[ast.expr, ...]
  keywords: tuple[tuple[Optional[str], ast.expr], ...]
  text: str

  def literals(self) -> tuple[list, dict]:
    """``(args, kwargs)`` as Python values.

    Raises:
      ValueError: an argument is not a literal (a name, an expression, ``*`` / ``**``).
    """
    if any(isinstance(a, ast.Starred) for a in self.args) or any(
        k is None for k, _ in self.keywords):
      raise ValueError('unpacking')
    return ([ast.literal_eval(a) for a in self.args],
            {k: ast.literal_eval(v) for k, v in self.keywords})

  def spelled(self, node: ast.expr) -> str:
    """How the text spells the argument ``node``."""
    return ast.get_source_segment(self.text, node) or ast.unparse(node)


def _name(node) -> Optional[str]:
  return node.attr if isinstance(node, ast.Attribute) else getattr(node, 'id', None)


def parse_call(text: str) -> DefCall:
  """``text`` as a call of a name (``Adam(...)``, ``optim.Adam(...)``).

  Raises:
    DefTextError: not Python, or not a call.
  """
  stripped = text.strip()
  try:
    node = ast.parse(stripped, mode='eval').body
  except (SyntaxError, ValueError) as e:  # (ValueError: null bytes)
    raise DefTextError('syntax', getattr(e, 'msg', str(e))) from None
  if not isinstance(node, ast.Call):
    raise DefTextError('not_a_call', _name(node))
  return DefCall(_name(node.func), isinstance(node.func, ast.Attribute), tuple(node.args), tuple((k.arg, k.value) for k in node.keywords),
                 stripped)
