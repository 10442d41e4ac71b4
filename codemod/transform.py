"""The LibCST pass that rewrites legacy ``flax.optim`` code to Optax + ``TrainState``.

Two passes over one ``MetadataWrapper``: :class:`_Analyzer` finds which names
hold optimizer defs and optimizers (by scope, via LibCST's ``ScopeProvider``;
legacy names are resolved with ``QualifiedNameProvider``, never by text), then
:class:`_Rewriter` rewrites and flags. Optax source comes from the shared
migration table (``optim_compat.spec``), so the rewritten code runs the same
chains the equivalence tests check.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodCommand, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import (PositionProvider, QualifiedNameProvider, ScopeProvider)

from codemod.rules import RULES, TODO_PREFIX
from optim_compat import spec as spec_lib

LEGACY = 'flax.optim'
REPLICATE_FNS = {'flax.jax_utils.replicate', 'flax.jax_utils.unreplicate'}
#: Optimizer attributes a TrainState does not have and no rule converts yet.
LEGACY_ONLY_ATTRS = {
    'optimizer_def': 'OM100', 'state': 'OM103', 'replicate': 'OM100', 'unreplicate': 'OM100',
    'compute_gradient': 'OM100', 'compute_gradients': 'OM100', 'optimize': 'OM100',
    'state_dict': 'OM100', 'restore_state': 'OM100'}


@dataclasses.dataclass
class Finding:
  """One report entry: ``path:line:col: rule: message``."""
  line: int
  col: int
  rule: str
  message: str
  fixed: bool

  def format(self, path: str) -> str:
    kind = 'fixed' if self.fixed else RULES[self.rule].safety
    return f'{path}:{self.line}:{self.col}: {self.rule} [{kind}] {self.message}'


class _Base:
  """Name resolution shared by both passes (a mixin over LibCST visitors)."""

  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

  def qnames(self, node) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

  def legacy_def(self, call: cst.BaseExpression) -> Optional[str]:
    """The legacy def name if ``call`` is ``flax.optim.<Def>(...)``."""
    if not isinstance(call, cst.Call):
      return None
    for q in self.qnames(call.func):
      if q.startswith(LEGACY + '.') and q.count('.') == 2:
        return q.rsplit('.', 1)[1]
    return None

  def binding(self, name: cst.Name):
    """``(scope, name)`` identifying the variable ``name`` refers to, or None."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return None
    assignments = list(scope[name.value])
    if not assignments:
      return None
    return (id(assignments[0].scope), name.value)

  def name_bindings(self, targets):
    """Bindings of the plain-name assignment targets among ``targets``."""
    for t in targets:
      if isinstance(t, cst.Name) and (b := self.binding(t)):
        yield b

  def is_def(self, expr, def_vars) -> bool:
    """``expr`` is ``flax.optim.<Def>(...)`` or a name bound to one (in ``def_vars``)."""
    return self.legacy_def(expr) is not None or (
        isinstance(expr, cst.Name) and self.binding(expr) in def_vars)


