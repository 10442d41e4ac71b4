"""Rule family *apply_gradient*: the update step and its apply-time learning rates.

OM002 (``opt.apply_gradient(g[, learning_rate=lr])`` -> ``apply_gradients``, the
rate set in an ``inject_hyperparams`` state; a ``MultiOptimizer``'s per-group
rates in ``inner_states``) and OM102 (overrides Optax cannot take at apply time,
mixed override / no-override files, rates another module's conversion does not
inject).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.names import apply_grads, attr_chain, code, kwargs, template
from codemod.facts.values import DEF_HYPER_PARAMS
from codemod.rules import defs
from optim_compat import spec as spec_lib

_APPLY = m.Attribute(attr=m.Name('apply_gradient'))


def prepare(q) -> None:
  """Whether the file's defs inject their learning rate (some call passes one), whether only
  some calls do (``mixed_lr``), and which ``hyper_params=[...]`` calls set per-group rates."""
  overrides = q.apply_overrides()
  q.inject_lr = any('learning_rate' in k for k in overrides)
  q.mixed_lr = q.inject_lr and not _each_optimizer_one_way(
      q, ['learning_rate' in k for k in overrides])
  if not q.inject_lr and q.f.def_calls and _hands_optimizer_to_injecting_module(q):
    q.inject_lr = True  # one layout with the module it exchanges optimizers with
  if not q.inject_lr and (q.f.def_calls or q.f.create_calls) and (
      _subclasses_injecting_module(q) or _subclassed_by_injecting_module(q)):
    # a base class elsewhere (or a subclass elsewhere) sets the rate on what this module's
    # classes create (from its own defs, or another module's def factory, which then injects
    # too: codemod.flow.DefUse.inject); this module's own calls pass none: each is converted
    # with a TODO naming the difference if it runs after a call that set one (leave_apply)
    q.inject_lr = True
    q.hierarchy_lr = True
  if not q.inject_lr and q.f.def_calls and _container_class_injects(q):
    q.inject_lr = True  # another module storing its optimizers in the same class injects
  if not q.inject_lr and q.f.def_calls and _own_def_factory_injects(q):
    q.inject_lr = True  # a caller of its def factory sets the rate at apply time
  if not q.inject_lr and q.f.def_calls and _own_factory_injects(q):
    q.inject_lr = True  # a user of its factory's optimizer sets the rate at apply time
    q.mixed_lr = bool(overrides)  # (its own calls pass none: they would keep the last one)
  _find_group_applies(q)


def _each_optimizer_one_way(q, with_lr: list) -> bool:
  """Each optimizer's apply calls all pass a learning rate, or none does (``with_lr``: one
  flag per apply_gradient / optimize call, in ``apply_calls + optimize_calls`` order).

  Legacy overrides a rate for one call; ``inject_hyperparams`` keeps the last one set. So a
  call passing none differs only on an optimizer some call gave one. True when every call
  agrees, or when each call's receiver is a local name (:func:`_lineage`) and no lineage has
  calls of both kinds: ``opt_g`` always stepped with a rate beside ``opt_d`` never given one
  (which, injected too, keeps its def's rate: the same update)."""
  if all(with_lr) or not any(with_lr):
    return True
  kinds: dict = {}
  for call, given in zip([*q.f.apply_calls, *q.f.optimize_calls], with_lr):
    lineage = _lineage(q, call.func.value)
    if lineage is None:
      return False  # (a parameter, an attribute, an alias: may be another call's optimizer)
    kinds.setdefault(lineage, set()).add(given)
  return all(len(k) == 1 for k in kinds.values())


def _lineage(q, recv):
  """The variable ``recv`` names (``Names.binding``) when every binding of it is ``x =
  <def>.create(...)`` or ``x = x.apply_gradient(...)`` / ``x.optimize(...)``: one optimizer
  created here and stepped in place, which no other name can hold; else None."""
  n = q.n
  if not isinstance(recv, cst.Name):
    return None
  scope = n.scope(recv)
  if scope is None or not (bindings := list(scope[recv.value])):
    return None
  values = q.assigned_values()
  for binding in bindings:
    value = values.get(id(binding.node))
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
      return None
    step, attr = value.func.value, value.func.attr.value
    if attr == 'create':
      if not n.is_def(step) and not (
          isinstance(step, cst.Name) and n.is_def(q.f.def_vars.get(n.binding(step)))):
        return None
    elif attr not in ('apply_gradient', 'optimize') or not (
        isinstance(step, cst.Name) and step.value == recv.value):
      return None
  return n.binding(recv)


def _own_def_factory_injects(q) -> bool:
  """A def factory of this module that the run converts must inject its learning rate: a
  module ``.create`` ing what it returns passes one at apply time (``codemod.flow``)."""
  flow = q.f.flow
  if flow is None or not flow.module:
    return False
  return any((found := flow.resolve_def(f'{flow.module}.{name}')) is not None
             and found.allowed and found.inject_required for name in q.f.def_factories)


def _own_factory_injects(q) -> bool:
  """A factory of this module that the run converts must inject its learning rate: a module
  using the optimizer it returns passes one at apply time (``codemod.flow``)."""
  flow = q.f.flow
  if flow is None or not flow.module:
    return False
  return any(getattr(flow.factories.get(f'{flow.module}.{name}'), 'inject_required', False)
             for name in q.f.module_factories)


def _subclasses_injecting_module(q) -> bool:
  """A module-level class of this module subclasses a class of another module of the run
  whose optimizers are built with ``inject_hyperparams`` (``codemod.flow.Layout``): the base
  class's methods may set the learning rate on the optimizer this module's ``__init__``
  stores in the same attribute (a fine-tuner's own Adam in ``self.optimizer``, stepped by
  the base trainer's ``train_step`` with its ``learning_rate=``), so this module's defs are
  built the same way (else a ``KeyError`` at ``tree_set``)."""
  return q.f.flow is not None and any(
      _names_injecting_module(q, base.value)
      for node in q.analysis.module.body if isinstance(node, cst.ClassDef) for base in node.bases)


def _subclassed_by_injecting_module(q) -> bool:
  """A module-level class of this module is the base of a class of another module that
  passes ``learning_rate=`` at apply time (``codemod.flow.Flow.inject_classes``): a
  fine-tuner's schedule on the optimizer the base trainer's ``__init__`` creates."""
  flow = q.f.flow
  if flow is None or not flow.module or not flow.inject_classes:
    return False
  return any(isinstance(node, cst.ClassDef)
             and f'{flow.module}.{node.name.value}' in flow.inject_classes
             for node in q.analysis.module.body)


def _hands_optimizer_to_injecting_module(q) -> bool:
  """This module passes one of its optimizers, or a container holding one, to a function of
  another module of the run whose defs are built with ``inject_hyperparams``
  (``codemod.flow.Layout``): called with it, or wrapped (``jax.pmap(functools.partial(
  training.train_step, ...))``, hypernerf) in a module that puts its optimizers in a
  container (the step sets the rate of what the container holds)."""
  if q.f.flow is None:
    return False
  calls = q.f.calls_by_func.values()
  if any(_names_injecting_module(q, call.func) for call in calls
         if any(q.is_optimizer(a.value) or q.is_container(a.value) for a in call.args)):
    return True
  return bool(q.f.container_vars) and any(
      _names_injecting_module(q, a.value) for call in calls for a in call.args
      if isinstance(a.value, (cst.Name, cst.Attribute)))


def _container_class_injects(q) -> bool:
  """A class with optimizer fields this module uses (its own, or another module's) is one an
  injecting module of the run stores its optimizers in (``codemod.flow.Layout`` of the
  class): the class's checkpoints have one layout (nerfies: ``train.py`` injects, its
  ``eval.py`` restores those checkpoints into its own optimizer)."""
  flow = q.f.flow
  if flow is None:
    return False
  classes = [*q.f.flow_classes, *(f'{flow.module}.{cls}' for cls in q.f.declared_fields)]
  return any((layout := flow.layout(cls)) is not None and layout.inject_lr for cls in classes)


def _names_injecting_module(q, node) -> bool:
  """``node`` (a function or class name) is one of another module of the run whose defs
  are built with ``inject_hyperparams`` (its :class:`codemod.flow.Layout`). (A name of this
  module is written without its module: never its own layout.)"""
  return any('.' in qname and (layout := q.f.flow.layout(qname.rsplit('.', 1)[0])) is not None
             and layout.inject_lr for qname in q.n.qnames(node))


def _find_group_applies(q) -> None:
  """Per-group learning rates (``hyper_params=[...]`` of a MultiOptimizer) that convert.

  Converted: every element replaces only its own group's learning rate, one per group:
  ``opt.optimizer_def.hyper_params[i].replace(learning_rate=x)``, or read from a name bound
  to ``opt.optimizer_def.hyper_params`` (``hp[i].replace(...)``; ``(a_hp, b_hp) = ...`` then
  ``a_hp.replace(...)`` in group order) that nothing else reads (the binding is dropped,
  OM012), ``opt`` the receiver (a name or an attribute chain such as ``state.optimizer``).
  The file's MultiOptimizers all have that many groups, of defs of the migration table; with
  several, every group is labelled by its position (``group_0``, ...), so one apply call fits
  whichever reaches it. Each group's transformation is then built with
  ``inject_hyperparams`` and its learning rate set in ``opt_state.inner_states[label]``
  (legacy semantics: the override holds for that call; the file converts only when every
  apply call overrides, see ``mixed_lr``).
  """
  n, f = q.n, q.f
  multis = [c for c in f.def_calls if n.legacy_def(c) == api.MULTI]
  calls = [c for c in f.apply_calls if 'hyper_params' in kwargs(c)]
  if not multis or len({len(c.args) for c in multis}) != 1 or any(
      defs.multi_problem(q, c) is not None for c in multis):
    return
  for multi in multis:
    subs = [arg.value.elements[1].value for arg in multi.args]
    subs = [f.def_vars.get(n.binding(x)) if isinstance(x, cst.Name) else x for x in subs]
    if not all(n.legacy_def(x) in spec_lib.SPECS for x in subs):
      return  # a user def (to_optax) has no injectable learning rate
  q.positional_labels = len(multis) > 1
  labels = defs.multi_labels(multis[0], positional=q.positional_labels)
  found, reads = {}, {}  # id(call) -> lrs; id(hp binding value) -> ids of its names read
  for call in calls:
    got = _group_lrs(q, call)
    if got is None or len(got[0]) != len(labels) or not q.is_optimizer(call.func.value):
      continue
    found[id(call)] = (call, *got)
    for value_id, name_ids in got[2].items():
      reads.setdefault(value_id, set()).update(name_ids)
  unread = {v for v, ids in reads.items() if f.hp_assigns.get(v) is not None
            and ids >= _hp_binding_reads(q, v)}
  for call, lrs, handled, bindings in found.values():
    if not set(bindings) <= unread:
      continue  # (a binding read elsewhere too, or one on a line that cannot be dropped)
    q.group_applies[id(call)] = (lrs, labels)
    q.handled.update(handled)  # each `opt.optimizer_def`
    q.hp_assign_lines.update(id(f.hp_assigns[v]) for v in bindings)
  q.inject_lr = q.inject_lr or bool(q.group_applies)
  with_lr = [('learning_rate' in kwargs(c)) or id(c) in q.group_applies
             for c in [*f.apply_calls, *f.optimize_calls]]
  q.mixed_lr = any(with_lr) and not _each_optimizer_one_way(q, with_lr)


def _hp_binding_reads(q, value_id) -> set:
  """Ids of every read of the names bound to the ``hyper_params`` value ``value_id``."""
  for targets, value in q.f.assignments:
    if id(value) == value_id:
      names = [targets[0]] if isinstance(targets[0], cst.Name) else [
          e.value for e in targets[0].elements]
      reads = set()
      for name in names:
        scope = q.n.scope(name)
        reads.update(id(a.node) for a in (scope.accesses[name.value] if scope else ()))
      return reads
  return set()


def _group_hp(q, expr, i: int, recv):
  """``(owner value id or None, owner `.optimizer_def` node, read Name ids)`` when ``expr`` is
  group ``i``'s hyper-parameters of ``recv``: ``recv.optimizer_def.hyper_params[i]``, or
  through a name bound to ``recv.optimizer_def.hyper_params`` (``hp[i]``, or the ``i``-th name
  it was unpacked into); else None."""
  n = q.n

  def owner(value):
    return m.matches(value, DEF_HYPER_PARAMS) and code(value.value.value) == code(recv)

  if isinstance(expr, cst.Subscript):
    index = expr.slice
    if len(index) != 1 or not m.matches(index[0].slice, m.Index(value=m.Integer())) \
        or int(index[0].slice.value.value, 0) != i:
      return None
    base = expr.value
    if owner(base):
      return None, base.value, set()
    if isinstance(base, cst.Name) and (bound := n.assignment(base)) is not None:
      targets, value = bound
      if isinstance(targets[0], cst.Name) and len(targets) == 1 and owner(value):
        return id(value), value.value, {id(base)}
    return None
  if isinstance(expr, cst.Name) and (bound := _unpacked_from(q, expr)) is not None:
    position, value = bound
    if position == i and owner(value):
      return id(value), value.value, {id(expr)}
  return None


def _unpacked_from(q, name: cst.Name):
  """``(position, value)`` when ``name``'s only binding is the ``position``-th name of
  ``(a, b) = value``, else None."""
  scope = q.n.scope(name)
  bindings = list(scope[name.value]) if scope is not None else []
  node = getattr(bindings[0], 'node', None) if len(bindings) == 1 else None
  for targets, value in q.f.assignments:
    if len(targets) == 1 and isinstance(targets[0], (cst.Tuple, cst.List)):
      for position, element in enumerate(targets[0].elements):
        if element.value is node:
          return position, value
  return None


def _group_lrs(q, call: cst.Call):
  """``(learning-rate expressions, ids of the ``.optimizer_def`` nodes read, {id of a bound
  ``hyper_params`` value: ids of its names read here})`` of ``opt.apply_gradient(g,
  hyper_params=[...])`` when each element only replaces its own group's learning rate
  (:func:`_group_hp`), else None."""
  kw = kwargs(call)
  positional = [x for x in call.args if x.keyword is None]
  recv = call.func.value
  if set(kw) != {'hyper_params'} or len(positional) != 1 or any(x.star for x in call.args) \
      or not (isinstance(recv, cst.Name) or attr_chain(recv) is not None) \
      or not isinstance(kw['hyper_params'].value, cst.List):
    return None
  lrs, handled, reads = [], [], {}
  for i, element in enumerate(kw['hyper_params'].value.elements):
    value = element.value
    if not isinstance(element, cst.Element) or not m.matches(value, m.Call(
        func=m.Attribute(attr=m.Name('replace')),
        args=[m.Arg(keyword=m.Name('learning_rate'), star='')])):
      return None
    got = _group_hp(q, value.func.value, i, recv)
    if got is None:
      return None
    value_id, owner, names = got
    handled.append(id(owner))
    if value_id is not None:
      reads.setdefault(value_id, set()).update(names)
    lrs.append(value.args[0].value)
  return lrs, handled, reads


# -- checks -----------------------------------------------------------------------------------
def flow_lr_problem(q, call: cst.Call) -> Optional[str]:
  """An apply-time learning rate the creating module's conversion cannot honour."""
  factory = q.factory_of(call.func.value)
  if factory is None or not factory.converted:
    return None
  given = 'learning_rate' in kwargs(call)
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


def _calls_container_factory(q) -> bool:
  """This module gets its containers from another module's function that builds them
  (:class:`codemod.flow.ContainerFactory`: ``s = state.create(params)``), which converts on
  its own (a step function other modules call with theirs is the flow's: codemod.flow.Step,
  whose callers' creators inject the rate it sets)."""
  f = q.f
  if f.flow is None:
    return False
  return any(f.flow.resolve_container_factory(name) is not None
             for call in f.calls_by_func.values() for name in q.n.qnames(call.func))


def _other_modules_field(q, recv) -> bool:
  """``recv`` is ``<x>.<field>`` of a class with optimizer fields another module declares
  and the run converts (or a name assigned one), not one of this module's classes."""
  f = q.f
  own = {field for fields in f.declared_fields.values() for field in fields}
  if isinstance(recv, cst.Attribute):
    return recv.attr.value in f.flow_fields and recv.attr.value not in own
  return isinstance(recv, cst.Name) and q.n.binding(recv) in f.field_aliases


def apply_problem(q, call: cst.Call) -> Optional[str]:
  if id(call) in q.group_applies:
    return None
  if (problem := flow_lr_problem(q, call)) is not None:
    return problem
  kw = kwargs(call)
  recv = call.func.value
  f = q.f
  if ('learning_rate' in kw and not (f.create_calls or f.flow_def_creates or f.def_calls)
      and _other_modules_field(q, recv) and _calls_container_factory(q)):
    # (the class's optimizers are created elsewhere, this file creating none, by modules that
    # do not know this call sets a rate: their transformations would not inject it; found by
    # a new user)
    field = recv.attr.value if isinstance(recv, cst.Attribute) else recv.value
    return (f'learning_rate at apply time on `{code(recv)}`, the `{field}` field of a class '
            'another module declares (converted by this run): where its optimizers are '
            'created, the transformation must inject the learning rate '
            '(optax.inject_hyperparams) for this call to set it, which cannot be told here: '
            'convert by hand')
  if ('learning_rate' in kw and not f.def_calls and isinstance(recv, cst.Name)
      and (b := q.n.binding(recv)) in f.params and b not in f.made_here_params
      and b not in f.flow_vars):
    # (a file that builds defs injects their learning rate when it passes one at apply time)
    return (f'learning_rate at apply time on `{recv.value}`, a parameter, and this file '
            'creates no optimizer: where it is created, its transformation must inject the '
            'learning rate (optax.inject_hyperparams) for this call to set it, which cannot be '
            'told here: convert by hand')
  other = sorted(set(kw) - {'learning_rate', 'grads'})
  if apply_grads(call) is None or other or any(a.star for a in call.args):
    if 'hyper_params' in other and not any(q.n.legacy_def(c) == api.MULTI for c in f.def_calls):
      return ('apply_gradient(hyper_params=...) overrides the def\'s hyper-parameters for '
              'this call, and an Optax transformation takes no hyper-parameters when it is '
              'applied: migrate it by hand: wrap the transformation in '
              'optax.inject_hyperparams and set the values in opt_state.hyperparams')
    if 'hyper_params' in other:
      return ('apply_gradient(hyper_params=[...]): per-group learning rates convert only as '
              '`[opt.optimizer_def.hyper_params[i].replace(learning_rate=x), ...]` (or through '
              'a name bound to `opt.optimizer_def.hyper_params` that nothing else reads), one '
              "per group in order, where the file's MultiOptimizers all have that many groups "
              'of table defs, on every apply call; otherwise inject them by hand with '
              'optax.inject_hyperparams, per group at '
              'opt_state.inner_states[label].inner_state.hyperparams')
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


def _unconvertible(call) -> bool:
  """An apply call whose arguments ``apply_gradients`` cannot take (overrides, no gradient)."""
  return apply_grads(call) is None or bool(set(kwargs(call)) - {'learning_rate', 'grads'})


def _converted_unproven(q, call) -> bool:
  """An apply call the rewrite converts though nothing proves its receiver an optimizer (a
  value wrapped in a container or a conditional, in a file that uses flax.optim)."""
  f = q.f
  return (f.uses_legacy and not q.is_optimizer(call.func.value)
          and (f.defines_apply_gradient or q.unconverted(call.func.value) is None)
          and id(call) not in q.group_applies)


def stepped_here(q, recv) -> bool:
  """``recv`` (a name whose ``.target`` / ``.state.step`` is read) holds, at the read, the
  very value an ``.apply_gradient`` call of the same block is given, or that call's result,
  and this rewrite converts that call though nothing proves its receiver
  (:func:`_converted_unproven`): the read is converted on the same evidence, not flagged
  beside a converted step (``optimizer, key = carry`` in a ``lax.scan`` body, then
  ``optimizer.target`` and ``optimizer = optimizer.apply_gradient(g)``). Both must be
  simple statements of one statement list with no other assignment of the name from one
  to the other (a branch or a rebinding in between keeps the flag)."""
  if not (q.converts and isinstance(recv, cst.Name)) or (b := q.n.binding(recv)) is None:
    return False
  return any(isinstance(c.func.value, cst.Name) and q.n.binding(c.func.value) == b
             and _converted_unproven(q, c) and not _unconvertible(c)
             and _same_value(q, recv, c) for c in q.f.apply_calls)


def stepped_in_scope(q, recv) -> bool:
  """``recv`` is a name that a converted ``.apply_gradient`` call of the same function (or
  module body) is made on: the rewrite treats what the name holds there as a TrainState."""
  if not (q.converts and isinstance(recv, cst.Name)) or (scope := q.n.scope(recv)) is None:
    return False
  return any(isinstance(c.func.value, cst.Name) and c.func.value.value == recv.value
             and q.n.scope(c.func.value) is scope and not _unconvertible(c)
             and (q.is_optimizer(c.func.value) or _converted_unproven(q, c))
             for c in q.f.apply_calls)


def _same_value(q, recv: cst.Name, call: cst.Call) -> bool:
  """No assignment of ``recv``'s name separates the read ``recv`` from ``call`` (see
  :func:`stepped_here`) but the one ``call``'s result is assigned by."""
  n = q.n
  scope = n.scope(recv)
  if scope is None or scope is not n.scope(call.func.value):
    return False  # (a read in a nested function runs at another time)
  owner = getattr(scope, 'node', None)
  body = owner.body.body if isinstance(owner, cst.FunctionDef) and isinstance(
      owner.body, cst.IndentedBlock) else (owner.body if isinstance(owner, cst.Module) else None)
  read, step = _position(n, recv), _position(n, call)
  if body is None or read is None or step is None:
    return False
  at_read, at_step = _innermost(n, body, read), _innermost(n, body, step)
  if at_read is None or at_step is None or at_read[0] is not at_step[0]:
    return False
  stmts = at_read[0]
  lo, hi = sorted((at_read[1], at_step[1]))
  if not all(isinstance(stmts[i], cst.SimpleStatementLine) for i in (lo, hi)):
    return False
  own = {id(t) for targets, value in q.f.assignments if value is call
         for t in targets if isinstance(t, cst.Name)}
  span = [_range(n, s) for s in stmts[lo:hi + 1]]
  for assignment in scope.assignments[recv.value]:
    where = _position(n, assignment.node)
    if id(assignment.node) in own or where is None:
      continue
    if any(r is None or r[0] <= where <= r[1] for r in span):
      return False
  return True


def _position(n, node):
  pos = n.position(node)
  return (pos.start.line, pos.start.column) if pos else None


def _range(n, node):
  pos = n.position(node)
  return ((pos.start.line, pos.start.column), (pos.end.line, pos.end.column)) if pos else None


def _suites(stmt) -> list:
  """The statement lists directly inside a compound statement (bodies, branches, handlers)."""
  found = []
  for part in (getattr(stmt, 'body', None), getattr(stmt, 'orelse', None),
               getattr(stmt, 'finalbody', None), *getattr(stmt, 'handlers', ()),
               *getattr(stmt, 'cases', ())):
    while part is not None and not isinstance(part, (cst.IndentedBlock,
                                                     cst.SimpleStatementSuite)):
      if isinstance(part, cst.If):
        found.extend(_suites(part))  # `elif`: its own bodies
        part = None
      else:
        part = getattr(part, 'body', None)
    if isinstance(part, cst.IndentedBlock):
      found.append(part.body)
  return found


def _innermost(n, stmts, pos):
  """``(statement list, index)`` of the innermost statement list with a statement holding
  ``pos``; None outside ``stmts``."""
  for i, stmt in enumerate(stmts):
    r = _range(n, stmt)
    if r is not None and r[0] <= pos <= r[1]:
      if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return stmts, i
      for suite in _suites(stmt):
        if (found := _innermost(n, suite, pos)) is not None:
          return found
      return stmts, i
  return None


def blocks(q) -> bool:
  """Overrides Optax cannot take: on a proven optimizer, or on a call the rewrite would
  convert otherwise (converting the file's other calls around it would half-migrate it)."""
  f = q.f
  return bool(q.mixed_lr
              or any(apply_problem(q, c) for c in f.apply_calls if q.is_optimizer(c.func.value))
              or any(_unconvertible(c) for c in f.apply_calls if _converted_unproven(q, c))
              or any(flow_lr_problem(q, c) for c in f.optimize_calls
                     if q.is_optimizer(c.func.value)))


# -- sites (links of the call chain, ``codemod.plan.sites``) ---------------------------------
def leave_mixed_lr(p, original) -> bool:
  q = p.q
  func = original.func
  if not (m.matches(func, m.Attribute(attr=m.Name('apply_gradient') | m.Name('optimize')))
          and q.mixed_lr and (func.attr.value == 'apply_gradient'
                              or any(original is c for c in q.f.optimize_calls))):
    return False
  what = 'apply_gradient' if func.attr.value == 'apply_gradient' else 'apply_gradient / optimize'
  p.flag(original, 'OM102', f'some {what} calls pass learning_rate and some do not; legacy '
                            'overrides last one call, Optax state persists', blocks=True)
  return True


def leave_optimize_lr(p, original) -> bool:
  q = p.q
  if (m.matches(original.func, m.Attribute(attr=m.Name('optimize')))
      and q.is_optimizer(original.func.value)
      and (problem := flow_lr_problem(q, original)) is not None):
    p.flag(original, 'OM102', problem, blocks=True)
    return True
  return False


def leave_apply_problem(p, original) -> bool:
  """Overrides Optax cannot take, on an optimizer or on a call the rewrite would otherwise
  convert (the file keeps its legacy code)."""
  q = p.q
  if not m.matches(original.func, _APPLY):
    return False
  if q.is_optimizer(original.func.value):
    problem = apply_problem(q, original)
  elif (any(original is c for c in q.f.apply_calls) and _converted_unproven(q, original)
        and _unconvertible(original)):
    other = sorted(set(kwargs(original)) - {'learning_rate', 'grads'})
    problem = apply_problem(q, original) or (
        f'apply_gradient overrides {other} have no Optax equivalent here; inject them with '
        'optax.inject_hyperparams')
  else:
    return False
  if problem:
    p.flag(original, 'OM102', problem, blocks=True)
    return True
  return False


def leave_apply(p, original) -> bool:
  """``opt.apply_gradient(g[, learning_rate=lr])`` -> ``apply_gradients`` (OM002)."""
  q = p.q
  if not (m.matches(original.func, _APPLY) and any(original is c for c in q.f.apply_calls)):
    return False
  if id(original) in q.group_applies:
    p.fix(original, apply_group, [('OM002', 'apply_gradient(g, hyper_params=[...]) with '
                                            'per-group learning rates -> each set in '
                                            'opt_state.inner_states[label] (inject_hyperparams), '
                                            'then apply_gradients')])
    return True
  kw = kwargs(original)
  if _unconvertible(original):
    return True  # (flagged by leave_apply_problem: the file keeps its legacy code)
  if 'learning_rate' in kw:
    p.fix(original, apply_apply, [('OM002', 'apply_gradient(g, learning_rate=lr) -> lr set in '
                                            'opt_state (inject_hyperparams), then apply_gradients')])
  else:
    p.fix(original, apply_apply, [('OM002', 'apply_gradient(g) -> apply_gradients(grads=g)')])
    if q.hierarchy_lr:
      p.flag(original, 'OM102', 'a class of another module that subclasses (or is the base '
                                'of) a class here passes learning_rate at apply time, so the '
                                'transformations here inject it; this call passes none: run '
                                'on an optimizer after a call that set one, it steps with that '
                                "rate (legacy: the def's own). Pass learning_rate here too if "
                                'that can happen')
  return True


def leave_hp_assign(p, original) -> None:
  """``hp = opt.optimizer_def.hyper_params`` read only for the per-group learning rates of
  apply calls that convert: the line is dropped (OM012)."""
  if id(original) in p.q.hp_assign_lines and p.q.converts:
    p.fix(original, apply_drop_line, [('OM012', f'`{code(original.body[0])}` (read only for '
                                                'the per-group learning rates set below) '
                                                'dropped')])


# -- fixes ----------------------------------------------------------------------------------
def apply_drop_line(ctx, original, updated, fix):
  return cst.RemovalSentinel.REMOVE


def apply_apply(ctx, original, updated, fix):
  kw = kwargs(updated)
  grads = apply_grads(updated)
  recv = updated.func.value
  if 'learning_rate' in kw:
    ctx.add_import('optax')
    return template('R.replace(opt_state=optax.tree_utils.tree_set(R.opt_state, learning_rate=L))'
                    '.apply_gradients(grads=G)', R=recv, L=kw['learning_rate'].value, G=grads)
  return template('R.apply_gradients(grads=G)', R=recv, G=grads)


def apply_group(ctx, original, updated, fix):
  """``opt.apply_gradient(g, hyper_params=[hp0.replace(learning_rate=a), ...])`` ->
  each group's learning rate set in its ``inner_states[label]``, then apply_gradients."""
  _, labels = ctx.q.group_applies[id(original)]
  new_lrs = [e.value.args[0].value for e in kwargs(updated)['hyper_params'].value.elements]
  groups = ', '.join(f'{label!r}: optax.tree_utils.tree_set(R.opt_state.inner_states[{label!r}], '
                     f'learning_rate=LR_{i}_)' for i, label in enumerate(labels))
  source = (f'R.replace(opt_state=R.opt_state._replace(inner_states={{'
            f'**R.opt_state.inner_states, {groups}}})).apply_gradients(grads=G)')
  subs = {'R': updated.func.value,
          'G': [x for x in updated.args if x.keyword is None][0].value,
          **{f'LR_{i}_': lr for i, lr in enumerate(new_lrs)}}
  ctx.add_import('optax')
  return template(source, **subs)
