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
import io
import re
import tokenize
from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodCommand, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import (PositionProvider, QualifiedNameProvider, ScopeProvider)

from codemod import import_scope
from codemod.rules import RULES, TODO_PREFIX, Options
from optim_compat import spec as spec_lib

LEGACY = 'flax.optim'
REPLICATE_FNS = {'flax.jax_utils.replicate', 'flax.jax_utils.unreplicate'}
#: Array attributes a legacy ``.state.step`` had and a fresh ``TrainState.step`` (an int) lacks.
ARRAY_ONLY_ATTRS = {'astype', 'dtype', 'shape', 'ndim', 'item', 'block_until_ready', 'tolist',
                    'copy', 'size', 'addressable_shards', 'sharding', 'devices'}
#: Wrappers whose result takes the wrapped function's arguments unchanged (``p_step = jax.pmap(step)``).
CALL_WRAPPERS = {'jax.jit', 'jax.pmap', 'jax.checkpoint', 'jax.remat'}
#: Optimizer attributes a TrainState does not have and no rule converts yet.
LEGACY_ONLY_ATTRS = {
    'optimizer_def': 'OM100', 'state': 'OM103', 'replicate': 'OM100', 'unreplicate': 'OM100',
    'compute_gradient': 'OM100', 'compute_gradients': 'OM100', 'optimize': 'OM100',
    'state_dict': 'OM100', 'restore_state': 'OM100'}
#: Optimizer attributes that fail on a ``TrainState`` (flagged where a converted
#: factory's value may reach a file that keeps its legacy code).
FLOW_FAILING_ATTRS = {'target', 'apply_gradient', *LEGACY_ONLY_ATTRS}
#: Reflection on an optimizer's fields by name (flagged on converted optimizers).
REFLECTION_FNS = {'builtins.getattr', 'builtins.hasattr', 'builtins.setattr', 'builtins.delattr',
                  'dataclasses.replace', 'flax.serialization.to_state_dict'}
#: The fields of a legacy ``flax.optim.Optimizer`` (a ``flax.struct`` dataclass).
OPTIMIZER_FIELDS = {'optimizer_def', 'state', 'target'}
#: Legacy submodules (``flax.optim.<module>.<Name>``), flax.optim 0.5.3.
LEGACY_SUBMODULES = {'base', 'adabelief', 'adadelta', 'adafactor', 'adagrad', 'adam', 'lamb',
                     'lars', 'momentum', 'rmsprop', 'sgd', 'weight_norm', 'dynamic_scale'}
#: Legacy defs the codemod converts: the migration table plus the wrappers.
MULTI, WEIGHT_NORM, TRAVERSAL = 'MultiOptimizer', 'WeightNorm', 'ModelParamTraversal'
DEF_NAMES = set(spec_lib.SPECS) | {MULTI, WEIGHT_NORM}
#: Legacy names replaced in type annotations (OM007).
ANNOTATIONS = {'Optimizer': ('train_state.TrainState', ('flax.training', 'train_state')),
               'OptimizerDef': ('optax.GradientTransformation', ('optax', None))}
#: Checkpoint readers whose target may be a legacy optimizer (OM013): qname -> target arg index.
RESTORES = {'flax.training.checkpoints.restore_checkpoint': (1, 'target'),
            'flax.serialization.from_state_dict': (0, 'target'),
            'flax.serialization.from_bytes': (0, 'target')}
FROZEN = 'frozen'
#: Ends the message of a flag that keeps its file legacy (the engine's second pass looks for it).
KEEPS_LEGACY = '(this file keeps its legacy optimizer code)'


#: Longest code excerpt a message quotes (longer ones are cut, multi-line ones folded).
EXCERPT_CHARS = 80
_QUOTED = re.compile(r'`([^`]*)`')


def one_line(message: str) -> str:
  """``message`` as one line, for a ``# TODO`` comment and a report entry.

  A quoted source excerpt (between backticks) that spans lines (a call written
  over several lines) is folded onto one line and, past :data:`EXCERPT_CHARS`
  characters, cut with ``...``; any other line break becomes a space. A comment
  holding a line break would not be a comment (LibCST refuses to build it).
  """
  def fold(match):
    text = match.group(1)
    if '\n' not in text and '\r' not in text and len(text) <= EXCERPT_CHARS:
      return match.group(0)
    text = ' '.join(text.split())
    if len(text) > EXCERPT_CHARS:
      text = text[:EXCERPT_CHARS - 3].rstrip() + '...'
    return f'`{text}`'
  return ' '.join(_QUOTED.sub(fold, message).splitlines())