class _Analyzer(_Base, cst.CSTVisitor):
  """Collect def variables, optimizer variables and lr-override usage."""

  def __init__(self):
    super().__init__()
    self.def_vars: dict = {}        # binding -> cst.Call of the legacy def
    self.opt_vars: set = set()      # bindings holding optimizers
    self.apply_calls: list[cst.Call] = []
    self.uses_legacy = False        # the module references flax.optim at all
    self.def_calls: list[cst.Call] = []
    self.create_calls: list[cst.Call] = []
    self.params: set = set()        # bindings of function parameters
    self.legacy_attrs: list[cst.Attribute] = []  # opt.optimizer_def, opt.state, opt.replicate...
    self.subclasses: list[cst.ClassDef] = []     # user OptimizerDef subclasses
    self.defines_apply_gradient = False          # the module has its own `def apply_gradient`
    self._state_step: set[int] = set()
    self.rebound: set = set()       # bindings also assigned something else

  def visit_Attribute(self, node: cst.Attribute) -> None:
    self.visit_Name(node)  # `flax.optim.X` after `import flax`
    attr = node.attr.value
    if attr == 'step' and m.matches(node.value, m.Attribute(attr=m.Name('state'))):
      self._state_step.add(id(node.value))  # `.state.step` is converted (OM004)
    elif attr in LEGACY_ONLY_ATTRS and id(node) not in self._state_step:
      self.legacy_attrs.append(node)

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    if any(q.startswith(LEGACY + '.') for base in node.bases for q in self.qnames(base.value)):
      self.subclasses.append(node)

  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    if node.name.value == 'apply_gradient':
      self.defines_apply_gradient = True

  def visit_Param(self, node: cst.Param) -> None:
    if (b := self.binding(node.name)):
      self.params.add(b)

  def visit_Name(self, node) -> None:
    if not self.uses_legacy and any(q == LEGACY or q.startswith(LEGACY + '.')
                                    for q in self.qnames(node)):
      self.uses_legacy = True

  def visit_Assign(self, node: cst.Assign) -> None:
    value = node.value
    targets = [t.target for t in node.targets]
    if self.legacy_def(value):
      self.def_vars.update(dict.fromkeys(self.name_bindings(targets), value))
    elif self._produces_optimizer(value):
      self.opt_vars.update(self.name_bindings(targets))
    elif not self._passes_name_through(value, targets):
      # `opt = Thing()`: this name also holds something else; never rewrite it blindly
      self.rebound.update(self.name_bindings(targets))

  def _passes_name_through(self, value, targets) -> bool:
    """``x = f(x, ...)``: a step function returning its (optimizer) argument."""
    if not isinstance(value, cst.Call):
      return False
    names = {t.value for t in targets if isinstance(t, cst.Name)}
    if m.matches(value.func, m.Attribute(value=m.Name())) and value.func.value.value in names:
      return True  # `x = x.method(...)`
    return any(isinstance(a.value, cst.Name) and a.value.value in names for a in value.args)

  def visit_Call(self, node: cst.Call) -> None:
    if self.legacy_def(node):
      self.def_calls.append(node)
    if m.matches(node.func, m.Attribute(attr=m.Name('create'))) and \
        self.is_def(node.func.value, self.def_vars):
      self.create_calls.append(node)
    if m.matches(node.func, m.Attribute(attr=m.Name('apply_gradient'))):
      self.apply_calls.append(node)
      recv = node.func.value
      if isinstance(recv, cst.Name) and (b := self.binding(recv)):
        self.opt_vars.add(b)

  def _produces_optimizer(self, value) -> bool:
    if not isinstance(value, cst.Call):
      return False
    func = value.func
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))):
      return True
    if m.matches(func, m.Attribute(attr=m.Name('create'))) and self.is_def(func.value, self.def_vars):
      return True
    if self.qnames(func) & REPLICATE_FNS and value.args:
      arg = value.args[0].value
      return isinstance(arg, cst.Name) and self.binding(arg) in self.opt_vars
    return False


