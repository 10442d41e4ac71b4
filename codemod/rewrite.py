"""Apply a module's plan: the one traversal that rewrites it.

Each node the plan chose a fix for is handed to the fix's own rule family
(``codemod.rules.<family>.apply_*``), and each statement gets the TODO lines
the plan gave it; nothing is decided here. The traversal enters only the nodes
on the way to a decision (``Plan.marks``). A family that fails is reported by
name and position (``codemod.failures.RuleFailure``); the engine then leaves
the file as it is.
"""
from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from codemod.visiting import NoAttributeHooks
from codemod.facts.setaside import restore
from codemod.failures import failure
from codemod.findings import TODO_LINE, stale_todo
from codemod.rules import fallback, imports

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)


class Context:
  """What a fix may use: the module's queries (read-only) and the import list."""

  def __init__(self, codemod_context: CodemodContext, queries):
    self.context = codemod_context
    self.q = queries

  def add_import(self, module, obj=None, asname=None) -> None:
    AddImportsVisitor.add_needed_import(self.context, module, obj, asname)


class _Apply(NoAttributeHooks, cst.CSTTransformer):
  def __init__(self, plan, ctx: Context):
    super().__init__()
    self.plan, self.ctx = plan, ctx

  def on_visit(self, node) -> bool:
    return id(node) in self.plan.marks

  def on_leave(self, original, updated):
    result = updated
    fix = self.plan.fixes.get(id(original))
    if fix is not None:
      try:
        result = fix.apply(self.ctx, original, updated, fix)
      except Exception as e:  # noqa: BLE001 - reported by the engine with the family's name
        raise failure(e, original, self.ctx.q.n, fix.family or 'rewrite') from e
    if isinstance(original, _STATEMENTS) and isinstance(result, cst.CSTNode):
      result = self._todos(original, result)
    return result

  def _todos(self, original, result):
    plan = self.plan
    if plan.converts:
      # this run converts the file: an earlier run's "keeps its legacy code" TODO is stale
      kept = [ll for ll in result.leading_lines
              if not (ll.comment is not None and stale_todo(ll.comment.value))]
      if len(kept) != len(result.leading_lines):
        result = result.with_changes(leading_lines=kept)
    todos = plan.todos.get(id(original))
    if todos:
      existing = {ll.comment.value for ll in result.leading_lines if ll.comment}
      if original is plan.first_statement:  # comments above it are the module's header
        existing |= plan.header_comments
      new = [t for t in todos if t not in existing]
      if new:
        # an earlier run's TODO of the same rule on this statement, worded otherwise (a
        # single-file run, then the whole tree's: helper-19), is replaced, not stacked
        rules = {found.group(2) for t in new if (found := TODO_LINE.match(t))}
        kept = [ll for ll in result.leading_lines if not (
            ll.comment is not None and ll.comment.value not in todos
            and (found := TODO_LINE.match(ll.comment.value)) and found.group(2) in rules)]
        lines = [cst.EmptyLine(comment=cst.Comment(t)) for t in new]
        result = result.with_changes(leading_lines=[*kept, *lines])
    return result


def apply_plan(analysis, plan, context: CodemodContext) -> cst.Module:
  """The module rewritten as ``plan`` says, set-aside statements put back, imports fixed.

  Raises:
    codemod.failures.RuleFailure: a family's fix raised.
  """
  tree = analysis.module.visit(_Apply(plan, Context(context, plan.queries)))
  tree = restore(tree, analysis.originals)
  try:
    tree = imports.finish(context, plan.queries, tree, analysis.full)
  except Exception as e:  # noqa: BLE001
    raise failure(e, None, analysis.names, 'imports') from e
  if plan.fallback:
    try:
      tree = fallback.apply(tree)
    except Exception as e:  # noqa: BLE001
      raise failure(e, None, analysis.names, 'fallback') from e
  elif plan.converts and not fallback.wanted(plan.queries):  # (no flax.optim code is left)
    tree = fallback.drop_stale(tree)
  return tree
