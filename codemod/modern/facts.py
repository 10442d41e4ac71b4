"""The OM2xx pass's facts: one read-only pass before the rewrite (:class:`_Facts`)."""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ImportAssignment, ScopeProvider

from codemod.visiting import NoAttributeHooks
from codemod.modern.helpers import _code, _dotted_name


class _Facts(NoAttributeHooks, cst.CSTVisitor):
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
    #: first words of the names imports bind, in any scope (``jnp``, ``jax`` for ``import
    #: jax.numpy``): only a name or attribute chain rooted at one (or at a builtin) can have
    #: a qualified name the table knows
    self.import_roots: set[str] = set()
    self.imports_flax = self.imports_jax = False
    self.plain_jax_import = False  # `import jax` at module level
    self._classes: list[cst.ClassDef] = []
    self._stmt: list[cst.CSTNode] = []
    self._blocks: list[int] = []
    self.statement_of: dict[int, cst.CSTNode] = {}   # id(Name) -> its innermost statement
    self.block_of: dict[int, int] = {}               # id(statement) -> id(its block)
    self.owner: dict[int, cst.CSTNode] = {}          # id(block) -> the statement it belongs to
    self.stores: set[int] = set()                    # ids of assignment / loop / del targets
    self.for_iters: dict[int, cst.BaseExpression] = {}  # id(a for loop's target) -> its iter
    self.attr_names: set[int] = set()                # ids of the `.x` Names of attributes
    self.annotated: set[int] = set()                 # ids of Names / Attributes in annotations
    self.assign_of: dict[int, cst.Assign] = {}       # id(value) -> its Assign
    #: ids of `x.unfreeze()` calls a test on `x` guards (`x.unfreeze() if hasattr(x,
    #: 'unfreeze') else dict(x)`, `if isinstance(x, FrozenDict): x = x.unfreeze()`): right on
    #: a dict and on a FrozenDict as written, so OM207 / OM208 leave them
    self.guarded_unfreeze: set[int] = set()
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
    # (`for layer in self.layers`, `for i, layer in enumerate(self.layers)`: OM209's flag)
    for target in [node.target, *m.findall(node.target, m.Name())]:
      self.for_iters[id(target)] = node.iter

  def visit_CompFor(self, node):
    self._store(node.target)

  def visit_AsName(self, node):
    self._store(node.name)

  def visit_Del(self, node):
    self._store(node.target)

  def visit_IfExp(self, node):
    self._guard(node.test, node.body)

  def visit_If(self, node):
    self._guard(node.test, node.body)

  def _guard(self, test, body) -> None:
    """``hasattr(x, 'unfreeze')`` / ``isinstance(x, ...FrozenDict)`` guarding ``body``."""
    if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and len(test.args) == 2
            and not any(a.star or a.keyword for a in test.args)):
      return
    subject, kind = test.args[0].value, test.args[1].value
    if not ((test.func.value == 'hasattr' and m.matches(kind, m.SimpleString())
             and kind.evaluated_value == 'unfreeze')
            or (test.func.value == 'isinstance'
                and m.matches(kind, m.Name('FrozenDict') | m.Attribute(attr=m.Name('FrozenDict'))))):
      return
    text = _code(subject)
    for call in m.findall(body, m.Call(func=m.Attribute(attr=m.Name('unfreeze')), args=[])):
      if _code(call.func.value) == text:
        self.guarded_unfreeze.add(id(call))

  def visit_Module(self, node):
    scopes = {s for s in self.metadata[ScopeProvider].values() if s is not None}
    for scope in scopes:
      self.bound.update(a.name for a in scope.assignments)
      self.import_roots.update(a.name.split('.')[0] for a in scope.assignments
                               if isinstance(a, ImportAssignment))

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
