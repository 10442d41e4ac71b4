"""The analysis pass: one visit of a module collecting its :class:`~codemod.facts.model.Facts`.

Which names hold optimizer defs and optimizers (by scope, via LibCST's
``ScopeProvider``; legacy names are resolved with ``QualifiedNameProvider``,
never by text), where flax.optim is referenced, and what each function takes
and returns. Parameters and rebinds are settled after the visit
(``codemod.facts.following``).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod.visiting import NoAttributeHooks
from codemod import docstrings
from codemod import legacy_api as api
from codemod.facts import following
from codemod.facts.model import Facts
from codemod.modern import table as modern_table
from optim_compat import spec as spec_lib
from codemod.facts.values import (DEF_HYPER_PARAMS, create_receiver, jitted_create,
                                  makes_bare_array,
                                  own_function as _own_function, pickled_value,
                                  produces_optimizer, wrapper_of, wraps_factory)
from codemod.names import (Names, attr_chain, code, container_values, last_name,
                           legacy_module_name, named_like_optimizer, target_names)

_NN_RENAMED = modern_table.nn_renames()
_HP_READ = m.Attribute(value=m.Attribute(attr=m.Name('hyper_params')))
_STATE_STEP = m.Attribute(attr=m.Name('state'))
_STEP_OF_STATE = m.Attribute(value=m.Attribute(attr=m.Name('state')), attr=m.Name('step'))
_TARGET_READ = m.Attribute(value=m.Name(), attr=m.Name('target'))
#: ``x.get('key'[, default])``
#: `o.optimizer_def.create(...)`: a fresh optimizer from `o`'s def (the reset idiom)
_DEF_RESET = m.Attribute(value=m.Attribute(attr=m.Name('optimizer_def')), attr=m.Name('create'))
_GET_CALL = m.Call(func=m.Attribute(attr=m.Name('get')),
                   args=[m.Arg(keyword=None, star=''), m.ZeroOrOne(m.Arg())])
#: a flax.optim Optimizer member read on a name (``x.target``, ``x.apply_gradient``, ...)
_MEMBER_READ = m.Attribute(value=m.Name(),
                           attr=m.OneOf(*map(m.Name, sorted(api.PICKLED_MEMBER_READS))))
_OPTIMIZER_ARG = m.Arg(keyword=m.Name(), value=m.Name())
_STATE_STEP_READ = m.Attribute(value=m.Attribute(value=m.Name(), attr=m.Name('state')),
                               attr=m.Name('step'))
#: attributes the late checks of the plan look at (a method used as a value, a member of
#: another module's optimizer)
#: a parameter named like an optimizer def (`optimizer_def`, `optim_def`, `opt_def`)
_DEF_LOOKING = api.DEF_LOOKING
#: A call whose function is named like a def's maker: `get_optimizer(config).create(p)`,
#: `momentum_clip.Optimizer(beta=0.9).create(p)` (another module's OptimizerDef subclass)
_DEF_CALL_LOOKING = api.OPTIM_WORD
_MEMBER_NAMES = frozenset({'apply_gradient', 'target', 'state'})


def _state_of(expr):
  """The ``<x>.state`` attribute ``expr`` reads through (``opt.state.param_states['head']``),
  else None."""
  while isinstance(expr, (cst.Attribute, cst.Subscript)):
    if isinstance(expr, cst.Attribute) and expr.attr.value == 'state':
      return expr
    expr = expr.value
  return None


class Analyzer(NoAttributeHooks, cst.CSTVisitor):
  """Collect def variables, optimizer variables, legacy references and their contexts."""

  def __init__(self, names: Names):
    super().__init__()
    self.n = names
    self.f: Facts = names.facts
    self._class_depth = 0
    self._class_levels: list[int] = []  # len(_function_stack) at each enclosing class
    self._classes: list[str] = []  # names of the classes being visited
    flow = self.f.flow
    self._field_classes = flow.field_classes if flow is not None else frozenset()
    self._own_fields: frozenset = frozenset()  # the module's own classes' optimizer fields
    self._annotation_depth = 0
    self._subclass_depth = 0
    self._state_step: set[int] = set()
    self._inner: set[int] = set()
    self._group_args: set[int] = set()
    self._tx_args: set[int] = set()  # `tx=` arguments of `.create(...)` calls (TrainState's)
    self._function_stack: list[str] = []
    self._elifs: set[int] = set()  # ids of the `elif` Ifs seen
    self._block_sizes: list[int] = []  # statements in each enclosing indented block
    self._receivers: set = set()  # ids of methods' first parameters (codemod.facts.analyzer)
    self._blocks: list[int] = []   # ids of the statement blocks being visited
    self._pickle_uses = None       # ids of names read as `.target` / `.state.step` or pickled
    self._member_uses = None       # ids of names read with a flax.optim Optimizer member
    self._line = None              # the simple statement line being visited
    #: settled after the visit (codemod.facts.following)
    self.chain_copies: list = []   # (chain, replicated chain): `self.o = replicate(self.o)`
    self.rebinds: set = set()      # bindings a loop, walrus, `with` or unpacking gives other values
    self.assign_sites: dict = {}   # binding -> [(target Name, value, id(block))]: `x = ...`
    self.class_chains: dict = {}   # module-level class -> attributes its methods set on `self`
    #: converted def factories (codemod.flow.DefFactory): their calls, the names bound to one,
    #: and the nodes consumed by `.create` / a name (anything else is a misuse, codemod.flow)
    self.def_factory_calls: list = []
    self.def_names: list = []
    self.consumed_defs: set = set()
    self.create_receivers: set = set()
    self._jitted_creates: set = set()  # `d.create` in `jax.jit(d.create, ...)(p)`
    self._sink_args: set = set()   # ids of the Args handing a def to a def sink the run converts
    #: def calls in a place the rewrite follows: bound to one name, or a MultiOptimizer group's
    #: def (with consumed_defs, wn_inner and escaping; any other is handed on, _unplaced_defs)
    self.placed_defs: set = set()

  # -- imports: only whether flax.optim is imported ----------------------------------------
  def visit_Import(self, node: cst.Import) -> bool:
    for alias in node.names:
      if code(alias.name).startswith(api.LEGACY):
        self.f.uses_legacy = True
        self.f.legacy_imports.append(node)
    self._imported_field_classes([code(alias.name) for alias in node.names])
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    base = '.' * len(node.relative) + (code(node.module) if node.module is not None else '')
    if not isinstance(node.names, cst.ImportStar):
      self._imported_field_classes(
          [base] + [f'{base}.{code(a.name)}' if node.module is not None else base + code(a.name)
                    for a in node.names])
    if node.module is None:
      return False
    module = code(node.module)
    if module == api.LEGACY or module.startswith(api.LEGACY + '.'):
      self.f.uses_legacy = True
      self.f.legacy_imports.append(node)
      if isinstance(node.names, cst.ImportStar):
        self.f.star_imports.append(node)
    elif module == 'flax' and not isinstance(node.names, cst.ImportStar) and any(
        isinstance(a.name, cst.Name) and a.name.value == 'optim' for a in node.names):
      self.f.uses_legacy = True
      self.f.legacy_imports.append(node)
    return False

  def visit_Module(self, node: cst.Module) -> None:
    self._module = node
    # the optimizer fields of the module's classes, before any function reading them (a
    # class declared below its users: `optimizer = state.optimizer` in a step above it)
    for stmt in node.body:
      if isinstance(stmt, cst.ClassDef) and any(
          api.is_def_class(self.n.symbol(b.value)) for b in stmt.bases):
        # a user def declared below the def factory returning it (scenic's `get_optimizer`
        # returns `MomentumHP(...)`, declared after it): wrapped there in to_optax
        self.f.subclass_names.add(stmt.name.value)
      if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
        for line in stmt.body.body:
          if isinstance(line, cst.SimpleStatementLine):
            for small in line.body:
              if (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)
                  and any(self.n.symbol(x) in ('Optimizer', 'ReplicatedOptimizer')
                          for x in m.findall(small.annotation, m.Name() | m.Attribute()))):
                self.f.annotated_fields.add(small.target.value)
                self.f.container_classes.add(stmt.name.value)
    self._own_fields = frozenset(self.f.annotated_fields)
    if self.f.flow is not None:  # another module hands this one containers of a class
      handoffs = self.f.flow.handoffs_to()
      for handoff in ([] if any(h.mixed for h in handoffs) else handoffs):
        if (found := self.f.flow.resolve_fields(handoff.cls)) is not None:
          self._register_fields(found)

  # -- contexts ----------------------------------------------------------------------------
  def visit_Annotation(self, node) -> None:
    self._annotation_depth += 1

  def leave_Annotation(self, node) -> None:
    self._annotation_depth -= 1

  def visit_ClassDef(self, node: cst.ClassDef) -> None:
    self._class_depth += 1
    self._class_levels.append(len(self._function_stack))
    self._classes.append(node.name.value)
    if any(self.n.symbol(base.value) for base in node.bases):
      self.f.subclasses.append(node)
      self.f.subclass_names.add(node.name.value)
      self._subclass_depth += 1

  def leave_ClassDef(self, node: cst.ClassDef) -> None:
    self._class_depth -= 1
    self._class_levels.pop()
    self._classes.pop()
    if any(node is c for c in self.f.subclasses):
      self._subclass_depth -= 1

  def visit_IndentedBlock(self, node) -> None:
    self._blocks.append(id(node))
    self._block_sizes.append(len(node.body))  # (an `if` OM015 removes must leave one)

  def leave_IndentedBlock(self, node) -> None:
    self._blocks.pop()
    self._block_sizes.pop()

  def visit_SimpleStatementLine(self, node) -> None:
    self._line = node

  def visit_SimpleStatementSuite(self, node) -> None:
    self._blocks.append(id(node))

  def leave_SimpleStatementSuite(self, node) -> None:
    self._blocks.pop()

  # -- references ----------------------------------------------------------------------------
  def _reference(self, node) -> None:
    if id(node) in self._inner:
      if isinstance(node, cst.Attribute):
        self._inner.add(id(node.value))
      return
    qnames = self.n.qnames(node)
    if qnames & _NN_RENAMED:  # `flax.nn.relu`: OM214 makes it `jax.nn.relu`, `flax.nn` and all
      if isinstance(node, cst.Attribute):
        self._inner.add(id(node.value))
      return
    sym = sorted(filter(None, map(api.legacy_symbol, qnames)))
    f = self.f
    if sym:
      f.uses_legacy = True
      f.refs[id(node)] = sym[0]
      f.ref_nodes[id(node)] = node
      if self._annotation_depth:
        f.in_annotation.add(id(node))
      if self._subclass_depth:
        f.in_subclass.add(id(node))
    elif any(q == api.NN_PREFIX or q.startswith(api.NN_PREFIX + '.') for q in qnames):
      f.nn_refs.add(id(node))
    else:
      if any(q == api.LEGACY for q in qnames):
        f.uses_legacy = True
        f.module_refs.append(node)  # the module object itself (`opt_lib = optim`)
      return
    if isinstance(node, cst.Attribute):
      self._inner.add(id(node.value))

  def visit_Name(self, node) -> None:
    self._reference(node)
    if node.value in self._field_classes:
      self._field_class(node)

  def _imported_field_classes(self, modules: list[str]) -> None:
    """The module imports one that declares classes with optimizer fields: ``<anything>.<field>``
    holds that module's optimizer here, as where the class is named (a reader that gets
    the container as an argument and names its class only in a docstring)."""
    flow = self.f.flow
    if flow is None or not self._field_classes:
      return
    for module in modules:
      for found in flow.fields_of_module(module):
        self._register_fields(found)

  def _register_fields(self, found) -> None:
    f = self.f
    f.flow_classes[found.qualified] = found
    if found.converted:
      f.flow_fields.update(found.fields)
      f.annotated_fields.update(found.fields)
    else:
      for field in found.fields:
        f.legacy_fields.setdefault(field, found)
    # a field name one class here converts and another keeps legacy: `<x>.<field>` may be
    # either, so it is neither converted nor taken for the converted one (flagged)
    for field in f.flow_fields & set(f.legacy_fields):
      f.flow_fields.discard(field)
      if field not in self._own_fields:
        f.annotated_fields.discard(field)

  def _field_class(self, node) -> None:
    """``node`` names another module's class with optimizer fields (``codemod.flow.Fields``):
    ``<anything>.<field>`` holds that module's optimizer here too."""
    f = self.f
    for q in sorted(self.n.qnames(node)):
      if (found := f.flow.resolve_fields(q)) is not None:
        self._register_fields(found)
        return

  def visit_Attribute(self, node: cst.Attribute) -> None:
    self._reference(node)
    if node.attr.value == 'create' and id(node) not in self.f.call_funcs and id(
        node) not in self._jitted_creates and self.n.is_def(node.value):
      # a def's bound `create` handed on (`f = d.create`, `jax.pmap(d.create)`): an Optax
      # transformation has none, so the def is handed to other code (OM114)
      self.f.escaping[id(node)] = node
      self.consumed_defs.add(id(node.value))  # (flagged here, not again as a def)
    if node.attr.value in self._field_classes:
      self._field_class(node)
    f = self.f
    attr = node.attr.value
    if attr == 'step' and m.matches(node.value, _STATE_STEP):
      self._state_step.add(id(node.value))  # `.state.step` is converted (OM004)
    if attr in api.ARRAY_ONLY_ATTRS and m.matches(node.value, _STEP_OF_STATE):
      f.step_array_uses.add(id(node.value))  # `opt.state.step.astype(...)`
    elif attr in api.LEGACY_ONLY_ATTRS and id(node) not in self._state_step:
      f.legacy_attrs.append(node)
    if m.matches(node, _HP_READ):
      owner = node.value.value
      if m.matches(owner, m.Attribute(attr=m.Name('optimizer_def'))):
        f.hp_reads[id(node)] = (owner.value, attr, True)
      else:
        f.hp_reads[id(node)] = (owner, attr, False)
    if attr in api.DEF_ONLY_ATTRS and isinstance(node.value, cst.Name):
      f.def_attrs.append(node)
    if attr in _MEMBER_NAMES:
      f.member_attrs.append(node)

  # -- functions and their parameters ---------------------------------------------------------
  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    if (self._class_depth and not self._function_stack and not self._subclass_depth
        and node.params.params and not any(
            m.matches(d.decorator, m.Name('staticmethod')) for d in node.decorators)):
      # a method's receiver (`self`, `cls`) of a class that is no flax.optim subclass holds
      # no optimizer: its `.state` (an agent's frame stack) is no legacy member
      self._receivers.add(id(node.params.params[0]))
    method = bool(self._class_levels) and self._class_levels[-1] == len(self._function_stack)
    if not self._function_stack and not self._subclass_depth and (
        not self._class_depth or (method and self._class_depth == 1)):
      self._def_sink(node, self._classes[0] if self._class_depth else None)
    self._function_stack.append(node.name.value)
    if not method:  # (a function nested in a method is followed as any other: `def step` in a test)
      self.f.functions.append(node)
      if len(self._function_stack) == 1:
        self.f.top_functions.append(node)
    if node.name.value == 'apply_gradient':
      self.f.defines_apply_gradient = True
    if self._field_classes:
      self._documented_field_classes(node)
    self._documented_optimizers(node)

  def _sink_called(self, node: cst.Call):
    """The def sink of another module (or this one) ``node`` calls (``codemod.flow.DefSink``):
    a method by its name (``actor.with_optimizer(...)``: the receiver's class is not
    followed; the flow offers a method name only when one sink has it), a function by its
    qualified name."""
    flow = self.f.flow
    if isinstance(node.func, cst.Attribute):
      return flow.sink_method(node.func.attr.value)
    names = sorted(self.n.qnames(node.func))
    if isinstance(node.func, cst.Name) and flow.module:
      names.append(f'{flow.module}.{node.func.value}')
    return next((found for q in names if (found := flow.resolve_sink(q)) is not None), None)

  def _sink_call(self, node: cst.Call, sink) -> None:
    """A call handing a def to a def sink: the def (a call of a table def, at the sink's
    parameter) becomes the Optax transformation the sink ``.create`` s where the run lets the
    sink convert; any other argument there is a use the sink cannot take (``def_misused``)."""
    f = self.f
    f.def_uses[sink.qualified] = sink
    position, name = sink.parameter
    given = [a for a in node.args if a.keyword is not None and a.keyword.value == name] or [
        a for i, a in enumerate(node.args) if a.keyword is None and not a.star and i == position]
    value = given[0].value if given else None
    if value is None or any(a.star for a in node.args) or \
        self.n.legacy_def(value) not in spec_lib.SPECS:
      f.def_misused.add(sink.qualified)
      return
    f.uses_legacy = True  # (a flax.optim def today)
    if sink.allowed:
      self._sink_args.add(id(given[0]))
      self.consumed_defs.add(id(value))

  def _def_sink(self, node: cst.FunctionDef, cls: Optional[str]) -> None:
    """A module-level function, or a method of a module-level class, with a parameter whose
    every use is the receiver of ``.create(...)`` (jax-rl's ``Model.with_optimizer(self,
    optim_def)``: ``optim_def.create(self.params)``): a *def sink* (``Facts.def_sinks``).
    Where the run lets it convert (``codemod.flow.DefSink.allowed``: every caller passes a
    def that converts) the parameter is a def of unknown kind here, its ``.create`` a
    ``TrainState.create(..., tx=<parameter>)``."""
    n = self.n
    params = list(node.params.params)
    offset = 1 if cls is not None else 0
    if cls is not None and (not params or any(
        m.matches(d.decorator, m.Name('staticmethod') | m.Name('classmethod'))
        for d in node.decorators)):
      return
    receivers = None  # ids of the names `.create` is called on in the body (read once, lazily)
    for i, param in enumerate(params[offset:]):
      if param.annotation is not None or param.default is not None or param.star:
        continue
      name = param.name.value
      scope = n.scope(param.name)
      if scope is None or len(list(scope.assignments[name])) != 1:
        continue  # (rebound in the body: not only a def)
      accesses = list(scope.accesses[name])
      if not accesses:
        continue
      if receivers is None:
        receivers = {id(c.func.value) for c in m.findall(node.body, m.Call(
            func=m.Attribute(value=m.Name(), attr=m.Name('create'))))}
        if not receivers:
          return  # (no `.create` at all: the common case)
      if all(id(a.node) in receivers for a in accesses):
        qualname = f'{cls}.{node.name.value}' if cls else node.name.value
        self.f.def_sinks[qualname] = (i, name)
        flow = self.f.flow
        found = flow.resolve_sink(f'{flow.module}.{qualname}') if (
            flow is not None and flow.module) else None
        if found is not None and found.allowed and (b := n.binding(param.name)):
          self.f.def_vars[b] = None  # a def of unknown kind: `.create` on it is converted

  def _documented_field_classes(self, node: cst.FunctionDef) -> None:
    """A parameter documented as another module's class with optimizer fields
    (``state: model_utils.TrainState.`` in the docstring's ``Args:``, the file never
    importing that module): ``<anything>.<field>`` holds that class's optimizer here, as
    where the module is imported (:meth:`_imported_field_classes`)."""
    doc = node.get_docstring(clean=False)
    if not doc or not any(name in doc for name in self._field_classes):
      return  # (the parse only where the docstring names such a class)
    for dotted in docstrings.parameter_types(node).values():
      if dotted.rsplit('.', 1)[-1] in self._field_classes and (
          found := self.f.flow.documented_fields(dotted)) is not None:
        self._register_fields(found)

  def _documented_optimizers(self, node: cst.FunctionDef) -> None:
    """Parameters the docstring types as a flax.optim ``Optimizer`` / ``OptimizerDef``
    (``optimizer: flax.optim.Optimizer`` in its ``Args:``, ``opt (optim.Optimizer): ...``):
    the same evidence as an annotation, also in a module that never imports flax.optim (a
    library function its users hand their optimizer). The docstring's type is rewritten
    with the code (``Facts.doc_types``, OM007)."""
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    doc = node.get_docstring(clean=False)
    if not doc or 'Optimizer' not in doc or not body:
      return
    found = {}
    scope = self.n.scope(node)
    for param, dotted in docstrings.parameter_types(node).items():
      qnames = {q.name for q in scope.get_qualified_names_for(dotted)} if scope else set()
      qnames.add(dotted)  # (`flax.optim.Optimizer` in a module that never imports flax)
      qnames = {q for q in qnames if q.startswith(api.LEGACY + '.')}
      sym = next((s for s in sorted(filter(None, map(api.legacy_symbol, qnames)))
                  if s in api.ANNOTATIONS), None)
      if sym is None:
        continue
      params = (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params)
      target = next(p for p in params if p.name.value == param)
      self.f.uses_legacy = True  # (documented as flax.optim's: the module's own evidence)
      if target.annotation is None and (b := self.n.binding(target.name)):
        if sym == 'Optimizer':  # (else the annotation decides)
          self.f.opt_vars.add(b)
        else:
          self.f.def_vars[b] = None
      found[dotted] = api.ANNOTATIONS[sym][0].replace(
          'train_state.', 'flax.training.train_state.')
    stmt = body[0]
    if found and isinstance(stmt, cst.SimpleStatementLine) and isinstance(
        stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.SimpleString):
      self.f.doc_types[id(stmt.body[0].value)] = found

  def _def_default(self, value, targets):
    """The table def ``value`` falls back to in ``name = <mapping>.get(key, optim.Adam(lr))``
    (one name target, a positional key and default), else None."""
    if not (len(targets) == 1 and isinstance(targets[0], cst.Name) and m.matches(
        value, m.Call(func=m.Attribute(attr=m.Name('get')), args=[m.Arg(keyword=None, star=''),
                                                                   m.Arg(keyword=None, star='')]))):
      return None
    default = value.args[1].value
    return default if self.n.legacy_def(default) in spec_lib.SPECS else None

  def visit_If(self, node: cst.If) -> Optional[bool]:
    """``if isinstance(x, optim.Optimizer): <legacy> else: <TrainState code>``: code taking
    both; the rewrite keeps the else branch alone (OM015), so the legacy branch is not
    analysed (its `.target`, `.state` are dropped with it). With no else, the statement goes
    (where its block keeps another: `if isinstance(...): return opt.apply_gradient(g)`
    before the TrainState's `return`)."""
    test, n = node.test, self.n
    if isinstance(node.orelse, cst.If):
      self._elifs.add(id(node.orelse))  # (`elif isinstance(...)`: its parent needs an If there)
    if (node.orelse is None and (not self._block_sizes or self._block_sizes[-1] < 2)) or (
        id(node) in self._elifs) or not (
        isinstance(test, cst.Call) and len(test.args) == 2 and not test.args[0].star
        and not test.args[1].star and n.qnames(test.func) & api.TYPE_TESTS
        and n.symbol(test.args[1].value) == 'Optimizer'):
      return None
    self.f.legacy_branches[id(node)] = node
    self.f.dual_members.add(id(test.args[1].value))
    test.visit(self)
    if node.orelse is not None:
      node.orelse.visit(self)
    return False

  def _dual_support(self, classes: cst.Tuple) -> None:
    """``isinstance(x, (flax.optim.Optimizer, train_state.TrainState))``: code that takes
    both. Its legacy members (``Facts.dual_members``) need no conversion: the tuple drops
    them (OM015), the TrainState branch is the one a migrated value takes."""
    n = self.n
    elements = [e.value for e in classes.elements if not isinstance(e, cst.StarredElement)]
    if len(elements) != len(classes.elements) or not any(
        n.qnames(e) & api.TRAIN_STATE_CLASSES for e in elements):
      return
    legacy = [e for e in elements if n.symbol(e) == 'Optimizer']
    if legacy:
      self.f.dual_tuples[id(classes)] = [id(e) for e in legacy]
      self.f.dual_members.update(id(e) for e in legacy)

  def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
    self._function_stack.pop()

  def visit_Param(self, node: cst.Param) -> None:
    if id(node) in self._receivers:
      return
    if (b := self.n.binding(node.name)):
      self.f.params.add(b)
      annotation = node.annotation.annotation if node.annotation is not None else None
      if annotation is not None and self.n.symbol(annotation) == 'Optimizer':
        self.f.opt_vars.add(b)
      if annotation is not None and self.n.symbol(annotation) == 'OptimizerDef':
        self.f.def_vars[b] = None  # a def of unknown kind: `.create` on it is still converted
      if annotation is not None and self._names_container(annotation):
        self.f.container_params.add(b)  # `tstate: TrainState`: its `.state` is its own field

  def _names_container(self, annotation, depth: int = 0) -> bool:
    """``annotation`` names a class with optimizer fields: this module's, another module's
    (``codemod.flow.Fields``), or a module-level alias of one (``TrainState =
    training_task.TrainState``)."""
    f, n = self.f, self.n
    if isinstance(annotation, cst.Name) and annotation.value in f.container_classes:
      return True
    if f.flow is None or not self._field_classes or not isinstance(
        annotation, (cst.Name, cst.Attribute)):
      return False
    if any(f.flow.resolve_fields(q) is not None for q in n.qnames(annotation)):
      return True
    if depth == 0 and isinstance(annotation, cst.Name):
      found = n.assignment(annotation)
      return found is not None and len(found[0]) == 1 and self._names_container(found[1], 1)
    return False

  def visit_Return(self, node: cst.Return) -> None:
    f, value = self.f, node.value
    if len(self._function_stack) == 1 and not self._class_depth:  # (read after the visit)
      f.top_returns.setdefault(self._function_stack[0], []).append(value)
    if value is not None and self.n.is_def(value):
      self.placed_defs.add(id(value))  # escaping below, or a def factory's (codemod.flow)
      top = len(self._function_stack) == 1 and not self._class_depth
      # a method of a module-level class returning a table def (meliad's gin-configured
      # `AdamConfig.create_optimizer_def(self)`): a def factory its callers reach by name
      method = (len(self._function_stack) == 1 and self._class_depth == 1
                and self._class_levels == [0] and not self._subclass_depth
                and self.n.legacy_def(value) in spec_lib.SPECS)
      name = (f'{self._classes[0]}.{self._function_stack[0]}' if method
              else self._function_stack[0] if top else None)
      if not (name and self._own_def_factory(name) is not None):
        f.escaping[id(value)] = value  # (a converted def factory returns its transformation)
      elif (user := self.n.def_call(value)) is not None and self.n.is_user_def(user):
        # a user OptimizerDef (here or another module's) returned by a converted def
        # factory: its transformation is `optim_compat.to_optax(...)`, wrapped where built
        f.user_def_wraps.add(id(user))
      if name:
        f.def_factories.add(name)  # its callers `.create` the def
        if self._returns_groups(value):
          f.group_def_factories.add(name)
    if value is not None and self._function_stack and (
        produces_optimizer(self.n, value)
        or (isinstance(value, cst.Name) and self.n.binding(value) in f.opt_vars)):
      f.opt_factories.add(self._function_stack[-1])
      if len(self._function_stack) == 1 and not self._class_depth:
        f.module_factories.add(self._function_stack[0])
    elif (value is not None and self._function_stack
          and isinstance(returned := self._dict_of(value), cst.Dict)
          and (keys := {e.key.evaluated_value for e in returned.elements
                        if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                        and self._holds_optimizer(e.value)})):
      f.bundle_factories.add(self._function_stack[-1])  # `return {'optim': optim, ...}`
      f.bundle_keys.setdefault(self._function_stack[-1], set()).update(keys)
    elif (value is not None and self._function_stack
          and isinstance(value, (cst.Tuple, cst.List, cst.Dict))
          and any(produces_optimizer(self.n, v)
                  or (isinstance(v, cst.Name) and self.n.binding(v) in f.opt_vars)
                  for v in container_values(value))):
      f.bundle_factories.add(self._function_stack[-1])  # `return optimizer, lr`
      if isinstance(value, (cst.Tuple, cst.List)):
        f.bundle_positions.setdefault(self._function_stack[-1], set()).update(
            i for i, e in enumerate(value.elements) if isinstance(e, cst.Element) and (
                produces_optimizer(self.n, e.value) or (isinstance(e.value, cst.Name) and
                                                        self.n.binding(e.value) in f.opt_vars)))

  def _holds_optimizer(self, value) -> bool:
    return produces_optimizer(self.n, value) or (
        isinstance(value, cst.Name) and self.n.binding(value) in self.f.opt_vars)

  def _dict_of(self, value):
    """``value``, or the dict display a name returned is bound to once (``returns = {...}``)."""
    if isinstance(value, cst.Name) and (found := self.n.assignment(value)) is not None:
      return found[1]
    return value

  # -- bindings -------------------------------------------------------------------------------
  def _target_bindings(self, target):
    """Bindings of the names a for/comprehension target binds (unpacking included)."""
    return self.n.name_bindings(target_names(target))

  def visit_For(self, node: cst.For) -> None:
    bindings = set(self._target_bindings(node.target))
    self.f.loop_vars.update(bindings)
    self.rebinds.update(bindings)  # `for opt in batches:` rebinds a name an optimizer may hold

  def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
    if isinstance(node.target, cst.Name) and (b := self.n.binding(node.target)):
      if produces_optimizer(self.n, node.value):
        self.f.opt_vars.add(b)
      else:
        self.rebinds.add(b)

  def visit_WithItem(self, node: cst.WithItem) -> None:
    if node.asname is not None:
      self.rebinds.update(self._target_bindings(node.asname.name))

  def visit_CompFor(self, node: cst.CompFor) -> None:
    self.f.loop_vars.update(self._target_bindings(node.target))

  def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
    n, f = self.n, self.f
    if n.symbol(node.annotation.annotation) == 'Optimizer':
      f.opt_vars.update(n.name_bindings([node.target]))
    if (self._class_depth and not self._function_stack and isinstance(node.target, cst.Name)
        and any(n.symbol(x) in ('Optimizer', 'ReplicatedOptimizer') for x in m.findall(
            node.annotation, m.Name() | m.Attribute()))):
      # `optimizer: optim.Optimizer` (also Optional[...]) in a dataclass / NamedTuple: a
      # proof that `<anything>.optimizer` holds one, wherever it is read in this file
      f.annotated_fields.add(node.target.value)
      if self._class_depth == 1:  # a module-level class: other modules may read its fields
        fields = f.declared_fields.setdefault(self._classes[-1], [])
        if node.target.value not in fields:
          fields.append(node.target.value)
    if node.value is not None and (n.legacy_def(node.value) or n.is_user_def(node.value)):
      f.def_vars.update(dict.fromkeys(n.name_bindings([node.target]), node.value))
      if isinstance(node.target, cst.Name):
        self.placed_defs.add(id(node.value))

  def flow_source(self, value):
    """The factory whose optimizer ``value`` is: its call, or a step/replicate of a name
    holding one (``opt.apply_gradient(g)``, ``jax_utils.replicate(opt)``)."""
    n, f = self.n, self.f
    found = n.factory_of_call(value)
    if isinstance(value, cst.Name):  # an alias: `best = opt`
      return f.flow_vars.get(n.binding(value))
    if found is not None or not isinstance(value, cst.Call):
      return found
    func = value.func
    if n.qnames(func) & api.REPLICATE_FNS:  # before `x.unreplicate(...)`: `jax_utils` is no optimizer
      if value.args and isinstance(value.args[0].value, cst.Name):
        return f.flow_vars.get(n.binding(value.args[0].value))
      return None
    if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name('apply_gradient') | m.Name('replicate')
                                   | m.Name('unreplicate') | m.Name('replace'))):
      return f.flow_vars.get(n.binding(func.value))
    return None

  def _own_def_factory(self, function: str):
    """This module's function ``function`` when the run converts it as a def factory (every
    caller ``.create`` s what it returns: ``codemod.flow``), else None."""
    flow = self.f.flow
    if flow is None or not flow.module:
      return None
    found = flow.resolve_def(f'{flow.module}.{function}')
    return found if found is not None and found.allowed else None

  def def_factory_of(self, value):
    """The other module's function returning a legacy def that ``value`` calls, if any."""
    if not isinstance(value, cst.Call):
      return None
    for q in sorted(self.n.qnames(value.func)):
      if (found := self.f.flow.resolve_def(q)) is not None:
        return found
    return None

  def makes_container(self, value) -> bool:
    """``value`` constructs a class with optimizer fields: this module's, or another module's
    that the run converts (``codemod.flow.Fields``), or calls another module's function that
    returns one the run converts (``codemod.flow.ContainerFactory``)."""
    if not isinstance(value, cst.Call):
      return False
    f = self.f
    if isinstance(value.func, cst.Name) and value.func.value in f.container_classes:
      return f.uses_legacy
    if f.flow is None or not self._field_classes:
      return False
    func = value.func
    if isinstance(func, cst.Name) and (alias := self.n.assignment(func)) is not None and len(
        alias[0]) == 1 and isinstance(alias[1], (cst.Name, cst.Attribute)):
      func = alias[1]  # a module-level alias: `TrainState = training_task.TrainState`
    found = next((x for q in sorted(self.n.qnames(func))
                  if (x := f.flow.resolve_fields(q) or f.flow.resolve_container_factory(q))
                  is not None), None)
    if getattr(found, 'held', ''):
      f.held_containers[id(value)] = found  # (kept legacy for a reader: codemod.flow)
    return found is not None and found.converted

  def _returns_groups(self, value) -> bool:
    """``value`` (a returned def) is a ``MultiOptimizer``, or a class of this module
    subclassing it (DETR's ``MultiOptimizerWithLogging``): its hyper-parameters are one per
    group, which ``optim_compat.to_optax`` cannot inject a learning rate into."""
    if self.n.legacy_def(value) == api.MULTI:
      return True
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
      return False
    return any(cls.name.value == value.func.value and any(
        code(b.value).rsplit('.', 1)[-1] == api.MULTI for b in cls.bases)
        for cls in self.f.subclasses)

  def _held_container(self, call: cst.Call) -> None:
    """``call`` builds another module's class with optimizer fields that the run keeps legacy
    for a reader, anywhere (``jax_utils.replicate(train_utils.TrainState(optimizer=o, ...))``,
    not only as an assigned or returned value) and hands it an optimizer field: registered in
    ``f.held_containers`` (the file keeps its legacy code with it, OM123)."""
    f = self.f
    self.makes_container(call)
    found = f.held_containers.get(id(call))
    fields = getattr(found, 'fields', None)  # (a container factory's arguments are its own)
    if fields is not None and not any(a.keyword is None or a.keyword.value in fields
                                      for a in call.args):
      del f.held_containers[id(call)]  # (no optimizer handed to it here)

  def def_created(self, value):
    """``value`` is ``d.create(...)`` on another module's def (:class:`codemod.flow.DefFactory`,
    directly or through a name): that factory, else None."""
    f = self.f
    if f.flow is None or not m.matches(value, m.Call(func=m.Attribute(attr=m.Name('create')))):
      return None
    recv = value.func.value
    if isinstance(recv, cst.Name):
      return f.flow_def_vars.get(self.n.binding(recv))
    found = self.def_factory_of(recv)
    return None if found is not None and found.allowed else found

  def visit_AugAssign(self, node: cst.AugAssign) -> None:
    self.f.stored.add(id(node.target))

  def visit_Del(self, node: cst.Del) -> None:
    self.f.stored.add(id(node.target))

  def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
    """``(o2 := opt)``: the walrus name holds what ``opt`` holds, an optimizer as an alias
    (``o2 = opt``) or as made there (``(o := d.create(p))``); the expression is read as its
    value (:meth:`codemod.plan.queries.Queries.is_optimizer`). helper-42's D2: its
    ``.target`` was left with no TODO in a converted file."""
    n, f = self.n, self.f
    if not isinstance(node.target, cst.Name) or (b := n.binding(node.target)) is None:
      return
    value = node.value
    if (isinstance(value, cst.Name) and n.binding(value) in f.opt_vars
        and n.binding(value) not in f.rebound) or produces_optimizer(n, value):
      f.opt_vars.add(b)

  def visit_Assign(self, node: cst.Assign) -> None:
    n, f = self.n, self.f
    value = node.value
    targets = [t.target for t in node.targets]
    f.stored.update(map(id, targets))
    for t in targets:
      if isinstance(t, (cst.Tuple, cst.List)):
        self._unpacking(t, value)
    if len(targets) == 1 and m.matches(value, DEF_HYPER_PARAMS) and m.matches(
        targets[0], m.Name() | m.Tuple(elements=[m.ZeroOrMore(m.Element(value=m.Name()))])
        | m.List(elements=[m.ZeroOrMore(m.Element(value=m.Name()))])):
      # `hparams = opt.optimizer_def.hyper_params` / `(a_hp, b_hp) = ...`: per-group rates
      line = self._line
      removable = (line is not None and len(line.body) == 1 and line.body[0] is node
                   and not any(ll.comment for ll in line.leading_lines)
                   and line.trailing_whitespace.comment is None
                   and (not self._block_sizes or self._block_sizes[-1] > 1))
      f.hp_assigns[id(value)] = line if removable else None
    if self._class_depth and not self._function_stack and n.legacy_def(value):
      f.escaping[id(value)] = value  # `class Cfg: opt_def = Adam(...)`: used as Cfg.opt_def
    if isinstance(value, cst.Name) and n.binding(value) in f.opt_vars and \
        n.binding(value) not in f.rebound:
      f.opt_vars.update(n.name_bindings(targets))  # `best = opt`: an alias
    for t in targets:
      if (chain := attr_chain(t)) is not None:
        self._chain_assigned(chain, value)
    if m.matches(value, m.Call(func=m.Attribute(attr=m.Name('create')))):
      f.create_keys[id(value)] = frozenset(
          ('chain', chain) if (chain := attr_chain(t)) is not None else ('name', n.binding(t))
          for t in targets if isinstance(t, (cst.Name, cst.Attribute)))
    if len(targets) == 1 and isinstance(targets[0], cst.Name) and wrapper_of(n, value):
      f.wrapped.append((node, value))  # (`jax.pmap(steps.train_step)` too: codemod.flow)
      if wraps_factory(n, value):
        f.opt_factories.add(targets[0].value)  # `p_step = jax.pmap(step)`: p_step(...) makes one
    f.assignments.append((targets, value))
    f.assigned.update((id(t), (targets, value)) for t in targets if isinstance(t, cst.Name))
    if len(targets) == 1 and isinstance(targets[0], cst.Name) and (b := n.binding(targets[0])):
      block = self._blocks[-1] if self._blocks else None
      self.assign_sites.setdefault(b, []).append((targets[0], value, block))
      f.array_vars[b] = f.array_vars.get(b, True) and makes_bare_array(n, value)
    source = self.flow_source(value) if f.flow is not None else None
    if source is None and f.flow is not None:
      source = self.def_created(value)  # `opt = get_optimizer(cfg).create(p)`: kept legacy there
    if (default := self._def_default(value, targets)) is not None:
      # `opt_def = params.get('optimizer', optim.Adam(lr))`: the default def converts in place;
      # the name holds a def of unknown kind, `.create`d here (what callers put there must be
      # an Optax transformation after the rewrite: the report says so, OM016)
      f.def_vars.update(dict.fromkeys(n.name_bindings(targets), None))
      f.def_defaults[id(value)] = default
      f.def_default_calls[id(default)] = value
      self.placed_defs.add(id(default))
      self._group_args.add(id(value.args[1]))
    if (made := n.converted_def_factory(value)) is not None:
      # `opt_def = get_optimizer(cfg)`: an Optax transformation once converted, `.create`d here
      f.def_vars.update(dict.fromkeys(n.name_bindings(targets), None))
      f.def_var_factories.update(dict.fromkeys(n.name_bindings(targets), made))
      if len(targets) == 1 and isinstance(targets[0], cst.Name):
        self.def_names.append((targets[0], made))
        self.consumed_defs.add(id(value))
    elif (isinstance(value, cst.Name) and len(targets) == 1 and isinstance(targets[0], cst.Name)
          and (made := f.def_var_factories.get(n.binding(value))) is not None):
      # `backbone_optim = other_optim` (scenic's get_backbone_multioptimizer): another name for
      # a converted def factory's transformation, its own uses read as the first name's are
      for b in n.name_bindings(targets):
        f.def_vars.setdefault(b, None)
        f.def_var_factories.setdefault(b, made)
      self.def_names.append((targets[0], made))
      self.create_receivers.add(id(value))
    elif f.flow is not None and (made := self.def_factory_of(value)) is not None:
      f.flow_def_vars.update(dict.fromkeys(n.name_bindings(targets), made))
    if source is not None:
      f.flow_vars.update(dict.fromkeys(n.name_bindings(targets), source))
    if n.legacy_def(value) or n.is_user_def(value):
      f.def_vars.update(dict.fromkeys(n.name_bindings(targets), value))
      if len(targets) == 1 and isinstance(targets[0], cst.Name):
        self.placed_defs.add(id(value))
    elif id(value) in f.def_defaults:
      pass  # (a def, above)
    elif n.is_traversal(value) and isinstance(value, cst.Call):
      f.traversal_vars.update(dict.fromkeys(n.name_bindings(targets), value))
    elif produces_optimizer(n, value):
      f.opt_vars.update(n.name_bindings(targets))
    elif source is not None:
      pass  # another module's optimizer, kept legacy there: flagged where it is used
    elif isinstance(value, cst.Name) and n.binding(value) in f.opt_vars:
      pass  # an alias (above)
    elif self.makes_container(value):
      f.container_vars.update(n.name_bindings(targets))  # `state = TrainState(optimizer=opt)`
      f.container_values.add(id(value))
      f.rebound.update(n.name_bindings(targets))
    elif (isinstance(value, cst.Attribute) and value.attr.value in f.annotated_fields
          and (f.uses_legacy or value.attr.value in f.flow_fields)):
      f.opt_vars.update(n.name_bindings(targets))  # `optimizer = state.optimizer` (a field)
      if value.attr.value in f.flow_fields:  # (of another module's class the run converts)
        f.field_aliases.update(n.name_bindings(targets))
    elif self._pickle_round_trip(value, targets):
      f.pickle_loaded.update(n.name_bindings(targets))
    elif not _passes_name_through(value, targets):
      # `opt = Thing()`: this name also holds something else; never rewrite it blindly
      f.rebound.update(n.name_bindings(targets))
    self._gradient_assign(node, targets, value)

  def _pickle_round_trip(self, value, targets) -> bool:
    """``state = pickle.load(f)`` where each use of ``state`` reads ``.target`` or
    ``.state.step``, or pickles it: what the file's own pickling of its optimizer wrote (a
    TrainState without its tx, OM018), not a rebinding. Another use (stepped, handed on)
    keeps the name rebound (a loaded TrainState has no tx to step with); where one of its
    uses is an Optimizer member, the load is recorded (``Facts.pickle_unsure``: flagged
    where the file's pickles are TrainStates)."""
    n, f = self.n, self.f
    if not (len(targets) == 1 and isinstance(targets[0], cst.Name) and isinstance(value, cst.Call)
            and n.qnames(value.func) & api.PICKLE_LOADERS):
      return False
    scope = n.scope(targets[0])
    accesses = list(scope.accesses[targets[0].value]) if scope is not None else []
    if self._pickle_uses is None:
      module = self._module
      self._pickle_uses = {id(a.value) for a in m.findall(module, _TARGET_READ)}
      self._pickle_uses |= {id(a.value.value) for a in m.findall(module, _STATE_STEP_READ)}
      self._member_uses = {id(a.value) for a in m.findall(module, _MEMBER_READ)}
      # (handed on as an optimizer: `S(optimizer=o)`, `s.replace(optimizer=o)`)
      self._member_uses |= {id(a.value) for a in m.findall(module, _OPTIMIZER_ARG)
                            if a.keyword.value in f.annotated_fields
                            or named_like_optimizer(a.keyword)}
      for call in m.findall(module, m.Call(args=[m.Arg(keyword=None, star=''), m.ZeroOrMore()])):
        if n.qnames(call.func) & api.PICKLERS:
          f.pickled.append(pickled_value(n, call))
          self._pickle_uses.add(id(f.pickled[-1]))
    if bool(accesses) and all(id(a.node) in self._pickle_uses for a in accesses):
      return True
    if any(id(a.node) in self._member_uses for a in accesses):
      f.pickle_unsure[n.binding(targets[0])] = value
    return False

  def _chain_assigned(self, chain: str, value) -> None:
    n, f = self.n, self.f
    if len(self._classes) == 1 and self._function_stack and chain.startswith('self.'):
      self.class_chains.setdefault(self._classes[0], set()).add(chain[len('self.'):])
    inner = (attr_chain(value.args[0].value) if isinstance(value, cst.Call) and value.args
             and n.qnames(value.func) & api.REPLICATE_FNS else None)
    if inner is None and isinstance(value, cst.Call) and any(
        attr_chain(a.value) == chain for a in value.args):
      inner = chain  # passed through: `self.opt = restore_checkpoint(d, self.opt)`
    if inner is not None:
      self.chain_copies.append((chain, inner))  # settled after the visit
    elif produces_optimizer(n, value) or (
        isinstance(value, cst.Name) and n.binding(value) in f.opt_vars):
      f.attr_chains.add(chain)
      if (factory := n.factory_of_call(value)) is not None and factory.converted:
        f.attr_flow[chain] = factory  # `self.opt = create_optimizer(p)`, converted there
    elif (made := self.def_created(value)) is not None:
      f.flow_def_chains[chain] = made  # `self.opt = get_optimizer(cfg).create(p)`
    elif n.is_def(value):
      # `self.opt_def = optim.Momentum(...)` in setUp, `.create`d in other methods: an
      # attribute holding a def is not followed, so the def is handed on (OM114)
      f.escaping[id(value)] = value
    elif not m.matches(value, m.Name('None')):
      f.attr_other.add(chain)  # `self.opt = Thing()`: never rewritten blindly

  def _gradient_assign(self, node, targets, value) -> None:
    """``a, b = opt.compute_gradient(f)`` and ``opt, loss = opt.optimize(f)`` (OM011)."""
    n, f = self.n, self.f
    if (len(targets) == 1 and m.matches(targets[0], m.Tuple())
        and m.matches(value, m.Call(func=m.Attribute(attr=m.Name('compute_gradient')
                                                     | m.Name('compute_gradients'))))
        and len(targets[0].elements) in (2, 3)
        and all(isinstance(e, cst.Element) for e in targets[0].elements)
        and len(value.args) == 1 and value.args[0].keyword is None and not value.args[0].star):
      f.grad_assigns.add(id(node))
      f.handled.add(id(value.func))
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
      f.optimize_assigns.add(id(node))
      f.optimize_calls.append(value)
      f.handled.add(id(value.func))
      first = list(n.name_bindings([targets[0].elements[0].value]))
      f.opt_vars.update(first)
      f.rebound.difference_update(first)

  def _unpacking(self, target, value) -> None:
    """``a, b = ...``: a name an optimizer may hold keeps it only when passed through
    (``opt, metrics = train_step(opt, batch)``, ``opt, loss = opt.optimize(f)``) or
    given an optimizer element-wise (``opt, n = Adam(...).create(p), 0``)."""
    n, f = self.n, self.f
    elements = [e.value for e in target.elements if isinstance(e, cst.Element)]
    values = ([e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List))
              and len(value.elements) == len(target.elements) else None)
    for i, element in enumerate(elements):
      for name in target_names(element):
        b = n.binding(name)
        if b is None:
          continue
        if values is not None and isinstance(element, cst.Name):
          v = values[i]
          if f.flow is not None and (source := self.flow_source(v)) is not None:
            f.flow_vars[b] = source  # `o, n = opt, 0` / `o, = [opt]`: another module's
          if produces_optimizer(n, v) or (isinstance(v, cst.Name) and v.value == name.value):
            continue
          if isinstance(v, cst.Name) and n.binding(v) in f.opt_vars:
            f.opt_vars.add(b)
            continue
        elif values is None and (_passes_name_through(value, [name]) or (
            i == 0 and m.matches(value, m.Call(func=m.Attribute(attr=m.Name('optimize')))))
            or _passes_tuple_through(value, elements, i)):
          continue  # (`new, loss = opt.optimize(f)`: the first is an optimizer)
        elif (values is None and isinstance(element, cst.Name) and f.uses_legacy
              and i in f.bundle_positions.get(_own_function(value), ())):
          f.opt_vars.add(b)  # `opt, hlo = self.run_layer(...)`: this file's function returns it there
          continue
        self.rebinds.add(b)

  # -- calls ----------------------------------------------------------------------------------
  def visit_Subscript(self, node: cst.Subscript) -> None:
    if (failure := dynamic_import(self.n, node)) is not None:
      self.f.uses_legacy = True
      self.f.dynamic_imports[id(node)] = failure
    if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
      self._legacy_key_read(node.value, node.slice[0].slice.value, node)

  def _legacy_key_read(self, value, key, node) -> None:
    """``x['target']`` / ``x.get('state')``: recorded by what ``x`` is (a name's binding,
    else the call itself) in ``Facts.legacy_key_reads``."""
    if not (isinstance(key, cst.SimpleString) and key.evaluated_value in api.CHECKPOINT_LEGACY_KEYS):
      return
    owner = self.n.binding(value) if isinstance(value, cst.Name) else (
        id(value) if isinstance(value, cst.Call) else None)
    if owner is not None:
      self.f.legacy_key_reads.setdefault(owner, []).append((node, code(key)))

  def visit_Arg(self, node: cst.Arg) -> None:
    if self.n.is_def(node.value) and id(node) not in self._group_args | self._tx_args \
        and id(node) not in self._sink_args:
      self.f.escaping[id(node.value)] = node.value

  def visit_Call(self, node: cst.Call) -> None:
    n, f = self.n, self.f
    f.call_funcs.add(id(node.func))
    if last_name(node.func) in self._field_classes and id(node) not in f.held_containers:
      self._held_container(node)  # (the last name first: a cheap test, as for the others)
    if m.matches(node.func, _DEF_RESET):
      f.def_resets[id(node.func.value)] = node
    if isinstance(node.func, cst.Attribute) and node.func.attr.value == 'get' and \
        m.matches(node, _GET_CALL):
      self._legacy_key_read(node.func.value, node.args[0].value, node)
    if (failure := dynamic_import(n, node)) is not None:
      f.uses_legacy = True
      f.dynamic_imports[id(node)] = failure
    f.calls_by_func[id(node.func)] = node
    if len(node.args) == 2 and isinstance(node.args[1].value, cst.Tuple) and (
        n.qnames(node.func) & api.TYPE_TESTS):
      self._dual_support(node.args[1].value)
    reads = [chain for arg in node.args if arg.star == ''
             and isinstance(chain := _state_of(arg.value), cst.Attribute)]
    if reads and n.qnames(node.func) & api.STATE_READERS:
      f.state_reads.update(map(id, reads))  # `tree_leaves(opt.state.param_states)`: read only
    if m.matches(node.func, m.Attribute(attr=m.Name('replace'))) and (
        written := next((a.value for a in node.args
                         if a.keyword is not None and a.keyword.value == 'state'), None)):
      # `opt.replace(state=reset(opt.state, ...))`: state surgery; the reads of the same
      # optimizer's state inside what is written back are reads of the legacy view
      f.state_writes[id(node)] = node
      recv = node.func.value
      f.state_reads.update(id(a) for a in m.findall(written, m.Attribute(attr=m.Name('state')))
                           if a.value.deep_equals(recv))
    f.double_starred.update(id(a.value) for a in node.args
                            if a.star == '**' and isinstance(a.value, cst.Name))
    if f.flow is not None and (sink := self._sink_called(node)) is not None:
      self._sink_call(node, sink)
    if (made := n.converted_def_factory(node)) is not None:
      f.uses_legacy = True  # it makes a flax.optim def today
      f.def_uses[made.qualified] = made
      if made.method:  # (called by its name: any method of that name may answer)
        f.def_uses.update((m_.qualified, m_) for m_ in f.flow.def_methods(made.method))
      self.def_factory_calls.append((node, made))
    if (created := create_receiver(n, node)) is not None:
      self.consumed_defs.add(id(created))
      if (inner := jitted_create(n, node)) is not None:
        self._jitted_creates.add(id(inner))  # (the bound `create` it hands jax.jit)
      elif {'params', 'tx'} <= {a.keyword.value for a in node.args if a.keyword is not None}:
        f.train_state_creates.append(node)  # (TrainState.create's own keywords)
      if isinstance(created, cst.Name):
        self.create_receivers.add(id(created))
      for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == 'tx':
          # `TrainState.create(..., tx=opt_def)`: what this codemod writes for `opt_def.create(p)`
          # (a second run over its output; a def factory that returns Optax today)
          self.consumed_defs.add(id(arg.value))
          if (wrapped := _to_optax_arg(n, arg.value)) is not None:
            # (`tx=optim_compat.to_optax(<a def>)`: a user def's, or a shimmed factory's)
            self.consumed_defs.add(id(wrapped))
            self._tx_args.add(id(arg.value.args[0]))
            if isinstance(wrapped, cst.Name):
              self.create_receivers.add(id(wrapped))
          self._tx_args.add(id(arg))
          if isinstance(arg.value, cst.Name):
            self.create_receivers.add(id(arg.value))
    if (factory := n.factory_of_call(node)) is not None:
      f.flow_used[factory.qualified] = factory
    elif (factory := n.factory_of_call(node, bundle=True)) is not None and (
        factory.converted or factory.held):
      # `o, lr = make_pair(p)`: its items are flagged (converted), or shim Optimizers (held
      # for a legacy user: this file, whose reads of them keep it legacy, attributes.py)
      f.flow_used[factory.qualified] = factory
    name = n.legacy_def(node)
    if name == api.WEIGHT_NORM:
      self._group_args.update(id(a) for a in node.args)
    elif name == api.MULTI:
      subs = [a.value.elements[1].value for a in node.args
              if isinstance(a.value, cst.Tuple) and len(a.value.elements) == 2]
      self.placed_defs.update(map(id, subs))
      # a group's def made by a converted def factory (`(trav, get_optimizer(cfg))`, or a name
      # bound to one) is used as a def: the MultiOptimizer converts with it, or the file keeps
      # its legacy code (multi_problem), and the factory with it (codemod.flow)
      self.consumed_defs.update(map(id, subs))
      self.create_receivers.update(id(s) for s in subs if isinstance(s, cst.Name))
    if not name and f.flow is not None and n.shimmed_def_factory(node) is not None:
      f.shimmed_def_calls.append(node)  # (a def of unknown layout: no legacy view here)
    if name:
      f.def_calls.append(node)
      if name == api.WEIGHT_NORM and node.args and n.legacy_def(node.args[0].value):
        f.wn_inner.add(id(node.args[0].value))
    func = node.func
    if created is not None and n.is_def(created):
      f.create_calls.append(node)  # (`jax.jit(d.create, backend='cpu')(p)` too)
    elif created is not None and not self._subclass_depth:
      recv = created  # (`jax.jit(get_optimizer(cfg).create)(p)` too: helper-22)
      made = None
      if f.flow is not None:
        made = (f.flow_def_vars.get(n.binding(recv)) if isinstance(recv, cst.Name)
                else self.def_factory_of(recv))
      if made is not None or (isinstance(recv, cst.Name) and _DEF_LOOKING.fullmatch(recv.value)
                              and n.binding(recv) not in f.def_vars) or (
          isinstance(recv, cst.Call) and _DEF_CALL_LOOKING.search(last_name(recv.func))):
        # (a parameter, or a name another library's function gave: `optimizer_def =
        # dqn_agent.create_optimizer(...)` from a package outside the run)
        f.flow_def_creates.append((node, made))
    if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))) and not self._subclass_depth \
        and not n.given_a_function(node):
      # (inside a user OptimizerDef subclass it is the def's own method: kept on the shim;
      # given a Python function, `model.apply_gradient(loss_fn)`, it is the user's own class's)
      f.apply_calls.append(node)
      recv = func.value
      if isinstance(recv, cst.Name) and (b := n.binding(recv)):
        f.opt_vars.add(b)
      elif (chain := attr_chain(recv)) is not None:
        f.attr_chains.add(chain)
    if m.matches(func, m.Attribute(attr=m.Name('replicate') | m.Name('unreplicate'))):
      f.method_calls[id(node)] = node
      f.handled.add(id(func))
      if isinstance(func.value, cst.Name) and (b := n.binding(func.value)) and \
          all(a.keyword is not None for a in node.args):
        f.opt_vars.add(b)  # flax.optim's own methods, as for apply_gradient
    if n.qnames(func) & (set(api.RESTORES) | api.RAW_RESTORES):
      f.restores.append(node)
    elif n.qnames(func) & set(api.SAVES):
      f.saves.append(node)

  def leave_Module(self, node: cst.Module) -> None:
    self._unplaced_defs()
    following.settle(self)
    self._def_misuses()

  def _unplaced_defs(self) -> None:
    """Def calls the rewrite cannot follow to their ``.create``: an element of a list, dict
    or tuple (``defs = [Adam(), Momentum()]``, ``d, e = Adam(), Sgd()``), a branch of
    ``a if c else b``, a lambda's body, a chained ``a = b = Adam()``. As Optax transformations
    they would have no ``.create``, so they are handed on (``Facts.escaping``, OM114)."""
    f = self.f
    placed = self.placed_defs | self.consumed_defs | f.wn_inner | set(f.escaping)
    for call in f.def_calls:
      if id(call) not in placed:
        f.escaping[id(call)] = call

  def _def_misuses(self) -> None:
    """The converted def factories (``f.def_uses``) whose result this module uses other than
    by ``.create`` (directly, or through a name read only so): ``f.def_misused``. The run
    then keeps those factories legacy (``codemod.flow``)."""
    f, n = self.f, self.n
    for call, made in self.def_factory_calls:
      if id(call) not in self.consumed_defs:
        f.def_misused.add(made.qualified)
    for target, made in self.def_names:
      scope = n.scope(target)
      accesses = scope.accesses[target.value] if scope is not None else ()
      if any(id(a.node) not in self.create_receivers for a in accesses):
        f.def_misused.add(made.qualified)