def legacy_symbol(qname: str) -> Optional[str]:
  """``'Adam'`` for ``flax.optim.Adam`` or ``flax.optim.adam.Adam``; a submodule
  name for ``flax.optim.adam``; None for anything else."""
  if not qname.startswith(LEGACY + '.'):
    return None
  parts = qname[len(LEGACY) + 1:].split('.')
  if len(parts) == 1:
    return parts[0]
  if len(parts) == 2 and parts[0] in LEGACY_SUBMODULES:
    return parts[1]
  return None


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

  def symbol(self, node) -> Optional[str]:
    """The legacy ``flax.optim`` name ``node`` refers to, if any."""
    found = sorted(filter(None, map(legacy_symbol, self.qnames(node))))
    return found[0] if found else None

  def legacy_def(self, call: cst.BaseExpression) -> Optional[str]:
    """The legacy def name if ``call`` is ``flax.optim.<Def>(...)`` (any import form)."""
    if not isinstance(call, cst.Call):
      return None
    name = self.symbol(call.func)
    return name if name in DEF_NAMES else None

  def binding(self, name: cst.Name):
    """``(scope, name)`` identifying the variable ``name`` refers to, or None."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return None
    assignments = list(scope[name.value])
    if not assignments:
      return None
    return (id(assignments[0].scope), name.value)

  def name_factory(self, expr):
    """The other module's factory (``codemod.flow``) whose optimizer the name ``expr``
    holds, or None (not a name, never bound to one, or rebound to something else)."""
    if not isinstance(expr, cst.Name):
      return None
    b = self.binding(expr)
    return None if b in self.an.rebound else self.an.flow_vars.get(b)

  def name_bindings(self, targets):
    """Bindings of the plain-name assignment targets among ``targets``."""
    for t in targets:
      if isinstance(t, cst.Name) and (b := self.binding(t)):
        yield b

  def factory_of_call(self, value, bundle=False):
    """The other module's factory ``value`` calls (``create_optimizer(p)``), if any
    (``bundle``: one that returns its optimizer inside a tuple, list or dict instead)."""
    if self.an.flow is None or not isinstance(value, cst.Call):
      return None
    for q in sorted(self.qnames(value.func)):
      found = self.an.flow.resolve(q)
      if found is not None and found.bundle == bundle:
        return found
    return None

  def is_user_def(self, expr) -> bool:
    """``expr`` is ``MyDef(...)`` for a user subclass of a flax.optim class in this file."""
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
            and expr.func.value in self.an.subclass_names)

  def is_def(self, expr, def_vars) -> bool:
    """``expr`` is a legacy def call (ours or a user subclass) or a name bound to one."""
    return self.legacy_def(expr) is not None or self.is_user_def(expr) or (
        isinstance(expr, cst.Name) and self.binding(expr) in def_vars)

  def is_traversal(self, expr) -> bool:
    """``expr`` builds a ``ModelParamTraversal`` or is a name bound to one."""
    if isinstance(expr, cst.Call):
      return self.symbol(expr.func) == TRAVERSAL or \
          'flax.traverse_util.ModelParamTraversal' in self.qnames(expr.func)
    return isinstance(expr, cst.Name) and self.binding(expr) in self.an.traversal_vars


_HP_READ = m.Attribute(value=m.Attribute(attr=m.Name('hyper_params')))
#: Def attributes (other than ``create``) that an Optax transformation does not have.
DEF_ONLY_ATTRS = {'hyper_params', 'init_state', 'apply_gradient', 'update_hyper_params',
                  'init_param_state', 'apply_param_gradient', 'state_dict', 'restore_state'}


class _Analyzer(_Base, cst.CSTVisitor):
  """Collect def variables, optimizer variables, legacy references and their contexts."""

  def __init__(self, flow=None):
    super().__init__()
    self.an = self
    self.flow = flow                # codemod.flow.Flow: factories of other modules, or None
    self.flow_vars: dict = {}       # binding -> flow.Factory whose result it holds
    self.flow_used: dict = {}       # qualified name -> flow.Factory this file calls
    self.module_factories: set[str] = set()  # module-level functions returning an optimizer
    self._class_depth = 0
    self.def_vars: dict = {}        # binding -> cst.Call of the legacy def
    self.opt_vars: set = set()      # bindings holding optimizers
    self.traversal_vars: dict = {}  # binding -> cst.Call of ModelParamTraversal
    self.apply_calls: list[cst.Call] = []
    self.uses_legacy = False        # the module references flax.optim at all
    self.def_calls: list[cst.Call] = []
    self.create_calls: list[cst.Call] = []
    self.params: set = set()        # bindings of function parameters
    self.loop_vars: set = set()     # bindings of for-loop and comprehension targets
    self.legacy_attrs: list[cst.Attribute] = []  # opt.optimizer_def, opt.state, opt.replicate...
    self.handled: set[int] = set()  # ids of legacy_attrs a rule converts
    self.subclasses: list[cst.ClassDef] = []     # user OptimizerDef subclasses
    self.subclass_names: set[str] = set()
    self.defines_apply_gradient = False          # the module has its own `def apply_gradient`
    self._state_step: set[int] = set()
    self.step_array_uses: set[int] = set()  # `.state.step` nodes used as an array
    self.rebound: set = set()       # bindings also assigned something else
    self.refs: dict[int, str] = {}  # id(outermost legacy reference) -> legacy symbol
    self.ref_nodes: dict[int, cst.CSTNode] = {}
    self.in_annotation: set[int] = set()
    self.in_subclass: set[int] = set()
    self.call_funcs: set[int] = set()
    self.nn_refs: set[int] = set()  # pre-Linen flax.nn references
    self._inner: set[int] = set()
    self._annotation_depth = 0
    self._subclass_depth = 0
    self.hp_reads: dict[int, tuple] = {}  # id(attr) -> (receiver, name, via_optimizer)
    self.def_attrs: list[cst.Attribute] = []
    self.method_calls: dict[int, cst.Call] = {}  # id(call) of opt.replicate()/unreplicate()
    self.grad_assigns: set[int] = set()  # `a, b = opt.compute_gradient(f)`
    self.optimize_assigns: set[int] = set()  # `opt, loss = opt.optimize(f)`
    self.optimize_calls: list[cst.Call] = []
    self.restores: list[cst.Call] = []
    self.wn_inner: set[int] = set()      # def calls wrapped by WeightNorm(...)
    self.opt_factories: set[str] = set()  # module functions returning a new optimizer
    self.bundle_factories: set[str] = set()  # functions returning one inside a tuple/list/dict
    self.escaping: dict[int, cst.CSTNode] = {}  # defs returned or passed to other code
    self._group_args: set[int] = set()
    self._function_stack: list[str] = []
    self.attr_chains: set[str] = set()  # `self.optimizer`-like chains holding optimizers
    self.attr_other: set[str] = set()   # chains also assigned something else
    self.attr_flow: dict = {}           # chain -> converted flow.Factory assigned to it
    self.assignments: list = []         # (targets, value) of every `=` statement
    self._chain_copies: list = []       # (chain, replicated chain): `self.o = replicate(self.o)`
    self.functions: list[cst.FunctionDef] = []  # functions outside classes (parameter following)
    self.made_here_params: set = set()  # parameters only ever given this file's optimizers
    self.top_functions: list[cst.FunctionDef] = []  # module-level ones (codemod.flow steps)
    self.steps: dict = {}  # module-level function -> its optimizer parameters (leave_Module)
    self._calls_by_func: dict[int, cst.Call] = {}  # id(call.func) -> call
    self._wrapped: list = []  # (assignment, call): `p_step = jax.pmap(step, ...)`
    self._rebinds: set = set()  # bindings a loop, walrus, `with` or unpacking gives other values
    self.module_refs: list = []   # uses of the flax.optim module object itself
    self.dynamic_imports: dict = {}  # id(node) -> what it does without flax.optim (below)
    self._blocks: list[int] = []  # ids of the statement blocks being visited
    self._assign_sites: dict = {}  # binding -> [(target Name, value, id(block))]: `x = ...`
    self.mixed_defs: dict[int, str] = {}  # id(def call) -> name that then holds the optimizer
    self.star_imports: list = []  # `from flax.optim import *`: its names cannot be resolved
    self.legacy_imports: list = []  # import statements of flax.optim
    self.annotated_fields: set[str] = set()  # class fields annotated `flax.optim.Optimizer`

  # -- imports: only whether flax.optim is imported ----------------------
  def visit_Import(self, node: cst.Import) -> bool:
    for alias in node.names:
      if cst.Module(body=[]).code_for_node(alias.name).startswith(LEGACY):
        self.uses_legacy = True
        self.legacy_imports.append(node)
    return False

  @property
  def only_imports(self) -> bool:  # (a star import's names are never seen as used)
    """flax.optim is imported and nothing in the module uses it: maybe a re-export
    (``from flax import optim`` in a package's ``__init__.py``)."""
    return bool(self.legacy_imports) and not self.star_imports and not (
        self.refs or self.module_refs or self.apply_calls or self.legacy_attrs or self.flow_used)

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    if node.module is None:
      return False
    module = cst.Module(body=[]).code_for_node(node.module)
    if module == LEGACY or module.startswith(LEGACY + '.'):
      self.uses_legacy = True
      self.legacy_imports.append(node)
      if isinstance(node.names, cst.ImportStar):
        self.star_imports.append(node)
    elif module == 'flax' and not isinstance(node.names, cst.ImportStar) and any(
        isinstance(a.name, cst.Name) and a.name.value == 'optim' for a in node.names):
      self.uses_legacy = True
      self.legacy_imports.append(node)
    return False

  # -- contexts ------------------------------------------------------------
  def visit_Annotation(self, node) -> None:
    self._annotation_depth += 1

  def leave_Annotation(self, node) -> None:
    self._annotation_depth -= 1

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    self._class_depth += 1
    if any(self.symbol(base.value) for base in node.bases):
      self.subclasses.append(node)
      self.subclass_names.add(node.name.value)
      self._subclass_depth += 1

  def leave_ClassDef(self, node: cst.ClassDef) -> None:
    self._class_depth -= 1
    if any(node is c for c in self.subclasses):
      self._subclass_depth -= 1

  def _reference(self, node) -> None:
    if id(node) in self._inner:
      if isinstance(node, cst.Attribute):
        self._inner.add(id(node.value))
      return
    qnames = self.qnames(node)
    sym = sorted(filter(None, map(legacy_symbol, qnames)))
    if sym:
      self.uses_legacy = True
      self.refs[id(node)] = sym[0]
      self.ref_nodes[id(node)] = node
      if self._annotation_depth:
        self.in_annotation.add(id(node))
      if self._subclass_depth:
        self.in_subclass.add(id(node))
    elif any(q == 'flax.nn' or q.startswith('flax.nn.') for q in qnames):
      self.nn_refs.add(id(node))
    else:
      if any(q == LEGACY for q in qnames):
        self.uses_legacy = True
        self.module_refs.append(node)  # the module object itself (`opt_lib = optim`)
      return
    if isinstance(node, cst.Attribute):
      self._inner.add(id(node.value))

  def visit_Attribute(self, node: cst.Attribute) -> None:
    self._reference(node)
    attr = node.attr.value
    if attr == 'step' and m.matches(node.value, m.Attribute(attr=m.Name('state'))):
      self._state_step.add(id(node.value))  # `.state.step` is converted (OM004)
    if attr in ARRAY_ONLY_ATTRS and m.matches(
        node.value, m.Attribute(value=m.Attribute(attr=m.Name('state')), attr=m.Name('step'))):
      self.step_array_uses.add(id(node.value))  # `opt.state.step.astype(...)`
    elif attr in LEGACY_ONLY_ATTRS and id(node) not in self._state_step:
      self.legacy_attrs.append(node)
    if m.matches(node, _HP_READ):
      owner = node.value.value
      if m.matches(owner, m.Attribute(attr=m.Name('optimizer_def'))):
        self.hp_reads[id(node)] = (owner.value, attr, True)
      else:
        self.hp_reads[id(node)] = (owner, attr, False)
    if attr in DEF_ONLY_ATTRS and isinstance(node.value, cst.Name):
      self.def_attrs.append(node)

  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    self._function_stack.append(node.name.value)
    if not self._class_depth:
      self.functions.append(node)
      if len(self._function_stack) == 1:
        self.top_functions.append(node)
    if node.name.value == 'apply_gradient':
      self.defines_apply_gradient = True

  def visit_Param(self, node: cst.Param) -> None:
    if (b := self.binding(node.name)):
      self.params.add(b)
      if node.annotation is not None and self.symbol(node.annotation.annotation) == 'Optimizer':
        self.opt_vars.add(b)
      if node.annotation is not None and self.symbol(node.annotation.annotation) == 'OptimizerDef':
        self.def_vars[b] = None  # a def of unknown kind: `.create` on it is still converted

  def visit_For(self, node: cst.For) -> None:
    bindings = set(self._target_bindings(node.target))
    self.loop_vars.update(bindings)
    self._rebinds.update(bindings)  # `for opt in batches:` rebinds a name an optimizer may hold

  def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
    if isinstance(node.target, cst.Name) and (b := self.binding(node.target)):
      if self._produces_optimizer(node.value):
        self.opt_vars.add(b)
      else:
        self._rebinds.add(b)

  def visit_WithItem(self, node: cst.WithItem) -> None:
    if node.asname is not None:
      self._rebinds.update(self._target_bindings(node.asname.name))

  def visit_CompFor(self, node: cst.CompFor) -> None:
    self.loop_vars.update(self._target_bindings(node.target))

  def _target_bindings(self, target):
    """Bindings of the names a for/comprehension target binds (unpacking included)."""
    return self.name_bindings(target_names(target))

  def visit_Name(self, node) -> None:
    self._reference(node)

  def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
    if self.symbol(node.annotation.annotation) == 'Optimizer':
      self.opt_vars.update(self.name_bindings([node.target]))
    if (self._class_depth and not self._function_stack and isinstance(node.target, cst.Name)
        and any(self.symbol(n) in ('Optimizer', 'ReplicatedOptimizer') for n in m.findall(
            node.annotation, m.Name() | m.Attribute()))):
      # `optimizer: optim.Optimizer` (also Optional[...]) in a dataclass / NamedTuple: a
      # proof that `<anything>.optimizer` holds one, wherever it is read in this file
      self.annotated_fields.add(node.target.value)
    if node.value is not None and (self.legacy_def(node.value) or self.is_user_def(node.value)):
      self.def_vars.update(dict.fromkeys(self.name_bindings([node.target]), node.value))

  def flow_source(self, value):
    """The factory whose optimizer ``value`` is: its call, or a step/replicate of a name
    holding one (``opt.apply_gradient(g)``, ``jax_utils.replicate(opt)``)."""
    found = self.factory_of_call(value)
    if isinstance(value, cst.Name):  # an alias: `best = opt`
      return self.flow_vars.get(self.binding(value))
    if found is not None or not isinstance(value, cst.Call):
      return found
    func = value.func
    if self.qnames(func) & REPLICATE_FNS:  # before `x.unreplicate(...)`: `jax_utils` is no optimizer
      if value.args and isinstance(value.args[0].value, cst.Name):
        return self.flow_vars.get(self.binding(value.args[0].value))
      return None
    if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name('apply_gradient') | m.Name('replicate')
                                   | m.Name('unreplicate') | m.Name('replace'))):
      return self.flow_vars.get(self.binding(func.value))
    return None

  def visit_Assign(self, node: cst.Assign) -> None:
    value = node.value
    targets = [t.target for t in node.targets]
    for t in targets:
      if isinstance(t, (cst.Tuple, cst.List)):
        self._unpacking(t, value)
    if self._class_depth and not self._function_stack and self.legacy_def(value):
      self.escaping[id(value)] = value  # `class Cfg: opt_def = Adam(...)`: used as Cfg.opt_def
    if isinstance(value, cst.Name) and self.binding(value) in self.opt_vars and \
        self.binding(value) not in self.rebound:
      self.opt_vars.update(self.name_bindings(targets))  # `best = opt`: an alias
    for t in targets:
      if (chain := attr_chain(t)) is not None:
        inner = (attr_chain(value.args[0].value) if isinstance(value, cst.Call) and value.args
                 and self.qnames(value.func) & REPLICATE_FNS else None)
        if inner is None and isinstance(value, cst.Call) and any(
            attr_chain(a.value) == chain for a in value.args):
          inner = chain  # passed through: `self.opt = restore_checkpoint(d, self.opt)`
        if inner is not None:
          self._chain_copies.append((chain, inner))  # settled in leave_Module
        elif self._produces_optimizer(value) or (
            isinstance(value, cst.Name) and self.binding(value) in self.opt_vars):
          self.attr_chains.add(chain)
          if (factory := self.factory_of_call(value)) is not None and factory.converted:
            self.attr_flow[chain] = factory  # `self.opt = create_optimizer(p)`, converted there
        elif not m.matches(value, m.Name('None')):
          self.attr_other.add(chain)  # `self.opt = Thing()`: never rewritten blindly
    if (len(targets) == 1 and isinstance(targets[0], cst.Name) and isinstance(value, cst.Call)
        and value.args and value.args[0].keyword is None and not value.args[0].star
        and self.qnames(value.func) & CALL_WRAPPERS):
      self._wrapped.append((node, value))  # (`jax.pmap(steps.train_step)` too: codemod.flow)
    self.assignments.append((targets, value))
    if len(targets) == 1 and isinstance(targets[0], cst.Name) and (b := self.binding(targets[0])):
      block = self._blocks[-1] if self._blocks else None
      self._assign_sites.setdefault(b, []).append((targets[0], value, block))
    source = self.flow_source(value) if self.flow is not None else None
    if source is not None:
      self.flow_vars.update(dict.fromkeys(self.name_bindings(targets), source))
    if self.legacy_def(value) or self.is_user_def(value):
      self.def_vars.update(dict.fromkeys(self.name_bindings(targets), value))
    elif self.is_traversal(value) and isinstance(value, cst.Call):
      self.traversal_vars.update(dict.fromkeys(self.name_bindings(targets), value))
    elif self._produces_optimizer(value):
      self.opt_vars.update(self.name_bindings(targets))
    elif source is not None:
      pass  # another module's optimizer, kept legacy there: flagged where it is used
    elif isinstance(value, cst.Name) and self.binding(value) in self.opt_vars:
      pass  # an alias (above)
    elif not self._passes_name_through(value, targets):
      # `opt = Thing()`: this name also holds something else; never rewrite it blindly
      self.rebound.update(self.name_bindings(targets))
    if (len(targets) == 1 and m.matches(targets[0], m.Tuple())
        and m.matches(value, m.Call(func=m.Attribute(attr=m.Name('compute_gradient')
                                                     | m.Name('compute_gradients'))))
        and len(targets[0].elements) in (2, 3)
        and all(isinstance(e, cst.Element) for e in targets[0].elements)
        and len(value.args) == 1 and value.args[0].keyword is None and not value.args[0].star):
      self.grad_assigns.add(id(node))
      self.handled.add(id(value.func))
    if (len(targets) == 1 and m.matches(targets[0], m.Tuple())
        and m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name('optimize'))))
        and len(targets[0].elements) in (2, 3)
        and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name)
                for e in targets[0].elements)
        and value.func.value.value not in {e.value.value for e in targets[0].elements[1:]}
        and len(value.args) >= 1 and value.args[0].keyword is None
        and all(not a.star for a in value.args)
        and all(a.keyword is not None and a.keyword.value == 'learning_rate'
                for a in value.args[1:])):
      self.optimize_assigns.add(id(node))
      self.optimize_calls.append(value)
      self.handled.add(id(value.func))
      self.opt_vars.update(self.name_bindings([targets[0].elements[0].value]))
      self.rebound.difference_update(self.name_bindings([targets[0].elements[0].value]))

  def _unpacking(self, target, value) -> None:
    """``a, b = ...``: a name an optimizer may hold keeps it only when passed through
    (``opt, metrics = train_step(opt, batch)``, ``opt, loss = opt.optimize(f)``) or
    given an optimizer element-wise (``opt, n = Adam(...).create(p), 0``)."""
    elements = [e.value for e in target.elements if isinstance(e, cst.Element)]
    values = ([e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List))
              and len(value.elements) == len(target.elements) else None)
    for i, element in enumerate(elements):
      for name in target_names(element):
        b = self.binding(name)
        if b is None:
          continue
        if values is not None and isinstance(element, cst.Name):
          v = values[i]
          if self.flow is not None and (source := self.flow_source(v)) is not None:
            self.flow_vars[b] = source  # `o, n = opt, 0` / `o, = [opt]`: another module's
          if self._produces_optimizer(v) or (isinstance(v, cst.Name) and v.value == name.value):
            continue
          if isinstance(v, cst.Name) and self.binding(v) in self.opt_vars:
            self.opt_vars.add(b)
            continue
        elif values is None and (self._passes_name_through(value, [name]) or (
            i == 0 and m.matches(value, m.Call(func=m.Attribute(attr=m.Name('optimize')))))):
          continue  # (`new, loss = opt.optimize(f)`: the first is an optimizer)
        self._rebinds.add(b)

  # -- flax.optim reached by name at run time ----------------------------
  def _dynamic_import(self, node) -> Optional[str]:
    """How ``node`` fails on Flax >= 0.6 if it reaches flax.optim by name, else None:
    ``importlib.import_module('flax.optim[.adam]')`` / ``__import__(...)`` (also
    ``import_module('.optim', 'flax')``), ``sys.modules['flax.optim']`` (and ``.get``,
    ``.pop``, ``.setdefault``), ``getattr(flax, 'optim'[, default])``."""
    if isinstance(node, cst.Subscript):
      if (len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
          and _legacy_module_name(node.slice[0].slice.value)
          and 'sys.modules' in self.qnames(node.value)):  # (the cheap tests first)
        return 'a KeyError'
      return None
    if not isinstance(node, cst.Call) or not node.args or any(a.star for a in node.args) \
        or not any(isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString))
                   for a in node.args):
      return None
    fn = self.qnames(node.func)
    args = {a.keyword.value if a.keyword is not None else i: a.value
            for i, a in enumerate(node.args)}
    if fn & {'importlib.import_module', 'builtins.__import__'}:
      name = args.get(0, args.get('name'))
      package = args.get(1, args.get('package')) if 'importlib.import_module' in fn else None
      if _legacy_module_name(name) or (
          isinstance(package, (cst.SimpleString, cst.ConcatenatedString))
          and package.evaluated_value == 'flax'
          and _legacy_module_name(name, prefix='.optim')):
        return 'a ModuleNotFoundError'
      return None
    if m.matches(node.func, m.Attribute(attr=m.Name('get') | m.Name('pop') | m.Name('setdefault'))) \
        and 'sys.modules' in self.qnames(node.func.value) and _legacy_module_name(args.get(0)):
      return {'get': 'None (or the default)', 'pop': 'a KeyError (or the default)',
              'setdefault': 'the default'}[node.func.attr.value]
    if 'builtins.getattr' in fn and len(node.args) in (2, 3) and 'flax' in self.qnames(args[0]) \
        and isinstance(args.get(1), (cst.SimpleString, cst.ConcatenatedString)) \
        and args[1].evaluated_value == 'optim':
      return 'the default' if len(node.args) == 3 else 'an AttributeError'
    return None

  def visit_Subscript(self, node: cst.Subscript) -> None:
    if (failure := self._dynamic_import(node)) is not None:
      self.uses_legacy = True
      self.dynamic_imports[id(node)] = failure

  def visit_IndentedBlock(self, node) -> None:
    self._blocks.append(id(node))

  def leave_IndentedBlock(self, node) -> None:
    self._blocks.pop()

  def visit_SimpleStatementSuite(self, node) -> None:
    self._blocks.append(id(node))

  def leave_SimpleStatementSuite(self, node) -> None:
    self._blocks.pop()

  # -- a name holding a def, then the optimizer its create returns --------
  def _split_def_rebinds(self) -> None:
    """``opt = Adam(1e-3)`` then ``opt = opt.create(p)``: one name, two values in time.

    When the def's assignment is the name's first and the create's its next, both plain
    assignments in the same block, and every read of the name is in its own scope after
    the def's, the reads after the create are the optimizer's: they are not taken for the
    def (passing the optimizer on or calling its ``apply_gradient`` converts; the def
    becomes the Optax transformation and ``tx=opt`` reads it before the rebind). Any other
    such name is flagged with what happened (:attr:`mixed_defs`) and keeps the file legacy.
    """
    for b in sorted(set(self.def_vars) & self.opt_vars - self.rebound, key=str):
      sites = self._assign_sites.get(b, [])
      if not any(m.matches(v, m.Call(func=m.Attribute(value=m.Name(t.value), attr=m.Name('create'))))
                 for t, v, _ in sites[1:]):
        continue  # no `x = x.create(...)`: not this case
      after = self._optimizer_reads(b, sites)
      reads = {id(r.node) for t, _, _ in sites for r in self._accesses(t)}
      if after is None:
        defs = [v for _, v, _ in sites if self.legacy_def(v) or self.is_user_def(v)]
        if defs:
          self.mixed_defs[id(defs[0])] = sites[0][0].value
        after = reads  # its uses are flagged there, not as a def's
      self.escaping = {k: v for k, v in self.escaping.items() if k not in after}
      self.def_attrs = [a for a in self.def_attrs if id(a.value) not in after]

  def _accesses(self, name: cst.Name):
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return []
    # (a read before every assignment is linked to none of them: the scope's own list has it)
    reads = {id(r): r for r in scope.accesses[name.value]}
    reads.update((id(r), r) for a in scope.assignments[name.value] for r in a.references)
    return list(reads.values())

  def _optimizer_reads(self, b, sites) -> Optional[set[int]]:
    """ids of the reads of ``b`` that see the optimizer (see :meth:`_split_def_rebinds`),
    or None when that cannot be told."""
    if len(sites) < 2:
      return None
    pos = lambda node: self.get_metadata(PositionProvider, node, None)
    (d_name, d_value, d_block), (c_name, c_value, c_block) = sites[:2]
    scope = self.get_metadata(ScopeProvider, d_name, None)
    if (scope is None or len(list(scope.assignments[d_name.value])) != len(sites)
        or not (self.legacy_def(d_value) or self.is_user_def(d_value))
        or any(self.legacy_def(v) or self.is_user_def(v) for _, v, _ in sites[1:])
        or d_block != c_block
        or not m.matches(c_value, m.Call(func=m.Attribute(value=m.Name(d_name.value),
                                                          attr=m.Name('create'))))):
      return None
    d_end, c_end = pos(d_value), pos(c_value)
    if d_end is None or c_end is None:
      return None
    d_end, c_end = (d_end.end.line, d_end.end.column), (c_end.end.line, c_end.end.column)
    after = set()
    for read in self._accesses(d_name):
      where = pos(read.node)
      if read.scope is not scope or where is None:
        return None  # a closure or comprehension: read when it runs
      at = (where.start.line, where.start.column)
      if at < d_end:
        return None  # before the def (a loop's next round sees the optimizer)
      if at > c_end:
        after.add(id(read.node))
    return after

  def _passes_name_through(self, value, targets) -> bool:
    """``x = f(x, ...)``: a step function returning its (optimizer) argument."""
    if not isinstance(value, cst.Call):
      return False
    names = {t.value for t in targets if isinstance(t, cst.Name)}
    if m.matches(value.func, m.Attribute(value=m.Name())) and value.func.value.value in names:
      return True  # `x = x.method(...)`
    return any(isinstance(a.value, cst.Name) and a.value.value in names for a in value.args)

  def visit_Call(self, node: cst.Call) -> None:
    self.call_funcs.add(id(node.func))
    if (failure := self._dynamic_import(node)) is not None:
      self.uses_legacy = True
      self.dynamic_imports[id(node)] = failure
    self._calls_by_func[id(node.func)] = node
    if (factory := self.factory_of_call(node)) is not None:
      self.flow_used[factory.qualified] = factory
    elif (factory := self.factory_of_call(node, bundle=True)) is not None and factory.converted:
      self.flow_used[factory.qualified] = factory  # `o, lr = make_pair(p)`: its items are flagged
    name = self.legacy_def(node)
    if name == WEIGHT_NORM:
      self._group_args.update(id(a) for a in node.args)
    if name:
      self.def_calls.append(node)
      if name == WEIGHT_NORM and node.args and self.legacy_def(node.args[0].value):
        self.wn_inner.add(id(node.args[0].value))
    func = node.func
    if m.matches(func, m.Attribute(attr=m.Name('create'))) and \
        self.is_def(func.value, self.def_vars):
      self.create_calls.append(node)
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))) and not self._subclass_depth:
      # (inside a user OptimizerDef subclass it is the def's own method: kept on the shim)
      self.apply_calls.append(node)
      recv = func.value
      if isinstance(recv, cst.Name) and (b := self.binding(recv)):
        self.opt_vars.add(b)
      elif (chain := attr_chain(recv)) is not None:
        self.attr_chains.add(chain)
    if m.matches(func, m.Attribute(attr=m.Name('replicate') | m.Name('unreplicate'))):
      self.method_calls[id(node)] = node
      self.handled.add(id(func))
      if isinstance(func.value, cst.Name) and (b := self.binding(func.value)) and \
          all(a.keyword is not None for a in node.args):
        self.opt_vars.add(b)  # flax.optim's own methods, as for apply_gradient
    if self.qnames(func) & set(RESTORES):
      self.restores.append(node)

  def _produces_optimizer(self, value) -> bool:
    if not isinstance(value, cst.Call):
      return False
    func = value.func
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))):
      return True
    if m.matches(func, m.Attribute(attr=m.Name('create'))) and self.is_def(func.value, self.def_vars):
      return True
    if self.qnames(func) & REPLICATE_FNS:
      if not value.args:
        return False
      arg = value.args[0].value
      if isinstance(arg, cst.Name):
        return self.binding(arg) in self.opt_vars
      if (chain := attr_chain(arg)) is not None:
        return chain in self.attr_chains
      return self._produces_optimizer(arg)
    if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name('replicate') | m.Name('unreplicate')
                                   | m.Name('replace'))):
      return self.binding(func.value) in self.opt_vars  # `opt.replace(target=p)` too
    if m.matches(func, m.Attribute(value=m.Call(), attr=m.Name('replicate') | m.Name('unreplicate')
                                   | m.Name('replace'))):
      return self._produces_optimizer(func.value)  # `Adam(...).create(p).replicate()`
    if isinstance(func, cst.Name) and func.value in self.opt_factories:
      return True  # a function of this module that returns `Def(...).create(...)`
    factory = self.factory_of_call(value)
    return factory is not None and factory.converted  # another module's, converted there

  def _is_def_value(self, expr) -> bool:
    return self.legacy_def(expr) is not None or self.is_user_def(expr) or (
        isinstance(expr, cst.Name) and self.binding(expr) in self.def_vars)

  def visit_Arg(self, node: cst.Arg) -> None:
    if self._is_def_value(node.value) and id(node) not in self._group_args:
      self.escaping[id(node.value)] = node.value

  def visit_Return(self, node: cst.Return) -> None:
    if node.value is not None and self._is_def_value(node.value):
      self.escaping[id(node.value)] = node.value
    if node.value is not None and self._function_stack and (
        self._produces_optimizer(node.value)
        or (isinstance(node.value, cst.Name) and self.binding(node.value) in self.opt_vars)):
      self.opt_factories.add(self._function_stack[-1])
      if len(self._function_stack) == 1 and not self._class_depth:
        self.module_factories.add(self._function_stack[0])
    elif (node.value is not None and self._function_stack
          and isinstance(node.value, (cst.Tuple, cst.List, cst.Dict))
          and any(self._produces_optimizer(v)
                  or (isinstance(v, cst.Name) and self.binding(v) in self.opt_vars)
                  for v in _container_values(node.value))):
      self.bundle_factories.add(self._function_stack[-1])  # `return optimizer, lr`

  def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
    self._function_stack.pop()

  def leave_Module(self, node: cst.Module) -> None:
    self.rebound.update(self._rebinds & self.opt_vars)
    self._split_def_rebinds()
    changed = True
    while changed:  # `self.o = jax_utils.replicate(self.o)` wherever it stands in the file
      changed = False
      for chain, inner in self._chain_copies:
        if inner in self.attr_chains and chain not in self.attr_chains:
          self.attr_chains.add(chain)
          changed = True
    self.attr_other.update(chain for chain, inner in self._chain_copies
                           if inner not in self.attr_chains)
    if self.uses_legacy or self.flow_vars:
      self._follow_parameters()
    self.steps = self._step_params()

  # -- parameters that receive optimizers ---------------------------------
  def _follow_parameters(self) -> None:
    """Parameters proven to hold optimizers join ``opt_vars``.

    A parameter is proven when its function (not a method) is only ever called
    in this file, directly or through ``jax.jit``/``jax.pmap`` bound to a name,
    and every call passes it a proven optimizer (``evaluate(optimizer, batch)``
    after ``optimizer = Adam(...).create(p)``). A function used any other way
    (passed as a value, called with ``*args``) proves nothing. Repeated until
    nothing changes, so a helper called by a proven function is followed too.
    """
    sites = {}
    for fn in self.functions:
      calls = self._call_sites(fn.name)
      if calls:
        sites[id(fn)] = (fn, calls)
    changed = True
    while changed:
      changed = False
      for fn, calls in sites.values():
        for param in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
          b = self.binding(param.name)
          if b is None or b in self.rebound or b in self.flow_vars:
            continue
          args = [self._argument(fn, param, call) for call in calls]
          sources = {self.name_factory(a) for a in args}
          if len(sources) == 1 and (factory := sources.pop()) is not None and factory.converted:
            self.flow_vars[b] = factory  # `step(opt, g)` with `opt = create_optimizer(p)`
            changed = True
          elif b in self.opt_vars:
            continue
          elif self.uses_legacy and all(a is not None and self._holds_optimizer(a) for a in args):
            self.opt_vars.add(b)
            changed = True
    changed = True
    while changed:  # parameters every call passes an optimizer made in this file (or a factory's)
      changed = False
      for fn, calls in sites.values():
        for param in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
          b = self.binding(param.name)
          if b is None or b in self.made_here_params:
            continue
          args = [self._argument(fn, param, call) for call in calls]
          if all(a is not None and (self._made_here(a) or self.name_factory(a) is not None)
                 for a in args):
            self.made_here_params.add(b)
            changed = True

  def _made_here(self, expr) -> bool:
    """``expr`` is an optimizer this file creates: a name assigned one (not a parameter,
    unless :attr:`made_here_params` has it), a create, or a step / replicate of one."""
    if isinstance(expr, cst.Name):
      b = self.binding(expr)
      return (b in self.opt_vars and b not in self.rebound and b not in self.flow_vars
              and (b not in self.params or b in self.made_here_params))
    if not isinstance(expr, cst.Call) or not self._produces_optimizer(expr) or \
        self.factory_of_call(expr) is not None:
      return False
    func = expr.func
    if self.qnames(func) & REPLICATE_FNS:
      return bool(expr.args) and self._made_here(expr.args[0].value)
    if isinstance(func, cst.Attribute) and func.attr.value in (
        'apply_gradient', 'replicate', 'unreplicate', 'replace'):
      return self._made_here(func.value)
    return True

  def _call_sites(self, name: cst.Name) -> Optional[list[cst.Call]]:
    """Every call of the function ``name`` defines, or None when it is used otherwise."""
    scope = self.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) != 1:
      return None  # redefined or rebound: cannot tell which one a call reaches
    calls = []
    for access in assignments[0].references:
      call = self._calls_by_func.get(id(access.node))
      if call is not None:
        calls.append(call)
        continue
      alias = self._wrapper_alias(access.node)
      if alias is None:
        return None
      more = self._call_sites(alias)
      if more is None:
        return None
      calls.extend(more)
    return calls

  def _wrapper_alias(self, node) -> Optional[cst.Name]:
    """``p_step`` in ``p_step = jax.pmap(step, ...)`` when ``node`` is that ``step``."""
    for (assign, call) in self._wrapped:
      if call.args and call.args[0].value is node and call.args[0].keyword is None:
        return assign.targets[0].target
    return None

  def _argument(self, fn: cst.FunctionDef, param: cst.Param, call: cst.Call):
    """The expression ``call`` passes to ``param`` (None: a default, or cannot tell)."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    index = next((i for i, p in enumerate(positional) if p is param), None)
    keyword = None if any(param is p for p in fn.params.posonly_params) else param.name.value
    return call_argument(call, index, keyword)

  def _step_params(self) -> dict[str, tuple[tuple[Optional[int], str], ...]]:
    """Module-level functions with parameters this file treats as optimizers (``def
    train_step(opt, batch)`` that calls ``opt.apply_gradient``): ``{function: ((position
    among the positional parameters or None, name), ...)}``, for :mod:`codemod.flow`."""
    names = [fn.name.value for fn in self.top_functions]
    out = {}
    for fn in self.top_functions:
      if names.count(fn.name.value) > 1:
        continue  # defined twice: which one a caller reaches cannot be told
      positional = [*fn.params.posonly_params, *fn.params.params]
      found = []
      for index, param in [*enumerate(positional), *((None, p) for p in fn.params.kwonly_params)]:
        b = self.binding(param.name)
        if b is not None and b not in self.rebound and (
            b in self.opt_vars or (b in self.flow_vars and self.flow_vars[b].converted)):
          found.append((index, param.name.value))
      if found:
        out[fn.name.value] = tuple(found)
    return out

  def _holds_optimizer(self, expr) -> bool:
    if isinstance(expr, cst.Name):
      b = self.binding(expr)
      return b in self.opt_vars and b not in self.rebound and b not in self.flow_vars
    return self._produces_optimizer(expr) and self.factory_of_call(expr) is None


class _Rewriter(_Base, cst.CSTTransformer):
  """Rewrite what is proven safe; flag the rest in place."""

  def __init__(self, context: CodemodContext, analysis: _Analyzer, options: Options):
    super().__init__()
    self.context = context
    self.a = self.an = analysis
    self.opts = options
    self.findings: list[Finding] = []
    self._pending: list[list[str]] = []
    overrides = [self._kwargs(c) for c in [*analysis.apply_calls, *analysis.optimize_calls]]
    self.inject_lr = any('learning_rate' in k for k in overrides)
    self.mixed_lr = self.inject_lr and not all('learning_rate' in k for k in overrides)
    # one def we cannot convert leaves every optimizer in the file legacy: then
    # usages are not rewritten either (half-migrated code would not run)
    self.blocked = False
    self.unproven = False
    self.bound_names: set[str] = set()
    self._legacy_attr_ids = {id(a) for a in analysis.legacy_attrs}
    self._bad_refs: dict[int, tuple[str, str]] = {}
    self._hp_values: dict[int, str] = {}
    self._bad_hp: dict[int, str] = {}
    self._state_of_step: set[int] = set()
    self._step_calls: dict = {}          # (visit_Module) calls of other modules' step functions
    self._step_calls_enabled = False
    self._wrapped_args: set[int] = set()  # `f` in `jax.jit(f)` / `jax.pmap(f, ...)`

  # -- what blocks the file ------------------------------------------------
  def visit_Module(self, node: cst.Module) -> None:
    a = self.a
    self._first_statement = node.body[0] if node.body else None
    self._header_comments = {ll.comment.value for ll in node.header if ll.comment}
    self._find_group_applies()
    for ref_id, sym in a.refs.items():
      problem = self._ref_problem(ref_id, sym)
      if problem:
        self._bad_refs[ref_id] = problem
    for attr_id, (recv, name, via_opt) in a.hp_reads.items():
      if via_opt and not self._is_optimizer(recv):
        continue
      if not via_opt and not (isinstance(recv, cst.Name) and self.binding(recv) in a.def_vars):
        continue
      value, problem = self._hp_value(recv, name, via_opt)
      if problem:
        self._bad_hp[attr_id] = problem
      else:
        self._hp_values[attr_id] = value
        if via_opt:
          self.a.handled.add(id(a.ref_nodes.get(attr_id, recv)))
    for attr_id in self._hp_values:
      recv, _, via_opt = a.hp_reads[attr_id]
    # `opt.optimizer_def` consumed by a hyper_params read: converted, or flagged with its own
    # message (a second, generic flag on `.optimizer_def` would say nothing more)
    self._hp_owner_ids = {id(self._hp_owner(i)) for i in [*self._hp_values, *self._bad_hp]}
    self.maybe_vars = self._derived_names()
    conflicts = sorted(self.bound_names & EMITTED_NAMES) if (a.uses_legacy or a.flow_used) else []
    self._module_flags = []  # written above the module's first statement (on_visit)
    if conflicts and (a.def_calls or a.create_calls or a.apply_calls):
      self._module_flags.append(
          ('OM100', f'{", ".join(f"`{n}`" for n in conflicts)} is bound to something else in '
                    'this file, and the rewrite would use that name for the module it imports: '
                    'rename it, then rerun (this file keeps its legacy optimizer code)'))
    self._step_calls = self._find_step_calls()
    self._step_calls_enabled = self.a.flow is not None and bool(self.a.flow.steps)
    self._wrapped_args = {id(c.args[0].value) for c in self.a._calls_by_func.values()
                          if self._step_calls_enabled and c.args
                          and self.qnames(c.func) & CALL_WRAPPERS}
    self.blocked = bool(
        self.opts.keep_legacy or conflicts or a.star_imports
        or any(not step.converted and self._own_optimizer(arg)
               for uses in self._step_calls.values() for step, _, arg in uses)
        or self.mixed_lr or self._bad_refs or self._bad_hp
        or any(self._def_problem(c) for c in a.def_calls)
        or any(self._create_problem(c) for c in a.create_calls)
        or any(self._apply_problem(c) for c in a.apply_calls if self._is_optimizer(c.func.value))
        or any(self._flow_lr_problem(c) for c in a.optimize_calls
               if self._is_optimizer(c.func.value))
        or any(self._method_problem(c) for c in a.method_calls.values())
        or self._legacy_only_uses() or self._def_only_uses() or a.module_refs
        or a.dynamic_imports or a.mixed_defs
        or (self.inject_lr and any(self._user_def_create(c) for c in a.create_calls))
        or bool(a.escaping))
    # a file that never references flax.optim: nothing proves `.apply_gradient` is ours, unless
    # a name holds what another module's converted factory returned (codemod.flow)
    self.unproven = not a.uses_legacy and not any(f.converted for f in a.flow_used.values())

  def _derived_names(self) -> set:
    """Bindings of names assigned a value computed from an optimizer that nothing proves
    to be one (``new, m = step(opt, g)``, ``o = jitted(opt, g)``, ``o = fori_loop(..., opt)``):
    their ``.target`` / ``.state.step`` is flagged, not converted and not left silent."""
    if not (self.a.uses_legacy or self.a.flow_used):
      return set()
    found: set = set()
    # (also from an attribute that may hold one: `x = make_trainer(p).optimizer`, and from a
    # function of this file that returns one in a tuple, list or dict: `o, lr = make(p)`)
    maybe = lambda e: self._is_optimizer(e) or self._mixed_chain(e) or (
        isinstance(e, cst.Call) and isinstance(e.func, cst.Name)
        and e.func.value in self.a.bundle_factories) or (
        (f := self.factory_of_call(e, bundle=True)) is not None and f.converted)
    from_optimizer = [(targets, value, self._mentions(value, maybe))
                      for targets, value in self.a.assignments]
    in_found = lambda e: isinstance(e, cst.Name) and self.binding(e) in found
    changed = True
    while changed:  # `opts = [...create(p)...]; first, second = opts`: derived from derived
      changed = False
      for targets, value, direct in from_optimizer:
        if not (direct or self._mentions(value, in_found)):
          continue
        for name in _target_names(targets):
          b = self.binding(name)
          if b is not None and b not in found and not self._is_optimizer(name):
            found.add(b)
            changed = True
    return found

  def _user_def_create(self, call) -> bool:
    recv = call.func.value
    return self.is_user_def(recv) or (isinstance(recv, cst.Name) and
                                      self.is_user_def(self.a.def_vars.get(self.binding(recv))))

  def _hp_owner(self, attr_id):
    """The ``.optimizer_def.hyper_params`` chain's ``optimizer_def`` attribute node."""
    for attr in self.a.legacy_attrs:
      if attr.attr.value == 'optimizer_def':
        recv = self.a.hp_reads[attr_id][0]
        if attr.value is recv:
          return attr
    return None

  def _ref_problem(self, ref_id, sym) -> Optional[tuple[str, str]]:
    a = self.a
    if sym in ('DynamicScale', 'dynamic_scale'):
      return None
    if ref_id in a.in_subclass:
      import optim_compat
      if sym in optim_compat.LOADED_NAMES or hasattr(optim_compat, sym):  # without loading jax
        return None
    elif ref_id in a.in_annotation:
      if sym in ANNOTATIONS:
        return None
    elif ref_id in a.call_funcs and (sym in DEF_NAMES or sym == TRAVERSAL):
      return None
    rule = 'OM103' if sym == 'OptimizerState' else 'OM100'
    return rule, (f'flax.optim.{sym} has no automatic conversion here; see optim_compat for a '
                  'drop-in (this file keeps its legacy optimizer code)')

  def _legacy_only_uses(self) -> list[cst.Attribute]:
    return [a for a in self.a.legacy_attrs
            if id(a) not in self.a.handled and id(a) not in self._hp_owner_ids
            and self._is_optimizer(a.value)]

  def _def_only_uses(self) -> list[cst.Attribute]:
    if getattr(self, '_def_only_cache', None) is not None:
      return self._def_only_cache
    self._def_only_cache = [a for a in self.a.def_attrs
            if id(a) not in self.a.hp_reads and self.binding(a.value) in self.a.def_vars
            and not self._is_hp_chain_part(a)]
    return self._def_only_cache

  def _is_hp_chain_part(self, attr) -> bool:
    return any(r[0] is attr.value and attr.attr.value == 'hyper_params'
               for i, r in self.a.hp_reads.items() if i in self._hp_values or i in self._bad_hp)

  def _find_group_applies(self) -> None:
    """Per-group learning rates (``hyper_params=[...]`` of a MultiOptimizer) that convert.

    Converted: every element is ``opt.optimizer_def.hyper_params[i].replace(learning_rate=x)``
    with ``i`` its position and ``opt`` the receiver (a name), one per group of the file's
    single MultiOptimizer, whose groups are all defs of the migration table. Each group's
    transformation is then built with ``inject_hyperparams`` and its learning rate set in
    ``opt_state.inner_states[label]`` (legacy semantics: the override holds for that call;
    the file converts only when every apply call overrides, see ``mixed_lr``).
    """
    a = self.a
    self._group_applies: dict[int, tuple] = {}  # id(call) -> (lr expressions, labels)
    multis = [c for c in a.def_calls if self.legacy_def(c) == MULTI]
    calls = [c for c in a.apply_calls if 'hyper_params' in self._kwargs(c)]
    if len(multis) != 1 or self._multi_problem(multis[0]) is not None:
      return
    multi = multis[0]
    subs = [arg.value.elements[1].value for arg in multi.args]
    subs = [self.a.def_vars.get(self.binding(x)) if isinstance(x, cst.Name) else x for x in subs]
    if not all(self.legacy_def(x) in spec_lib.SPECS for x in subs):
      return  # a user def (to_optax) has no injectable learning rate
    for call in calls:
      lrs = self._group_lrs(call)
      if lrs is None or len(lrs) != len(multi.args) or not self._is_optimizer(call.func.value):
        continue
      self._group_applies[id(call)] = (lrs, self._multi_labels(multi))
      for element in self._kwargs(call)['hyper_params'].value.elements:
        a.handled.add(id(element.value.func.value.value.value))  # `opt.optimizer_def`
    self.inject_lr = self.inject_lr or bool(self._group_applies)
    with_lr = [('learning_rate' in self._kwargs(c)) or id(c) in self._group_applies
               for c in [*a.apply_calls, *a.optimize_calls]]
    self.mixed_lr = any(with_lr) and not all(with_lr)

  def _group_lrs(self, call: cst.Call) -> Optional[list]:
    """The learning-rate expressions of ``opt.apply_gradient(g, hyper_params=[...])`` when
    each element only replaces its own group's learning rate, else None."""
    kwargs = self._kwargs(call)
    positional = [x for x in call.args if x.keyword is None]
    recv = call.func.value
    if set(kwargs) != {'hyper_params'} or len(positional) != 1 or any(x.star for x in call.args) \
        or not isinstance(recv, cst.Name) or not isinstance(kwargs['hyper_params'].value, cst.List):
      return None
    lrs = []
    for i, element in enumerate(kwargs['hyper_params'].value.elements):
      value = element.value
      if not isinstance(element, cst.Element) or not m.matches(value, m.Call(
          func=m.Attribute(value=m.Subscript(value=m.Attribute(
              value=m.Attribute(value=m.Name(recv.value), attr=m.Name('optimizer_def')),
              attr=m.Name('hyper_params'))), attr=m.Name('replace')),
          args=[m.Arg(keyword=m.Name('learning_rate'), star='')])):
        return None
      index = value.func.value.slice
      if len(index) != 1 or not m.matches(index[0].slice, m.Index(value=m.Integer())) \
          or int(index[0].slice.value.value, 0) != i:
        return None
      lrs.append(value.args[0].value)
    return lrs

  def _multi_labels(self, call: cst.Call) -> list[str]:
    """The multi_transform label of each group: the traversal's name, else ``group_<i>``."""
    labels = []
    for i, arg in enumerate(call.args):
      traversal = arg.value.elements[0].value
      labels.append(traversal.value if isinstance(traversal, cst.Name) else f'group_{i}')
    return [f'group_{i}' if labels.count(label) > 1 or label == FROZEN else label
            for i, label in enumerate(labels)]

  # -- cross-module flows (codemod.flow) ----------------------------------
  def factory_of(self, expr):
    """The other module's factory whose optimizer ``expr`` holds, converted or not."""
    if isinstance(expr, cst.Name):
      return self.name_factory(expr)
    if (chain := attr_chain(expr)) is not None:
      return self.a.attr_flow.get(chain)
    if isinstance(expr, cst.Call):
      found = self.factory_of_call(expr)
      if found is None and m.matches(expr.func, m.Attribute(attr=m.Name('apply_gradient'))):
        return self.factory_of(expr.func.value)
      return found
    return None

  def _unconverted(self, expr):
    found = self.factory_of(expr)
    return found if found is not None and not found.converted else None

  def _flow_lr_problem(self, call: cst.Call) -> Optional[str]:
    """An apply-time learning rate the creating module's conversion cannot honour."""
    factory = self.factory_of(call.func.value)
    if factory is None or not factory.converted:
      return None
    given = 'learning_rate' in self._kwargs(call)
    if factory.inject_lr is None and given:  # without one: the tx's own rate, either way
      return (f'the optimizer is created by {factory.where}, which returns a TrainState whose tx '
              'is built elsewhere: whether its learning rate is injected cannot be told, so this '
              'call is not converted; convert it by hand')
    if given and not factory.inject_lr:
      return (f'learning_rate at apply time, but the optimizer is created by {factory.where}, '
              'whose conversion does not inject the learning rate (that file passes none at '
              'apply time): build its transformation with optax.inject_hyperparams there, or '
              'convert this call by hand')
    if not given and factory.inject_lr:
      return (f'no learning_rate here, but the optimizer is created by {factory.where}, whose '
              'conversion injects it (an injected rate persists in opt_state, legacy used the '
              "def's value for calls without one): pass learning_rate here too, or convert by hand")
    return None

  def _find_step_calls(self) -> list:
    """Calls of another module's step function (:class:`codemod.flow.Step`) with the
    arguments given to its optimizer parameters: ``[(call, step, parameter, argument)]``.
    Direct (``train_step(opt, b)``, ``steps.train_step(...)``) or through ``jax.jit`` /
    ``jax.pmap`` (``p_step = jax.pmap(train_step)``, ``jax.jit(train_step)(opt, b)``).
    Keyed by ``id(call)``."""
    if self.a.flow is None or not self.a.flow.steps:
      return {}
    aliases = {}
    for assign, wrap in self.a._wrapped:
      if (step := self._step_named(wrap.args[0].value)) is not None and \
          (b := self.binding(assign.targets[0].target)) is not None:
        aliases[b] = step
    found = {}
    for call in self.a._calls_by_func.values():
      func = call.func
      if isinstance(func, cst.Call) and func.args and self.qnames(func.func) & CALL_WRAPPERS:
        step = self._step_named(func.args[0].value)
      elif isinstance(func, cst.Name) and self.binding(func) in aliases:
        step = aliases[self.binding(func)]
      else:
        step = self._step_named(func)
      if step is None:
        continue
      for position, name in step.params:
        if (arg := call_argument(call, position, name)) is not None:
          found.setdefault(id(call), []).append((step, name, arg))
    return found

  def _step_named(self, expr):
    for q in sorted(self.qnames(expr)):
      if (found := self.a.flow.resolve_step(q)) is not None:
        return found
    return None

  def _own_optimizer(self, expr) -> bool:
    """``expr`` is one of this file's legacy optimizers (a TrainState only if the file converts)."""
    return self.a.uses_legacy and self._is_optimizer(expr) and self.factory_of(expr) is None

  def _step_problems(self, call: cst.Call) -> list[str]:
    """Why a call of another module's step function fails after this run, per argument:
    the step keeps its legacy code and gets a TrainState, or it is converted and gets a
    flax.optim Optimizer (this file, or the factory that made it, keeps its legacy code)."""
    problems = []
    for step, name, arg in self._step_calls.get(id(call), ()):
      code, factory = self._code(arg), self.factory_of(arg)
      if not step.converted and self._own_optimizer(arg):
        problems.append(f'`{code}` is passed to {step.where}, which keeps its legacy optimizer '
                        f'code ({step.why}): migrated here, it would get a TrainState: migrate it '
                        f'there first {KEEPS_LEGACY}')
      elif not step.converted and factory is not None and factory.converted:
        problems.append(f'`{code}` holds what {factory.where} returns, now a TrainState, and is '
                        f'passed to {step.where}, which keeps its legacy optimizer code '
                        f'({step.why}): migrate it there first, or convert this call by hand')
      elif step.converted and self.blocked and self._own_optimizer(arg):
        problems.append(f'{step.where} now takes a TrainState as `{name}` (this run converts '
                        f'it), but `{code}` stays a flax.optim Optimizer here: fix the other '
                        f'TODOs of this file and rerun, or convert this call by hand {KEEPS_LEGACY}')
      elif step.converted and factory is not None and not factory.converted:
        problems.append(f'`{code}` is created by {factory.where}, which keeps its legacy optimizer '
                        f'code ({factory.why}), and is passed to {step.where}, which this run '
                        f'converts to take a TrainState as `{name}`: migrate {factory.where} too, '
                        'or convert this call by hand')
    return problems

  def _unproven_message(self, recv, what='`.apply_gradient`') -> str:
    """The flag on a legacy-looking use nothing proves to be an optimizer."""
    code = self._code(recv)
    factory = self._unconverted(recv)
    if factory is not None:
      return (f'`{code}` is created by {factory.where}, which keeps its legacy optimizer code '
              f'({factory.why}): migrate it there first {KEEPS_LEGACY}')
    if self.a.flow_used:
      where = ', '.join(f.where for f in self.a.flow_used.values())
      return (f'nothing proves `{code}` holds a flax.optim Optimizer (function parameters, '
              'attributes and values from unknown modules are not followed); if it is the one '
              f'created by {where}, that now returns a TrainState: convert {what} here by hand '
              f'{KEEPS_LEGACY}')
    return ('this file never imports flax.optim: if this is a flax.optim Optimizer, migrate it '
            'where it is created')

  def _flow_failure(self, attr: cst.Attribute) -> Optional[str]:
    """In a file that keeps its legacy code: a legacy use (``.target``, ``.state``,
    ``.apply_gradient``, ...) on a value that holds, or may hold, what another module's
    converted factory now returns (a ``TrainState``, on which the use fails at run time)."""
    converted = [f for f in self.a.flow_used.values() if f.converted]
    if not converted:
      return None
    recv = attr.value
    if (attr.attr.value == 'apply_gradient' and id(attr) in self.a.call_funcs
        and not self.a.defines_apply_gradient and not self._is_optimizer(recv)
        and (not self.a.uses_legacy or self._unconverted(recv) is not None)):
      return None  # leave_Call's "nothing proves" flag names the factory already
    if any(c.func is attr and self._flow_lr_problem(c) is not None
           for c in [*self.a.apply_calls, *self.a.optimize_calls]):
      return None  # flagged OM102, naming the factory
    factory = self.factory_of(recv)
    if factory is not None:
      if not factory.converted:
        return None
      lead = f'`{self._code(recv)}` holds what {factory.where} returns'
    elif self._maybe_optimizer(recv) or (not self.a.uses_legacy and self._holds_local(recv)):
      lead = (f'`{self._code(recv)}` may hold what '
              f'{", ".join(sorted(f.where for f in converted))} returns')
    else:
      return None
    return (f'{lead}, now a TrainState, on which the flax.optim Optimizer uses here fail: '
            'convert them by hand (`.target` is `.params`, `.state.step` is `.step`, '
            '`.apply_gradient(g)` is `.apply_gradients(grads=g)`) ' + KEEPS_LEGACY)

  def _field_replace(self, attr: cst.Attribute) -> bool:
    """``x.replace(target=...)`` (or ``state=`` / ``optimizer_def=``): a legacy Optimizer's
    fields, which a TrainState's ``replace`` rejects."""
    call = self.a._calls_by_func.get(id(attr))
    return attr.attr.value == 'replace' and call is not None and any(
        a.keyword is not None and a.keyword.value in OPTIMIZER_FIELDS for a in call.args)

  def _holds_local(self, expr) -> bool:
    """In a file without flax.optim: a name or attribute chain the file treats as an
    optimizer (assigned an ``apply_gradient`` result, or ``.apply_gradient``'ed here)."""
    if isinstance(expr, cst.Name):
      b = self.binding(expr)
      return b in self.a.opt_vars or b in self.a.rebound
    chain = attr_chain(expr)
    return chain is not None and chain in self.a.attr_chains

  def _reflection_problem(self, call: cst.Call) -> Optional[str]:
    """``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` / ``dataclasses.replace`` naming a
    legacy Optimizer field on a converted optimizer: no rule rewrites them, and on a
    ``TrainState`` ``hasattr(x, 'target')`` is silently False."""
    fn = self.qnames(call.func) & REFLECTION_FNS
    if not fn or not call.args or call.args[0].keyword is not None:
      return None
    recv = call.args[0].value
    if not (self._is_optimizer(recv) or self._maybe_optimizer(recv)):
      return None
    code = self._code(call)
    if fn == {'flax.serialization.to_state_dict'}:
      return (f'`{code}`: a TrainState\'s state dict has the keys `step`, `params`, `opt_state` '
              '(a flax.optim Optimizer\'s: `target`, `state` with `step` and `param_states`): '
              'code that reads it by key, and checkpoints written from it, change layout '
              '(old checkpoints: optim-migrate convert-checkpoint or restore_legacy)')
    if fn == {'dataclasses.replace'}:
      fields = sorted(a.keyword.value for a in call.args[1:]
                      if a.keyword is not None and a.keyword.value in OPTIMIZER_FIELDS)
      if not fields:
        return None
      return (f'`{code}`: a TrainState has no field {", ".join(f"`{f}`" for f in fields)} '
              '(`target` is `params`, `state.step` is `step`, the optimizer state is '
              '`opt_state`): convert it by hand')
    if len(call.args) < 2:
      return None
    attr = call.args[1].value
    if isinstance(attr, cst.SimpleString):
      if attr.evaluated_value not in FLOW_FAILING_ATTRS:
        return None
      what = f"no attribute '{attr.evaluated_value}'"
    else:
      what = 'other attributes than a flax.optim Optimizer (the name is computed here)'
    effect = 'this is silently False' if fn == {'builtins.hasattr'} else 'this fails'
    return (f'`{code}`: a TrainState has {what}, so {effect} (`target` is `params`, '
            '`state.step` is `step`): convert it by hand')

  def _created_by(self) -> str:
    converted = [f.where for f in self.a.flow_used.values() if f.converted]
    return f' (created by {", ".join(converted)}, this file uses it)' if converted else ''

  def _apply_problem(self, call: cst.Call) -> Optional[str]:
    if id(call) in self._group_applies:
      return None
    if (problem := self._flow_lr_problem(call)) is not None:
      return problem
    kwargs = self._kwargs(call)
    recv = call.func.value
    if ('learning_rate' in kwargs and not self.a.def_calls and isinstance(recv, cst.Name)
        and (b := self.binding(recv)) in self.a.params and b not in self.a.made_here_params
        and b not in self.a.flow_vars):
      # (a file that builds defs injects their learning rate when it passes one at apply time)
      return (f'learning_rate at apply time on `{recv.value}`, a parameter, and this file '
              'creates no optimizer: where it is created, its transformation must inject the '
              'learning rate (optax.inject_hyperparams) for this call to set it, which cannot be '
              'told here: convert by hand')
    other = sorted(set(kwargs) - {'learning_rate', 'grads'})
    if _apply_grads(call) is None or other or any(a.star for a in call.args):
      if 'hyper_params' in other and not any(self.legacy_def(c) == MULTI
                                             for c in self.a.def_calls):
        return ('apply_gradient(hyper_params=...) overrides the def\'s hyper-parameters for '
                'this call, and an Optax transformation takes no hyper-parameters when it is '
                'applied: migrate it by hand: wrap the transformation in '
                'optax.inject_hyperparams and set the values in opt_state.hyperparams')
      if 'hyper_params' in other:
        return ('apply_gradient(hyper_params=[...]): per-group learning rates convert only as '
                '`[opt.optimizer_def.hyper_params[i].replace(learning_rate=x), ...]`, one per '
                "group in order, for the file's single MultiOptimizer of table defs, on every "
                'apply call; otherwise inject them by hand with optax.inject_hyperparams, per '
                'group at opt_state.inner_states[label].inner_state.hyperparams')
      if any(a.star for a in call.args):
        return ('apply_gradient with *args / **kwargs: which overrides it passes cannot be '
                'told; convert it by hand (learning_rate: optax.inject_hyperparams)')
      if other:
        return (f'apply_gradient overrides {other} have no Optax equivalent here; inject them '
                'with optax.inject_hyperparams')
      given = sum(a.keyword is None or a.keyword.value == 'grads' for a in call.args)
      return (f'apply_gradient with {given} gradient arguments (a flax.optim Optimizer takes '
              'the gradients only, positional or grads=): convert it by hand')
    return None

  def _method_problem(self, call: cst.Call) -> Optional[tuple[str, str]]:
    if not self._is_optimizer(call.func.value):
      return None
    method = call.func.attr.value
    if method == 'replicate':
      if not self.opts.fixable('OM009'):
        return 'OM009', ('`.replicate()` -> flax.jax_utils.replicate(...) is an unsafe fix (legacy '
                         'also pmean-ed the gradients in apply_gradient): rerun with --unsafe-fixes, '
                         'or convert by hand (this file keeps its legacy optimizer code)')
      if any(a.keyword is None or a.keyword.value not in ('devices', 'axis_name') for a in call.args):
        return 'OM100', '`.replicate(...)` with these arguments is not converted'
    elif call.args or not self.opts.fixable('OM010'):
      return 'OM010', '`.unreplicate()` is not converted here'
    return None

  def _hp_value(self, recv, name, via_opt) -> tuple[Optional[str], Optional[str]]:
    """Source text of the def's ``name`` (a literal) or a problem message."""
    if name == 'replace':  # the hyper-parameters dataclass's replace, not a hyper-parameter
      return None, ('hyper_params.replace(...) is a dataclass replace of the def\'s '
                    'hyper-parameters (new values for apply_gradient(hyper_params=...)), and an '
                    'Optax transformation takes no hyper-parameters when it is applied: migrate '
                    'it by hand: wrap the transformation in optax.inject_hyperparams and set the '
                    f'new value in opt_state.hyperparams {KEEPS_LEGACY}')
    calls = [c for c in self.a.def_calls if self.legacy_def(c) in spec_lib.SPECS]
    if not via_opt:
      calls = [self.a.def_vars[self.binding(recv)]]
      if calls[0] is None:
        calls = []
    if len(calls) != 1 or self.legacy_def(calls[0]) not in spec_lib.SPECS:
      return None, ('hyper_params read: no single def in this file says which value it is '
                    '(this file keeps its legacy optimizer code)')
    spec = spec_lib.SPECS[self.legacy_def(calls[0])]
    try:
      args = self._def_args(calls[0], spec)
    except TypeError as e:
      return None, str(e)
    if name not in spec.hyper_param_names:
      return None, f'{spec.name} has no hyper-parameter {name!r}'
    src = args.get(name, repr(spec.defaults()[name]))
    if spec_lib.literal(src) is None and src != 'None':
      return None, (f'hyper_params.{name} is `{src}`, not a literal: read the value where the '
                    'def is built (this file keeps its legacy optimizer code)')
    return src, None

  def _create_problem(self, call: cst.Call) -> Optional[str]:
    kw = {a.keyword.value: a for a in call.args if a.keyword is not None}
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or set(kw) - {'target', 'focus'} or \
        len(positional) + len(kw) not in (1, 2) or len(positional) > 2:
      return 'create(...) with these arguments is not converted (this file keeps its legacy optimizer code)'
    focus = _create_focus(call)
    if focus is not None and not m.matches(focus, m.Name('None')) and not self.is_traversal(focus):
      return (f'create(..., focus={self._code(focus)}): not a ModelParamTraversal built in this '
              'file (it may be None, which legacy read as "all params"), so its labels cannot '
              'be derived: convert by hand (this file keeps its legacy optimizer code)')
    return None

  # -- helpers -------------------------------------------------------------
  @staticmethod
  def _kwargs(call: cst.Call) -> dict:
    return {a.keyword.value: a for a in call.args if a.keyword is not None}

  def _pos(self, node):
    pos = self.get_metadata(PositionProvider, node, None)
    return (pos.start.line, pos.start.column + 1) if pos else (0, 0)

  def fixed(self, node, rule, message):
    # recorded even when the rule is not selected: the engine then keeps the file as it was
    self.findings.append(Finding(*self._pos(node), rule, message, True))

  def flag(self, node, rule, message):
    if not self.opts.enabled(rule):
      return
    message = one_line(message)
    text = f'{TODO_PREFIX}{rule}: {message}'
    if self._pending and text in self._pending[-1]:
      return  # once per statement
    self.findings.append(Finding(*self._pos(node), rule, message, False))
    self.note(rule, message)

  def note(self, rule, message):
    """An inline TODO on the current statement (no report entry)."""
    if self._pending:
      message = one_line(message)
      text = f'{TODO_PREFIX}{rule}: {message}'
      if text not in self._pending[-1]:
        self._pending[-1].append(text)

  def _is_optimizer(self, expr) -> bool:
    if isinstance(expr, cst.Name):
      b = self.binding(expr)
      if b in self.a.rebound:
        return False
      if b in self.a.flow_vars:  # another module's optimizer: converted there or not at all
        return self.a.flow_vars[b].converted
      # in a file without flax.optim only the flow proves anything
      return b in self.a.opt_vars and self.a.uses_legacy
    if self._annotated_field(expr):
      return True
    if (chain := attr_chain(expr)) is not None:  # `self.optimizer`: apply_gradient'ed here
      return (chain in self.a.attr_chains and chain not in self.a.attr_other
              and (self.a.uses_legacy or chain in self.a.attr_flow))
    if isinstance(expr, cst.Call) and (factory := self.factory_of_call(expr)) is not None:
      return factory.converted
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
        and expr.func.value in self.a.opt_factories and self.a.uses_legacy):
      return True  # `make(p).target`: a function of this file returning its optimizer
    if isinstance(expr, cst.Call) and self.qnames(expr.func) & REPLICATE_FNS and expr.args:
      return self._is_optimizer(expr.args[0].value)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
      recv, method = expr.func.value, expr.func.attr.value
      if method == 'create':  # `Def(...).create(p).target`
        return self.is_def(recv, self.a.def_vars)
      if method == 'apply_gradient':  # `opt.apply_gradient(g).target`
        return self.a.uses_legacy or self._is_optimizer(recv)
      if method in ('replicate', 'unreplicate'):
        return self._is_optimizer(recv)
    return False

  def _maybe_optimizer(self, value) -> bool:
    """A value of unknown origin in a legacy (or flow-using) file that may hold an optimizer:
    a parameter, loop variable or rebound name that held one, a container item, or an
    attribute chain :meth:`_mixed_chain` names (its ``.target`` is flagged, not converted)."""
    if not (self.a.uses_legacy or self.a.flow_used):
      return False
    if isinstance(value, cst.Subscript) or self._mixed_chain(value):
      return True
    return isinstance(value, cst.Name) and (
        self.binding(value) in (self.a.params | self.a.loop_vars | self.maybe_vars)
        or self.binding(value) in (self.a.rebound & self.a.opt_vars))

  def _annotated_field(self, expr) -> bool:
    """``x.optimizer`` where this file's class declares ``optimizer: optim.Optimizer``
    (and no chain ending in that attribute is assigned anything but an optimizer)."""
    if not (isinstance(expr, cst.Attribute) and expr.attr.value in self.a.annotated_fields
            and self.a.uses_legacy):
      return False
    return not any(c.rsplit('.', 1)[-1] == expr.attr.value for c in self.a.attr_other)

  def _mixed_chain(self, expr) -> bool:
    """Maybe an optimizer (flagged, not converted): ``self.optimizer`` that gets
    ``.apply_gradient`` here but is also assigned something else, or another chain
    ending in the same attribute (``trainer.optimizer`` beside ``self.optimizer``, also
    on a call's result: ``make_trainer(p).optimizer``)."""
    if self._annotated_field(expr):
      return False
    chain = attr_chain(expr)
    if chain is None:
      # `T(p).optimizer`, `make_trainer(p).optimizer`, `trainers[0].optimizer`: an attribute
      # of a call's result or of a container item, named like a chain that holds optimizers
      # (what the call returns is not followed)
      return isinstance(expr, cst.Attribute) and expr.attr.value in {
          c.rsplit('.', 1)[1] for c in self.a.attr_chains}
    if chain in self.a.attr_chains:
      return chain in self.a.attr_other
    return chain.rsplit('.', 1)[1] in {c.rsplit('.', 1)[1] for c in self.a.attr_chains}

  def _mentions_optimizer(self, expr) -> bool:
    return self._mentions(expr, self._is_optimizer)

  def _mentions(self, expr, test) -> bool:
    """``test`` holds for ``expr`` or an expression inside it (arguments and elements too)."""
    if test(expr):
      return True
    return any(self._mentions(c, test) for c in expr.children
               if isinstance(c, (cst.BaseExpression, cst.Element, cst.Arg, cst.DictElement)))

  def _code(self, node) -> str:
    return cst.Module(body=[]).code_for_node(node)

  def _add_import(self, module, obj=None, asname=None):
    AddImportsVisitor.add_needed_import(self.context, module, obj, asname)

  # -- statements: carry TODO comments ------------------------------------
  def on_visit(self, node) -> bool:
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      self._pending.append([])
      if node is self._first_statement:
        for rule, message in self._module_flags:
          self.flag(node, rule, message)
    if any(node is ref for ref in self.a.module_refs):
      self.flag(node, 'OM100', f'`{self._code(node)}`, the flax.optim module itself, is used as a '
                               'value (an alias, a None check, an argument): the codemod cannot '
                               'follow it, and Flax >= 0.6 has no flax.optim; convert its uses '
                               'by hand (this file keeps its legacy optimizer code)')
    if id(node) in self.a.dynamic_imports:
      self.flag(node, 'OM100', f'`{self._code(node)}` reaches flax.optim by name at run time, and '
                               'Flax >= 0.6 has no flax.optim (here: '
                               f'{self.a.dynamic_imports[id(node)]}); the codemod cannot follow '
                               'the module it gets: use `optim_compat` (the shim, same names) in '
                               'its place, or migrate its uses to Optax by hand ' + KEEPS_LEGACY)
    if id(node) in self.a.mixed_defs:
      name = self.a.mixed_defs[id(node)]
      self.flag(node, 'OM100', f'`{name}` holds this flax.optim def and later an optimizer '
                               f'(`{name} = {name}.create(...)`), and the codemod cannot tell '
                               'which of the two each use reads (a use before the def or in a '
                               'closure, or the two assignments not one after the other in one '
                               'block): give the def its own '
                               f'name (`{name}_def = ...`), then rerun ' + KEEPS_LEGACY)
    if id(node) in self.a.escaping:
      self.flag(node, 'OM100', f'`{self._code(node)}` is an optimizer def handed to other code '
                               '(returned, passed as an argument or kept as a class attribute): as '
                               'an Optax transformation '
                               'it has no .create(); convert it where it is used (this file keeps '
                               'its legacy optimizer code)')
    return super().on_visit(node)

  def on_leave(self, original, updated):
    result = super().on_leave(original, updated)
    if isinstance(original, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
      todos = self._pending.pop()
      if isinstance(result, cst.CSTNode) and not (self.blocked or self.unproven):
        # this run converts the file: an earlier run's "keeps its legacy code" TODO is stale
        kept_lines = [ll for ll in result.leading_lines if not _stale_todo(ll)]
        if len(kept_lines) != len(result.leading_lines):
          result = result.with_changes(leading_lines=kept_lines)
      if isinstance(result, cst.CSTNode):
        existing = {ll.comment.value for ll in result.leading_lines if ll.comment}
        if original is self._first_statement:  # comments above it are the module's header
          existing |= self._header_comments
        new = [t for t in todos if t not in existing]
        if new:
          lines = [cst.EmptyLine(comment=cst.Comment(t)) for t in new]
          result = result.with_changes(leading_lines=[*result.leading_lines, *lines])
    return result

  # -- flags on references -------------------------------------------------
  def visit_Name(self, node: cst.Name) -> None:
    self._flag_reference(node)
    if self._step_calls_enabled and (problem := self._step_value_problem(node)):
      self.flag(node, 'OM100', problem)

  def visit_Attribute(self, node: cst.Attribute) -> None:
    self._flag_reference(node)
    if self._step_calls_enabled and (problem := self._step_value_problem(node)):
      self.flag(node, 'OM100', problem)
    if node.attr.value == 'step' and m.matches(node.value, m.Attribute(attr=m.Name('state'))):
      self._state_of_step.add(id(node.value))  # `.state.step` is flagged once, at `.step`

  def _step_value_problem(self, node) -> Optional[str]:
    """A step function of another module (:class:`codemod.flow.Step`) named here other than
    in a call or a ``jax.jit`` / ``jax.pmap`` of it (``functools.partial(train_step, ...)``,
    ``fn = steps.train_step``): its calls are not followed, so when it and this file's
    optimizers end up on different sides of the migration, nothing else would say so."""
    if not self._step_calls_enabled or id(node) in self.a.call_funcs or \
        id(node) in self._wrapped_args:
      return None
    step = self._step_named(node)
    if step is None:
      return None
    converts = not (self.blocked or self.unproven)
    code = self._code(node)
    legacy_factories = [f for f in self.a.flow_used.values() if not f.converted]
    if step.converted and legacy_factories:
      return (f'`{code}` ({step.where}) is used as a value here, so its calls are not followed: '
              f'this run converts it to take a TrainState as '
              f'{", ".join(f"`{n}`" for _, n in step.params)}, while '
              f'{", ".join(f.where for f in legacy_factories)} keeps its legacy optimizer code '
              f'({legacy_factories[0].why}): make sure no optimizer made there reaches it')
    if step.converted and self.blocked and self.a.uses_legacy:
      return (f'`{code}` ({step.where}) is used as a value here, so its calls are not followed: '
              f'this run converts it to take a TrainState as '
              f'{", ".join(f"`{n}`" for _, n in step.params)}, while this file keeps its legacy '
              'optimizer code: make sure no flax.optim Optimizer of this file reaches it '
              + KEEPS_LEGACY)
    if not step.converted and ((converts and self.a.uses_legacy)
                               or any(f.converted for f in self.a.flow_used.values())):
      return (f'`{code}` ({step.where}) keeps its legacy optimizer code ({step.why}) and is used '
              'as a value here, so its calls are not followed: an optimizer this file now makes '
              'a TrainState must not reach it: check, or migrate it there first')
    return None

  def _flag_reference(self, node) -> None:
    if id(node) in self._bad_refs:
      self.flag(node, *self._bad_refs[id(node)])
    elif id(node) in self.a.nn_refs and self.a.uses_legacy:
      self.flag(node, 'OM105', 'pre-Linen flax.nn model: migrate the model to Linen first '
                               '(the optimizer parts are converted)')
    elif id(node) in self._bad_hp:
      self.flag(node, 'OM100', self._bad_hp[id(node)])

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    if any(node is c for c in self.a.subclasses):
      self.flag(node, 'OM104', f'`{node.name.value}` subclasses a flax.optim class: it runs on '
                               f'the shim (optim_compat) and TrainState gets optim_compat.to_optax('
                               f'{node.name.value}(...)); port it to an optax.GradientTransformation '
                               'when convenient')

  def visit_Import(self, node) -> bool:
    self._unused_import(node)
    return False

  def visit_ImportFrom(self, node) -> bool:
    self._unused_import(node)
    return False

  def _unused_import(self, node) -> None:
    if any(node is i for i in self.a.star_imports):
      self.flag(node, 'OM100', '`from flax.optim import *`: the names it brings cannot be told '
                               'apart from others, so nothing here is converted; import them by '
                               f'name, then rerun {KEEPS_LEGACY}')
    if self.a.only_imports and any(node is i for i in self.a.legacy_imports):
      code = ' '.join(self._code(node).replace('(', ' ').replace(')', ' ').split())
      self.flag(node, 'OM100', f'flax.optim is imported here (`{code}`) but not used in this '
                               'module: drop it from the import; if other modules import it from '
                               'here (a re-export), migrate them first (flax >= 0.6 has no '
                               'flax.optim; `optim-migrate run` supplies the shim meanwhile)')

  def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom):
    """``DynamicScale`` / ``dynamic_scale`` from flax.optim -> flax.training (OM006)."""
    if original.module is None or isinstance(original.names, cst.ImportStar) \
        or not self.opts.fixable('OM006'):
      return updated
    module = self._code(original.module)
    if module not in (LEGACY, LEGACY + '.dynamic_scale'):
      return updated
    keep = []
    for alias in updated.names:
      name = alias.name.value if isinstance(alias.name, cst.Name) else None
      asname = alias.asname.name.value if alias.asname else None
      if name == 'DynamicScale':
        self._add_import('flax.training.dynamic_scale', 'DynamicScale', asname)
      elif name == 'dynamic_scale' and module == LEGACY:
        self._add_import('flax.training', 'dynamic_scale', asname)
      else:
        keep.append(alias)
        continue
      self.fixed(original, 'OM006', f'{module}.{name} -> flax.training.dynamic_scale')
    if len(keep) == len(updated.names):
      return updated
    if not keep:
      return cst.RemoveFromParent()
    keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(names=keep)

  # -- rewrites --------------------------------------------------------------
  def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    name = self.legacy_def(original)
    if name is not None:
      return self._rewrite_def(original, updated, name)
    if self._step_calls:
      for problem in self._step_problems(original):
        self.flag(original, 'OM100', problem)
    if not (self.blocked or self.unproven) and (problem := self._reflection_problem(original)):
      self.flag(original, 'OM100', problem)
      return updated
    func = updated.func
    if m.matches(func, m.Attribute(attr=m.Name('create'))):
      if self.is_def(original.func.value, self.a.def_vars):
        problem = self._create_problem(original)
        if problem:
          self.flag(original, 'OM100', problem)
        elif self.inject_lr and self._user_def_create(original):
          self.flag(original, 'OM102', 'learning_rate at apply time with a user OptimizerDef: '
                                       'optim_compat.to_optax has no injectable learning rate '
                                       '(this file keeps its legacy optimizer code)')
        elif not self.blocked:
          return self._rewrite_create(original, updated)
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient') | m.Name('optimize'))) \
        and self.mixed_lr and (original.func.attr.value == 'apply_gradient'
                               or any(original is c for c in self.a.optimize_calls)):
      what = ('apply_gradient' if original.func.attr.value == 'apply_gradient'
              else 'apply_gradient / optimize')
      self.flag(original, 'OM102', f'some {what} calls pass learning_rate and some do '
                                   'not; legacy overrides last one call, Optax state persists '
                                   '(this file keeps its legacy optimizer code)')
      return updated
    if (m.matches(func, m.Attribute(attr=m.Name('apply_gradient')))
        and not self.a.defines_apply_gradient and not self._is_optimizer(original.func.value)
        and (not self.a.uses_legacy or self._unconverted(original.func.value) is not None)):
      # not proven: a file without flax.optim, or another module's optimizer kept legacy there
      self.flag(original, 'OM100', self._unproven_message(original.func.value))
      return updated
    if self.unproven:
      return updated
    if (m.matches(func, m.Attribute(attr=m.Name('optimize')))
        and self._is_optimizer(original.func.value)
        and (problem := self._flow_lr_problem(original)) is not None):
      self.flag(original, 'OM102', problem + ' (this file keeps its legacy optimizer code)')
      return updated
    if id(original) in self.a.method_calls and self._is_optimizer(original.func.value):
      problem = self._method_problem(original)
      if problem:
        self.flag(original, *problem)
      elif not self.blocked:
        return self._rewrite_method(original, updated)
      return updated
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))) and \
        self._is_optimizer(original.func.value):
      problem = self._apply_problem(original)
      if problem:
        self.flag(original, 'OM102', problem + ' (this file keeps its legacy optimizer code)')
        return updated
    if self.blocked:
      return updated
    if any(original is c for c in self.a.restores):
      return self._rewrite_restore(original, updated)
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))) and \
        any(original is c for c in self.a.apply_calls):
      return self._rewrite_apply(original, updated)
    if m.matches(func, m.Attribute(attr=m.Name('replace'))) and self._is_optimizer(original.func.value):
      args = [a.with_changes(keyword=cst.Name('params'))
              if a.keyword is not None and a.keyword.value == 'target' else a
              for a in updated.args]
      if args != list(updated.args):
        self.fixed(original, 'OM003', 'replace(target=...) -> replace(params=...)')
        return updated.with_changes(args=args)
    elif (m.matches(func, m.Attribute(attr=m.Name('replace')))
          and any(a.keyword is not None and a.keyword.value in OPTIMIZER_FIELDS
                  for a in original.args)
          and self._maybe_optimizer(original.func.value)):
      self.flag(original, 'OM100', f'if `{self._code(original.func.value)}` is a flax.optim '
                                   'Optimizer, `.replace(target=...)` is `.replace(params=...)` '
                                   'on a TrainState (`state=` has no counterpart)'
                                   + self._created_by())
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
    if name == MULTI:
      return self._multi_problem(call)
    if name == WEIGHT_NORM:
      inner = call.args[0].value if call.args and call.args[0].keyword is None else None
      if inner is None or self.legacy_def(inner) not in spec_lib.SPECS or self.inject_lr:
        return 'OM101', ('WeightNorm is converted only around a def of the migration table and '
                         'without learning_rate at apply time; use optim_compat.WeightNorm '
                         'meanwhile (this file keeps its legacy optimizer code)')
      return self._def_problem(inner)
    spec = spec_lib.SPECS.get(name)
    try:
      args = self._def_args(call, spec)
    except TypeError as e:
      return 'OM100', f'{e} {KEEPS_LEGACY}'
    if 'learning_rate' not in args and not self.inject_lr:
      return 'OM100', (f'{name} has no learning rate and none is passed at apply time '
                       f'in this file; set learning_rate explicitly {KEEPS_LEGACY}')
    return None

  def _multi_problem(self, call):
    for i, arg in enumerate(call.args):
      group = arg.value
      if (arg.keyword is not None or arg.star or not isinstance(group, cst.Tuple)
          or len(group.elements) != 2
          or not all(isinstance(e, cst.Element) for e in group.elements)):
        return 'OM100', (f'MultiOptimizer argument {i} is not a literal (traversal, def) pair '
                         '(this file keeps its legacy optimizer code)')
      traversal, sub = (e.value for e in group.elements)
      if not self.is_traversal(traversal):
        return 'OM100', (f'MultiOptimizer group {i}: `{self._code(traversal)}` is not a '
                         'ModelParamTraversal built in this file (this file keeps its legacy '
                         'optimizer code)')
      sub_call = sub
      if isinstance(sub, cst.Name) and self.binding(sub) in self.a.def_vars:
        sub_call = self.a.def_vars[self.binding(sub)]
      if self.legacy_def(sub_call) not in spec_lib.SPECS and not self.is_user_def(sub_call):
        return 'OM101', (f'MultiOptimizer group {i}: only defs of the migration table are '
                         'converted (this file keeps its legacy optimizer code)')
    if not call.args:
      return 'OM100', 'MultiOptimizer() without groups'
    return None

  def _rewrite_def(self, original, updated, name):
    problem = self._def_problem(original)
    if problem:
      self.flag(original, *problem)
      return updated
    if self.blocked or id(original) in self.a.wn_inner:
      return updated
    if name == WEIGHT_NORM:
      return self._rewrite_weight_norm(original)
    self._add_import('optax')
    if name == MULTI:
      return self._rewrite_multi(original, updated)
    spec = spec_lib.SPECS[name]
    args = self._def_args(updated, spec)
    source = spec.emit(args, learning_rate_injected=self.inject_lr)
    stock = None
    if self.opts.prefer_stock_optax and 'optim_compat.' in source:
      stock = getattr(spec_lib, 'STOCK_ALTERNATIVES', {}).get(name)
    if stock is not None:
      source = stock.emit(spec, args, self.inject_lr)
      distance = f'stock Optax, preferred: measured {stock.measured}'
    else:
      distance = ('bitwise equal to legacy' if spec.stock_max_ulp == 0 else
                  f'measured <= {spec.stock_max_ulp} ulp from legacy') + f': {spec.differences}'
    if 'optim_compat.' in source:  # a faithful transformation (intrinsic difference)
      self._add_import('optim_compat')
    self.fixed(original, 'OM001', f'flax.optim.{name}(...) -> {source} ({distance})')
    return cst.parse_expression(source)

  def _rewrite_weight_norm(self, original):
    inner = original.args[0].value
    inner_name = self.legacy_def(inner)
    inner_src = self._code(inner.with_changes(func=cst.parse_expression(
        f'optim_compat.{inner_name}')))
    rest = ''.join(', ' + self._code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                   for a in original.args[1:])
    source = f'optim_compat.to_optax(optim_compat.WeightNorm({inner_src}{rest}))'
    self._add_import('optim_compat')
    self.fixed(original, 'OM001', f'flax.optim.WeightNorm(...) -> {source} (no Optax '
                                  'equivalent: the shim\'s faithful WeightNorm)')
    return cst.parse_expression(source)

  def _labels(self, traversals: list[tuple[str, str]]) -> str:
    """``lambda`` building the label tree: each traversal labels what it selects."""
    expr = f'jax.tree_util.tree_map(lambda _: {FROZEN!r}, params_)'
    for code, label in traversals:
      expr = f'{code}.update(lambda _: {label!r}, {expr})'
    self._add_import('jax')
    return f'lambda params_: {expr}'

  def _rewrite_multi(self, original, updated):
    groups = []
    for i, (o_arg, u_arg) in enumerate(zip(original.args, updated.args)):
      o_trav = o_arg.value.elements[0].value
      u_trav, u_sub = (e.value for e in u_arg.value.elements)
      label = o_trav.value if isinstance(o_trav, cst.Name) else f'group_{i}'
      sub = self._code(u_sub)
      o_sub = o_arg.value.elements[1].value
      if self.is_user_def(o_sub) or (isinstance(o_sub, cst.Name) and
                                     self.is_user_def(self.a.def_vars[self.binding(o_sub)])):
        sub = f'optim_compat.to_optax({sub})'
        self._add_import('optim_compat')
      groups.append([label, self._code(u_trav), sub])
    for g, label in zip(groups, self._multi_labels(original)):
      g[0] = label
    txs = ', '.join(f'{g[0]!r}: {g[2]}' for g in groups)
    source = (f'optax.multi_transform({{{txs}, {FROZEN!r}: optax.set_to_zero()}}, '
              f'{self._labels([(g[1], g[0]) for g in groups])})')
    self.fixed(original, 'OM008', 'MultiOptimizer -> optax.multi_transform, labels from the '
                                  'traversal filters, unselected leaves frozen (set_to_zero); a '
                                  'leaf two filters select, which legacy refused at create '
                                  '(ValueError), gets the later group here: keep the filters '
                                  'disjoint')
    return cst.parse_expression(source)

  def _rewrite_create(self, original, updated):
    positional = [a for a in updated.args if a.keyword is None]
    kw = self._kwargs(updated)
    target = (positional[0] if positional else kw['target']).value
    focus = _create_focus(updated)
    if focus is not None and m.matches(focus, m.Name('None')):
      focus = None  # legacy: every param
    tx = self._code(updated.func.value)
    o_recv = original.func.value
    if self.is_user_def(o_recv) or (isinstance(o_recv, cst.Name) and
                                    self.is_user_def(self.a.def_vars.get(self.binding(o_recv)))):
      tx = f'optim_compat.to_optax({tx})'
      self._add_import('optim_compat')
    if focus is not None:
      tx = (f"optax.multi_transform({{'focus': {tx}, {FROZEN!r}: optax.set_to_zero()}}, "
            f"{self._labels([(self._code(focus), 'focus')])})")
      self._add_import('optax')
      self.fixed(original, 'OM008', 'create(params, focus=traversal) -> optax.multi_transform, '
                                    'unfocused leaves frozen (set_to_zero)')
    self._add_import('flax.training', 'train_state')
    self.fixed(original, 'OM001', '.create(params) -> train_state.TrainState.create(...)')
    return cst.parse_expression(f'train_state.TrainState.create(apply_fn=None, params=P, tx={tx})') \
        .visit(_Substitute({'P': target}))

  def _rewrite_method(self, original, updated):
    recv = updated.func.value
    method = original.func.attr.value
    self._add_import('flax', 'jax_utils')
    devices = [a for a in updated.args if a.keyword is not None and a.keyword.value == 'devices']
    args = [cst.Arg(recv)] + [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in devices]
    if method == 'replicate':
      axis = self._kwargs(original).get('axis_name')
      axis = self._code(axis.value) if axis else "'batch'"
      message = (f'.replicate() -> jax_utils.replicate(...): legacy also averaged the gradients '
                 f'over pmap axis {axis} in apply_gradient; add grads = jax.lax.pmean(grads, '
                 f'{axis}) before apply_gradients unless the step already does')
      self.fixed(original, 'OM009', message)
      self.note('OM009', message)
    else:
      self.fixed(original, 'OM010', '.unreplicate() -> jax_utils.unreplicate(...)')
    for a in args[1:]:
      pass
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
    args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' ')))
            for a in args[:-1]] + args[-1:]
    return cst.Call(func=cst.parse_expression(f'jax_utils.{method}'), args=args)

  def _rewrite_restore(self, original, updated):
    qname = sorted(self.qnames(original.func) & set(RESTORES))[0]
    index, keyword = RESTORES[qname]
    kw = self._kwargs(updated)
    positional = [a for a in updated.args if a.keyword is None]
    target = kw[keyword].value if keyword in kw else (
        positional[index].value if len(positional) > index else None)
    o_kw = self._kwargs(original)
    o_pos = [a for a in original.args if a.keyword is None]
    o_target = o_kw[keyword].value if keyword in o_kw else (
        o_pos[index].value if len(o_pos) > index else None)
    if o_target is None or not self._mentions_optimizer(o_target):
      return updated
    import importlib.util
    landed = importlib.util.find_spec('optim_compat.checkpoint') is not None
    short = qname.rsplit('.', 1)[1]
    extra = set(kw) - {keyword, 'step', 'ckpt_dir', 'state', 'encoded_bytes'}
    if not landed or not self.opts.fixable('OM013') or extra or len(updated.args) > 3 \
        or (short != 'restore_checkpoint' and 'step' in kw):
      self.flag(original, 'OM013', f'{short} restores a flax.optim Optimizer with arguments the '
                                   'codemod does not convert: use optim_compat.checkpoint.'
                                   'restore_legacy(path_or_state_dict, target[, step=]), which reads '
                                   'legacy and TrainState checkpoints')
      return updated
    source_arg = positional[0].value if (index == 1 or keyword in kw) and positional else None
    if short == 'restore_checkpoint':
      source_arg = kw['ckpt_dir'].value if 'ckpt_dir' in kw else positional[0].value
      rest = ', step=' + self._code(kw['step'].value) if 'step' in kw else (
          ', step=' + self._code(positional[2].value) if len(positional) > 2 else '')
      src = f'optim_compat.checkpoint.restore_legacy(S, T{rest})'
    elif short == 'from_state_dict':
      source_arg = kw['state'].value if 'state' in kw else positional[-1].value
      src = 'optim_compat.checkpoint.restore_legacy(S, T)'
    else:
      source_arg = kw['encoded_bytes'].value if 'encoded_bytes' in kw else positional[-1].value
      src = 'optim_compat.checkpoint.restore_legacy(serialization.msgpack_restore(S), T)'
      self._add_import('flax', 'serialization')
    self._add_import('optim_compat.checkpoint')
    self.fixed(original, 'OM013', f'{short}(..., optimizer) -> optim_compat.checkpoint.'
                                  'restore_legacy: legacy checkpoints are converted, TrainState ones '
                                  'and fresh runs behave as before')
    return cst.parse_expression(src).visit(_Substitute({'S': source_arg, 'T': target}))

  def _rewrite_apply(self, original, updated):
    if id(original) in self._group_applies:
      return self._rewrite_group_apply(original, updated)
    kwargs = self._kwargs(updated)
    other = sorted(set(kwargs) - {'learning_rate', 'grads'})
    grads = _apply_grads(updated)
    if grads is None or other:
      self.flag(original, 'OM102', self._apply_problem(original) or
                f'apply_gradient overrides {other} have no Optax equivalent here; inject them '
                'with optax.inject_hyperparams')
      return updated
    recv = updated.func.value
    if 'learning_rate' in kwargs:
      lr = kwargs['learning_rate'].value
      template = 'R.replace(opt_state=optax.tree_utils.tree_set(R.opt_state, learning_rate=L))' \
                 '.apply_gradients(grads=G)'
      self._add_import('optax')
      subs = {'R': recv, 'L': lr, 'G': grads}
      self.fixed(original, 'OM002', 'apply_gradient(g, learning_rate=lr) -> lr set in '
                                    'opt_state (inject_hyperparams), then apply_gradients')
    else:
      template = 'R.apply_gradients(grads=G)'
      subs = {'R': recv, 'G': grads}
      self.fixed(original, 'OM002', 'apply_gradient(g) -> apply_gradients(grads=g)')
    return cst.parse_expression(template).visit(_Substitute(subs))

  def _rewrite_group_apply(self, original, updated):
    """``opt.apply_gradient(g, hyper_params=[hp0.replace(learning_rate=a), ...])`` ->
    each group's learning rate set in its ``inner_states[label]``, then apply_gradients."""
    lrs, labels = self._group_applies[id(original)]
    new_lrs = [e.value.args[0].value for e in self._kwargs(updated)['hyper_params'].value.elements]
    groups = ', '.join(f'{label!r}: optax.tree_utils.tree_set(R.opt_state.inner_states[{label!r}], '
                       f'learning_rate=LR_{i}_)' for i, label in enumerate(labels))
    template = (f'R.replace(opt_state=R.opt_state._replace(inner_states={{'
                f'**R.opt_state.inner_states, {groups}}})).apply_gradients(grads=G)')
    subs = {'R': updated.func.value,
            'G': [x for x in updated.args if x.keyword is None][0].value,
            **{f'LR_{i}_': lr for i, lr in enumerate(new_lrs)}}
    self._add_import('optax')
    self.fixed(original, 'OM002', 'apply_gradient(g, hyper_params=[...]) with per-group learning '
                                  'rates -> each set in opt_state.inner_states[label] '
                                  '(inject_hyperparams), then apply_gradients')
    return cst.parse_expression(template).visit(_Substitute(subs))

  def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
    """``loss, g = opt.compute_gradient(f)`` -> ``jax.value_and_grad`` (OM011)."""
    if id(original) not in self.a.grad_assigns or self.blocked or self.unproven:
      return updated
    call = original.value
    if not self._is_optimizer(call.func.value):
      return updated
    recv = updated.value.func.value
    fn = updated.value.args[0].value
    target = updated.targets[0].target
    elements = list(target.elements)
    self._add_import('jax')
    self.fixed(original, 'OM011', 'compute_gradient(f) -> jax.value_and_grad(f)(opt.params)')
    if len(elements) == 2:
      value = cst.parse_expression('jax.value_and_grad(F)(R.params)')
      return updated.with_changes(value=value.visit(_Substitute({'F': fn, 'R': recv})))
    value = cst.parse_expression('jax.value_and_grad(F, has_aux=True)(R.params)')
    a, b, c = (e.value for e in elements)
    new_target = cst.parse_expression('(A, B), C').visit(_Substitute({'A': a, 'B': b, 'C': c}))
    targets = [updated.targets[0].with_changes(target=new_target)]
    return updated.with_changes(targets=targets,
                                value=value.visit(_Substitute({'F': fn, 'R': recv})))

  def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                updated: cst.SimpleStatementLine):
    """``new, loss[, aux] = opt.optimize(f[, learning_rate=lr])`` -> value_and_grad, then
    apply_gradients: two statements (OM011)."""
    at = next((i for i, small in enumerate(original.body)
               if id(small) in self.a.optimize_assigns), None)
    if (at is None or self.blocked or self.unproven
        or not self._is_optimizer(original.body[at].value.func.value)):
      return updated
    assign = updated.body[at]
    call = assign.value
    recv, fn = call.func.value, call.args[0].value
    names = [e.value for e in assign.targets[0].target.elements]
    self._add_import('jax')
    subs = {'F': fn, 'R': recv, 'A': names[0], 'L': names[1]}
    if len(names) == 2:
      first = 'L, grads_from_optimize = jax.value_and_grad(F)(R.params)'
    else:
      first = '(L, X), grads_from_optimize = jax.value_and_grad(F, has_aux=True)(R.params)'
      subs['X'] = names[2]
    lr = self._kwargs(call).get('learning_rate')
    if lr is not None:
      second = ('A = R.replace(opt_state=optax.tree_utils.tree_set(R.opt_state, '
                'learning_rate=LR)).apply_gradients(grads=grads_from_optimize)')
      subs['LR'] = lr.value
      self._add_import('optax')
    else:
      second = 'A = R.apply_gradients(grads=grads_from_optimize)'
    self.fixed(original, 'OM011', 'optimize(f) -> jax.value_and_grad(f)(opt.params), then '
                                  'apply_gradients (two statements)')
    first_small = cst.parse_statement(first).body[0].visit(_Substitute(subs))
    second_small = cst.parse_statement(second).body[0].visit(_Substitute(subs))
    if len(updated.body) > 1:  # `x = 1; new, loss = opt.optimize(f)`: both on this line
      body = list(updated.body)
      body[at:at + 1] = [first_small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT),
                         second_small.with_changes(semicolon=assign.semicolon)]
      return updated.with_changes(body=body)
    line1 = updated.with_changes(body=[first_small])
    line2 = cst.SimpleStatementLine(body=[second_small])
    return cst.FlattenSentinel([line1, line2])

  def leave_Name(self, original: cst.Name, updated: cst.Name):
    return self._rewrite_reference(original, updated)

  def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
    if (original.attr.value == 'apply_gradient' and id(original) not in self.a.call_funcs
        and (self._is_optimizer(original.value) or (
            isinstance(original.value, cst.Name)
            and self.binding(original.value) in self.a.opt_vars))):
      # e.g. jax.jit(opt.apply_gradient): a method reference has no TrainState counterpart
      self.flag(original, 'OM100', '`.apply_gradient` used as a value (not called) cannot be '
                                   'converted: call it, or convert by hand (this file keeps its '
                                   'legacy optimizer code)')
    replaced = self._rewrite_reference(original, updated)
    if replaced is not updated:
      return replaced
    rule = LEGACY_ONLY_ATTRS.get(original.attr.value)
    if rule and id(original) in self._legacy_attr_ids and id(original) not in self.a.handled \
        and id(original) not in self._hp_owner_ids and self._is_optimizer(original.value):
      self.flag(original, rule, f'`.{original.attr.value}` of a flax.optim Optimizer has no '
                                'TrainState equivalent yet (this file keeps its legacy optimizer code)')
    elif (rule and id(original) not in self._state_of_step and id(original) in self._legacy_attr_ids
          and not (self.blocked or self.unproven) and not self._is_optimizer(original.value)
          and self._maybe_optimizer(original.value)):
      # `res = opt.optimize(f); opt = res[0]`: `opt` is rebound, its create still converts
      self.flag(original, 'OM100', f'if `{self._code(original.value)}` is a flax.optim Optimizer '
                                   f'(a TrainState after this rewrite), `.{original.attr.value}` '
                                   'has no TrainState equivalent: convert it by hand'
                                   + self._created_by())
    if original.attr.value in DEF_ONLY_ATTRS and any(original is a for a in self._def_only_uses()):
      self.flag(original, 'OM100', f'`.{original.attr.value}` of a flax.optim def has no Optax '
                                   'equivalent (this file keeps its legacy optimizer code)')
    if original.attr.value in ('target', 'state') and self._unconverted(original.value):
      self.flag(original, 'OM100', self._unproven_message(original.value,
                                                          f'`.{original.attr.value}`'))
      return updated
    if self.blocked and (original.attr.value in FLOW_FAILING_ATTRS or self._field_replace(original)):
      message = self._flow_failure(original)
      if message is not None:
        self.flag(original, 'OM100', message)
    if (self.unproven and original.attr.value in ('target', 'state') and self.a.apply_calls
        and not self.a.defines_apply_gradient and self._holds_local(original.value)):
      # the `.apply_gradient` of this name is flagged as unproven: so is its `.target` / `.state`
      self.flag(original, 'OM100', self._unproven_message(original.value,
                                                          f'`.{original.attr.value}`'))
    if self.blocked or self.unproven:
      return updated
    if id(original) in self._hp_values:
      recv, name, _ = self.a.hp_reads[id(original)]
      value = self._hp_values[id(original)]
      self.fixed(original, 'OM012', f'hyper_params.{name} -> {value} (the value the def was built '
                                    'with; legacy per-call overrides never changed it)')
      return cst.parse_expression(value)
    if original.attr.value == 'target':
      if self._is_optimizer(original.value):
        self.fixed(original, 'OM003', '.target -> .params')
        return updated.with_changes(attr=cst.Name('params'))
      if self._maybe_optimizer(original.value):
        self.flag(original, 'OM100', f'if `{self._code(original.value)}` is a flax.optim '
                                     'Optimizer, `.target` is `.params` on a TrainState'
                                     + self._created_by())
    if (original.attr.value == 'step' and isinstance(original.value, cst.Attribute)
        and original.value.attr.value == 'state'):
      if self._is_optimizer(original.value.value):
        self.fixed(original, 'OM004', '.state.step -> .step (TrainState.create starts it as the '
                                      'Python int 0, legacy as an int32 array, and it stays an '
                                      'int outside jit: a learning rate computed from it there is '
                                      'float64 math (legacy: float32), measured 1 ulp on the '
                                      'params; a jitted step returns an array)')
        if id(original) in self.a.step_array_uses:
          self.flag(original, 'OM100', '`.step` is a Python int on a TrainState fresh from '
                                       'TrainState.create or stepped outside jit (legacy: an int32 '
                                       'array): use jnp.asarray(<state>.step, jnp.int32) here')
        return updated.with_changes(value=updated.value.value)
      value = original.value.value
      if self._maybe_optimizer(value):
        self.flag(original, 'OM100', f'if `{self._code(value)}` is a flax.optim Optimizer, '
                                     '`.state.step` is `.step` on a TrainState'
                                     + self._created_by())
    return updated

  def _rewrite_reference(self, original, updated):
    """Legacy names that have a modern home: DynamicScale, annotations, traversals, subclasses."""
    sym = self.a.refs.get(id(original))
    if sym is None or id(original) in self._bad_refs:
      return updated
    if sym in ('DynamicScale', 'dynamic_scale'):
      if isinstance(original, cst.Name) or not self.opts.fixable('OM006') or (
          isinstance(original.value, cst.Name)
          and LEGACY + '.dynamic_scale' in self.qnames(original.value)):
        return updated  # the import statement is rewritten
      self._add_import('flax.training', 'dynamic_scale', 'dynamic_scale_lib')
      self.fixed(original, 'OM006', f'flax.optim {sym} -> flax.training.dynamic_scale')
      return cst.parse_expression('dynamic_scale_lib' + ('.DynamicScale' if sym == 'DynamicScale'
                                                         else ''))
    if self.blocked:
      return updated
    if id(original) in self.a.in_subclass:
      self._add_import('optim_compat')
      return cst.parse_expression(f'optim_compat.{sym}')
    if id(original) in self.a.in_annotation:
      source, (module, obj) = ANNOTATIONS[sym]
      self._add_import(module, obj)
      self.fixed(original, 'OM007', f'annotation flax.optim.{sym} -> {source}')
      return cst.parse_expression(source)
    if sym == TRAVERSAL:
      self._add_import('flax', 'traverse_util')
      return cst.parse_expression('traverse_util.ModelParamTraversal')
    return updated


