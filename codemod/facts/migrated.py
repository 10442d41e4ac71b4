"""Factories of a module migrated before this run (they return ``TrainState.create(...)``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider

from codemod import legacy_api as api


class _MigratedFactories(cst.CSTVisitor):
  """Module-level functions that return ``TrainState.create(...)`` (directly, or a local
  name only ever assigned one): a module migrated before this run, so that its users still
  convert, and a second run over a tree gives what the first wrote."""

  METADATA_DEPENDENCIES = (QualifiedNameProvider,)

  def __init__(self):
    super().__init__()
    self.found: dict[str, Optional[bool]] = {}  # function -> inject_lr
    self._depth = 0                             # functions and classes entered
    self._assigned: dict[str, list] = {}        # local name -> values assigned
    self._returns: list = []

  def qnames(self, node) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

  def _creates(self, node) -> bool:
    return isinstance(node, cst.Call) and api.TRAIN_STATE_CREATE in self.qnames(node.func)

  def visit_ClassDef(self, node) -> None:
    self._depth += 1

  def leave_ClassDef(self, node) -> None:
    self._depth -= 1

  def visit_FunctionDef(self, node) -> None:
    if self._depth == 0:
      self._assigned, self._returns = {}, []
    self._depth += 1

  def visit_Assign(self, node) -> None:
    if self._depth == 1:
      for t in node.targets:
        if isinstance(t.target, cst.Name):
          self._assigned.setdefault(t.target.value, []).append(node.value)

  def visit_Return(self, node) -> None:
    if self._depth == 1 and node.value is not None:
      self._returns.append(node.value)

  def leave_FunctionDef(self, node) -> None:
    self._depth -= 1
    if self._depth or not self._returns:
      return
    creates = []
    for value in self._returns:
      if isinstance(value, cst.Name) and self._assigned.get(value.value):
        values = self._assigned[value.value]
      else:
        values = [value]
      if not all(self._creates(v) for v in values):
        return
      creates.extend(values)
    self.found[node.name.value] = self._inject(creates)

  def _inject(self, calls) -> Optional[bool]:
    verdicts = set()
    for call in calls:
      tx = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == 'tx'),
                None)
      if not isinstance(tx, cst.Call):
        return None  # built elsewhere: cannot tell
      finder = _Finder(self, api.INJECT)
      tx.visit(finder)
      verdicts.add(finder.found)
    return verdicts.pop() if len(verdicts) == 1 else None


class _Finder(cst.CSTVisitor):
  def __init__(self, owner, qname):
    super().__init__()
    self.owner, self.qname, self.found = owner, qname, False

  def visit_Call(self, node) -> None:
    if self.qname in self.owner.qnames(node.func):
      self.found = True


def migrated_factories(module: cst.Module, text: str) -> dict[str, Optional[bool]]:
  """``{function: inject_lr}`` of a module's functions that already return a TrainState
  (``module``: ``text`` parsed)."""
  if api.TRAIN_STATE_CREATE.rsplit('.', 2)[1] not in text:
    return {}
  visitor = _MigratedFactories()
  cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
  return visitor.found


class _MigratedFields(cst.CSTVisitor):
  """Module-level classes with fields annotated ``TrainState`` (``optimizer:
  train_state.TrainState``): what this codemod makes of a container class's
  ``flax.optim.Optimizer`` fields, or a class written for a TrainState."""

  METADATA_DEPENDENCIES = (QualifiedNameProvider,)

  def __init__(self):
    super().__init__()
    self.found: dict[str, list[str]] = {}  # class -> its TrainState fields
    self._classes: list[str] = []
    self._functions = 0

  def visit_ClassDef(self, node) -> None:
    self._classes.append(node.name.value)

  def leave_ClassDef(self, node) -> None:
    self._classes.pop()

  def visit_FunctionDef(self, node) -> None:
    self._functions += 1

  def leave_FunctionDef(self, node) -> None:
    self._functions -= 1

  def visit_AnnAssign(self, node) -> None:
    if len(self._classes) != 1 or self._functions or not isinstance(node.target, cst.Name):
      return
    names = m.findall(node.annotation, m.Name() | m.Attribute())
    if any(_TRAIN_STATE in {q.name for q in self.get_metadata(QualifiedNameProvider, x, set())}
           for x in names):
      fields = self.found.setdefault(self._classes[0], [])
      if node.target.value not in fields:
        fields.append(node.target.value)


_TRAIN_STATE = api.TRAIN_STATE_CREATE.rsplit('.', 1)[0]


def migrated_field_classes(module: cst.Module, text: str) -> dict[str, list[str]]:
  """``{class: fields}`` of a module's module-level classes whose fields are annotated
  ``flax.training.train_state.TrainState`` (``module``: ``text`` parsed): a container
  migrated before this run, so that its readers in other modules are planned as in the
  run that migrated it (a second run gives what the first wrote)."""
  if 'TrainState' not in text:
    return {}
  visitor = _MigratedFields()
  cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
  return visitor.found
