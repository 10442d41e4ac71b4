"""Syntax helpers of the OM2xx pass (no state: nodes in, nodes or facts out)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import libcst as cst
from libcst.metadata import ImportAssignment

from codemod.names import dotted_name as _dotted_name

if TYPE_CHECKING:  # annotations only: base imports this module
  from codemod.modern.base import _Base


_EQ = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(''),
                      whitespace_after=cst.SimpleWhitespace(''))


def _unsafe_why(rule: str) -> str:
  return f'unsafe fix {rule}: run with --unsafe-fixes or change it by hand'


def _with_todos(node, todos: list[str], header: set[str]):
  if not isinstance(node, cst.CSTNode):  # removed, or flattened into several lines
    if isinstance(node, cst.FlattenSentinel) and node.nodes:
      first = _with_todos(node.nodes[0], todos, header)
      return cst.FlattenSentinel([first, *node.nodes[1:]])
    return node
  existing = {ln.comment.value for ln in node.leading_lines if ln.comment} | header
  new = [t for t in todos if t not in existing]
  if not new:
    return node
  return node.with_changes(leading_lines=[*node.leading_lines,
                                          *(cst.EmptyLine(comment=cst.Comment(t)) for t in new)])


def _fix_semicolons(body):
  body = list(body)
  if body and not isinstance(getattr(body[-1], 'semicolon', None), type(cst.MaybeSentinel.DEFAULT)):
    body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
  return body


def _scope_chain_imports(scope):
  """The import assignments visible from ``scope`` (innermost first)."""
  while scope is not None:
    yield [a for a in scope.assignments if isinstance(a, ImportAssignment)]
    parent = getattr(scope, 'parent', None)
    scope = parent if parent is not scope else None




def _dotted(parts: Sequence[str]) -> cst.BaseExpression:
  expr: cst.BaseExpression = cst.Name(parts[0])
  for p in parts[1:]:
    expr = cst.Attribute(value=expr, attr=cst.Name(p))
  return expr


def _names(expr) -> list[str]:
  name = _dotted_name(expr)
  return name.split('.') if name else []


def _code(node) -> str:
  return cst.Module(body=[]).code_for_node(node)


def _atom(expr):
  if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.List, cst.Dict,
                       cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp)) or expr.lpar:
    return expr
  return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _bind(args: Sequence[cst.Arg], names: Sequence[str]) -> Optional[dict]:
  """``{parameter: value}`` for a call of ``def f(<names>)``, or None (stars, unknown or
  repeated keywords, too many positional arguments)."""
  bound = {}
  for i, a in enumerate(args):
    if a.star:
      return None
    if a.keyword is None:
      if i >= len(names) or names[i] in bound:
        return None
      bound[names[i]] = a.value
    else:
      key = a.keyword.value
      if key not in names or key in bound:
        return None
      bound[key] = a.value
  return bound


def _returns(fn: cst.FunctionDef) -> list:
  found = []

  class _R(cst.CSTVisitor):
    def visit_Return(self, node):
      found.append(node.value)

    def visit_FunctionDef(self, node):
      return node is fn

    def visit_Lambda(self, node):
      return False

    def visit_ClassDef(self, node):
      return False

  fn.visit(_R())
  return found


def _comp_fors(comp):
  while comp is not None:
    yield comp
    comp = comp.inner_for_in


def _keys_with(body, name: str, rewriter: '_Base') -> bool:
  """``name`` is a key of a dict display, or indexes a name whose reaching value is a dict
  (``{}``, ``dict(...)``, a dict comprehension, ``collections.defaultdict(...)``), in ``body``."""
  found = []

  class _K(cst.CSTVisitor):
    def visit_DictElement(self, node):
      if isinstance(node.key, cst.Name) and node.key.value == name:
        found.append(node)

    def visit_Subscript(self, node):
      if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) and \
          isinstance(node.slice[0].slice.value, cst.Name) and \
          node.slice[0].slice.value.value == name and isinstance(node.value, cst.Name):
        value = rewriter.value_of(node.value)
        if value is not None and value[1] is None and _is_dict(value[0], rewriter):
          found.append(node)

    def visit_FunctionDef(self, node):
      return False

  body.visit(_K())
  return bool(found)


def _is_dict(expr, rewriter: '_Base') -> bool:
  if isinstance(expr, (cst.Dict, cst.DictComp)):
    return True
  return isinstance(expr, cst.Call) and bool(
      rewriter.qname_in(expr.func, {'builtins.dict', 'collections.defaultdict',
                                    'collections.OrderedDict', 'collections.Counter'}))


def _own_comment(leading_lines: Sequence[cst.EmptyLine]) -> int:
  """How many of a removed omnistaging call's leading lines are its own comment and go with it:
  the block of comment lines directly above the call (no blank line between), when one of them
  names omnistaging ('# Require JAX omnistaging mode.'); else 0 (other comments are kept)."""
  n = 0
  for ln in reversed(leading_lines):
    if ln.comment is None:
      break
    n += 1
  block = leading_lines[len(leading_lines) - n:]
  return n if any('omnistaging' in ln.comment.value.lower() for ln in block) else 0