def _stale_todo(line: cst.EmptyLine) -> bool:
  """A TODO this codemod wrote saying the file keeps its legacy code."""
  text = line.comment.value if line.comment else ''
  return text.startswith(TODO_PREFIX) and text.endswith(KEEPS_LEGACY)


def _container_values(node):
  """The element values of a tuple or list display, the values of a dict display."""
  if isinstance(node, cst.Dict):
    return [e.value for e in node.elements if isinstance(e, cst.DictElement)]
  return [e.value for e in node.elements if isinstance(e, cst.Element)]


def call_argument(call: cst.Call, position: Optional[int], keyword: Optional[str]):
  """The expression ``call`` passes to the parameter at ``position`` among the positional
  ones, or named ``keyword`` (None: not passed, a ``*args`` / ``**kwargs`` call, or a
  positional-only parameter for ``keyword``)."""
  if any(a.star for a in call.args):
    return None
  if keyword is not None:
    for a in call.args:
      if a.keyword is not None and a.keyword.value == keyword:
        return a.value
  given = [a for a in call.args if a.keyword is None]
  if position is not None and position < len(given):
    return given[position].value
  return None


def _apply_grads(call: cst.Call):
  """The gradient of ``opt.apply_gradient(g)`` / ``apply_gradient(grads=g)`` (legacy
  0.5.3: ``apply_gradient(self, grads, **hyper_param_overrides)``), or None when the call
  does not pass exactly one."""
  positional = [a.value for a in call.args if a.keyword is None]
  named = [a.value for a in call.args if a.keyword is not None and a.keyword.value == 'grads']
  return (positional + named)[0] if len(positional) + len(named) == 1 else None


