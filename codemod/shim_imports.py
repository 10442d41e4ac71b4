"""Code already pointed at the shim by hand is legacy code to the codemod.

The transition the docs describe has a stage where a user replaces ``from flax import optim``
with ``import optim_compat as optim`` (or ``from optim_compat import Adam``) and keeps the
rest. A later ``rewrite`` of such a file must convert it as it converts the flax.optim
original, so the codemod analyses it with those imports read as their flax.optim forms:

=========================================  ==========================================
as the user wrote it                       as the codemod analyses it
=========================================  ==========================================
``import optim_compat as optim``           ``import flax.optim as optim``
``from optim_compat import Adam, ...``     ``from flax.optim import Adam, ...``
``from optim_compat.adam import _Adam...``  ``from flax.optim.adam import _Adam...``
=========================================  ==========================================

Only imports that stand for flax.optim: an aliased module import (the codemod's own
``import optim_compat`` + ``optim_compat.to_optax(...)`` stays the shim), and ``from``
imports of the legacy public names (``LEGACY_NAMES``) only. Each such line is put back as the
user wrote it wherever the rewrite keeps it (a file kept on legacy code stays on the shim,
with its TODOs; no ``optim_compat.install()`` is added to it), so the analysed form never
reaches the file.
"""
from __future__ import annotations

import ast
import re

from codemod import legacy_api as api

#: ``import optim_compat as X`` (X not ``optim_compat``) on its own line.
_ALIAS = re.compile(r'^([ \t]*)import[ \t]+optim_compat[ \t]+as[ \t]+(\w+)(?=[ \t]*(?:#|;|$))',
                    re.M)
#: ``from optim_compat[.submodule] import names`` (names up to the end of the statement).
_FROM = re.compile(r'^([ \t]*)from[ \t]+optim_compat((?:\.\w+)?)[ \t]+import[ \t]+'
                   r'(\([^)]*\)|(?:[^\n#;\\]|\\\n)*)', re.M)
#: The cheap test: no text without it holds a shim import this module reads.
WORD = 'optim_compat'
#: The comment marking an analysed line (it makes the line one the file cannot already hold).
MARK = 'optim-migrate: read as flax.optim'


def legacy_names() -> frozenset:
  """The public names of flax.optim 0.5.3 (the defs, the base classes, the submodules)."""
  return api.def_names() | {'OptimizerDef', 'Optimizer', 'OptimizerState', api.TRAVERSAL,
                            'DynamicScale'} | api.SUBMODULES


def may_hold(text: str) -> bool:
  """``text`` may import the shim in a form :func:`analysed` reads as flax.optim."""
  return WORD in text and (_ALIAS.search(text) is not None or _FROM.search(text) is not None)


def analysed(text: str) -> str:
  """``text`` with its shim imports in their flax.optim form, each marked by a comment
  (:data:`MARK`) that :func:`restore` reads back; ``text`` itself when there is nothing to
  read (a file that never names the shim). A line continued over a backslash is left as
  written (no comment can mark it)."""
  if not may_hold(text):
    return text
  lines = text.splitlines(keepends=True)
  line_of = {}  # character offset of each line's start -> its index
  offset = 0
  for i, line in enumerate(lines):
    line_of[offset] = i
    offset += len(line)
  changed = set()
  for m in _ALIAS.finditer(text):
    if m.group(2) != WORD:
      changed.add(line_of[m.start()])
  names = legacy_names()
  for m in _FROM.finditer(text):
    submodule = m.group(2)[1:]
    imported = [part.split()[0] for part in
                re.sub(r'[()\\\n]', ' ', m.group(3)).split(',') if part.strip()]
    if (submodule and submodule not in api.SUBMODULES) or not imported:
      continue
    if not submodule and imported != ['*'] and not all(name in names for name in imported):
      continue
    changed.add(line_of[m.start()])
  for i in sorted(changed):
    line = lines[i]
    body = line.rstrip('\r\n')
    if body.endswith('\\'):
      continue
    new = re.sub(r'\boptim_compat\b', 'flax.optim', body, count=1)
    new += f' {MARK}' if '#' in body else f'  # {MARK}'
    lines[i] = new + line[len(body):]
  return ''.join(lines)


def restore(text: str) -> str:
  """``text`` (a rewrite of :func:`analysed`'s text) with each marked line it kept put back
  as the user wrote it: the mark dropped and the shim's module in place of flax.optim's (the
  first on the line, where :func:`analysed` wrote it; a ``from`` import the rewrite trimmed
  keeps its remaining names on the shim)."""
  if text is None or MARK not in text:
    return text
  lines = text.splitlines(keepends=True)
  for i, line in enumerate(lines):
    if MARK in line:
      body = line.rstrip('\r\n')
      kept = body.replace(f'  # {MARK}', '').replace(f' {MARK}', '')
      lines[i] = re.sub(r'\bflax\.optim\b', WORD, kept, count=1) + line[len(body):]
  return ''.join(lines)


def names_flax_optim(text: str) -> bool:
  """``text``'s code (as written; not its comments, TODOs or docstrings) reaches flax.optim:
  an import of it, ``<flax>.optim``, a ``"flax.optim..."`` string, ``getattr(<flax>,
  "optim")``. True when CPython cannot parse it (the rewrite reports that)."""
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return True
  flax = {'flax'}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      flax.update(a.asname for a in node.names if a.name == 'flax' and a.asname)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      if any(a.name == api.LEGACY or a.name.startswith(api.LEGACY + '.') for a in node.names):
        return True
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      if node.module == api.LEGACY or node.module.startswith(api.LEGACY + '.'):
        return True
      if node.module == 'flax' and any(a.name in ('optim', '*') for a in node.names):
        return True
    elif isinstance(node, ast.Attribute):
      if node.attr == 'optim' and isinstance(node.value, ast.Name) and node.value.id in flax:
        return True
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      if node.value == api.LEGACY or node.value.startswith(api.LEGACY + '.'):
        return True
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
        node.func.id == 'getattr') and len(node.args) >= 2 and isinstance(
            node.args[1], ast.Constant) and node.args[1].value == 'optim':
      return True
  return False
