"""Rule family *crossmodule*: optimizers and step functions that cross modules (``codemod.flow``).

OM122 (an optimizer nothing proves: created by another module's factory kept
legacy, or by an unknown module, or in a file that never imports flax.optim),
OM123 (a converted factory's ``TrainState`` reaching legacy code in a file that
keeps it), OM124 (calls and uses of another module's step function that would
hand it the wrong kind of optimizer).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.facts.values import create_receiver
from codemod.names import call_argument, code, kwargs, named_like_optimizer

_APPLY = m.Attribute(attr=m.Name('apply_gradient'))


def prepare(q) -> None:
  """The calls of other modules' step functions, and the functions wrapped by jit / pmap."""
  f = q.f
  q.step_calls = _find_step_calls(q)
  q.step_calls_enabled = f.flow is not None and bool(f.flow.steps)
  q.wrapped_args = {id(c.args[0].value) for c in f.calls_by_func.values()
                    if q.step_calls_enabled and c.args and q.n.qnames(c.func) & api.CALL_WRAPPERS}


def _find_step_calls(q) -> dict:
  """Calls of another module's step function (:class:`codemod.flow.Step`) with the
  arguments given to its optimizer parameters: ``{id(call): [(step, parameter, argument)]}``.
  Direct (``train_step(opt, b)``, ``steps.train_step(...)``) or through ``jax.jit`` /
  ``jax.pmap`` (``p_step = jax.pmap(train_step)``, ``jax.jit(train_step)(opt, b)``)."""
  n, f = q.n, q.f
  if f.flow is None or not f.flow.steps:
    return {}
  aliases = {}
  for assign, wrap in f.wrapped:
    if (step := q.step_named(wrap.args[0].value)) is not None and \
        (b := n.binding(assign.targets[0].target)) is not None:
      aliases[b] = step
  found = {}
  for call in f.calls_by_func.values():
    func = call.func
    if isinstance(func, cst.Call) and func.args and n.qnames(func.func) & api.CALL_WRAPPERS:
      step = q.step_named(func.args[0].value)
    elif isinstance(func, cst.Name) and n.binding(func) in aliases:
      step = aliases[n.binding(func)]
    else:
      step = q.step_named(func)
    if step is None:
      continue
    for position, name in step.params:
      if (arg := call_argument(call, position, name)) is not None:
        found.setdefault(id(call), []).append((step, name, arg))
  return found


# -- checks -----------------------------------------------------------------------------------
def unproven_message(q, recv, what='`.apply_gradient`') -> tuple[str, bool]:
  """The flag on a legacy-looking use nothing proves to be an optimizer, and whether it keeps
  the file legacy."""
  excerpt = code(recv)
  factory = q.unconverted(recv)
  if factory is not None:
    return (f'`{excerpt}` is created by {factory.where}, which keeps its legacy optimizer code '
            f'({factory.why}): migrate it there first'), True
  unknown = ('nothing proves `{}` holds a flax.optim Optimizer (function parameters, attributes '
             'and values from unknown modules are not followed); if it is the one created by {}')
  if converted := [fac.where for fac in q.f.flow_used.values() if fac.converted]:
    return (unknown.format(excerpt, ', '.join(converted)) + ', that now returns a TrainState: '
            f'convert {what} here by hand'), True
  if q.f.flow_used:  # (only factories kept legacy: what they return stays a shim Optimizer)
    where = ', '.join(fac.where for fac in q.f.flow_used.values())
    return (unknown.format(excerpt, where) + ', which keeps its legacy optimizer code, it stays '
            'a flax.optim Optimizer (on the shim): migrate them together'), True
  return ('this file never imports flax.optim: if this is a flax.optim Optimizer, migrate it '
          'where it is created'), False


