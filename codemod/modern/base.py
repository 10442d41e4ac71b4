"""What every OM2xx fix shares: the table read by kind, and the rewriter's base.

:class:`_Base` is the transformer's bookkeeping (findings, TODO lines per statement,
fixed / flagged / decided), qualified names at a site, an expression naming a module
there (scheduling its import), and values followed in straight-line code (see
``codemod.modern.rewrite``). The fix families (``imports``, ``drops``, ``references``,
``arrays``, ``linen``) are mixins over it; ``codemod.modern.rewrite`` puts them together.
"""
from __future__ import annotations

import builtins
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.metadata import ImportAssignment, PositionProvider, ScopeProvider

from codemod import docstrings
from codemod.visiting import NoAttributeHooks
from codemod.modern import table
from codemod.positions import StatementPositions
from codemod.rules import RULES, TODO_PREFIX, Options
from codemod.findings import Finding, one_line
from codemod.modern.helpers import _dotted, _names, _scope_chain_imports, _with_todos
from codemod.modern.facts import _Facts


_GROUPS = table.prefilter_words()
_RENAMES = table.renames()
_RELOCATE = table.by_kind('relocate')
_DROP = table.by_kind('drop_call')
_FLAGS = table.by_kind('flag')
_SCATTER = table.by_kind('scatter')
_MHA = table.by_kind('mha')
_DROPOUT = table.by_kind('dropout')
_STATIC = table.by_kind('static_sizes')
_PIL = table.by_kind('pil')
_SECOND_ARG = table.by_kind('second_arg')
_FROZEN = {a.extra: a for a in table.APIS if a.kind == 'frozendict'}
_CELLS = {q for q, a in _FLAGS.items() if a.rule == 'OM222'}
_DICT_KEYS = next(a for a in table.APIS if a.kind == 'dict_keys')
#: moved modules (``jax.experimental.optimizers``): their import statements move too
_MODULE_MOVES = {q: a for q, a in _RENAMES.items() if a.extra == 'module'}
#: names a from-import may bind that a relocation renames to (the old qname -> new qname)
_FROM_MOVES = {**{q: a.new for q, a in _RENAMES.items()},
               **{q: a.new for q, a in _RELOCATE.items() if q != 'jax.config'}}
#: modules added when nothing in scope names them: module -> (import module, asname, local name)
_ADDABLE = {'jax': ('jax', None, 'jax'), 'jax.numpy': ('jax.numpy', 'jnp', 'jnp'),
            'numpy': ('numpy', 'np', 'np'), 'flax': ('flax', None, 'flax')}
_BUILTINS = frozenset(dir(builtins))
_ARRAY_CTORS = frozenset({'jax.numpy.array', 'jax.numpy.asarray'})
_NUMPY_WRAPS = frozenset({'numpy.asarray', 'numpy.array', 'numpy.ascontiguousarray',
                          'jax.device_get'})