def _create_focus(call: cst.Call):
  """The ``focus`` argument of ``Def(...).create(target, focus)``, or None."""
  positional = [a for a in call.args if a.keyword is None]
  if len(positional) == 2:
    return positional[1].value
  return next((a.value for a in call.args if a.keyword is not None
               and a.keyword.value == 'focus'), None)


def _target_names(targets):
  """The plain names among assignment targets, inside tuples and lists too."""
  for t in targets:
    if isinstance(t, cst.Name):
      yield t
    elif isinstance(t, (cst.Tuple, cst.List)):
      yield from _target_names([e.value for e in t.elements])
    elif isinstance(t, cst.StarredElement):
      yield from _target_names([t.value])


def _legacy_imports(tree: cst.Module):
  """``(module, obj, asname)`` of top-level ``import flax.optim[ as X]`` /
  ``from flax.optim[.sub] import Y[ as X]`` / ``from flax import optim[ as X]``."""
  for stmt in tree.body:
    if not isinstance(stmt, cst.SimpleStatementLine):
      continue
    for small in stmt.body:
      if isinstance(small, cst.Import):
        for alias in small.names:
          name = cst.Module(body=[]).code_for_node(alias.name)
          if name.startswith(LEGACY):
            yield name, None, alias.asname.name.value if alias.asname else None
      elif isinstance(small, cst.ImportFrom) and small.module is not None and \
          not isinstance(small.names, cst.ImportStar):
        module = cst.Module(body=[]).code_for_node(small.module)
        for alias in small.names:
          obj = alias.name.value if isinstance(alias.name, cst.Name) else None
          if module.startswith(LEGACY) or (module == 'flax' and obj == 'optim'):
            yield module, obj, alias.asname.name.value if alias.asname else None