def unproven_apply(q, call: cst.Call) -> bool:
  """``x.apply_gradient(...)`` on something no module proves an optimizer (flagged). Not when
  it is given a Python function (``model.apply_gradient(loss_fn)``): a flax.optim Optimizer
  takes gradients, so ``x`` is the user's own class (a ``Model`` wrapping one)."""
  f = q.f
  return (m.matches(call.func, _APPLY) and not f.defines_apply_gradient
          and not q.is_optimizer(call.func.value) and not q.n.given_a_function(call)
          and (not f.uses_legacy or q.unconverted(call.func.value) is not None))


def flow_failure(q, attr: cst.Attribute) -> Optional[str]:
  """In a file that keeps its legacy code: a legacy use (``.target``, ``.state``,
  ``.apply_gradient``, ...) on a value that holds, or may hold, what another module's
  converted factory now returns (a ``TrainState``, on which the use fails at run time)."""
  f = q.f
  converted = [fac for fac in f.flow_used.values() if fac.converted]
  if not converted:
    return None
  recv = attr.value
  if (attr.attr.value == 'apply_gradient' and id(attr) in f.call_funcs
      and not f.defines_apply_gradient and not q.is_optimizer(recv)
      and (not f.uses_legacy or q.unconverted(recv) is not None)):
    return None  # the call's own "nothing proves" flag names the factory already
  from codemod.rules.apply_gradient import flow_lr_problem
  if any(c.func is attr and flow_lr_problem(q, c) is not None
         for c in [*f.apply_calls, *f.optimize_calls]):
    return None  # flagged OM102, naming the factory
  factory = q.factory_of(recv)
  if factory is not None:
    if not factory.converted:
      return None
    lead = f'`{code(recv)}` holds what {factory.where} returns'
  elif q.maybe_optimizer(recv) or (not f.uses_legacy and q.holds_local(recv)):
    lead = (f'`{code(recv)}` may hold what '
            f'{", ".join(sorted(fac.where for fac in converted))} returns')
  else:
    return None
  return (f'{lead}, now a TrainState, on which the flax.optim Optimizer uses here fail: '
          'convert them by hand (`.target` is `.params`, `.state.step` is `.step`, '
          '`.apply_gradient(g)` is `.apply_gradients(grads=g)`)')


def step_problems(q, call: cst.Call) -> list[tuple[str, bool, bool]]:
  """Why a call of another module's step function fails after this run, per argument:
  ``(text, blocks, note)``. The step keeps its legacy code and gets a TrainState, or it is
  converted and gets a flax.optim Optimizer (this file, or the factory that made it, keeps
  its legacy code)."""
  problems = []
  for step, name, arg in q.step_calls.get(id(call), ()):
    excerpt, factory = code(arg), q.factory_of(arg)
    if step.restores and _restores_optimizer(q, arg):
      # (helper-27's D2: `ckpt_util.restore_or_init(workdir, optimizer)`, no flax.optim there)
      problems.append((f'`{excerpt}` is passed to {step.where}, a checkpoint helper ({step.why}):'
                       ' migrated here, it would get a TrainState, into which a checkpoint the '
                       'legacy code wrote does not load (`Missing field step`): restore there '
                       'with optim_compat.checkpoint.restore_legacy(ckpt_dir, target), which '
                       'reads both layouts, and rerun', True, True))
    elif not step.converted and q.own_optimizer(arg):
      problems.append((f'`{excerpt}` is passed to {step.where}, which keeps its legacy optimizer '
                       f'code ({step.why}): migrated here, it would get a TrainState: migrate it '
                       'there first', True, True))
    elif not step.converted and factory is None and q.maybe_optimizer(arg):
      # (`lax.cond(bad, lambda o: skip(o), ..., opt)`: a parameter that may hold this file's
      # optimizer, a TrainState after this run; helper-22's skip branch failed there)
      problems.append((f'`{excerpt}` may hold an optimizer of this file (a TrainState after '
                       f'this run) and is passed to {step.where}, which keeps its legacy '
                       f'optimizer code ({step.why}): migrate it there first', True, True))
    elif not step.converted and factory is not None and factory.converted:
      problems.append((f'`{excerpt}` holds what {factory.where} returns, now a TrainState, and is '
                       f'passed to {step.where}, which keeps its legacy optimizer code '
                       f'({step.why}): migrate it there first, or convert this call by hand',
                       False, False))
    elif step.converted and q.blocked and q.own_optimizer(arg):
      problems.append((f'{step.where} now takes a TrainState as `{name}` (this run converts '
                       f'it), but `{excerpt}` stays a flax.optim Optimizer here: fix the other '
                       'TODOs of this file and rerun, or convert this call by hand', False, True))
    elif step.converted and factory is not None and not factory.converted:
      problems.append((f'`{excerpt}` is created by {factory.where}, which keeps its legacy '
                       f'optimizer code ({factory.why}), and is passed to {step.where}, which '
                       f'this run converts to take a TrainState as `{name}`: migrate '
                       f'{factory.where} too, or convert this call by hand', False, False))
  return problems


