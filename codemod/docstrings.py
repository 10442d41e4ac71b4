"""The parameter types a function's docstring documents, as evidence a rule may take.

Code of 2020-2021 names its parameters' types in docstrings more often than in
annotations: ``params_ema_G (frozen_dict.FrozenDict): ...`` (Google style, typed),
``state: model_utils.TrainState.`` (Google style, a description that is only a type,
as nerfies writes it), ``x : flax.core.FrozenDict`` (NumPy style). The docstring is
parsed with ``docstring_parser`` (Google, NumPy, reST and Epydoc styles); only a plain
dotted name is taken as a type (``Optional[X]``, ``X or Y``, ``dict of ...`` are not).
"""
from __future__ import annotations

import re
import textwrap
from typing import Optional

import docstring_parser
import libcst as cst

# a dotted name, then the end, a comma (`dict, test example.`) or the end of the line (the
# type alone on the description's first line, the prose below it), an optional trailing period
_TYPE = re.compile(r'([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)\.?[ \t]*(?:,|\n|\Z)')
_OPTIONAL = re.compile(r',\s*optional\s*\Z')

# Google-style section titles that may open a docstring, with no summary line before them
_SECTIONS = frozenset({'Args:', 'Arguments:', 'Parameters:', 'Params:'})


def parameter_types(fn: cst.FunctionDef) -> dict[str, str]:
  """``{parameter name: dotted type name}`` that ``fn``'s docstring documents, for the
  parameters ``fn`` has (``{}`` when it has no docstring or one no style parses).

  The type is the docstring's typed field (``name (T): ...``, ``name : T``), else a
  description that starts with a dotted name followed by a comma or nothing else
  (``name: T.``, ``name: T, what it is``, ``T`` alone on the description's first line);
  ``, optional`` is dropped.
  """
  doc = fn.get_docstring(clean=True)
  if not doc:
    return {}
  first, _, rest = doc.partition('\n')
  if first.strip() in _SECTIONS:
    # `"""Args:` on the docstring's first line: a summary line is what the parsers expect
    # there, and cleaning dedented the arguments to the title's column
    doc = f'.\n\n{first.strip()}\n' + textwrap.indent(textwrap.dedent(rest), '    ')
  try:
    parsed = docstring_parser.parse(doc)
  except (docstring_parser.ParseError, ValueError, IndexError):
    return {}
  names = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params,
                                   *fn.params.kwonly_params)}
  types: dict[str, str] = {}
  for p in parsed.params:
    if p.arg_name not in names or p.arg_name in types:
      continue
    text = _type_text(p.type_name, typed=True) or _type_text(p.description, typed=False)
    if text is not None:
      types[p.arg_name] = text
  return types


def _type_text(text: Optional[str], *, typed: bool) -> Optional[str]:
  if not text:
    return None
  text = _OPTIONAL.sub('', text.strip())
  found = _TYPE.match(text)
  if found is None or (typed and found.end() != len(text)):
    return None
  return found.group(1)


def documents(fn: Optional[cst.FunctionDef], param: str, last_names) -> Optional[str]:
  """The dotted type ``fn``'s docstring gives ``param`` when its last component is one of
  ``last_names`` (``'FrozenDict'``), else None."""
  if fn is None:
    return None
  text = parameter_types(fn).get(param)
  if text is None or text.rsplit('.', 1)[-1] not in last_names:
    return None
  return text
