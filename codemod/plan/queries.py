"""The questions the plan's checks ask about a module's values, over its facts.

:class:`Queries` wraps one :class:`~codemod.facts.model.Analysis` and the run's
options. It answers *is this expression an optimizer* (proven, maybe, another
module's), and holds the facts the plan derives before deciding anything
(which hyper-parameter reads resolve, which apply calls set per-group learning
rates, the calls of other modules' step functions). It never changes the facts.
"""
from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.names import attr_chain, code, kwargs, names_in_targets

#: an imported class named like an optimizer or a train state (``MyOptimizer``, ``TrainState``)
_OPTIMIZER_CLASS_LOOKING = re.compile(r'opt|state', re.I)


def _params_of(value) -> bool:
  """``value`` reads an optimizer's parameters: ``x.target`` / ``x.params``, subscripted or
  not (``opt.target['w']``)."""
  while isinstance(value, cst.Subscript):
    value = value.value
  return isinstance(value, cst.Attribute) and value.attr.value in ('target', 'params')


class Queries:
  """Read-only questions over one module's analysis."""

  def __init__(self, analysis, options):
    self.analysis = analysis
    self.n = analysis.names
    self.f = analysis.facts
    self.opts = options
    #: ids of legacy attributes some rule converts (the facts' own, and those the plan adds:
    #: an `opt.optimizer_def` a converted hyper_params read consumes)
    self.handled = set(self.f.handled)
    self.legacy_attr_ids = {id(a) for a in self.f.legacy_attrs}
    self.blocked = False    # the verdict (codemod.plan.verdict): keep the legacy code
    self.unproven = False   # nothing proves any optimizer here (no flax.optim, no flow)
    # -- derived by the families before the verdict (their ``prepare``) --
    self.inject_lr = False  # the defs inject their learning rate (some call passes one)
    self.mixed_lr = False   # only some apply calls pass one
    self.hierarchy_lr = False  # injected for a class of another module (codemod.rules.apply_gradient)
    self.group_applies: dict = {}  # id(call) -> (per-group lr expressions, labels)
    self.positional_labels = False  # MultiOptimizer groups labelled group_<i> (several multis)
    self.hp_assign_lines: set = set()  # ids of `hp = opt.optimizer_def.hyper_params` lines dropped
    self.bad_refs: dict = {}       # id(reference) -> Problem
    self.hp_values: dict = {}      # id(hyper_params read) -> the literal's source
    self.bad_hp: dict = {}         # id(hyper_params read) -> Problem
    self.hp_owner_ids: set = set()  # ids of `opt.optimizer_def` those reads consume
    self.maybe_vars: set = set()   # bindings derived from optimizers, not proven ones
    self.conflicts: list = []      # names the rewrite emits, bound here to something else
    self.train_state_alias = None  # `train_state` is bound here: the module is imported as this
    self.step_calls: dict = {}     # id(call) -> [(flow.Step, parameter, argument)]
    self.step_calls_enabled = False
    self.wrapped_args: set = set()  # ids of functions given to jax.jit / jax.pmap
    self.def_only = None           # (cache of codemod.rules.defs.def_only_uses)
    self.view_def = False          # (cache of codemod.rules.attributes.view_def; False: unset)
    self.resets: set = set()       # ids of `o.optimizer_def.create(p)` on a proven optimizer
    self._container_receivers = None  # (cache of container_receivers)
    self._foreign_receivers = None  # (cache of foreign_receivers)
    self._plain_annotated = None  # (cache of annotated_plain)
    self._pickles_converted = None  # (cache of pickles_converted)
    self._assigned_values = None  # (cache of assigned_values)
    self.bundle_item_reads = None  # (cache of codemod.rules.attributes.bundle_item_reads)

  @property
  def converts(self) -> bool:
    return not (self.blocked or self.unproven)

  # -- what an expression holds ---------------------------------------------------------------
  def is_optimizer(self, expr) -> bool:
    n, f = self.n, self.f
    if isinstance(expr, cst.NamedExpr):  # `(o2 := opt).target`: what it binds
      return self.is_optimizer(expr.value)
    if isinstance(expr, cst.Name):
      b = n.binding(expr)
      if b in f.rebound:
        return False
      if b in f.flow_vars:  # another module's optimizer: converted there or not at all
        return f.flow_vars[b].converted
      # in a file without flax.optim only the flow proves anything (a field of another
      # module's converted class read into a name: `optimizer = state.optimizer`)
      if b in f.pickle_loaded and b not in f.opt_vars:  # `x = pickle.load(f)`, read as one
        return f.uses_legacy and self.pickles_converted()
      return b in f.opt_vars and (f.uses_legacy or b in f.field_aliases)
    if self.annotated_field(expr):
      return True
    if (chain := attr_chain(expr)) is not None:  # `self.optimizer`: apply_gradient'ed here
      return (chain in f.attr_chains and chain not in f.attr_other
              and (f.uses_legacy or chain in f.attr_flow))
    if isinstance(expr, cst.Call) and (factory := n.factory_of_call(expr)) is not None:
      return factory.converted
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
        and expr.func.value in f.opt_factories and f.uses_legacy):
      return True  # `make(p).target`: a function of this file returning its optimizer
    if isinstance(expr, cst.Call) and n.qnames(expr.func) & api.REPLICATE_FNS and expr.args:
      return self.is_optimizer(expr.args[0].value)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
      recv, method = expr.func.value, expr.func.attr.value
      if method == 'create':  # `Def(...).create(p).target`
        return n.is_def(recv)
      if method == 'apply_gradient':  # `opt.apply_gradient(g).target`
        return f.uses_legacy or self.is_optimizer(recv)
      if method in ('replicate', 'unreplicate', 'replace'):
        return self.is_optimizer(recv)  # (`opt.replace(state=s).target`: an optimizer too)
    return False

  def maybe_optimizer(self, value) -> bool:
    """A value of unknown origin in a legacy (or flow-using) file that may hold an optimizer:
    a parameter, loop variable or rebound name that held one, a container item, or an
    attribute chain :meth:`mixed_chain` names (its ``.target`` is flagged, not converted)."""
    f = self.f
    if not (f.uses_legacy or f.flow_used or f.flow_fields):
      return False
    if isinstance(value, cst.Subscript) or self.mixed_chain(value):
      return True
    if isinstance(value, cst.Name) and self.n.binding(value) in self.container_receivers():
      return False  # `ts.optimizer` is read too: a container of this file's class, no Optimizer
    if (isinstance(value, cst.Name) and self.n.binding(value) in f.pickle_unsure
        and self.pickles_converted()):
      return True  # loaded from this file's pickles, also stepped or handed on
    return isinstance(value, cst.Name) and self.n.binding(value) not in f.container_params and (
        self.n.binding(value) in (f.params | f.loop_vars | self.maybe_vars)
        or self.n.binding(value) in (f.rebound & f.opt_vars))

  def maybe_read_as_optimizer(self, value) -> bool:
    """:meth:`maybe_optimizer`, for a member read off ``value`` itself (OM117): not a name
    the file also reads for a member neither an Optimizer nor a TrainState has (it may still
    *hold* one, as a container: a checkpoint restored into it is another question)."""
    if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in self.f.opt_factories and self.f.uses_legacy):
      return True  # `Trainer().make(p).target`: a method named like one of this file's that
      # return an optimizer (helper-24: read off the call, it was left with no TODO)
    return self.maybe_optimizer(value) and not self.foreign(value)

  def foreign(self, value) -> bool:
    """``value`` is a name in :meth:`foreign_receivers`."""
    return isinstance(value, cst.Name) and self.n.binding(value) in self.foreign_receivers()

  def foreign_receivers(self) -> set:
    """Bindings of names also read for a member neither a flax.optim Optimizer nor a
    TrainState has (``ex.inputs`` beside ``ex.target``: a NamedTuple of data), so they hold
    neither (the read would fail on one)."""
    found = self._foreign_receivers
    if found is None:
      found = set()
      for attr in m.findall(self.analysis.module, m.Attribute(value=m.Name())):
        name = attr.attr.value
        if name not in api.OPTIMIZER_OR_STATE_ATTRS and not name.startswith('_') and (
            b := self.n.binding(attr.value)) is not None:
          found.add(b)
      found |= self._own_class_parameters()
      self._foreign_receivers = found
    return found

  def annotated_plain(self, value) -> bool:
    """``value`` is a parameter annotated with a class that holds no optimizer
    (:meth:`_own_class_parameters`)."""
    if self._plain_annotated is None:
      self._plain_annotated = self._own_class_parameters()
    return isinstance(value, cst.Name) and self.n.binding(value) in self._plain_annotated

  def _own_class_parameters(self) -> set:
    """Bindings of function parameters annotated with a class of this module that derives
    from nothing naming an optimizer (``def loss(ex: Example)``, ``Example`` a dataclass with
    a ``target`` field), or with an imported class named like neither an optimizer nor a
    state, from outside flax (``from data import Batch``): its instances are no flax.optim
    Optimizers."""
    module = self.analysis.module
    classes = {c.name.value: c for c in module.body if isinstance(c, cst.ClassDef)}

    def imported_plain(annotation) -> bool:
      qnames = self.n.qnames(annotation)
      return bool(qnames) and all(
          '.' in q and not q.startswith(('flax.', 'optim_compat', 'builtins.'))
          and _OPTIMIZER_CLASS_LOOKING.search(q.rsplit('.', 1)[1]) is None for q in qnames)

    def plain(name: str, seen=()) -> bool:
      c = classes.get(name)
      if c is None or name in seen:
        return False
      for base in c.bases:
        if isinstance(base.value, cst.Name) and base.value.value in classes:
          if not plain(base.value.value, (*seen, name)):
            return False
        elif any(q.startswith((api.LEGACY, 'optim_compat')) or 'optim' in q.lower()
                 for q in self.n.qnames(base.value) or {code(base.value)}):
          return False  # (flax.optim's classes and the shim's, or a class named like one)
      return True
    found = set()
    for param in m.findall(module, m.Param(annotation=m.Annotation(
        annotation=m.Name() | m.Attribute()))):
      annotation = param.annotation.annotation
      if (plain(annotation.value) if isinstance(annotation, cst.Name) and annotation.value in
          classes else imported_plain(annotation)) and (b := self.n.binding(param.name)) is not None:
        found.add(b)
    return found

  def pickles_converted(self) -> bool:
    """This file pickles one of the optimizers it converts (OM018), so what it loads back with
    ``pickle.load`` is such a TrainState (without its tx)."""
    if self._pickles_converted is None:
      self._pickles_converted = False  # (while deciding: a loaded name is not yet one)
      f, n = self.f, self.n
      self._pickles_converted = f.uses_legacy and any(
          not (isinstance(value, cst.Name) and n.binding(value) in f.pickle_loaded)
          and self.is_optimizer(value) for value in f.pickled)
    return self._pickles_converted

  def container_receivers(self) -> set:
    """Bindings of names read as ``<name>.<field>`` for a field this file's classes annotate
    as an optimizer that a flax.optim Optimizer lacks (``ts.optimizer``): containers, never
    Optimizers themselves."""
    found = self._container_receivers
    if found is None:
      fields = set(self.f.annotated_fields) - api.OPTIMIZER_FIELDS
      found = set()
      if fields:
        for attr in m.findall(self.analysis.module, m.Attribute(
            value=m.Name(), attr=m.OneOf(*(m.Name(x) for x in sorted(fields))))):
          if (b := self.n.binding(attr.value)) is not None:
            found.add(b)
      self._container_receivers = found
    return found

  def is_container(self, expr) -> bool:
    """``expr`` holds an instance of a class with optimizer fields (``TrainState(optimizer=
    opt)`` of this module, or of another module the run converts), by name."""
    return isinstance(expr, cst.Name) and (
        self.n.binding(expr) in self.f.container_vars
        or self.n.binding(expr) in self.f.container_params)  # (`train_state: TrainState`)

  def annotated_field(self, expr) -> bool:
    """``x.optimizer`` where this file's class declares ``optimizer: optim.Optimizer``
    (and no chain ending in that attribute is assigned anything but an optimizer)."""
    f = self.f
    if not (isinstance(expr, cst.Attribute) and expr.attr.value in f.annotated_fields
            and (f.uses_legacy or expr.attr.value in f.flow_fields)):
      return False
    return not any(c.rsplit('.', 1)[-1] == expr.attr.value for c in f.attr_other)

  def mixed_chain(self, expr) -> bool:
    """Maybe an optimizer (flagged, not converted): ``self.optimizer`` that gets
    ``.apply_gradient`` here but is also assigned something else, or another chain
    ending in the same attribute (``trainer.optimizer`` beside ``self.optimizer``, also
    on a call's result: ``make_trainer(p).optimizer``)."""
    if self.annotated_field(expr):
      return False
    f = self.f
    chain = attr_chain(expr)
    if chain is None:
      # `T(p).optimizer`, `make_trainer(p).optimizer`, `trainers[0].optimizer`: an attribute
      # of a call's result or of a container item, named like a chain that holds optimizers
      # (what the call returns is not followed)
      return isinstance(expr, cst.Attribute) and expr.attr.value in {
          c.rsplit('.', 1)[1] for c in f.attr_chains}
    if chain in f.attr_chains:
      return chain in f.attr_other
    return chain.rsplit('.', 1)[1] in {c.rsplit('.', 1)[1] for c in f.attr_chains}

  def mentions(self, expr, test) -> bool:
    """``test`` holds for ``expr`` or an expression inside it (arguments and elements too)."""
    if test(expr):
      return True
    return any(self.mentions(c, test) for c in expr.children
               if isinstance(c, (cst.BaseExpression, cst.Element, cst.Arg, cst.DictElement)))

  def mentions_optimizer(self, expr) -> bool:
    return self.mentions(expr, self.is_optimizer)

  def derived_names(self) -> set:
    """Bindings of names assigned a value computed from an optimizer that nothing proves
    to be one (``new, m = step(opt, g)``, ``o = jitted(opt, g)``, ``o = fori_loop(..., opt)``):
    their ``.target`` / ``.state.step`` is flagged, not converted and not left silent."""
    n, f = self.n, self.f
    if not (f.uses_legacy or f.flow_used or f.flow_fields):
      return set()
    found: set = set()
    # (also from an attribute that may hold one: `x = make_trainer(p).optimizer`, and from a
    # function of this file that returns one in a tuple, list or dict: `o, lr = make(p)`)
    maybe = lambda e: self.is_optimizer(e) or self.mixed_chain(e) or (
        isinstance(e, cst.Call) and isinstance(e.func, cst.Name)
        and e.func.value in f.bundle_factories) or (
        (fac := n.factory_of_call(e, bundle=True)) is not None and fac.converted)
    # (not `tstate = TrainState(optimizer, mstate)`: a container holds the optimizer; nor
    # `params = opt.target[...]`: an optimizer's parameters, never an optimizer)
    from_optimizer = [(targets, value, self.mentions(value, maybe))
                      for targets, value in f.assignments if id(value) not in f.container_values
                      and not _params_of(value)]
    in_found = lambda e: isinstance(e, cst.Name) and n.binding(e) in found
    changed = True
    while changed:  # `opts = [...create(p)...]; first, second = opts`: derived from derived
      changed = False
      for targets, value, direct in from_optimizer:
        if not (direct or self.mentions(value, in_found)):
          continue
        for name in names_in_targets(targets):
          b = n.binding(name)
          if b is not None and b not in found and not self.is_optimizer(name):
            found.add(b)
            changed = True
    return found

  # -- other modules (codemod.flow) ----------------------------------------------------------
  def factory_of(self, expr):
    """The other module's factory whose optimizer ``expr`` holds, converted or not."""
    n = self.n
    if isinstance(expr, cst.Name):
      return n.name_factory(expr)
    if (chain := attr_chain(expr)) is not None:
      found = self.f.attr_flow.get(chain) or self.f.flow_def_chains.get(chain)
      if found is None and isinstance(expr, cst.Attribute) and not self.f.uses_legacy:
        # `<x>.optimizer` of a class whose module keeps its legacy code (a shim Optimizer)
        found = self.f.legacy_fields.get(expr.attr.value)
      return found
    if isinstance(expr, cst.Call):
      found = n.factory_of_call(expr)
      if found is None and m.matches(expr.func, m.Attribute(attr=m.Name('apply_gradient'))):
        return self.factory_of(expr.func.value)
      return found
    return None

  def unconverted(self, expr):
    found = self.factory_of(expr)
    return found if found is not None and not found.converted else None

  def own_optimizer(self, expr) -> bool:
    """``expr`` is one of this file's legacy optimizers (a TrainState only if the file converts)."""
    return self.f.uses_legacy and self.is_optimizer(expr) and self.factory_of(expr) is None

  def holds_local(self, expr) -> bool:
    """In a file without flax.optim: a name or attribute chain the file treats as an
    optimizer (assigned an ``apply_gradient`` result, or ``.apply_gradient``'ed here)."""
    if isinstance(expr, cst.Name):
      b = self.n.binding(expr)
      return b in self.f.opt_vars or b in self.f.rebound
    chain = attr_chain(expr)
    return chain is not None and chain in self.f.attr_chains

  def created_by(self) -> str:
    converted = [fac.where for fac in self.f.flow_used.values() if fac.converted]
    return f' (created by {", ".join(converted)}, this file uses it)' if converted else ''

  def step_named(self, expr):
    """The other module's step function (``codemod.flow.Step``) ``expr`` names, if any."""
    for q in sorted(self.n.qnames(expr)):
      if (found := self.f.flow.resolve_step(q)) is not None:
        return found
    return None

  # -- defs ------------------------------------------------------------------------------------
  def user_def_create(self, call) -> bool:
    recv = call.func.value
    n = self.n
    return n.is_user_def(recv) or (isinstance(recv, cst.Name) and
                                   n.is_user_def(self.f.def_vars.get(n.binding(recv))))

  def field_replace(self, attr: cst.Attribute) -> bool:
    """``x.replace(target=...)`` (or ``state=`` / ``optimizer_def=``): a legacy Optimizer's
    fields, which a TrainState's ``replace`` rejects."""
    call = self.f.calls_by_func.get(id(attr))
    return attr.attr.value == 'replace' and call is not None and any(
        a.keyword is not None and a.keyword.value in api.OPTIMIZER_FIELDS for a in call.args)

  def assigned_values(self) -> dict:
    """``{id(target name): value}`` of each ``name = value`` statement (one plain target)."""
    if self._assigned_values is None:
      self._assigned_values = {id(targets[0]): value for targets, value in self.f.assignments
                               if len(targets) == 1 and isinstance(targets[0], cst.Name)}
    return self._assigned_values

  def apply_overrides(self) -> list[dict]:
    """The keyword arguments of every apply_gradient / optimize call."""
    return [kwargs(c) for c in [*self.f.apply_calls, *self.f.optimize_calls]]