def _restores_optimizer(q, arg) -> bool:
  """``arg``, handed to a checkpoint helper (:attr:`codemod.flow.Step.restores`), is an
  optimizer of this file, or may hold one and is named like one (``p`` may as well be params)."""
  return q.own_optimizer(arg) or (q.factory_of(arg) is None and q.maybe_optimizer(arg)
                                  and named_like_optimizer(arg))


def factories_to_legacy_steps(q) -> dict:
  """``{qualified: why}`` of the converted factories of other modules whose optimizer this
  file passes to a step function that keeps its legacy code (helper-20's `factory.py` /
  `steps.py` without flax.optim / `main.py`): the run then holds each (``codemod.flow``: its
  user is not counted as converting, for ``why``), so the step gets a flax.optim Optimizer,
  on the shim, and runs."""
  found = {}
  for uses in q.step_calls.values():
    for step, _, arg in uses:
      factory = q.factory_of(arg)
      if not step.converted and factory is not None and factory.converted:
        found.setdefault(factory.qualified,
                         f'it hands what {factory.function} returns to {step.where}, which '
                         f'keeps its legacy optimizer code ({step.why})')
  return found


def step_value_problem(q, node) -> Optional[tuple[str, bool]]:
  """A step function of another module (:class:`codemod.flow.Step`) named here other than
  in a call or a ``jax.jit`` / ``jax.pmap`` of it (``functools.partial(train_step, ...)``,
  ``fn = steps.train_step``): its calls are not followed, so when it and this file's
  optimizers end up on different sides of the migration, nothing else would say so.
  ``(text, note)``."""
  f = q.f
  if not q.step_calls_enabled or id(node) in f.call_funcs or id(node) in q.wrapped_args:
    return None
  step = q.step_named(node)
  if step is None:
    return None
  excerpt = code(node)
  legacy_factories = [fac for fac in f.flow_used.values() if not fac.converted]
  params = ', '.join(f'`{x}`' for _, x in step.params)
  if step.converted and legacy_factories:
    return (f'`{excerpt}` ({step.where}) is used as a value here, so its calls are not followed: '
            f'this run converts it to take a TrainState as {params}, while '
            f'{", ".join(fac.where for fac in legacy_factories)} keeps its legacy optimizer code '
            f'({legacy_factories[0].why}): make sure no optimizer made there reaches it'), False
  if step.converted and q.blocked and f.uses_legacy:
    return (f'`{excerpt}` ({step.where}) is used as a value here, so its calls are not followed: '
            f'this run converts it to take a TrainState as {params}, while this file keeps its '
            'legacy optimizer code: make sure no flax.optim Optimizer of this file reaches it'), True
  if not step.converted and ((q.converts and f.uses_legacy)
                             or any(fac.converted for fac in f.flow_used.values())):
    return (f'`{excerpt}` ({step.where}) keeps its legacy optimizer code ({step.why}) and is used '
            'as a value here, so its calls are not followed: an optimizer this file now makes '
            'a TrainState must not reach it: check, or migrate it there first'), False
  return None