class _Rewriter(_Base, cst.CSTTransformer):
  """Rewrite what is proven safe; flag the rest in place."""

  def __init__(self, context: CodemodContext, analysis: _Analyzer):
    super().__init__()
    self.context = context
    self.a = analysis
    self.findings: list[Finding] = []
    self._pending: list[list[str]] = []
    self._refs: list[list] = []
    self._consumed: set[int] = set()
    overrides = [self._kwargs(c) for c in analysis.apply_calls]
    self.inject_lr = any('learning_rate' in k for k in overrides)
    self.mixed_lr = self.inject_lr and not all('learning_rate' in k for k in overrides)
    # one def we cannot convert leaves every optimizer in the file legacy: then
    # usages are not rewritten either (half-migrated code would not run)
    self.blocked = False
    self.unproven = False
    self._legacy_attr_ids = {id(a) for a in analysis.legacy_attrs}

  def visit_Module(self, node: cst.Module) -> None:
    self.blocked = (self.mixed_lr or any(self._def_problem(c) for c in self.a.def_calls)
                    or any(self._create_problem(c) for c in self.a.create_calls)
                    or bool(self.a.subclasses) or bool(self._legacy_only_uses()))
    # a file that never references flax.optim: nothing proves `.apply_gradient` is ours
    self.unproven = not self.a.uses_legacy

  def _legacy_only_uses(self) -> list[cst.Attribute]:
    return [a for a in self.a.legacy_attrs if self._is_optimizer(a.value)]

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    if any(node is c for c in self.a.subclasses):
      self._consumed.update(id(base.value) for base in node.bases)
      self.flag(node, 'OM100', f'`{node.name.value}` subclasses a flax.optim class: use '
                               f'optim_compat.to_optax({node.name.value}(...)) as the TrainState tx '
                               '(this file keeps its legacy optimizer code)')

  @staticmethod
  def _create_problem(call: cst.Call) -> Optional[str]:
    if len(call.args) != 1 or call.args[0].keyword is not None:
      return ('create(target, focus=...) -> optax.multi_transform is not converted yet '
              '(this file keeps its legacy optimizer code)')
    return None

  # -- helpers -------------------------------------------------------------
  @staticmethod
  def _kwargs(call: cst.Call) -> dict:
    return {a.keyword.value: a for a in call.args if a.keyword is not None}

  def _pos(self, node):
    pos = self.get_metadata(PositionProvider, node, None)
    return (pos.start.line, pos.start.column + 1) if pos else (0, 0)

  def fixed(self, node, rule, message):
    self.findings.append(Finding(*self._pos(node), rule, message, True))

  def flag(self, node, rule, message):
    self.findings.append(Finding(*self._pos(node), rule, message, False))
    if self._pending:
      text = f'{TODO_PREFIX}{rule}: {message}'
      if text not in self._pending[-1]:
        self._pending[-1].append(text)

  def _is_optimizer(self, expr) -> bool:
    if isinstance(expr, cst.Name):
      b = self.binding(expr)
      return b in self.a.opt_vars and b not in self.a.rebound
    if isinstance(expr, cst.Call) and self.qnames(expr.func) & REPLICATE_FNS and expr.args:
      return self._is_optimizer(expr.args[0].value)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
      recv, method = expr.func.value, expr.func.attr.value
      if method == 'create':  # `Def(...).create(p).target`
        return self.is_def(recv, self.a.def_vars)
      if method == 'apply_gradient':  # `opt.apply_gradient(g).target`
        return True
    return False

  def _code(self, node) -> str:
    return cst.Module(body=[]).code_for_node(node)

  # -- statements: carry TODO comments ------------------------------------
  def on_visit(self, node) -> bool:
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      self._pending.append([])
      self._refs.append([])
    return super().on_visit(node)

  def on_leave(self, original, updated):
    result = super().on_leave(original, updated)
    if isinstance(original, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      for ref, qname in self._refs.pop():
        if id(ref) not in self._consumed:
          self.flag(ref, 'OM100', f'{qname} has no automatic conversion yet; '
                                  'see optim_compat for a drop-in')
      todos = self._pending.pop()
      existing = {ll.comment.value for ll in result.leading_lines if ll.comment}
      new = [t for t in todos if t not in existing]
      if new:
        lines = [cst.EmptyLine(comment=cst.Comment(t)) for t in new]
        result = result.with_changes(leading_lines=[*result.leading_lines, *lines])
    return result

  # -- rewrites --------------------------------------------------------------
  def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    name = self.legacy_def(original)
    if name is not None:
      return self._rewrite_def(original, updated, name)
    func = updated.func
    if m.matches(func, m.Attribute(attr=m.Name('create'))):
      if self.is_def(original.func.value, self.a.def_vars):
        problem = self._create_problem(original)
        if problem:
          self.flag(original, 'OM100', problem)
        elif not self.blocked:
          return self._rewrite_create(original, updated)
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))) and self.mixed_lr:
      self.flag(original, 'OM102', 'some apply_gradient calls pass learning_rate and some do '
                                   'not; legacy overrides last one call, Optax state persists '
                                   '(this file keeps its legacy optimizer code)')
      return updated
    if self.unproven:
      if (m.matches(func, m.Attribute(attr=m.Name('apply_gradient')))
          and not self.a.defines_apply_gradient):
        self.flag(original, 'OM100', 'this file never imports flax.optim: if this is a flax.optim '
                                     'Optimizer, migrate it where it is created')
      return updated
    if self.blocked:
      return updated
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))):
      return self._rewrite_apply(original, updated)
    if m.matches(func, m.Attribute(attr=m.Name('replace'))) and self._is_optimizer(original.func.value):
      args = [a.with_changes(keyword=cst.Name('params'))
              if a.keyword is not None and a.keyword.value == 'target' else a
              for a in updated.args]
      if args != list(updated.args):
        self.fixed(original, 'OM003', 'replace(target=...) -> replace(params=...)')
        return updated.with_changes(args=args)
    return updated

  def _def_args(self, call: cst.Call, spec) -> dict[str, str]:
    """Legacy keyword -> source text of the def call's arguments.

    Raises:
      TypeError: star-args, too many positionals or unknown keywords.
    """
    args, names = {}, spec.hyper_param_names
    for i, a in enumerate(call.args):
      if a.star:
        raise TypeError(f'{spec.name}(*args/**kwargs) cannot be converted statically')
      if a.keyword is None and i >= len(names):
        raise TypeError(f'{spec.name}() takes at most {len(names)} arguments')
      key = a.keyword.value if a.keyword is not None else names[i]
      args[key] = self._code(a.value)
    spec.emit(args)  # validates the keywords
    return args

  def _def_problem(self, call: cst.Call) -> Optional[tuple[str, str]]:
    """``(rule, message)`` when the def call cannot be converted, else None."""
    name = self.legacy_def(call)
    spec = spec_lib.SPECS.get(name)
    if spec is None:
      import optim_compat
      meanwhile = (f'; use optim_compat.{name} meanwhile' if hasattr(optim_compat, name)
                   else '')
      return 'OM101', (f'flax.optim.{name} is not converted yet{meanwhile} '
                       '(this file keeps its legacy optimizer code)')
    try:
      args = self._def_args(call, spec)
    except TypeError as e:
      return 'OM100', str(e)
    if 'learning_rate' not in args and not self.inject_lr:
      return 'OM100', (f'{name} has no learning rate and none is passed at apply time '
                       'in this file; set learning_rate explicitly')
    return None

  def _rewrite_def(self, original, updated, name):
    problem = self._def_problem(original)
    self._consumed.add(id(original.func))
    if problem:
      self.flag(original, *problem)
      return updated
    if self.blocked:  # another part of the file cannot be converted: keep it all legacy
      return updated
    spec = spec_lib.SPECS[name]
    source = spec.emit(self._def_args(updated, spec), learning_rate_injected=self.inject_lr)
    AddImportsVisitor.add_needed_import(self.context, 'optax')
    if 'optim_compat.' in source:  # a faithful transformation (intrinsic difference)
      AddImportsVisitor.add_needed_import(self.context, 'optim_compat')
    distance = ('bitwise equal to legacy' if spec.stock_max_ulp == 0 else
                f'measured <= {spec.stock_max_ulp} ulp from legacy: {spec.differences}')
    self.fixed(original, 'OM001', f'flax.optim.{name}(...) -> {source} ({distance})')
    return cst.parse_expression(source)

  def _rewrite_create(self, original, updated):
    target = updated.args[0].value
    AddImportsVisitor.add_needed_import(self.context, 'flax.training', 'train_state')
    self.fixed(original, 'OM001', '.create(params) -> train_state.TrainState.create(...)')
    return cst.parse_expression('train_state.TrainState.create(apply_fn=None, params=P, tx=T)') \
        .visit(_Substitute({'P': target, 'T': updated.func.value}))

  def _rewrite_apply(self, original, updated):
    kwargs = self._kwargs(updated)
    positional = [a for a in updated.args if a.keyword is None]
    other = sorted(set(kwargs) - {'learning_rate'})
    if len(positional) != 1 or other:
      self.flag(original, 'OM102', f'apply_gradient overrides {other} have no Optax '
                                   'equivalent here; inject them with optax.inject_hyperparams')
      return updated
    recv = updated.func.value
    grads = positional[0].value
    if 'learning_rate' in kwargs:
      lr = kwargs['learning_rate'].value
      template = 'R.replace(opt_state=optax.tree_utils.tree_set(R.opt_state, learning_rate=L))' \
                 '.apply_gradients(grads=G)'
      AddImportsVisitor.add_needed_import(self.context, 'optax')
      subs = {'R': recv, 'L': lr, 'G': grads}
      self.fixed(original, 'OM002', 'apply_gradient(g, learning_rate=lr) -> lr set in '
                                    'opt_state (inject_hyperparams), then apply_gradients')
    else:
      template = 'R.apply_gradients(grads=G)'
      subs = {'R': recv, 'G': grads}
      self.fixed(original, 'OM002', 'apply_gradient(g) -> apply_gradients(grads=g)')
    return cst.parse_expression(template).visit(_Substitute(subs))

  def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
    rule = LEGACY_ONLY_ATTRS.get(original.attr.value)
    if rule and id(original) in self._legacy_attr_ids and self._is_optimizer(original.value):
      self.flag(original, rule, f'`.{original.attr.value}` of a flax.optim Optimizer has no '
                                'TrainState equivalent yet (this file keeps its legacy optimizer code)')
    if self.blocked or self.unproven:
      return updated
    if original.attr.value == 'target':
      if self._is_optimizer(original.value):
        self.fixed(original, 'OM003', '.target -> .params')
        return updated.with_changes(attr=cst.Name('params'))
      value = original.value
      if (self.a.uses_legacy and isinstance(value, cst.Name)
          and (self.binding(value) in self.a.params
               or self.binding(value) in (self.a.rebound & self.a.opt_vars))):
        # a parameter of unknown origin in a legacy file: maybe an optimizer
        self.flag(original, 'OM100', f'if `{self._code(original.value)}` is a flax.optim '
                                     'Optimizer, `.target` is `.params` on a TrainState')
    if (original.attr.value == 'step' and isinstance(original.value, cst.Attribute)
        and original.value.attr.value == 'state' and self._is_optimizer(original.value.value)):
      self.fixed(original, 'OM004', '.state.step -> .step')
      return updated.with_changes(value=updated.value.value)
    return updated

  # -- legacy references left after rewriting: flagged -------------------
  def visit_Import(self, node) -> bool:
    return False

  def visit_ImportFrom(self, node) -> bool:
    return False

  def visit_Attribute(self, node: cst.Attribute) -> None:
    self._record_legacy(node)

  def visit_Name(self, node: cst.Name) -> None:
    self._record_legacy(node)

  def _record_legacy(self, node) -> None:
    """Remember a reference to a legacy name ``flax.optim.<X>`` (not its parts)."""
    legacy = sorted(q for q in self.qnames(node)
                    if q.startswith(LEGACY + '.') and q.count('.') == 2)
    if legacy and self._refs:
      self._refs[-1].append((node, legacy[0]))


