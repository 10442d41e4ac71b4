"""The OM2xx pass: rewrite (or flag) JAX / Flax APIs removed beside ``flax.optim``.

Its own LibCST transformer over its own table (``codemod.modern.table``); the
engine calls :func:`apply` once per file, after the ``flax.optim`` pass, with
that pass's result. Names are resolved as ``QualifiedNameProvider`` resolves them (``from
jax import tree_map``, ``import jax as J; J.tree_map`` and
``jax.tree_util.tree_multimap`` all resolve; a local ``tree_map`` or another
library's does not) and ``ScopeProvider``; imports are added and dropped with
LibCST's ``AddImportsVisitor`` / ``RemoveImportsVisitor``.

Values are followed only in straight-line code: a name's value is the one of
its nearest earlier assignment in the same scope, taken only when that
statement is in the block of the use or an enclosing one (no loop or branch
rebinding it in between is looked for); anything else is not proven.

The fixes live in one module per family (``imports``, ``drops``, ``references``,
``arrays``, ``linen``; the shared machinery in ``base``, the read-only facts in
``facts``, syntax helpers in ``helpers``); this module runs the pass and dispatches
calls by the kind of their table entry.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from codemod import import_scope
from codemod.rules import Options
from codemod.findings import Finding, line_opcodes
from codemod.sources import parse
from codemod.modern.base import _DROP, _FROZEN, _GROUPS, _PIL, _SCATTER, _SECOND_ARG, _STATIC, _Base
from codemod.modern import table
from codemod.modern.facts import _Facts
from codemod.modern.imports import _Imports
from codemod.modern.drops import _Drops
from codemod.modern.references import _References
from codemod.modern.arrays import _Arrays
from codemod.modern.linen import _Linen

_KEYED = table.by_first_word(_GROUPS)


def may_apply(text: str) -> bool:
  """Cheap text prefilter: False only for files no OM2xx entry can apply to (one of the
  table's groups must pass: ``codemod.modern.table.prefilter_words``)."""
  return table.passes(text, _KEYED)


def rewrite_source(source: str, options: Options | None = None) -> tuple[str, list[Finding]]:
  """The OM2xx pass over one module's source.

  Returns:
    ``(new_source, findings)``; finding positions are ``source``'s (1-based line,
    1-based column).

  Raises:
    libcst.ParserSyntaxError: ``source`` does not parse.
  """
  options = options or Options()
  module = parse(source)
  wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
  facts = _Facts()
  wrapper.visit(facts)
  context = CodemodContext()
  rewriter = _Rewriter(context, facts, options, module, wrapper)
  new = wrapper.visit(rewriter)
  if rewriter.adds or rewriter.removes:
    for mod, obj, asname in rewriter.adds:
      AddImportsVisitor.add_needed_import(context, mod, obj, asname)
    for mod, obj, asname in rewriter.removes:
      RemoveImportsVisitor.remove_unused_import(context, mod, obj, asname)
    # LibCST's visitors, given only the statements they can act on (codemod.import_scope)
    if rewriter.adds:
      new = import_scope.add_imports(context, new, anchored=False)
    if rewriter.removes:
      removals = context.scratch.pop(RemoveImportsVisitor.CONTEXT_KEY, [])
      n_head = next((i for i, st in enumerate(new.body)
                     if isinstance(st, cst.BaseCompoundStatement)), len(new.body))
      new = import_scope.keep_section_breaks(
          new, import_scope.remove_unused_imports(context, new, n_head, removals))
  return new.code, rewriter.findings


def apply(result, options: Options | None = None, parse_error=None):
  """The engine's hook: run the OM2xx pass on ``result.new`` (a ``codemod.engine.FileResult``
  the ``flax.optim`` pass produced, or the untouched source) and merge its findings.

  Findings are positioned in ``result.original`` (lines the first pass changed are mapped
  through a line diff). A file that does not parse, whose OM2xx output would not parse, or
  on which the pass fails gets ``result.error`` (``parse_error(path, source, exc)`` words a
  parse error) and ``new`` None: nothing is written.
  """
  if result.error or result.new is None or not may_apply(result.new):
    return result
  current = result.new
  try:
    new, findings = rewrite_source(current, options)
    problem = None if new == current else _syntax_problem(new)
  except cst.ParserSyntaxError as e:
    result.error = parse_error(result.path, current, e) if parse_error else \
        f'{result.path}: cannot parse: {e.message}'
    result.new = None
    return result
  except Exception as e:  # noqa: BLE001 - one file's failure must not stop the run
    result.error = f'{result.path}: OM2xx pass failed: {type(e).__name__}: {e}'
    result.new = None
    return result
  if problem:
    result.error = f'{result.path}: internal error, OM2xx output does not parse ({problem}); file left as is'
    result.new = None
    return result
  if findings and current != result.original:
    line_of = _line_map(current, result.original)
    findings = [dataclasses.replace(f, line=line_of(f.line)) for f in findings]
  result.new = new
  result.findings = [*result.findings, *findings]
  return result


def _syntax_problem(text: str) -> Optional[str]:
  try:
    compile(text, '<om2xx>', 'exec', flags=0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST
  except SyntaxError as e:
    return f'line {e.lineno}: {e.msg}'
  return None


def _line_map(current: str, original: str):
  """A function: line of ``current`` -> the line of ``original`` it came from (unchanged
  lines exactly; a changed or inserted line -> the original line it replaced or follows)."""
  a, b = original.splitlines(), current.splitlines()
  mapping: dict[int, int] = {}
  for tag, i1, i2, j1, j2 in line_opcodes(a, b):
    for k, j in enumerate(range(j1, j2)):
      if tag == 'equal':
        mapping[j + 1] = i1 + k + 1
      else:
        mapping[j + 1] = min(i1 + k, max(i2 - 1, i1)) + 1 if i2 > i1 else max(i1, 1)
  return lambda line: mapping.get(line, line)


#: expressions that need no parentheses where a call stood
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float,
          cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString,
          cst.Tuple, cst.List, cst.Dict, cst.Set)


def _pure_first(call: cst.Call) -> bool:
  """``call`` has two plain positional arguments, the first a name, an attribute chain on a
  name or a constant: dropping it drops no side effect."""
  if len(call.args) != 2 or any(a.keyword is not None or a.star for a in call.args):
    return False
  first = call.args[0].value
  while isinstance(first, cst.Attribute):
    first = first.value
  return isinstance(first, (cst.Name, cst.Integer, cst.Float, cst.SimpleString))


class _Rewriter(_Imports, _Drops, _References, _Arrays, _Linen, _Base):
  """The OM2xx transformer: each fix family is a mixin (``imports``, ``drops``,
  ``references``, ``arrays``, ``linen``) over the shared :class:`~codemod.modern.base._Base`;
  calls are dispatched here, by the kind of their table entry."""

  # -- calls -------------------------------------------------------------------------------
  def visit_Call(self, node):
    if (name := self.qname_in(node.func, _SECOND_ARG)) is not None and _pure_first(node) and \
        self.opts.fixable(_SECOND_ARG[name].rule):
      self.second_arg_funcs.add(id(node.func))  # (its reference is then not flagged)

  def leave_Call(self, original, updated):
    func = original.func
    if id(func) in self.second_arg_funcs:
      api = _SECOND_ARG[self.qname_in(func, _SECOND_ARG)]
      self.fixed(original, api.rule, f'`tie_in(x, y)` -> `y`: {api.why}; {api.since}')
      value = updated.args[1].value
      if not isinstance(value, _ATOMS) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
      return value.with_changes(lpar=[*updated.lpar, *value.lpar],
                                rpar=[*value.rpar, *updated.rpar])
    if (name := self.qname_in(func, _SCATTER)) is not None:
      return self._scatter(original, updated, _SCATTER[name])
    if (name := self.qname_in(func, _STATIC)) is not None:
      return self._static_sizes(original, updated)
    if (name := self.qname_in(func, _PIL)) is not None:
      return self._pil(original, updated)
    if (name := self.qname_in(func, _DROP)) is not None and original.args:
      self.flag(original, 'OM224', f'`{name}(...)` with arguments: omnistaging is always on; '
                'delete the call')
    self._cells(original)
    if isinstance(func, cst.Attribute) and func.attr.value in _FROZEN:
      return self._frozen(original, updated)
    construction = self._construction(func)
    if construction is not None:
      kind, ctor = construction
      return self._mha(original, updated) if kind == 'mha' else \
          self._dropout(original, updated, ctor)
    self._unproven_mha(original)
    return updated