def factory_lr(q) -> dict:
  """``{qualified name: passes a learning rate}`` of each factory of another module that the
  run converts and this file uses (``codemod.flow`` decides with it whether the factory
  converts: every file using it must, and it injects its rate when one of them passes one at
  ``apply_gradient`` / ``optimize`` time)."""
  f = q.f
  found = {fac.qualified: False for fac in f.flow_used.values() if fac.converted}
  for call in [*f.apply_calls, *f.optimize_calls]:
    if 'learning_rate' not in kwargs(call):
      continue
    fac = q.factory_of(call.func.value)
    if fac is not None and fac.qualified in found:
      found[fac.qualified] = True
    elif fac is None and not (f.create_calls and q.own_optimizer(call.func.value)):
      # an optimizer this file does not trace to a factory and does not create (read back
      # from its own container, `optimizer = state.optimizer`): it may come from any of
      # them, so each injects its rate (else a KeyError at `tree_set`, on a line with no TODO)
      found = dict.fromkeys(found, True)
  return found


def held_factory(q, function: str):
  """This module's factory ``function`` when the run keeps it legacy for a file using it
  (``codemod.flow.Factory.held``), else None."""
  flow = q.f.flow
  if flow is None or not flow.module or (function not in q.f.module_factories
                                         and function not in q.f.bundle_factories):
    return None  # (a bundle, `return {'optimizer': opt}`, is held as a factory is)
  found = flow.factories.get(f'{flow.module}.{function}')
  return found if getattr(found, 'held', '') else None


def held_class(q, name: str):
  """This module's class ``name`` with optimizer fields when the run keeps it legacy for a
  file reading its fields (``codemod.flow.Fields.held``), else None."""
  flow = q.f.flow
  if flow is None or not flow.module or name not in q.f.declared_fields:
    return None
  found = flow.factories.get(f'{flow.module}.{name}')
  return found if getattr(found, 'held', '') else None


def blocks(q) -> bool:
  """A step kept legacy that would get this file's optimizer as a TrainState; a use of an
  optimizer nothing proves, or that another module's factory kept legacy makes."""
  f = q.f
  if any(held_factory(q, fn.name.value) for fn in f.top_functions):
    return True
  if any(held_class(q, name) for name in f.declared_fields) or f.held_containers:
    return True
  if any(_restores_optimizer(q, arg) if step.restores else not step.converted and (
      q.own_optimizer(arg) or (q.factory_of(arg) is None and q.maybe_optimizer(arg)))
         for uses in q.step_calls.values() for step, _, arg in uses):
    return True
  if any(unproven_apply(q, c) and unproven_message(q, c.func.value)[1]
         for c in f.calls_by_func.values()):
    return True
  if any((found := def_create_message(q, c)) is not None and found[1]
         for c, _ in f.flow_def_creates):
    return True
  return any(a.attr.value in ('target', 'state') and q.unconverted(a.value)
             for a in f.member_attrs)


# -- sites ------------------------------------------------------------------------------------
def visit_function(p, node) -> None:
  """A factory of this module kept legacy for a file that uses it: flagged at its ``def``."""
  if p.q.f.flow is None or not any(node is fn for fn in p.q.f.top_functions):
    return
  if (found := held_factory(p.q, node.name.value)) is not None:
    p.flag(node, 'OM123', f'what `{node.name.value}` returns is used by {found.held}: kept a '
                          'flax.optim Optimizer with it, on the shim (a TrainState would fail '
                          'there); migrate them together', blocks=True)


def visit_class(p, node) -> None:
  """A class with optimizer fields kept legacy for a file reading them: flagged at its
  ``class`` line."""
  if p.q.f.flow is not None and (found := held_class(p.q, node.name.value)) is not None:
    p.flag(node, 'OM123', f'the optimizer fields of `{node.name.value}` are read by '
                          f'{found.held}: what they hold stays a flax.optim Optimizer, on the '
                          'shim (a TrainState would fail there); migrate them together',
           blocks=True)