def _aliased_legacy_imports(tree: cst.Module):
  """``(module, obj, asname)`` of top-level ``import flax.optim as X`` /
  ``from flax.optim[.sub] import Y as X`` / ``from flax import optim as X``."""
  for stmt in tree.body:
    if not isinstance(stmt, cst.SimpleStatementLine):
      continue
    for small in stmt.body:
      if isinstance(small, cst.Import):
        for alias in small.names:
          name = cst.Module(body=[]).code_for_node(alias.name)
          if name.startswith(LEGACY) and alias.asname:
            yield name, None, alias.asname.name.value
      elif isinstance(small, cst.ImportFrom) and small.module is not None and \
          not isinstance(small.names, cst.ImportStar):
        module = cst.Module(body=[]).code_for_node(small.module)
        for alias in small.names:
          obj = alias.name.value if isinstance(alias.name, cst.Name) else None
          if alias.asname and (module.startswith(LEGACY) or (module == 'flax' and obj == 'optim')):
            yield module, obj, alias.asname.name.value


class _Substitute(cst.CSTTransformer):
  """Replace placeholder names in a parsed template with real nodes."""

  def __init__(self, subs: dict):
    self.subs = subs

  def leave_Name(self, original, updated):
    return self.subs.get(updated.value, updated)


class MigrateCommand(CodemodCommand):
  """LibCST codemod: legacy flax.optim -> Optax + flax.training.train_state."""

  DESCRIPTION = __doc__

  def __init__(self, context: CodemodContext):
    super().__init__(context)
    self.findings: list[Finding] = []

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    wrapper = cst.MetadataWrapper(tree, unsafe_skip_copy=True)
    analysis = _Analyzer()
    wrapper.visit(analysis)
    rewriter = _Rewriter(self.context, analysis)
    result = wrapper.visit(rewriter)
    self.findings = rewriter.findings
    # RemoveImportsVisitor drops only imports left unused: a legacy import in use stays
    RemoveImportsVisitor.remove_unused_import(self.context, 'flax', 'optim')
    RemoveImportsVisitor.remove_unused_import(self.context, 'flax.optim')
    RemoveImportsVisitor.remove_unused_import(self.context, 'flax')
    for name in spec_lib.SPECS:
      RemoveImportsVisitor.remove_unused_import(self.context, 'flax.optim', name)
    for module, obj, asname in _aliased_legacy_imports(tree):
      RemoveImportsVisitor.remove_unused_import(self.context, module, obj, asname)
    return result
