"""Per-site decisions: one read-only walk of the module asking each rule family what to do.

The walk visits the nodes in the order the rewrite will, so the report lists
the findings in the order of the TODO lines and fixes in the file. At each
node the families are asked in a fixed order (:data:`CALL_CHAIN` and the
``leave_Attribute`` sequence): the first link that claims a call ends its
chain, as a file's more specific rule wins over a general one. A family
records a fix (:meth:`SitePlanner.fix`, applied by ``codemod.rewrite``) or a
flag (:meth:`SitePlanner.flag`, a TODO on the statement and a report entry).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

import libcst as cst

from codemod.visiting import NoAttributeHooks
from codemod.failures import failure
from codemod.findings import TODO_PREFIX, Finding, one_line, render, stale_todo, todo_text
from codemod.rules import (references, apply_gradient, attributes, crossmodule, defs, imports,
                           methods, restores)


@dataclasses.dataclass
class Fix:
  """A rewrite the plan chose at one node: ``apply(ctx, original, updated, fix)`` returns the
  new node (``codemod.rewrite``); ``findings`` are its report entries, in order; ``family``:
  the rule family that chose it (named if the fix fails)."""
  apply: Callable
  findings: list
  data: dict
  family: str = ''


def _stop_if_unproven(p, original) -> bool:
  return p.q.unproven


def _stop_if_blocked(p, original) -> bool:
  return p.q.blocked


def _step_calls(p, original) -> bool:
  return bool(p.q.step_calls) and crossmodule.leave_step_call(p, original)


def _held_container(p, original) -> bool:
  crossmodule.leave_held_container(p, original)
  return False


#: The links of a call's chain, in order; a link returning True ends it.
CALL_CHAIN = (
    _held_container,
    defs.leave_def_call,
    _step_calls,
    attributes.leave_reflection,
    defs.leave_create,
    apply_gradient.leave_mixed_lr,
    crossmodule.leave_unproven_apply,
    crossmodule.leave_tree_field_replace,
    crossmodule.leave_def_create,
    restores.leave_raw_restore,  # (also in a file with nothing to convert: flagged only)
    _stop_if_unproven,
    apply_gradient.leave_optimize_lr,
    methods.leave_method,
    apply_gradient.leave_apply_problem,
    restores.leave_save,  # (also where the file keeps its legacy code: orbax's absolute path)
    _stop_if_blocked,
    attributes.leave_reset,
    restores.leave_restore,
    apply_gradient.leave_apply,
    attributes.leave_replace,
)

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)


class SitePlanner(NoAttributeHooks, cst.CSTVisitor):
  """Walks the analysed module once, recording fixes, flags and the TODO lines of each
  statement in ``plan``."""

  def __init__(self, q, plan):
    super().__init__()
    self.q = q
    self.plan = plan
    self.state_of_step: set[int] = set()  # `.state` of a `.state.step` (flagged once, at `.step`)
    self._pending: list[list[str]] = []   # TODO lines of the statements being visited
    self._unless: list[list[tuple]] = []  # ... and flags for them only if nothing else flags
    self._todo_above: list[bool] = []      # ... and whether an earlier run put one above each
    self._stack: list[int] = []           # ids of the nodes being visited
    self._stale = TODO_PREFIX in q.analysis.text

  # -- what the families call ---------------------------------------------------------------
  def flag(self, node, rule, text, *, blocks=False, note=None, data=None) -> None:
    """A manual item at ``node``: a report entry and a TODO on its statement (once per
    statement; nothing when ``rule`` is not selected). ``blocks``: it keeps the file on its
    legacy code; ``note`` (default: ``blocks``): the message says so."""
    if not self.q.opts.enabled(rule):
      return
    message, reason = render(text, blocks if note is None else note)
    line = todo_text(rule, message)
    if self._pending and line in self._pending[-1]:
      return  # once per statement
    self.plan.findings.append(Finding(*self.q.n.pos(node), rule, message, False, blocks, reason,
                                      data or {}))
    self._add_todo(line)

  def flag_unless_flagged(self, node, rule, text) -> None:
    """A note (:meth:`flag`, ``note=True``) at ``node`` that its statement gets only when no
    other flag lands on it (a kept file's legacy use, when its statement says why already)."""
    if self._unless:
      self._unless[-1].append((node, rule, text))

  def todo_above(self) -> bool:
    """The statement being visited has a TODO(optim-migrate) line an earlier run wrote."""
    return bool(self._todo_above) and self._todo_above[-1]

  def note(self, rule, message) -> None:
    """An inline TODO on the current statement (no report entry)."""
    self._add_todo(todo_text(rule, one_line(message)))

  def fix(self, node, apply, findings, data=None) -> Fix:
    """A rewrite at ``node`` (``findings``: its ``(rule, message)`` report entries; a message
    of None is filled in by ``apply``)."""
    line, col = self.q.n.pos(node)
    made = [Finding(line, col, rule, one_line(message) if message else '', True)
            for rule, message in findings]  # (an excerpt over several lines: one report line)
    self.plan.findings.extend(made)
    caller = sys._getframe(1).f_globals.get('__name__', '')  # the family deciding it
    fix = Fix(apply, made, data or {}, caller.rsplit('.', 1)[-1])
    self.plan.fixes[id(node)] = fix
    self._mark()
    return fix

  def _add_todo(self, line: str) -> None:
    if self._pending and line not in self._pending[-1]:
      self._pending[-1].append(line)

  def _mark(self) -> None:
    """The nodes being visited lead to a decision: the rewrite must enter them."""
    self.plan.marks.update(self._stack)

  # -- the walk -------------------------------------------------------------------------------
  def on_visit(self, node) -> bool:
    try:
      return self._on_visit(node)
    except Exception as e:  # noqa: BLE001 - reported with the family that raised
      raise failure(e, node, self.q.n) from e

  def on_leave(self, original) -> None:
    try:
      self._on_leave(original)
    except Exception as e:  # noqa: BLE001
      raise failure(e, original, self.q.n) from e

  def _on_visit(self, node) -> bool:
    self._stack.append(id(node))
    if isinstance(node, _STATEMENTS):
      self._pending.append([])
      self._unless.append([])
      self._todo_above.append(any(ll.comment is not None and ll.comment.value.startswith(
          TODO_PREFIX) for ll in node.leading_lines))
      if node is self.plan.first_statement:
        imports.first_statement(self, node)
      if self._stale and self.q.converts and any(
          ll.comment is not None and stale_todo(ll.comment.value) for ll in node.leading_lines):
        self._mark()  # an earlier run's "keeps its legacy code" TODO, now stale
    imports.visit_node(self, node)
    defs.visit_statement_node(self, node)
    return super().on_visit(node)

  def _on_leave(self, original) -> None:
    super().on_leave(original)
    if isinstance(original, _STATEMENTS):
      unless = self._unless.pop()
      if unless and not self._pending[-1]:
        for node, rule, text in unless:
          self.flag(node, rule, text, note=True)
      todos = self._pending.pop()
      self._todo_above.pop()
      if todos:
        self.plan.todos[id(original)] = todos
        self._mark()
    self._stack.pop()

  def visit_Name(self, node) -> None:
    references.visit_reference(self, node)
    crossmodule.visit_name(self, node)

  def visit_Attribute(self, node) -> None:
    references.visit_reference(self, node)
    crossmodule.visit_name(self, node)
    attributes.visit_attribute(self, node)

  def visit_ClassDef(self, node) -> None:
    references.visit_class(self, node)
    crossmodule.visit_class(self, node)

  def visit_FunctionDef(self, node) -> None:
    crossmodule.visit_function(self, node)

  def visit_If(self, node) -> Optional[bool]:
    if id(node) not in self.q.f.legacy_branches:
      return None
    node.test.visit(self)  # (the legacy branch is dropped: references.leave_legacy_branch)
    if node.orelse is not None:
      node.orelse.visit(self)
    return False

  def leave_If(self, original) -> None:
    references.leave_legacy_branch(self, original)

  def visit_Import(self, node) -> bool:
    imports.visit_import(self, node)
    return False

  def visit_ImportFrom(self, node) -> bool:
    imports.visit_import(self, node)
    return False

  def leave_ImportFrom(self, original) -> None:
    imports.leave_import_from(self, original)

  def leave_Call(self, original) -> None:
    for link in CALL_CHAIN:
      if link(self, original):
        return

  def leave_Name(self, original) -> None:
    references.leave_reference(self, original)

  def leave_Tuple(self, original) -> None:
    references.leave_dual_support(self, original)

  def leave_SimpleString(self, original) -> None:
    references.leave_docstring(self, original)

  def leave_Attribute(self, original) -> None:
    attributes.leave_method_reference(self, original)
    if references.leave_reference(self, original):
      return
    no_equivalent = attributes.leave_legacy_only(self, original)
    defs.leave_def_attribute(self, original)
    if crossmodule.leave_unconverted_member(self, original, no_equivalent):
      return
    crossmodule.leave_flow_failure(self, original)
    crossmodule.leave_unproven_member(self, original)
    if not self.q.converts:
      return
    if defs.leave_hp_read(self, original):
      return
    attributes.leave_rename(self, original)

  def leave_Assign(self, original) -> None:
    methods.leave_compute_gradient(self, original)

  def leave_SimpleStatementLine(self, original) -> None:
    methods.leave_optimize(self, original)
    apply_gradient.leave_hp_assign(self, original)