def leave_held_container(p, original) -> None:
  """``TrainState(optimizer=opt)`` of another module's class that the run keeps legacy for a
  reader of its fields: this file keeps its legacy code with it."""
  found = p.q.f.held_containers.get(id(original))
  if found is not None:
    p.flag(original, 'OM123', f'`{code(original.func)}` is {found.where}, whose optimizer fields '
                              f'are read by {found.held}: what this file stores there stays a '
                              'flax.optim Optimizer, on the shim (a TrainState would fail '
                              'there); migrate them together', blocks=True)


def field_uses(q) -> list[str]:
  """The classes with optimizer fields of other modules (qualified) whose fields this module
  reads as ``<x>.<field>`` (:attr:`codemod.plan.Summary.field_uses`)."""
  f = q.f
  tree = f.flow.tree_fields if f.flow is not None else {}
  if not f.flow_classes and not tree:
    return []
  read = {a.attr.value for a in m.findall(q.analysis.module, m.Attribute())}
  found = {qualified for qualified, entry in f.flow_classes.items() if read & set(entry.fields)}
  # a field named like one of a class elsewhere in the tree, read where nothing says what it
  # holds, in a module using flax.optim (pkg/surgery.py handed main.py's `state`: `opt =
  # state.optimizer`, state surgery): if it keeps its legacy code, that class is held with it
  # (a TrainState would fail there). (A module without flax.optim is flagged instead, OM122.)
  if f.uses_legacy and tree:
    own = {field for fields in f.declared_fields.values() for field in fields}
    own |= {t.attr.value for targets, _ in f.assignments for t in targets
            if isinstance(t, cst.Attribute)}  # (`self.optimizer = ...`: its own attribute)
    state_read = {a.attr.value for a in m.findall(q.analysis.module, m.Attribute())
                  if not _config_receiver(a.value)}
    found |= {entry.qualified for field, entry in tree.items()
              if field in state_read and field not in own}
  return sorted(found)


def _config_receiver(node) -> bool:
  """``node`` (an attribute's receiver) names a configuration (``config``, ``FLAGS``,
  ``self.hparams``: :data:`codemod.legacy_api.CONFIG_RECEIVER`)."""
  last = node.attr.value if isinstance(node, cst.Attribute) else getattr(node, 'value', None)
  return isinstance(last, str) and api.CONFIG_RECEIVER.search(last.lower()) is not None


def visit_name(p, node) -> None:
  q = p.q
  if q.step_calls_enabled and (found := step_value_problem(q, node)):
    text, note = found
    p.flag(node, 'OM124', text, note=note)


def leave_step_call(p, original) -> bool:
  for text, blocking, note in step_problems(p.q, original):
    p.flag(original, 'OM124', text, blocks=blocking, note=note)
  return False


def leave_unproven_apply(p, original) -> bool:
  q = p.q
  if not unproven_apply(q, original):
    return False
  # not proven: a file without flax.optim, or another module's optimizer kept legacy there
  text, blocking = unproven_message(q, original.func.value)
  if 'learning_rate' in kwargs(original):
    text += ('; as a TrainState, `.apply_gradient(g, learning_rate=lr)` is '
             '`.replace(opt_state=optax.tree_utils.tree_set(<it>.opt_state, learning_rate=lr))'
             '.apply_gradients(grads=g)`, and only a transformation built with '
             'optax.inject_hyperparams where it is created has a rate to set: without one '
             'the schedule is lost')
  p.flag(original, 'OM122', text, blocks=blocking)
  return True


