"""The OM2xx pass: rewrite (or flag) JAX / Flax APIs removed beside ``flax.optim``.

Its own LibCST transformer over its own table (``codemod.modern.table``); the
engine calls :func:`apply` once per file, after the ``flax.optim`` pass, with
that pass's result. Names are resolved with ``QualifiedNameProvider`` (``from
jax import tree_map``, ``import jax as J; J.tree_map`` and
``jax.tree_util.tree_multimap`` all resolve; a local ``tree_map`` or another
library's does not) and ``ScopeProvider``; imports are added and dropped with
LibCST's ``AddImportsVisitor`` / ``RemoveImportsVisitor``.

Values are followed only in straight-line code: a name's value is the one of
its nearest earlier assignment in the same scope, taken only when that
statement is in the block of the use or an enclosing one (no loop or branch
rebinding it in between is looked for); anything else is not proven.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Optional, Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import (ImportAssignment, PositionProvider, QualifiedNameProvider,
                             ScopeProvider)

from codemod.modern import table
from codemod.rules import RULES, TODO_PREFIX, Options
from codemod.findings import Finding, one_line

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
_FROZEN = {a.extra: a for a in table.APIS if a.kind == 'frozendict'}
_CELLS = {q for q, a in _FLAGS.items() if a.rule == 'OM222'}
_DICT_KEYS = next(a for a in table.APIS if a.kind == 'dict_keys')
#: names a from-import may bind that a relocation renames to (the old qname -> new qname)
_FROM_MOVES = {**{q: a.new for q, a in _RENAMES.items()},
               **{q: a.new for q, a in _RELOCATE.items() if q != 'jax.config'}}
#: modules added when nothing in scope names them: module -> (import module, asname, local name)
_ADDABLE = {'jax': ('jax', None, 'jax'), 'jax.numpy': ('jax.numpy', 'jnp', 'jnp'),
            'numpy': ('numpy', 'np', 'np'), 'flax': ('flax', None, 'flax')}
_ARRAY_CTORS = frozenset({'jax.numpy.array', 'jax.numpy.asarray'})
_NUMPY_WRAPS = frozenset({'numpy.asarray', 'numpy.array', 'numpy.ascontiguousarray',
                          'jax.device_get'})


def may_apply(text: str) -> bool:
  """Cheap text prefilter: False only for files no OM2xx entry can apply to (all the words
  of one of the table's word groups must occur in ``text``)."""
  return any(all(w in text for w in group) for group in _GROUPS)


def rewrite_source(source: str, options: Options | None = None) -> tuple[str, list[Finding]]:
  """The OM2xx pass over one module's source.

  Returns:
    ``(new_source, findings)``; finding positions are ``source``'s (1-based line,
    1-based column).

  Raises:
    libcst.ParserSyntaxError: ``source`` does not parse.
  """
  options = options or Options()
  module = cst.parse_module(source)
  wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
  facts = _Facts()
  wrapper.visit(facts)
  context = CodemodContext()
  rewriter = _Rewriter(context, facts, options, module)
  new = wrapper.visit(rewriter)
  if rewriter.adds or rewriter.removes:
    for mod, obj, asname in rewriter.adds:
      AddImportsVisitor.add_needed_import(context, mod, obj, asname)
    for mod, obj, asname in rewriter.removes:
      RemoveImportsVisitor.remove_unused_import(context, mod, obj, asname)
    if rewriter.adds:
      new = AddImportsVisitor(context).transform_module(new)
    if rewriter.removes:
      new = RemoveImportsVisitor(context).transform_module(new)
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
  for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
    for k, j in enumerate(range(j1, j2)):
      if tag == 'equal':
        mapping[j + 1] = i1 + k + 1
      else:
        mapping[j + 1] = min(i1 + k, max(i2 - 1, i1)) + 1 if i2 > i1 else max(i1, 1)
  return lambda line: mapping.get(line, line)


# -- facts: one read-only pass ----------------------------------------------------------
class _Facts(cst.CSTVisitor):
  """Assignments (target -> value), ``self.x = ...`` per class, local functions, the
  module's imports, the names bound anywhere, and the little structure the rewrite asks
  about (statements and their blocks, assignment targets, annotations) in place of LibCST's
  parent and expression-context metadata (they cost a third of the pass)."""

  METADATA_DEPENDENCIES = (ScopeProvider,)

  def __init__(self):
    super().__init__()
    #: id(target Name) -> (value, index in a tuple target or None, the statement)
    self.values: dict[int, tuple[cst.BaseExpression, Optional[int], cst.CSTNode]] = {}
    #: (id(class), attribute) -> values assigned to ``self.<attribute>`` in the class
    self.self_attrs: dict[tuple[int, str], list[cst.BaseExpression]] = {}
    self.functions: dict[int, cst.FunctionDef] = {}  # id(def's Name) -> the def
    self.bound: set[str] = set()
    self.imports_flax = self.imports_jax = False
    self.plain_jax_import = False  # `import jax` at module level
    self._classes: list[cst.ClassDef] = []
    self._stmt: list[cst.CSTNode] = []
    self._blocks: list[int] = []
    self.statement_of: dict[int, cst.CSTNode] = {}   # id(Name) -> its innermost statement
    self.block_of: dict[int, int] = {}               # id(statement) -> id(its block)
    self.owner: dict[int, cst.CSTNode] = {}          # id(block) -> the statement it belongs to
    self.stores: set[int] = set()                    # ids of assignment / loop / del targets
    self.attr_names: set[int] = set()                # ids of the `.x` Names of attributes
    self.annotated: set[int] = set()                 # ids of Names / Attributes in annotations
    self.assign_of: dict[int, cst.Assign] = {}       # id(value) -> its Assign
    self._annotation = 0

  def on_visit(self, node):
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      if self._blocks:
        self.block_of[id(node)] = self._blocks[-1]
      self._stmt.append(node)
    elif isinstance(node, (cst.Module, cst.IndentedBlock, cst.SimpleStatementSuite)):
      if self._stmt:
        self.owner[id(node)] = self._stmt[-1]
      self._blocks.append(id(node))
    elif isinstance(node, cst.Annotation):
      self._annotation += 1
    elif isinstance(node, cst.Name):
      if self._stmt:
        self.statement_of[id(node)] = self._stmt[-1]
      if self._annotation:
        self.annotated.add(id(node))
    elif isinstance(node, cst.Attribute):
      self.attr_names.add(id(node.attr))
      if self._annotation:
        self.annotated.add(id(node))
    return super().on_visit(node)

  def on_leave(self, original):
    if isinstance(original, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      self._stmt.pop()
    elif isinstance(original, (cst.Module, cst.IndentedBlock, cst.SimpleStatementSuite)):
      self._blocks.pop()
    elif isinstance(original, cst.Annotation):
      self._annotation -= 1
    return super().on_leave(original)

  def _store(self, target) -> None:
    self.stores.add(id(target))
    if isinstance(target, (cst.Tuple, cst.List)):
      for el in target.elements:
        self._store(el.value)
    elif isinstance(target, cst.StarredElement):
      self._store(target.value)

  def visit_AugAssign(self, node):
    self._store(node.target)

  def visit_For(self, node):
    self._store(node.target)

  def visit_CompFor(self, node):
    self._store(node.target)

  def visit_AsName(self, node):
    self._store(node.name)

  def visit_Del(self, node):
    self._store(node.target)

  def visit_Module(self, node):
    scopes = {s for s in self.metadata[ScopeProvider].values() if s is not None}
    for scope in scopes:
      self.bound.update(a.name for a in scope.assignments)

  def visit_ClassDef(self, node):
    self._classes.append(node)

  def leave_ClassDef(self, node):
    self._classes.pop()

  def visit_FunctionDef(self, node):
    self.functions[id(node.name)] = node

  def visit_Import(self, node):
    for alias in node.names:
      self._note_import(_dotted_name(alias.name))
      if _dotted_name(alias.name) == 'jax' and alias.asname is None and len(self._stmt) == 1:
        self.plain_jax_import = True

  def visit_ImportFrom(self, node):
    if node.module is not None and not node.relative:
      self._note_import(_dotted_name(node.module))

  def _note_import(self, name: str):
    root = name.split('.')[0]
    self.imports_flax |= root == 'flax'
    self.imports_jax |= root == 'jax'

  def visit_Assign(self, node):
    stmt = self._stmt[-1] if self._stmt else node
    self.assign_of[id(node.value)] = node
    for target in node.targets:
      self._store(target.target)
      self._target(target.target, node.value, stmt)

  def visit_AnnAssign(self, node):
    self._store(node.target)
    if node.value is not None:
      self._target(node.target, node.value, self._stmt[-1] if self._stmt else node)

  def _target(self, target, value, stmt):
    if isinstance(target, cst.Name):
      self.values[id(target)] = (value, None, stmt)
    elif isinstance(target, (cst.Tuple, cst.List)):
      for i, el in enumerate(target.elements):
        if isinstance(el.value, cst.Name) and not isinstance(el, cst.StarredElement):
          self.values[id(el.value)] = (value, i, stmt)
    elif (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
          and target.value.value == 'self' and self._classes):
      key = (id(self._classes[-1]), target.attr.value)
      self.self_attrs.setdefault(key, []).append(value)


# -- the rewrite -------------------------------------------------------------------------
class _Rewriter(cst.CSTTransformer):
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

  def __init__(self, context: CodemodContext, facts: _Facts, options: Options,
               module: cst.Module):
    super().__init__()
    self.context, self.facts, self.opts = context, facts, options
    self.findings: list[Finding] = []
    self.adds: list[tuple[str, Optional[str], Optional[str]]] = []
    self.removes: list[tuple[str, Optional[str], Optional[str]]] = []
    self._pending: list[list[str]] = []
    self._dropped: set[int] = set()       # ids of `pass` lines standing for removed statements
    self._classes: list[cst.ClassDef] = []
    self._plans: dict[tuple[int, int], Optional[tuple]] = {}  # see _plan
    self._first = module.body[0] if module.body else None
    self._header = {ln.comment.value for ln in module.header if ln.comment}

  # -- bookkeeping -----------------------------------------------------------------------
  def on_visit(self, node):
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
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

  def qnames(self, node) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

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
      if best is not None:
        return _dotted([best[0], *best[1]])
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
    pos = self.get_metadata(PositionProvider, name, None)
    use_stmt = self._statement_of(name)
    if pos is None or use_stmt is None:
      return None
    here = (pos.start.line, pos.start.column)
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
    loops = self._loops(use_stmt)
    if any(loop in self._loops(stmt) for stmt in later for loop in loops):
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

  # -- imports ---------------------------------------------------------------------------
  def visit_Import(self, node):
    return False

  def visit_ImportFrom(self, node):
    return False

  def _redundant_jax_config(self, node: cst.Import) -> bool:
    """``import jax.config`` alone, where ``import jax`` binds ``jax`` too: dropped (OM203)."""
    if not self._alone_jax_config(node):
      return False
    return self.decide(node, 'OM203', '`import jax.config` removed: `import jax` is there (the '
                       'jax.config submodule was removed in jax 0.4.29)', '')

  def _alone_jax_config(self, node: cst.Import) -> bool:
    return (len(node.names) == 1 and node.names[0].asname is None
            and _dotted_name(node.names[0].name) == 'jax.config' and self.facts.plain_jax_import
            and self.opts.fixable('OM203'))

  def leave_Import(self, original, updated):
    if self._alone_jax_config(original):
      return updated  # dropped with its line (leave_SimpleStatementLine)
    names = list(updated.names)
    for i, alias in enumerate(original.names):
      if _dotted_name(alias.name) != 'jax.config':
        continue
      api = _RELOCATE['jax.config']
      message = '`import jax.config` -> `import jax` (the jax.config submodule was removed in jax 0.4.29)'
      if alias.asname is None:
        if self.decide(original, api.rule, message, message):
          names[i] = names[i].with_changes(name=cst.Name('jax'))
      elif len(original.names) == 1:
        local = alias.asname.name.value
        if self.decide(original, api.rule, f'`import jax.config as {local}` -> '
                       f'`from jax import config as {local}`', message):
          return cst.ImportFrom(module=cst.Name('jax'), names=[
              cst.ImportAlias(name=cst.Name('config'), asname=alias.asname)])
      else:
        self.flag(original, 'OM224', '`import jax.config as ...` beside other imports: the '
                  'jax.config submodule is gone (jax 0.4.29); use `from jax import config as ...`')
    return updated.with_changes(names=names)

  def leave_SimpleStatementLine(self, original, updated):
    extra: list[cst.SimpleStatementLine] = []
    body = []
    for orig_small, small in zip(original.body, updated.body):
      if isinstance(orig_small, cst.ImportFrom) and isinstance(small, cst.ImportFrom):
        kept, moved = self._relocate(orig_small, small)
        if kept is not None:
          body.append(kept)
        extra.extend(cst.SimpleStatementLine(body=[m]) for m in moved)
        continue
      if isinstance(orig_small, cst.Expr) and self._drop(orig_small):
        continue
      if isinstance(orig_small, cst.Import) and self._redundant_jax_config(orig_small):
        continue
      body.append(small)
    if not body and not extra:
      marker = updated.with_changes(body=[cst.Pass()])
      self._dropped.add(id(marker))
      return marker
    if not body:
      first, *rest = extra  # the line's comments (above it, after it) stay with its first part
      return cst.FlattenSentinel([first.with_changes(
          leading_lines=updated.leading_lines, trailing_whitespace=updated.trailing_whitespace),
          *rest])
    line = updated.with_changes(body=_fix_semicolons(body))
    return cst.FlattenSentinel([line, *extra]) if extra else line

  def _plan(self, node: cst.ImportFrom, alias: cst.ImportAlias):
    """How a from-imported removed name moves, or None: ``(new module, new name, the local
    name its uses get or None to keep theirs, rule, message)``. Pure, so that the import and
    its uses (visited before or after it) agree."""
    key = (id(node), id(alias))
    if key in self._plans:
      return self._plans[key]
    module = _dotted_name(node.module)
    qname = f'{module}.{_dotted_name(alias.name)}'
    plan = None
    if (new := _FROM_MOVES.get(qname)) is not None:
      local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
      new_module, new_name = new.rsplit('.', 1)
      rename = None if (alias.asname or new_name == local or new_name in self.facts.bound) \
          else new_name
      rule = self._reference_rule(node, local, qname)
      api = _RENAMES.get(qname) or _RELOCATE[qname]
      shown = f'{new_name} as {local}' if (new_name != local and rename is None) else new_name
      was = _dotted_name(alias.name) + (f' as {local}' if alias.asname else '')
      message = f'`from {module} import {was}` -> `from {new_module} import {shown}`: {api.since}'
      plan = (new_module, new_name, rename, rule, message)
    self._plans[key] = plan
    return plan

  def _relocate(self, original: cst.ImportFrom, updated: cst.ImportFrom):
    """``from jax import tree_map, jit`` -> (``from jax import jit``,
    [``from jax.tree_util import tree_map``]); (``updated``, []) when nothing moves."""
    if original.relative or original.module is None or isinstance(original.names, cst.ImportStar):
      return updated, []
    module = _dotted_name(original.module)
    kept, moved = [], []
    for alias in original.names:
      plan = self._plan(original, alias)
      if plan is None:
        if module == 'jax.config':
          self.flag(original, 'OM224', f'`from jax.config import {_dotted_name(alias.name)}`: the '
                    'jax.config submodule was removed in jax 0.4.29; `jax.config` is the config '
                    'object, read its options from it')
        kept.append(alias)
        continue
      new_module, new_name, rename, rule, message = plan
      if not self.decide(original, rule, message, message + f' ({_unsafe_why(rule)})'):
        kept.append(alias)
        continue
      local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
      asname = None if (rename is not None or new_name == local) else \
          cst.AsName(name=cst.Name(local))
      moved.append(cst.ImportFrom(module=_dotted(new_module.split('.')), names=[
          cst.ImportAlias(name=cst.Name(new_name), asname=asname)]))
    if len(kept) == len(original.names):
      return updated, []
    if not kept:
      return None, moved
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(names=kept), moved

  def _moved_name(self, name: cst.Name) -> Optional[str]:
    """The new local name of a use of a from-imported name whose import moves and renames it."""
    scope = self.get_metadata(ScopeProvider, name, None)
    for a in (scope[name.value] if scope is not None else ()):
      node = getattr(a, 'node', None)
      if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
          local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
          if local == name.value and (plan := self._plan(node, alias)) is not None:
            if plan[2] is not None and self.opts.fixable(plan[3]):
              return plan[2]
    return None

  def _reference_rule(self, node: cst.ImportFrom, local: str, qname: str) -> str:
    """The rule of a from-imported name's relocation: the entry's, or for ``DeviceArray``
    OM205 (unsafe) when any use of the name is outside an annotation."""
    api = _RENAMES.get(qname) or _RELOCATE[qname]
    if api.rule != 'OM204':
      return api.rule
    scope = self.get_metadata(ScopeProvider, node, None)
    if scope is None:
      return 'OM205'
    for a in scope.assignments[local]:
      if getattr(a, 'node', None) is node:
        if any(not self._in_annotation(ref.node) for ref in a.references):
          return 'OM205'
    return 'OM204'

  def _in_annotation(self, node) -> bool:
    return id(node) in self.facts.annotated

  # -- OM202: statements that only enable omnistaging --------------------------------------
  def _drop(self, expr: cst.Expr) -> bool:
    call = expr.value
    if not isinstance(call, cst.Call) or call.args:
      return False
    name = self.qname_in(call.func, _DROP)
    if name is None:
      return False
    if not self.decide(call, _DROP[name].rule, f'`{_code(call)}` removed: {_DROP[name].why}', ''):
      return False
    if ('jax', 'config', None) not in self.removes:  # its import, when nothing else uses it
      self.removes.append(('jax', 'config', None))
    return True

  def leave_IndentedBlock(self, original, updated):
    body, footer = self._without_dropped(updated.body)
    if not body:
      return updated
    return updated.with_changes(body=body, footer=[*updated.footer, *footer]) \
        if footer else updated.with_changes(body=body)

  def leave_Module(self, original, updated):
    body, footer = self._without_dropped(updated.body)
    return updated.with_changes(body=body, footer=[*footer, *updated.footer])

  def _without_dropped(self, statements: Sequence[cst.BaseStatement]):
    """``statements`` without the removed ones (their comment lines go to the next statement,
    or to the block's footer, except the removed call's own comment: see :func:`_own_comment`);
    a block left empty keeps one ``pass``."""
    if not any(id(s) in self._dropped for s in statements):
      return list(statements), []
    out, carried = [], []
    for s in statements:
      if id(s) in self._dropped:
        lines = list(s.leading_lines)
        carried.extend(lines[:len(lines) - _own_comment(lines)])
        continue
      if carried:
        # the removed lines' blank lines stand in for this one's; comments are all kept
        own = list(s.leading_lines)
        lines = [*carried, *own] if not own else \
            [*(ln for ln in carried if ln.comment is not None), *own]
        s = s.with_changes(leading_lines=lines)
        carried = []
      out.append(s)
    carried = [ln for ln in carried if ln.comment is not None]
    if not out:
      keep = statements[-1]
      return [keep.with_changes(leading_lines=[*keep.leading_lines])], []
    return out, carried

  # -- references: renames and flags -------------------------------------------------------
  def leave_Attribute(self, original, updated):
    if not self._loads(original):
      return updated
    name = self.qname_in(original, _RENAMES)
    if name is not None:
      return self._rename(original, updated, name)
    self._flag_reference(original)
    return updated

  def leave_Name(self, original, updated):
    if id(original) in self.facts.attr_names:
      return updated
    if not self._loads(original):
      return updated
    if self.qname_in(original, _RENAMES) is not None:
      moved = self._moved_name(original)
      return updated.with_changes(value=moved) if moved else updated
    self._flag_reference(original)
    return updated

  def _rename(self, original: cst.Attribute, updated: cst.Attribute, old: str):
    api = _RENAMES[old]
    new = api.new
    rule = api.rule
    if rule == 'OM204' and not self._in_annotation(original):
      rule = 'OM205'
    replacement = None
    base = updated.value
    for q in self.qnames(original.value):
      if new.startswith(q + '.') and _names(base):
        replacement = _dotted([*_names(base), *new[len(q) + 1:].split('.')])
        break
    if replacement is None:
      if not self.opts.fixable(rule):
        self.decide(original, rule, '', self._rename_message(old, new, rule))
        return updated
      module, attr = new.rsplit('.', 1)
      expr = self.module_expr(original, module)
      if expr is None:
        self.flag(original, 'OM224', f'`{old}` -> `{new}`: no name for module `{module}` here '
                  '(bound to something else, or imported only after this line): import it '
                  'above and rerun')
        return updated
      replacement = _dotted([*_names(expr), attr])
      self._drop_if_unused(original.value)
    if self.decide(original, rule, self._rename_message(old, new, rule),
                   self._rename_message(old, new, rule)):
      return replacement.with_changes(lpar=updated.lpar, rpar=updated.rpar)
    return updated

  def _drop_if_unused(self, base) -> None:
    """Schedule the removal of the import binding ``base``'s root name (``jnp`` of
    ``jnp.DeviceArray``), done only if nothing uses it after the rewrite."""
    root = base
    while isinstance(root, cst.Attribute):
      root = root.value
    if not isinstance(root, cst.Name):
      return
    scope = self.get_metadata(ScopeProvider, root, None)
    for a in (scope[root.value] if scope is not None else ()):
      node = getattr(a, 'node', None)
      entry = None
      if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative and \
          not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
          if (alias.asname.name.value if alias.asname else _dotted_name(alias.name)) == root.value:
            entry = (_dotted_name(node.module), _dotted_name(alias.name),
                     alias.asname.name.value if alias.asname else None)
      elif isinstance(node, cst.Import):
        for alias in node.names:
          if alias.asname is not None and alias.asname.name.value == root.value:
            entry = (_dotted_name(alias.name), None, root.value)
      if entry is not None and entry not in self.removes:
        self.removes.append(entry)

  @staticmethod
  def _rename_message(old: str, new: str, rule: str) -> str:
    api = _RENAMES[old]
    text = f'`{old}` -> `{new}`: {api.since}'
    if rule != 'OM205':
      return text
    return (f'`{old}` -> `{new}` outside an annotation: under jit a tracer is a `jax.Array` '
            f'but was no `DeviceArray` before jax 0.4.1 (`isinstance` checks change); '
            f'{api.since} ({_unsafe_why(rule)})')

  def _flag_reference(self, node) -> None:
    name = self.qname_in(node, _FLAGS)
    if name is None or name in _CELLS:
      return
    api = _FLAGS[name]
    self.flag(node, api.rule, api.extra.format(name=name))
    return

  # -- calls -------------------------------------------------------------------------------
  def leave_Call(self, original, updated):
    func = original.func
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
    return updated

  def _construction(self, func):
    """``('mha' | 'dropout', constructor call)`` when ``func`` is proven to be a
    ``MultiHeadDotProductAttention`` / ``Dropout`` instance: built inline, held by a name whose
    reaching value built it, or ``self.<attr>`` assigned only that in its class."""
    values = []
    if isinstance(func, cst.Call):
      values = [func]
    elif isinstance(func, cst.Name):
      found = self.value_of(func)
      values = [found[0]] if found is not None and found[1] is None else []
    elif (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
          and func.value.value == 'self' and self._classes):
      values = self.facts.self_attrs.get((id(self._classes[-1]), func.attr.value), [])
    kinds = set()
    for v in values:
      if not isinstance(v, cst.Call):
        return None
      if self.qname_in(v.func, _MHA):
        kinds.add('mha')
      elif self.qname_in(v.func, _DROPOUT):
        kinds.add('dropout')
      else:
        return None
    if len(kinds) != 1 or (len(values) != 1 and kinds == {'dropout'}):
      return None
    return kinds.pop(), values[0]

  def visit_ClassDef(self, node):
    self._classes.append(node)

  def leave_ClassDef(self, original, updated):
    self._classes.pop()
    return updated

  def _scatter(self, original: cst.Call, updated: cst.Call, api: table.Api):
    args = _bind(updated.args, ('x', 'idx', 'y', 'indices_are_sorted', 'unique_indices'))
    name = self.qname_in(original.func, _SCATTER)
    if args is None or not all(k in args for k in ('x', 'idx', 'y')):
      self.flag(original, 'OM224', f'`{name}(...)` with these arguments is not rewritten: use '
                f'`x.at[idx].{api.extra}(y)` (removed in jax 0.3.2)')
      return updated
    if not self.opts.fixable(api.rule):
      return updated
    orig = _bind(original.args, ('x', 'idx', 'y', 'indices_are_sorted', 'unique_indices'))
    x, idx = args['x'], args['idx']
    if not self.is_jax_value(orig['x']):
      asarray = self.module_expr(original, 'jax.numpy')
      if asarray is None:
        self.flag(original, 'OM224', f'`{name}`: no name for jax.numpy here to make '
                  '`jnp.asarray(x).at[...]`: rewrite by hand')
        return updated
      x = cst.Call(func=_dotted([*_names(asarray), 'asarray']), args=[cst.Arg(x)])
    if isinstance(orig['idx'], cst.Subscript) and isinstance(idx, cst.Subscript) and \
        self.qname_in(orig['idx'].value, table.INDEX_HELPERS):
      elements = list(idx.slice)
      elements[-1] = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    else:
      elements = [cst.SubscriptElement(slice=cst.Index(value=idx))]
    method_args = [cst.Arg(args['y'])] + [
        cst.Arg(args[k], keyword=cst.Name(k), equal=_EQ) for k in ('indices_are_sorted',
                                                                    'unique_indices') if k in args]
    new = cst.Call(func=cst.Attribute(value=cst.Subscript(
        value=cst.Attribute(value=_atom(x), attr=cst.Name('at')), slice=elements),
        attr=cst.Name(api.extra)), args=method_args)
    self.fixed(original, api.rule, f'`{name}(x, idx, y)` -> `x.at[idx].{api.extra}(y)`: '
               f'{api.since}')
    module, fn = name.rsplit('.', 1)
    for entry in ((module, fn, None), ('jax.ops', 'index', None)):
      if entry not in self.removes:
        self.removes.append(entry)
    return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

  def _static_sizes(self, original: cst.Call, updated: cst.Call):
    api = _STATIC['jax.lax.dynamic_slice']
    position = next((i for i, a in enumerate(original.args)
                     if (a.keyword is not None and a.keyword.value == 'slice_sizes')
                     or (a.keyword is None and not a.star and i == 2)), None)
    if position is None:
      return updated
    sizes = original.args[position].value
    if not (isinstance(sizes, cst.Call) and self.qname_in(sizes.func, _ARRAY_CTORS)
            and len(sizes.args) == 1 and sizes.args[0].keyword is None and not sizes.args[0].star
            and isinstance(sizes.args[0].value, (cst.Tuple, cst.List))):
      return updated
    if not self.decide(sizes, api.rule, f'`{_code(sizes)}` as `slice_sizes` -> a tuple of '
                       f'the same values: {api.why}', ''):
      return updated
    new_sizes = updated.args[position].value.args[0].value
    elements = list(new_sizes.elements)
    if len(elements) == 1:
      elements = [elements[0].with_changes(comma=cst.Comma())]
    as_tuple = cst.Tuple(elements=elements)
    args = list(updated.args)
    args[position] = args[position].with_changes(value=as_tuple)
    return updated.with_changes(args=args)

  def _pil(self, original: cst.Call, updated: cst.Call):
    api = _PIL['PIL.Image.fromarray']
    if not self.facts.imports_jax or not original.args:
      return updated
    first = original.args[0]
    if first.star or (first.keyword is not None and first.keyword.value != 'obj'):
      return updated
    value = first.value
    if isinstance(value, cst.Call) and self.qname_in(value.func, _NUMPY_WRAPS):
      return updated
    if not self.opts.fixable(api.rule):
      return updated
    numpy = self.module_expr(original, 'numpy')
    if numpy is None:
      self.flag(original, 'OM224', '`PIL.Image.fromarray(x)`: no name for numpy here to make '
                '`np.asarray(x)`: wrap the argument by hand if it may be a jax array')
      return updated
    self.fixed(original, api.rule, f'`fromarray(x)` -> `fromarray(np.asarray(x))`: {api.why}')
    args = list(updated.args)
    args[0] = args[0].with_changes(value=cst.Call(
        func=_dotted([*_names(numpy), 'asarray']), args=[cst.Arg(args[0].value)]))
    return updated.with_changes(args=args)

  def _cells(self, call: cst.Call) -> None:
    """OM222: a recurrent cell built without ``features``, or its static ``initialize_carry``."""
    func = call.func
    name = self.qname_in(func, _CELLS)
    if name is not None:
      if not any(a.keyword is None or (a.keyword.value == 'features') or a.star
                 for a in call.args):
        cell = _code(func)
        self.flag(call, 'OM222', _FLAGS[name].extra.format(
            name=f'`{cell}()` has no `features` (required since flax 0.7.0)', cell=cell))
      return
    if isinstance(func, cst.Attribute) and func.attr.value == 'initialize_carry':
      name = self.qname_in(func.value, _CELLS)
      if name is not None:
        cell = _code(func.value)
        self.flag(call, 'OM222', _FLAGS[name].extra.format(
            name=f'static `{cell}.initialize_carry(rng, batch_dims, size)` is gone (flax 0.7.0)',
            cell=cell))

  def _frozen(self, original: cst.Call, updated: cst.Call):
    attr = original.func.attr.value
    receiver = original.func.value
    if attr == 'pop':
      if not (len(original.args) == 1 and original.args[0].keyword is None
              and not original.args[0].star and self._unpacked_in_two(original)):
        return updated
      key = original.args[0].value
      if not isinstance(key, (cst.SimpleString, cst.ConcatenatedString, cst.Name)):
        return updated
      proven = self.from_init(receiver)
      if not proven and not (self.facts.imports_flax and isinstance(key, cst.SimpleString)):
        return updated
    else:
      if original.args:
        return updated
      proven = self.from_init(receiver)
      if not proven and not self.facts.imports_flax:
        return updated
    api = _FROZEN[attr]
    rule = 'OM207' if proven else 'OM208'
    shown = (f'`{_code(receiver)}.pop(...)` -> `flax.core.pop({_code(receiver)}, ...)`'
             if attr == 'pop' else
             f'`{_code(receiver)}.unfreeze()` -> `flax.core.unfreeze({_code(receiver)})`')
    why = ('what Flax `init` returns is a dict since flax 0.7.1' if proven else
           f'if `{_code(receiver)}` is what a Flax `init` returns (a dict since flax 0.7.1); '
           f'`flax.core.{attr}` takes a FrozenDict too ({_unsafe_why("OM208")})')
    if not self.opts.fixable(rule):
      self.decide(original, rule, '', f'{shown}: {why}')
      return updated
    core = self.module_expr(original, 'flax.core')
    if core is None:
      self.flag(original, 'OM224', f'{shown}: no name for flax here: rewrite by hand')
      return updated
    self.decide(original, rule, f'{shown}: {why}', '')
    args = [cst.Arg(updated.func.value)] + [cst.Arg(a.value) for a in updated.args]
    return cst.Call(func=_dotted([*_names(core), api.extra]), args=args,
                    lpar=updated.lpar, rpar=updated.rpar)

  def _unpacked_in_two(self, call: cst.Call) -> bool:
    parent = self.facts.assign_of.get(id(call))
    if parent is None:
      return False
    targets = [t.target for t in parent.targets]
    return len(targets) == 1 and isinstance(targets[0], (cst.Tuple, cst.List)) and \
        len(targets[0].elements) == 2

  def from_init(self, expr, depth: int = 0) -> bool:
    """``expr`` is proven to hold what a Flax ``init`` returned (its variables), or one part
    of it popped off: ``model.init(...)``, ``init_with_output(...)[1]`` (as the second target),
    a call of a local def or ``jax.jit(m.init)`` that returns one, or a name whose reaching
    value is one of those."""
    if depth > 8 or not self.facts.imports_flax:
      return False
    if isinstance(expr, cst.Call):
      f = expr.func
      if isinstance(f, cst.Attribute) and f.attr.value == 'init':
        return self._flax_receiver(f.value)
      if isinstance(f, cst.Attribute) and f.attr.value == 'pop' and len(expr.args) == 1:
        return self.from_init(f.value, depth + 1)
      if isinstance(f, cst.Name):
        return self._init_function(f, depth)
      return False
    if isinstance(expr, cst.Name):
      found = self.value_of(expr)
      if found is None:
        return False
      value, index = found
      if index is None:
        return self.from_init(value, depth + 1)
      if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        attr = value.func.attr.value
        if attr == 'init_with_output' and index == 1:
          return self._flax_receiver(value.func.value)
        if attr == 'pop' and len(value.args) == 1:  # variables, params = variables.pop(...)
          return self.from_init(value.func.value, depth + 1)
        if attr == 'pop' and self.qname_in(value.func, {'flax.core.pop'}):
          return self.from_init(value.args[0].value, depth + 1)
      return False
    return False

  def _flax_receiver(self, expr, depth: int = 0) -> bool:
    """``expr`` (what ``.init`` is called on) is not another library's object: its root name is
    a flax import, or a local whose reaching value is not a call into another imported
    library (``tx = optax.adam(...)``)."""
    root = expr
    while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
      root = root.func if isinstance(root, cst.Call) else root.value
    if not isinstance(root, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, root, None)
    assignments = list(scope[root.value]) if scope is not None else []
    if any(isinstance(a, ImportAssignment) for a in assignments):
      return all(q.name.startswith('flax') for a in assignments if isinstance(a, ImportAssignment)
                 for q in a.get_qualified_names_for(root.value))
    if depth < 4 and root is expr:
      found = self.value_of(root)
      if found is not None and isinstance(found[0], cst.Call):
        return self._flax_receiver(found[0].func, depth + 1)
    return True

  def _init_function(self, name: cst.Name, depth: int) -> bool:
    scope = self.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) != 1:
      return False
    node = getattr(assignments[0], 'node', None)
    fn = self.facts.functions.get(id(node)) if isinstance(node, cst.Name) else None
    if fn is None and isinstance(node, cst.FunctionDef):
      fn = node
    if fn is not None:
      returns = _returns(fn)
      return bool(returns) and all(r is not None and self.from_init(r, depth + 1) for r in returns)
    entry = self.facts.values.get(id(node))
    if entry is not None and entry[1] is None and isinstance(entry[0], cst.Call):
      wrapped = entry[0]  # init = jax.jit(model.init)
      if self.qname_in(wrapped.func, {'jax.jit', 'jax.pmap'}) and wrapped.args:
        inner = wrapped.args[0].value
        return isinstance(inner, cst.Attribute) and inner.attr.value == 'init' and \
            self._flax_receiver(inner.value)
    return False

  def _mha(self, original: cst.Call, updated: cst.Call):
    api = _MHA['flax.linen.MultiHeadDotProductAttention']
    positional = [a for a in original.args if a.keyword is None]
    if any(a.star for a in original.args) or len(positional) < 3:
      return updated
    if any(a.keyword is None for a in original.args[len(positional):]):
      return updated
    if len(positional) > 4 or any(a.keyword is not None and a.keyword.value in
                                  ('mask', 'deterministic') for a in original.args):
      self.flag(original, 'OM224', 'MultiHeadDotProductAttention called with these positional '
                'arguments: pass mask= and deterministic= by keyword')
      return updated
    names = ['mask', 'deterministic'][:len(positional) - 2]
    if not self.decide(original, api.rule, f'positional {" and ".join(names)} of '
                       f'MultiHeadDotProductAttention -> keyword: {api.why}', ''):
      return updated
    args = list(updated.args)
    for offset, kw in enumerate(names):
      i = 2 + offset
      args[i] = args[i].with_changes(keyword=cst.Name(kw), equal=_EQ)
    return updated.with_changes(args=args)

  def _dropout(self, original: cst.Call, updated: cst.Call, ctor: cst.Call):
    api = _DROPOUT['flax.linen.Dropout']
    if any(a.star for a in ctor.args) or \
        any(a.keyword is not None and a.keyword.value == 'deterministic' for a in ctor.args) or \
        len([a for a in ctor.args if a.keyword is None]) >= 3:
      return updated
    if any(a.star for a in original.args):
      return updated
    if any(a.keyword is not None and a.keyword.value == 'deterministic' for a in original.args) or \
        len([a for a in original.args if a.keyword is None]) >= 2:
      return updated
    if any(a.keyword is not None and a.keyword.value == 'broadcast_dims' for a in original.args):
      self.flag(original, 'OM224', 'Dropout(...)(x, broadcast_dims=...): flax 0.3.0\'s call '
                'argument is a module attribute since 0.3.1: move it to `nn.Dropout(..., '
                'broadcast_dims=...)` and pass `deterministic=False` (0.3.0\'s default)')
      return updated
    if not self.decide(original, api.rule, '`deterministic=False` made explicit on a Dropout '
                       f'call that gives none: {api.why}', ''):
      return updated
    args = list(updated.args)
    args.append(cst.Arg(cst.Name('False'), keyword=cst.Name('deterministic'), equal=_EQ))
    return updated.with_changes(args=args)

  # -- OM223: loops over a jax array whose elements become dict keys -------------------------
  def visit_For(self, node):
    if isinstance(node.target, cst.Name) and self.is_jax_value(node.iter) and \
        _keys_with(node.body, node.target.value, self):
      self.flag(node, _DICT_KEYS.rule, f'`{node.target.value}` is a 0-d jax array (unhashable) '
                f'used as a dict key: iterate `{_code(node.iter)}.tolist()` for Python scalars '
                '(or key by `int(...)` / `.item()`)')

  def visit_DictComp(self, node):
    for comp in _comp_fors(node.for_in):
      if isinstance(comp.target, cst.Name) and isinstance(node.key, cst.Name) and \
          node.key.value == comp.target.value and self.is_jax_value(comp.iter):
        self.flag(node, _DICT_KEYS.rule, f'`{comp.target.value}` is a 0-d jax array '
                  f'(unhashable) used as a dict key: iterate `{_code(comp.iter)}.tolist()`')


# -- helpers -------------------------------------------------------------------------------
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


def _dotted_name(node) -> str:
  if isinstance(node, cst.Name):
    return node.value
  if isinstance(node, cst.Attribute):
    return f'{_dotted_name(node.value)}.{node.attr.value}'
  return ''


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


def _keys_with(body, name: str, rewriter: _Rewriter) -> bool:
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


def _is_dict(expr, rewriter: _Rewriter) -> bool:
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