class _PlainFlaxImport(cst.CSTTransformer):
  """``import flax.optim`` -> ``import flax`` (the line still binds ``flax`` for
  ``flax.linen`` and the like, and Flax >= 0.6 has no ``flax.optim`` to import)."""

  def leave_Import(self, original, updated):
    names = [a.with_changes(name=cst.Name('flax')) if a.asname is None and (
        _dotted(a.name) == LEGACY or _dotted(a.name).startswith(LEGACY + '.')) else a
             for a in updated.names]
    return updated.with_changes(names=names)


def _dotted(node) -> str:
  return cst.Module(body=[]).code_for_node(node)


def _plain_flax_imports(tree: cst.Module) -> cst.Module:
  """``tree`` with each ``import flax.optim`` the migration kept (its ``flax`` is
  used) turned into ``import flax``."""
  if not re.search(r'\bimport[^\n#]*\bflax\.optim\b', tree.code):
    return tree
  return tree.visit(_PlainFlaxImport())


class _Substitute(cst.CSTTransformer):
  """Replace placeholder names in a parsed template with real nodes."""

  def __init__(self, subs: dict):
    self.subs = subs

  def leave_Name(self, original, updated):
    return self.subs.get(updated.value, updated)


#: Module names the rewrite may import and use.
EMITTED_NAMES = frozenset({'optax', 'train_state', 'optim_compat', 'jax_utils', 'traverse_util'})


