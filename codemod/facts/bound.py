"""Names a module binds by anything but an import (a rewrite must not emit one of them)."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from codemod.names import target_names


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