def def_create_message(q, call: cst.Call) -> Optional[tuple[str, bool]]:
  """``d.create(p)`` on another module's legacy def (what a function of the run returns,
  or a parameter named like a def in a file nothing proves): the flag and whether it
  keeps the file legacy (it does where this file's own code would be converted around a
  flax.optim Optimizer)."""
  f = q.f
  found = next(((c, made) for c, made in f.flow_def_creates if c is call), None)
  if found is None or q.is_optimizer(call):
    return None
  _, made = found
  recv = code(create_receiver(q.n, call))
  after = ('as Optax: `train_state.TrainState.create(apply_fn=..., params=..., tx=tx)`')
  if made is not None:
    if made.converted:
      text = (f'`{recv}` is what {made.where} returns, which this run makes an Optax '
              f'transformation: {after}; convert this call by hand')
    else:
      text = (f'`{recv}` is the flax.optim def {made.where} returns, which keeps its legacy '
              f'optimizer code: `.create` makes a flax.optim Optimizer here; migrate them '
              f'together ({after})')
      # a flax.optim Optimizer for certain: this file's code around it (a container class of
      # the run it is stored in, read as a TrainState elsewhere) keeps its legacy code too
      return text, True
    return text, f.uses_legacy and not q.unproven
  # what it makes is a flax.optim Optimizer wherever the def is one: a file that would be
  # converted around it (`.target` read as `.params`) keeps its legacy code instead
  # (helper-35's D3: "made elsewhere" was said of a def a same-file factory kept legacy makes)
  return (f'if `{recv}` is a flax.optim optimizer def (what it is is not proven here: a '
          f'parameter, or made by code the run does not convert), `.create` makes a '
          f'flax.optim Optimizer: migrate it where the def is made ({after})'), (
              f.uses_legacy and not q.unproven)


def leave_def_create(p, original) -> bool:
  if not p.q.f.flow_def_creates or (found := def_create_message(p.q, original)) is None:
    return False
  text, blocking = found
  p.flag(original, 'OM122', text, blocks=blocking)
  return True


#: The members of a flax.optim Optimizer flagged (OM122) on a value another module's factory or
#: class kept legacy makes (``.apply_gradient`` is flagged at its call).
UNCONVERTED_MEMBERS = frozenset({'target', *api.LEGACY_ONLY_ATTRS})


def leave_unconverted_member(p, original, no_equivalent=False) -> bool:
  """``.target``, ``.state``, ``.optimizer_def``, ``.replace(target=...)``... on what another
  module kept legacy makes: each such use is flagged, not only the first of a function
  (a member already flagged as having no TrainState equivalent, ``no_equivalent``, once)."""
  q = p.q
  member = original.attr.value
  if (member in UNCONVERTED_MEMBERS or q.field_replace(original)) and q.unconverted(original.value):
    if no_equivalent and member not in ('target', 'state'):
      return True
    shown = 'replace(target=...)' if member == 'replace' else member
    text, blocking = unproven_message(q, original.value, f'`.{shown}`')
    p.flag(original, 'OM122', text, blocks=blocking)
    return True
  return False


def leave_flow_failure(p, original) -> None:
  q = p.q
  if q.blocked and (original.attr.value in api.FLOW_FAILING_ATTRS or q.field_replace(original)):
    message = flow_failure(q, original)
    if message is not None:
      p.flag(original, 'OM123', message, note=True)
    elif (message := kept_member_message(q, original)) is not None:
      p.flag_unless_flagged(original, 'OM122', message)
  elif q.blocked and original.attr.value == 'create' and (
      message := kept_member_message(q, original)) is not None:
    p.flag_unless_flagged(original, 'OM122', message)  # (`get_optimizer(cfg).create(p)`)


def kept_member_message(q, attr: cst.Attribute) -> Optional[str]:
  """In a file that keeps its legacy code and never names flax.optim (so no OM014
  ``install()`` marks it: its optimizers are made by code on the shim, a def factory the run
  leaves there), each Optimizer use left on an optimizer-looking value (``.target``,
  ``.apply_gradient``, ``.optimizer_def``, ...): the TODO that says it is kept, on its line."""
  from codemod.rules import fallback
  if fallback.touches_legacy(q):
    return None
  if attr.attr.value == 'create':
    if not q.n.is_def(attr.value):
      return None
    return (f'`{code(attr.value)}.create(...)` is left as it is (the TODOs of this file say '
            'why): the def comes from code on the shim, and so does the flax.optim Optimizer '
            'it makes; migrate them together')
  if not (q.is_optimizer(attr.value) or q.maybe_optimizer(attr.value)
          or named_like_optimizer(attr.value)):
    return None
  member = 'replace(target=...)' if attr.attr.value == 'replace' else attr.attr.value
  return (f'`{code(attr.value)}.{member}` is left as it is (the TODOs of this file say why): '
          'the optimizer comes from code on the shim, where it runs as flax.optim did; '
          'migrate them together')