def _passes_name_through(value, targets) -> bool:
  """``x = f(x, ...)``: a step function returning its (optimizer) argument."""
  if not isinstance(value, cst.Call):
    return False
  names = {t.value for t in targets if isinstance(t, cst.Name)}
  if m.matches(value.func, m.Attribute(value=m.Name())) and value.func.value.value in names:
    return True  # `x = x.method(...)`
  return any(isinstance(a.value, cst.Name) and a.value.value in names for a in value.args)


def _passes_tuple_through(value, elements, i: int) -> bool:
  """``opt, ema = f((opt, ema))``: a call given the targets, in their order, as one tuple
  (or list) argument (``jax_utils.replicate((opt, ema))``, a checkpoint restore into
  ``[opt, dynamic_scale]``), so that element ``i`` keeps what it held."""
  if not isinstance(value, cst.Call) or not isinstance(elements[i], cst.Name):
    return False
  names = [e.value if isinstance(e, cst.Name) else None for e in elements]
  return any(isinstance(a.value, (cst.Tuple, cst.List)) and not a.star and [
      e.value.value if isinstance(e.value, cst.Name) else None for e in a.value.elements] == names
      for a in value.args)


# -- flax.optim reached by name at run time -------------------------------------------------
def dynamic_import(n: Names, node) -> Optional[str]:
  """How ``node`` fails on Flax >= 0.6 if it reaches flax.optim by name, else None:
  ``importlib.import_module('flax.optim[.adam]')`` / ``__import__(...)`` (also
  ``import_module('.optim', 'flax')``), ``sys.modules['flax.optim']`` (and ``.get``,
  ``.pop``, ``.setdefault``), ``getattr(flax, 'optim'[, default])``."""
  if isinstance(node, cst.Subscript):
    if (len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
        and legacy_module_name(node.slice[0].slice.value)
        and 'sys.modules' in n.qnames(node.value)):  # (the cheap tests first)
      return 'a KeyError'
    return None
  if not isinstance(node, cst.Call) or not node.args or any(a.star for a in node.args) \
      or not any(isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString))
                 for a in node.args):
    return None
  fn = n.qnames(node.func)
  args = {a.keyword.value if a.keyword is not None else i: a.value
          for i, a in enumerate(node.args)}
  if fn & {'importlib.import_module', 'builtins.__import__'}:
    name = args.get(0, args.get('name'))
    package = args.get(1, args.get('package')) if 'importlib.import_module' in fn else None
    if legacy_module_name(name) or (
        isinstance(package, (cst.SimpleString, cst.ConcatenatedString))
        and package.evaluated_value == 'flax'
        and legacy_module_name(name, prefix='.optim')):
      return 'a ModuleNotFoundError'
    return None
  if m.matches(node.func, m.Attribute(attr=m.Name('get') | m.Name('pop') | m.Name('setdefault'))) \
      and 'sys.modules' in n.qnames(node.func.value) and legacy_module_name(args.get(0)):
    return {'get': 'None (or the default)', 'pop': 'a KeyError (or the default)',
            'setdefault': 'the default'}[node.func.attr.value]
  if 'builtins.getattr' in fn and len(node.args) in (2, 3) and 'flax' in n.qnames(args[0]) \
      and isinstance(args.get(1), (cst.SimpleString, cst.ConcatenatedString)) \
      and args[1].evaluated_value == 'optim':
    return 'the default' if len(node.args) == 3 else 'an AttributeError'
  return None


def _to_optax_arg(n, value):
  """``value`` is ``optim_compat.to_optax(<def>, ...)`` (what the codemod writes for a user
  def, or the def a factory left on the shim returns): that ``<def>``; else None."""
  if (isinstance(value, cst.Call) and value.args and value.args[0].keyword is None
      and not value.args[0].star and 'optim_compat.to_optax' in n.qnames(value.func)):
    return value.args[0].value
  return None