def attr_chain(node) -> Optional[str]:
  """``'self.optimizer'`` for an attribute chain on a name (``self.optimizer``,
  ``state.train.opt``), else None (a name alone, a call, a subscript)."""
  parts = []
  while isinstance(node, cst.Attribute):
    parts.append(node.attr.value)
    node = node.value
  if not parts or not isinstance(node, cst.Name):
    return None
  return '.'.join([node.value, *reversed(parts)])


def _legacy_module_name(expr, prefix=LEGACY) -> bool:
  """``expr`` is a string literal naming flax.optim or one of its submodules."""
  if not isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
    return False
  value = expr.evaluated_value
  return isinstance(value, str) and (value == prefix or value.startswith(prefix + '.'))


def target_names(target):
  """The ``cst.Name`` nodes an assignment or loop target binds (``a``, ``a, (b, *c)``)."""
  if isinstance(target, cst.Name):
    yield target
  elif isinstance(target, (cst.Tuple, cst.List)):
    for element in target.elements:
      yield from target_names(element.value)
  elif isinstance(target, cst.StarredElement):
    yield from target_names(target.value)


class _Bindings(cst.CSTVisitor):
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


def _bound_names(tree: cst.Module, among: frozenset, code: Optional[str] = None) -> set[str]:
  """The names of ``among`` that ``tree`` binds by anything but an import (``code``:
  ``tree``'s source text, when the caller has it).

  A name bound in a statement is spelled in that statement's text, so only the
  top-level statements whose text holds one of the words are walked: most
  modules hold none, and a full walk cost ~10 ms per file.
  """
  pattern = re.compile(r'\b(?:' + '|'.join(map(re.escape, sorted(among))) + r')\b')
  if not pattern.search(tree.code if code is None else code):
    return set()
  visitor = _Bindings()
  for stmt in tree.body:
    if pattern.search(tree.code_for_node(stmt)):
      stmt.visit(visitor)
  return visitor.names & among