def tree_field_message(q, value, member: str = '') -> Optional[str]:
  """``value`` (``state.optimizer``, read with ``.target`` / ``.state`` / ``member``) is named
  like a field of a class with optimizer fields elsewhere in the tree, and nothing in this
  file says what it holds: the flag that says what that class becomes."""
  f = q.f
  if (f.flow is None or not isinstance(value, cst.Attribute) or q.is_optimizer(value)
      or value.attr.value in f.annotated_fields or value.attr.value in f.legacy_fields):
    return None
  found = f.flow.tree_fields.get(value.attr.value)
  if found is None:
    return None
  where = found.where
  if found.converted and member and member not in ('target', 'state'):
    return (f'`{code(value)}` is named like the `{value.attr.value}` field of {where}, which '
            f'this run makes a TrainState: if it is that one, a TrainState has no '
            f'`.{member}` (`.optimizer_def` is `.tx`, an Optax transformation, with no '
            '`hyper_params`); convert this by hand')
  if found.converted:
    return (f'`{code(value)}` is named like the `{value.attr.value}` field of {where}, which '
            'this run makes a TrainState: if it is that one, `.target` is `.params` and '
            '`.state.step` is `.step` there; convert this by hand')
  return (f'`{code(value)}` is named like the `{value.attr.value}` field of {where}, which '
          f'keeps its legacy optimizer code ({found.why}): if it is that one, it stays a '
          'flax.optim Optimizer (on the shim); migrate them together')


def leave_tree_field_replace(p, original) -> bool:
  """``state.optimizer.replace(target=...)`` where ``state.optimizer`` is named like the
  optimizer field of a class elsewhere in the tree that this run makes a TrainState, and
  nothing here says what it holds (a TrainState's ``replace`` has no ``target`` field: the
  call would fail there). Ends the call's chain when it flags."""
  q = p.q
  func = original.func
  if not m.matches(func, m.Attribute(value=m.Attribute(), attr=m.Name('replace'))):
    return False
  fields = sorted({a.keyword.value for a in original.args if a.keyword is not None}
                  & api.OPTIMIZER_FIELDS)
  recv = func.value
  f = q.f
  if (not fields or f.flow is None or q.is_optimizer(recv) or recv.attr.value in f.annotated_fields
      or recv.attr.value in f.legacy_fields
      or (found := f.flow.tree_fields.get(recv.attr.value)) is None):
    return False
  if found.converted:
    p.flag(original, 'OM122', f'`{code(recv)}` is named like the `{recv.attr.value}` field of '
                              f'{found.where}, which this run makes a TrainState: if it is that '
                              'one, `.replace(target=...)` is `.replace(params=...)` there '
                              '(`state=` has no counterpart); convert this by hand')
  else:
    p.flag(original, 'OM122', tree_field_message(q, recv))  # (it stays a shim Optimizer)
  return True


def named_member(attr: cst.Attribute):
  """``(receiver, member)`` for a flax.optim Optimizer member read on a value named like an
  optimizer (:data:`codemod.legacy_api.OPTIMIZER_NAMED`): ``optimizer.target``,
  ``state.optimizer.state.step`` (at its ``.step``), ``opt.optimizer_def``; else None."""
  member, recv = attr.attr.value, attr.value
  if member in ('step', 'param_states') and m.matches(recv, m.Attribute(attr=m.Name('state'))):
    member, recv = f'state.{member}', recv.value
  if member not in api.NAMED_MEMBERS:
    return None
  return (recv, member) if named_like_optimizer(recv) else None


