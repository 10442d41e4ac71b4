"""Names a module binds by anything but an import of the module the rewrite means by them (a
rewrite must not emit one of them)."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from codemod.legacy_api import EMITTED_MODULES
from codemod.names import dotted_name as _dotted, target_names


class Bindings(cst.CSTVisitor):
  """Names bound by anything but an import (assignments, parameters, defs, loops, ...)."""

  def __init__(self):
    self.names: set[str] = set()

  def _add(self, target) -> None:
    self.names.update(n.value for n in target_names(target))

  def visit_AssignTarget(self, node):
    self._add(node.target)

  def visit_AnnAssign(self, node):
    self._add(node.target)

  def visit_AugAssign(self, node):
    self._add(node.target)

  def visit_NamedExpr(self, node):
    self._add(node.target)

  def visit_For(self, node):
    self._add(node.target)

  def visit_CompFor(self, node):
    self._add(node.target)

  def visit_WithItem(self, node):
    if node.asname is not None:
      self._add(node.asname.name)

  def visit_ExceptHandler(self, node):
    if node.name is not None:
      self._add(node.name.name)

  def visit_Param(self, node):
    self._add(node.name)

  def visit_FunctionDef(self, node):
    self._add(node.name)

  def visit_ClassDef(self, node):
    self._add(node.name)

  def visit_Import(self, node):
    for alias in node.names:
      full = _dotted(alias.name)
      bound = alias.asname.name.value if alias.asname else full.split('.')[0]
      if alias.asname is not None and EMITTED_MODULES.get(bound, full) != full:
        self.names.add(bound)  # `import other.module as train_state`
    return False

  def visit_ImportFrom(self, node):
    if isinstance(node.names, cst.ImportStar):
      return False
    module = _dotted(node.module) if node.module is not None else ''
    for alias in node.names:
      bound = (alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name)
               else _dotted(alias.name))
      full = f'{module}.{_dotted(alias.name)}' if module and not node.relative else None
      if bound in EMITTED_MODULES and EMITTED_MODULES[bound] != full:
        self.names.add(bound)  # `from t5x import train_state`, `from . import optax`
    return False




def bound_names(tree: cst.Module, among: frozenset, code: Optional[str] = None) -> set[str]:
  """The names of ``among`` that ``tree`` binds by anything but an import (``code``:
  ``tree``'s source text, when the caller has it).

  A name bound in a statement is spelled in that statement's text, so only the
  top-level statements whose text holds one of the words are walked: most
  modules hold none, and a full walk cost ~10 ms per file.
  """
  pattern = re.compile(r'\b(?:' + '|'.join(map(re.escape, sorted(among))) + r')\b')
  if not pattern.search(tree.code if code is None else code):
    return set()
  visitor = Bindings()
  for stmt in tree.body:
    if pattern.search(tree.code_for_node(stmt)):
      stmt.visit(visitor)
  return visitor.names & among