class MigrateCommand(CodemodCommand):
  """LibCST codemod: legacy flax.optim -> Optax + flax.training.train_state."""

  DESCRIPTION = __doc__

  def __init__(self, context: CodemodContext, options: Optional[Options] = None, flow=None):
    super().__init__(context)
    self.options = options or Options()
    self.flow = flow if flow is not None and (flow.factories or flow.steps) else None
    self.findings: list[Finding] = []
    #: module-level functions returning an optimizer -> whether the result is a TrainState
    self.factories: dict[str, bool] = {}
    #: module-level functions taking optimizers -> (their parameters, converted)
    self.steps: dict[str, tuple[tuple, bool]] = {}
    #: module-level functions returning an optimizer in a tuple, list or dict -> converted
    self.bundles: dict[str, bool] = {}
    self.inject_lr = False
    #: ``(module, text)``: a parsed module and the text it was parsed from, set by a caller
    #: that has both, so that the text is not generated again from the tree
    self.parsed: Optional[tuple[cst.Module, str]] = None

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    code = self.parsed[1] if self.parsed is not None and self.parsed[0] is tree else None
    if self.flow is not None and self.flow.mentioned(tree.code if code is None else code):
      reduced, originals = tree, {}  # a factory's name is no word _reduce knows
    else:
      reduced, originals = _reduce(tree)
    wrapper = cst.MetadataWrapper(reduced, unsafe_skip_copy=True)
    analysis = _Analyzer(self.flow)
    wrapper.visit(analysis)
    rewriter = _Rewriter(self.context, analysis, self.options)
    # the whole module, set-aside statements too; only the names the rewrite emits are asked about
    rewriter.bound_names = _bound_names(tree, EMITTED_NAMES, code)
    result = _restore(wrapper.visit(rewriter), originals)
    self.findings = rewriter.findings
    converts = not rewriter.blocked and not rewriter.unproven
    # a function that takes an optimizer is a step (`opt = train_step(opt, b)` passes the
    # caller's own through), not a factory, even when it returns the updated one
    self.factories = dict.fromkeys(sorted(analysis.module_factories - set(analysis.steps)),
                                   converts)
    # (a file that never imports flax.optim has steps too: kept as they are, flagged there)
    self.steps = {name: (params, converts) for name, params in sorted(analysis.steps.items())}
    top = {fn.name.value for fn in analysis.top_functions}
    self.bundles = dict.fromkeys(sorted(analysis.bundle_factories & top - set(analysis.steps)),
                                 converts)
    self.inject_lr = rewriter.inject_lr
    # RemoveImportsVisitor drops only imports left unused: a legacy import in use stays. A file
    # that keeps its legacy code keeps its flax.optim imports, used or not: they say (to the
    # reader and to later runs' cross-module flow) that its optimizers are flax.optim ones
    # (only flax.optim's own imports: an `import flax` the migration left unused stays)
    removals = [('flax', 'optim', None), ('flax.optim', None, None), *_legacy_imports(tree)] if (analysis.uses_legacy and not analysis.only_imports
                                            and not rewriter.blocked) \
        else []  # an import nothing uses may be a re-export: kept, flagged
    result = _fix_imports(self.context, result, removals)
    return _plain_flax_imports(result) if removals else result