class _Base(NoAttributeHooks, cst.CSTTransformer):
  """The transformer's shared machinery (the fix families are mixins over it)."""

  # Only scopes are resolved for every file the pass parses; qualified names are asked of a
  # node's scope when a fix asks (what QualifiedNameProvider does for every node), and
  # positions per top-level statement, when a finding or a value followed asks
  # (codemod.positions): on the ecosystem tree the two providers were a third of the pass.
  METADATA_DEPENDENCIES = (ScopeProvider,)

  def __init__(self, context: CodemodContext, facts: _Facts, options: Options,
               module: cst.Module, wrapper: Optional[cst.MetadataWrapper] = None):
    super().__init__()
    self._wrapper = wrapper
    self._positions = StatementPositions(module)  # per top-level statement, when asked
    self._top: Optional[int] = None  # index of the top-level statement being visited
    self._qnames: dict[int, set[str]] = {}  # id(original node) -> its qualified names
    self._layer_values: Optional[bool] = None  # see _Linen._layers_assigned
    self.context, self.facts, self.opts = context, facts, options
    self.findings: list[Finding] = []
    self.adds: list[tuple[str, Optional[str], Optional[str]]] = []
    self.removes: list[tuple[str, Optional[str], Optional[str]]] = []
    self._pending: list[list[str]] = []
    self._dropped: set[int] = set()       # ids of `pass` lines standing for removed statements
    self.second_arg_funcs: set[int] = set()  # ids of the funcs of calls OM217 replaces
    self._classes: list[cst.ClassDef] = []
    self._plans: dict[tuple[int, int], Optional[tuple]] = {}  # see _plan
    self._first = module.body[0] if module.body else None
    self._module_node = module
    self._header = {ln.comment.value for ln in module.header if ln.comment}

  # -- bookkeeping -----------------------------------------------------------------------
  def on_visit(self, node):
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      if not self._pending:
        self._top = self._positions.index(node)
      self._pending.append([])
    return super().on_visit(node)

  def on_leave(self, original, updated):
    result = super().on_leave(original, updated)
    if isinstance(original, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      todos = self._pending.pop()
      if todos:
        result = _with_todos(result, todos, self._header if original is self._first else set())
    return result

  def _pos(self, node) -> tuple[int, int]:
    pos = self.get_metadata(PositionProvider, node, None)
    return (pos.start.line, pos.start.column + 1) if pos else (1, 1)

  def fixed(self, node, rule: str, message: str) -> None:
    self.findings.append(Finding(*self._pos(node), rule, message, True))

  def flag(self, node, rule: str, message: str) -> None:
    if not self.opts.enabled(rule):
      return
    message = one_line(message)  # a multi-line excerpt would make the comment no comment
    text = f'{TODO_PREFIX}{rule}: {message}'
    if self._pending and text in self._pending[-1]:
      return  # once per statement
    self.findings.append(Finding(*self._pos(node), rule, message, False))
    if self._pending:
      self._pending[-1].append(text)

  def decide(self, node, rule: str, message: str, todo: str) -> bool:
    """Whether to apply ``rule``'s fix at ``node``: reported as fixed when it is applied, as a
    TODO (``todo``) when it is an unsafe fix without ``--unsafe-fixes``; nothing when the
    rule is not selected."""
    if self.opts.fixable(rule):
      self.fixed(node, rule, message)
      return True
    if self.opts.enabled(rule) and RULES[rule].safety == 'unsafe':
      self.flag(node, rule, todo)
    return False

  def get_metadata(self, key, node, default=None):
    if key is PositionProvider:
      return self._positions.get(node, default, self._top)
    return super().get_metadata(key, node, default)

  def qnames(self, node) -> set[str]:
    """The qualified names ``node`` (an original node) has, as ``QualifiedNameProvider``
    gives them (its scope's ``get_qualified_names_for``)."""
    found = self._qnames.get(id(node))
    if found is None and not self._may_be_imported(node):
      found = self._qnames[id(node)] = set()
    if found is None:
      scope = self.get_metadata(ScopeProvider, node, None)
      found = {q.name for q in scope.get_qualified_names_for(node)} if scope else set()
      self._qnames[id(node)] = found
    return found

  def _may_be_imported(self, node) -> bool:
    """False for a name, or an attribute chain on a name, that no import binds and no
    builtin has: its qualified names are the module's own (``x``, ``f.<locals>.x``), never
    one of the tables' (a cheap test that spares the scope lookup of most names)."""
    while isinstance(node, cst.Attribute):
      node = node.value
    if not isinstance(node, cst.Name):
      return True
    return node.value in self.facts.import_roots or node.value in _BUILTINS

  def qname_in(self, node, names) -> Optional[str]:
    found = sorted(q for q in self.qnames(node) if q in names)
    return found[0] if found else None

  def _loads(self, node) -> bool:
    return id(node) not in self.facts.stores

  # -- names of modules at a site --------------------------------------------------------
  def module_expr(self, node, module: str) -> Optional[cst.BaseExpression]:
    """An expression naming ``module`` at ``node`` (``jnp`` for ``jax.numpy`` after ``import
    jax.numpy as jnp``, ``jax.numpy`` after ``import jax``), else an import of it is scheduled
    (``import jax``, ``import jax.numpy as jnp``, ``import numpy as np``, ``import flax``) when
    its name is bound nowhere in the module; None when neither is possible."""
    scope = self.get_metadata(ScopeProvider, node, None)
    here = self.get_metadata(PositionProvider, node, None)
    if scope is not None:
      best = None
      for assignments in _scope_chain_imports(scope):
        for a in assignments:
          at = self.get_metadata(PositionProvider, a.node, None)
          if at is None or here is None or (at.start.line, at.start.column) >= \
              (here.start.line, here.start.column):
            continue  # an import after the use (a late import, a later notebook cell)
          for q in a.get_qualified_names_for(a.name):
            if (module == q.name or module.startswith(q.name + '.')) and \
                self._only_binding(scope, a.name, q.name):
              rest = module[len(q.name):].lstrip('.').split('.') if module != q.name else []
              if best is None or len(rest) < len(best[1]):
                best = (a.name, rest)
      if best is not None:  # (`import flax.core` binds the name 'flax.core': two parts)
        return _dotted([*best[0].split('.'), *best[1]])
    add = _ADDABLE.get(module)
    if add is None:
      parent = module.rsplit('.', 1)[0] if '.' in module else None
      base = self.module_expr(node, parent) if parent else None
      return _dotted([*_names(base), module.rsplit('.', 1)[1]]) if base is not None else None
    mod, asname, local = add
    if local in self.facts.bound and (mod, None, asname) not in self.adds:
      return None
    if (mod, None, asname) not in self.adds:
      self.adds.append((mod, None, asname))
      self.facts.bound.add(local)
    return cst.Name(local)

  @staticmethod
  def _only_binding(scope, name: str, qname: str) -> bool:
    assignments = list(scope[name])
    return bool(assignments) and all(
        isinstance(a, ImportAssignment) and {q.name for q in a.get_qualified_names_for(name)}
        == {qname} for a in assignments)

  # -- values in straight-line code ------------------------------------------------------
  def _use_site(self, name: cst.Name):
    """``((line, column), statement)`` of a use of ``name``, or None where unknown."""
    pos = self.get_metadata(PositionProvider, name, None)
    use_stmt = self._statement_of(name)
    if pos is None or use_stmt is None:
      return None
    return (pos.start.line, pos.start.column), use_stmt

  def _reassigned_in_loop(self, use_stmt, later: list) -> bool:
    """One of the assignments ``later`` than a use (their statements) is in a loop around
    the use: it reaches the use the next time round."""
    loops = self._loops(use_stmt)
    return any(loop in self._loops(stmt) for stmt in later for loop in loops)

  def documented_param(self, name: cst.Name, last_names) -> Optional[str]:
    """The type the docstring of ``name``'s function documents for it (a dotted name ending
    in one of ``last_names``: ``frozen_dict.FrozenDict``), where ``name`` is that function's
    parameter and nothing else assigned to it reaches the use (``p = p.unfreeze()`` reads
    the parameter); else None (:mod:`codemod.docstrings`)."""
    scope = self.get_metadata(ScopeProvider, name, None)
    fn = getattr(scope, 'node', None)
    if not isinstance(fn, cst.FunctionDef):
      return None
    site = self._use_site(name)
    if site is None:
      return None
    here, use_stmt = site
    param, later = None, []
    for a in scope[name.value]:
      target = getattr(a, 'node', None)
      if a.scope is not scope:
        return None
      if isinstance(target, cst.Param):
        param = target
        continue
      entry = self.facts.values.get(id(target))
      tpos = self.get_metadata(PositionProvider, target, None)
      if entry is None or tpos is None:
        return None  # a loop target, an import, a def ...: not followed
      if entry[2] is not use_stmt and (tpos.start.line, tpos.start.column) < here:
        return None  # assigned before the use
      later.append(entry[2])
    if param is None:
      return None
    if self._reassigned_in_loop(use_stmt, later):
      return None
    return docstrings.documents(fn, name.value, last_names)

  def value_of(self, name: cst.Name):
    """``(value, index)`` of the assignment that reaches ``name`` in straight-line code, or
    None (see the module docstring): the nearest earlier assignment in the name's scope (a
    comprehension sees its function's), in the block of the use or an enclosing one, and no
    assignment after the use inside a loop around both."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return None
    home = scope
    while type(home).__name__ == 'ComprehensionScope':
      home = home.parent
    site = self._use_site(name)
    if site is None:
      return None
    here, use_stmt = site
    best, later = None, []
    for a in scope[name.value]:
      if a.scope is not home:
        return None  # a global or a closure's: not followed
      target = getattr(a, 'node', None)
      entry = self.facts.values.get(id(target))
      if entry is None:
        return None  # bound by a loop, a def, an import, a parameter ...: not proven
      value, index, stmt = entry
      tpos = self.get_metadata(PositionProvider, target, None)
      if tpos is None:
        return None
      at = (tpos.start.line, tpos.start.column)
      if stmt is use_stmt or at >= here:
        later.append(stmt)
        continue
      if best is None or at > best[0]:
        best = (at, value, index, stmt)
    if best is None or not self._encloses(best[3], use_stmt):
      return None
    if self._reassigned_in_loop(use_stmt, later):
      return None
    return best[1], best[2]

  def _parent_statement(self, stmt):
    """The compound statement whose block holds ``stmt`` (None at module level)."""
    block = self.facts.block_of.get(id(stmt))
    return self.facts.owner.get(block) if block is not None else None

  def _loops(self, stmt) -> list:
    found = []
    while stmt is not None and not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
      if isinstance(stmt, (cst.For, cst.While)):
        found.append(stmt)
      stmt = self._parent_statement(stmt)
    return found

  def _statement_of(self, name):
    return self.facts.statement_of.get(id(name))

  def _encloses(self, stmt, use_stmt) -> bool:
    """``stmt`` lies in the block of ``use_stmt`` or of one of its enclosing statements."""
    block = self.facts.block_of.get(id(stmt))
    node = use_stmt
    while node is not None:
      if self.facts.block_of.get(id(node)) == block:
        return True
      node = self._parent_statement(node)
      if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return False
    return False

  def is_jax_value(self, expr, depth: int = 0) -> bool:
    """``expr`` is proven to be a jax array: a ``jax.numpy`` / ``lax`` / ``random`` / ...
    call, an ``.at[...]`` update, or a name whose reaching value is one."""
    if depth > 8:
      return False
    if isinstance(expr, cst.Call):
      if any(q.startswith(table.JAX_VALUE_PREFIXES) for q in self.qnames(expr.func)):
        return True
      f = expr.func
      return (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Subscript)
              and isinstance(f.value.value, cst.Attribute) and f.value.value.attr.value == 'at')
    if isinstance(expr, cst.Name):
      found = self.value_of(expr)
      return found is not None and found[1] is None and self.is_jax_value(found[0], depth + 1)
    return False