def named_member_message(q, attr: cst.Attribute) -> Optional[str]:
  """In a file that never imports flax.optim and has nothing else to say about the value:
  the flag on ``optimizer.target`` and the like (the optimizer is made in another file, or
  by code no module of the run shows)."""
  f = q.f
  found = named_member(attr)
  if found is None and q.field_replace(attr) and named_like_optimizer(attr.value):
    found = attr.value, 'replace(target=...)'
  if found is None or not q.unproven or q.annotated_plain(found[0]):
    return None  # (`opt_batch: Batch`: annotated with a plain class, no optimizer)
  recv, member = found
  flagged_as_local = (f.apply_calls and q.holds_local(recv)
                      and (member == 'target' or member.startswith('state.')))
  if (flagged_as_local or tree_field_message(q, recv) is not None
      or q.factory_of(recv) is not None):
    return None  # flagged with its `.apply_gradient`, as a field, or as a factory's optimizer
  return (f'this file never imports flax.optim, and nothing here says what `{code(recv)}` '
          f'holds: if it is a flax.optim Optimizer, once migrated to a TrainState its '
          f'`.{member}` is {api.NAMED_MEMBERS[member]}; convert this where that is so')


def leave_unproven_member(p, original) -> None:
  q = p.q
  f = q.f
  if (text := named_member_message(q, original)) is not None:
    if not p.todo_above():  # (a file an earlier run converted: its TODO says more)
      p.flag(original, 'OM122', text)
    return
  if original.attr.value in UNCONVERTED_MEMBERS and (
      text := tree_field_message(q, original.value, original.attr.value)) is not None:
    p.flag(original, 'OM122', text)  # (`.replace(target=...)`: leave_tree_field_replace)
    return
  if (q.unproven and original.attr.value in ('target', 'state') and f.apply_calls
      and not f.defines_apply_gradient and q.holds_local(original.value)):
    # the `.apply_gradient` of this name is flagged as unproven: so is its `.target` / `.state`
    text, blocking = unproven_message(q, original.value, f'`.{original.attr.value}`')
    p.flag(original, 'OM122', text, blocks=blocking)


def container_handoffs(q) -> dict:
  """The functions of other modules this module hands instances of classes with optimizer
  fields: its own (l2p's ``train_continual.py`` passes its ``state`` to
  ``utils.state_with_new_param(state, p)``, whose module reads ``state.optimizer.target``
  without naming the class), or another module's that it names or imports
  (``state = create_train_state(...)`` of ``proj.state``, then ``helpers.param_norm(state)``):
  ``{qualified function as imported (relative ones too): (((class, fields), ...), mixed)}``,
  an own class by its name, another module's qualified (:class:`codemod.flow.Handoff`);
  ``mixed``: some call of it here passes something else in that argument. An instance
  is a name assigned one or read as ``<name>.<field>``, or an own class called in place,
  passed as an argument of a call whose function an import binds, in the same argument of
  every call of that function in this module."""
  from libcst.metadata import QualifiedNameSource
  f, n = q.f, q.n
  classes = tuple((cls, tuple(fields)) for cls, fields in sorted(f.declared_fields.items()))
  classes += tuple((qualified, tuple(found.fields))
                   for qualified, found in sorted(f.flow_classes.items()))
  if not classes:
    return {}
  containers = f.container_vars | f.container_params | q.container_receivers()

  def container(value) -> bool:
    return ((isinstance(value, cst.Name) and n.binding(value) in containers)
            or (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
                and value.func.value in f.declared_fields))
  slots: dict = {}  # qualified function -> the slots of each call of it: those given one
  for call in f.calls_by_func.values():
    scope = n.scope(call.func)
    names = [qname.name for qname in (scope.get_qualified_names_for(call.func) if scope else ())
             if qname.source is QualifiedNameSource.IMPORT]
    if not names:
      continue
    given = frozenset(a.keyword.value if a.keyword is not None else i
                      for i, a in enumerate(call.args) if a.star == '' and container(a.value))
    for name in names:
      slots.setdefault(name, []).append(given)
  # every call of the function here hands an instance in the same argument; one called with
  # something else there too (a namedtuple standing in for it) is a mixed hand-off: its module
  # then proves nothing by it (codemod.flow.Handoff.mixed)
  return {name: (classes, not all(g == given[0] for g in given))
          for name, given in sorted(slots.items()) if any(given)}