#: Words a top-level statement needs for any rule to see it (or a name another such statement binds).
_RELEVANT = re.compile(
    r'\b(optim|apply_gradient|target|step|state|replicate|unreplicate|compute_gradients?|optimize'
    r'|hyper_params|optimizer_def|create|restore_checkpoint|from_state_dict|from_bytes|nn'
    r'|DynamicScale|dynamic_scale|ModelParamTraversal|OptimizerDef|Optimizer|OptimizerState)\b')
_KEEP = '__optim_migrate_kept_{}__'
_MIN_REDUCE = 8  # top-level statements below which the whole module is analysed as is


def _top_level_names(stmt) -> set[str]:
  """Module-level names ``stmt`` binds (defs, classes, plain assignment targets)."""
  if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
    return {stmt.name.value}
  names = set()
  if isinstance(stmt, cst.SimpleStatementLine):
    for small in stmt.body:
      targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign) else
                 [small.target] if isinstance(small, (cst.AnnAssign, cst.AugAssign)) else [])
      for t in targets:
        names.update(n.value for n in _names_in(t))
  return names


def _names_in(expr):
  if isinstance(expr, cst.Name):
    yield expr
  elif isinstance(expr, (cst.Tuple, cst.List)):
    for e in expr.elements:
      yield from _names_in(e.value)


def _reduce(tree: cst.Module):
  """The module with top-level statements no rule can see replaced by line-preserving
  placeholders (``pass  # __optim_migrate_kept_N__``), and the originals.

  A statement is kept when it is an import, mentions a word of :data:`_RELEVANT`,
  or mentions a name bound by a kept statement (to a fixpoint). Scope analysis
  is then spent on the legacy code, not on a module's other 90%; line numbers
  (finding positions) stay those of the original.
  """
  body = list(tree.body)
  if len(body) < _MIN_REDUCE:
    return tree, {}
  empty = cst.Module(body=[])
  codes = [empty.code_for_node(st) for st in body]
  keep = [bool(_RELEVANT.search(c)) or (
      isinstance(st, cst.SimpleStatementLine)
      and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in st.body))
      for st, c in zip(body, codes)]
  bound: set[str] = set()
  while True:
    new = set().union(*(_top_level_names(st) for st, k in zip(body, keep) if k)) - bound
    if not new:
      break
    bound |= new
    pattern = re.compile(r'\b(' + '|'.join(map(re.escape, sorted(new))) + r')\b')
    keep = [k or bool(pattern.search(c)) for k, c in zip(keep, codes)]
  if all(keep):
    return tree, {}
  originals, reduced = {}, []
  for i, (st, k, c) in enumerate(zip(body, keep, codes)):
    if k:
      reduced.append(st)
      continue
    n_lines = c.count('\n')
    originals[_KEEP.format(i)] = st
    reduced.append(cst.SimpleStatementLine(
        body=[cst.Pass()], leading_lines=[cst.EmptyLine()] * max(n_lines - 1, 0),
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace('  '), comment=cst.Comment('# ' + _KEEP.format(i)))))
  return tree.with_changes(body=reduced), originals


def _restore(tree: cst.Module, originals: dict) -> cst.Module:
  """Put the statements :func:`_reduce` set aside back in place."""
  if not originals:
    return tree
  body = []
  for st in tree.body:
    comment = (st.trailing_whitespace.comment if isinstance(st, cst.SimpleStatementLine)
               else None)
    key = comment.value[2:] if comment is not None else None
    body.append(originals.pop(key) if key in originals else st)
  if originals:
    raise RuntimeError(f'internal error: {len(originals)} statement(s) lost while rewriting')
  return tree.with_changes(body=body)


def _used_names(code: str) -> tuple[set[str], set[str], int]:
  """Names ``code`` uses outside import statements (not after a ``.``), the names
  imports bind, and the last line of an import statement that mentions ``optim``.

  A token scan: it over-approximates use (a shadowing local counts), which is
  the safe direction for deciding that an import is unused.
  """
  used, imported, last_optim_import = set(), set(), 0
  in_import, start, prev, line_tokens = False, True, None, []
  for tok in tokenize.generate_tokens(io.StringIO(code).readline):
    if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
      if in_import and 'optim' in line_tokens:
        last_optim_import = tok.start[0]
      in_import, start, prev, line_tokens = False, True, None, []
      continue
    if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
      continue
    if start:
      in_import = tok.type == tokenize.NAME and tok.string in ('import', 'from')
      start = False
    if tok.type == tokenize.NAME:
      line_tokens.append(tok.string)
      if in_import:
        imported.add(tok.string)
      elif not (prev is not None and prev.type == tokenize.OP and prev.string == '.'):
        used.add(tok.string)
    prev = tok
  return used, imported, last_optim_import


def _add_imports(context: CodemodContext, tree: cst.Module, adds) -> cst.Module:
  """``tree`` with the imports ``adds`` (LibCST ``ImportItem`` entries) added.

  With nothing to add LibCST's visitor would return the module unchanged; it is
  not built (its construction alone costs ~10 ms). The entries are taken back out
  of the context afterwards, so that the engine does not run the visitor once
  more on the final module (it would find them all present and add nothing).
  """
  if not adds:
    return tree
  context.scratch[AddImportsVisitor.CONTEXT_KEY] = adds
  try:
    return import_scope.add_imports(context, tree)
  finally:
    context.scratch.pop(AddImportsVisitor.CONTEXT_KEY, None)


def _fix_imports(context: CodemodContext, tree: cst.Module, removals) -> cst.Module:
  """Add the imports the rewrite needs and drop the unused legacy ones.

  LibCST's ``AddImportsVisitor`` only looks at the leading statements, and an
  import whose name appears nowhere else needs no scope analysis: both run on
  the module's head (the statements before the first compound statement),
  which keeps a 20,000-statement file from being re-analysed twice. Only a
  legacy import whose name still appears (maybe shadowed), or one after the
  head, gets ``RemoveImportsVisitor``'s scope analysis, on the head and the
  statements that name it (``import_scope.remove_unused_imports``).
  """
  adds = context.scratch.pop(AddImportsVisitor.CONTEXT_KEY, [])
  context.scratch.pop(RemoveImportsVisitor.CONTEXT_KEY, None)
  k = next((i for i, st in enumerate(tree.body) if isinstance(st, cst.BaseCompoundStatement)),
           len(tree.body))
  head, tail = tree.with_changes(body=tree.body[:k]), list(tree.body[k:])
  used, _, last_optim_import = _used_names(tree.code)
  head_lines = head.code.count('\n') + 1
  if last_optim_import > head_lines:  # a legacy import after the head: every removal in the
    tree = _add_imports(context, tree, adds)  # scope-analysed pass, on the statements naming one
    n_head = next((i for i, st in enumerate(tree.body) if isinstance(st, cst.BaseCompoundStatement)),
                  len(tree.body))
    return import_scope.remove_unused_imports(context, tree, n_head, removals)
  fast, slow = [], []
  for module, obj, asname in dict.fromkeys(removals):
    bound = asname or obj or module.split('.')[0]
    legacy = module.startswith(LEGACY) or (module == 'flax' and obj == 'optim')
    if bound not in used:
      fast.append((module, obj, asname))
    elif legacy:
      slow.append((module, obj, asname))
  head = _add_imports(context, head, adds)
  if fast and import_scope.may_remove(head.body, fast):
    head = import_scope.remove_unused_head_imports(context, head, fast)
  tree = tree.with_changes(body=[*head.body, *tail])
  if slow:
    tree = import_scope.remove_unused_imports(context, tree, len(head.body), slow)
  return tree
