"""Facts settled after the analysis visit: rebinds, attribute copies, parameters that
receive optimizers, and the module's step functions."""
from __future__ import annotations

import collections
import re
from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.facts.values import holds_optimizer, made_here, wrapper_of
from codemod.names import Names, call_argument


def settle(analyzer) -> None:
  """Finish ``analyzer``'s facts once the whole module has been visited."""
  n, f = analyzer.n, analyzer.f
  if not f.uses_legacy and f.create_calls:
    # `momentum_clip.Optimizer(...).create(p)` with no flax.optim import (vit's train.py): it
    # creates flax.optim optimizers from another module's defs, and proves them, as a file
    # importing flax.optim does
    f.uses_legacy = True
  f.rebound.update(analyzer.rebinds & f.opt_vars)
  _split_def_rebinds(n, analyzer.assign_sites)
  _other_values_of_defs(n, analyzer.assign_sites)
  _weight_norm_rebinds(n, analyzer.assign_sites)
  changed = True
  while changed:  # `self.o = jax_utils.replicate(self.o)` wherever it stands in the file
    changed = False
    for chain, inner in analyzer.chain_copies:
      if inner in f.attr_chains and chain not in f.attr_chains:
        f.attr_chains.add(chain)
        changed = True
  f.attr_other.update(chain for chain, inner in analyzer.chain_copies
                      if inner not in f.attr_chains)
  _follow_instances(analyzer)
  sites = None
  # `return TrainState(step=0, optimizer=opt)` in a factory, no name assigned one: its
  # callers' names still hold one (a user's `restore_checkpoint(workdir, state)` was left)
  containers = bool(f.container_vars) or any(
      analyzer.makes_container(v) or (isinstance(v, cst.Tuple) and any(
          analyzer.makes_container(e.value) for e in v.elements))
      for values in f.top_returns.values() for v in values)
  if f.uses_legacy or f.flow_vars or containers:
    sites = [(fn, calls) for fn in f.functions
             if (calls := _call_sites(n, fn.name, _decorator_methods(n, fn)))]
    sites += [(call.args[0].value, calls) for assign, call in f.wrapped  # `W(lambda o, b: ...)`
              if isinstance(call.args[0].value, cst.Lambda)
              and (calls := _call_sites(n, assign.targets[0].target,
                                        api.WRAPPERS[wrapper_of(n, call)].methods))]
  if f.uses_legacy or f.flow_vars:
    _follow_parameters(n, sites)
  if f.uses_legacy and (f.create_calls or (f.train_state_creates and not f.apply_calls
                                           and not f.flow_used and not f.flow_vars)):
    _follow_uncalled(n)
  if containers:
    _follow_containers(analyzer, sites)
  f.steps = _step_params(n)


def _follow_instances(analyzer) -> None:
  """``agent = Agent(...)`` then ``agent.optimizer.target``: ``Agent`` a class of this module
  whose methods set ``self.optimizer`` to nothing but optimizers. The chain ``agent.optimizer``
  holds one too, when every plain assignment of the name ``agent`` in the module makes an
  ``Agent`` and no function takes ``agent`` as a parameter or loop variable (chains are
  followed by their text, as ``self.optimizer`` is)."""
  f = analyzer.f
  if not analyzer.class_chains:
    return
  made: dict = {}  # name -> the classes its plain assignments call (None: something else)
  for (_, name), sites in analyzer.assign_sites.items():
    for _, value, _ in sites:
      cls = (value.func.value if isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
             else None)
      made.setdefault(name, set()).add(cls if cls in analyzer.class_chains else None)
  other = {name for _, name in f.params | f.loop_vars | analyzer.rebinds}
  for name, classes in sorted(made.items()):
    if len(classes) != 1 or None in classes or name in other or name == 'self':
      continue
    (cls,) = classes
    for attr in sorted(analyzer.class_chains[cls]):
      inner, chain = f'self.{attr}', f'{name}.{attr}'
      if inner in f.attr_chains and inner not in f.attr_other and chain not in f.attr_other:
        f.attr_chains.add(chain)
        if inner in f.attr_flow:
          f.attr_flow.setdefault(chain, f.attr_flow[inner])


def _follow_containers(analyzer, sites) -> None:
  """Instances of a class with optimizer fields (``f.container_vars``, read by the checkpoint
  rules: ``restore_checkpoint(d, state)`` restores a legacy optimizer inside it) reach more
  names: ``state = create_train_state(...)`` (one such assignment, as for ``state =
  TrainState(...)``), a module-level function of this file whose every ``return`` gives one
  (Flax v0.3 imagenet), and a parameter of a function (not a method) this
  file only ever calls, every call passing one (``def restore_checkpoint(state, workdir)``).
  ``sites``: each such function with its calls. Repeated until nothing changes."""
  n, f = analyzer.n, analyzer.f

  def gives_one(value) -> bool:
    return value is not None and (analyzer.makes_container(value) or (
        isinstance(value, cst.Name) and n.binding(value) in f.container_vars))
  makers = f.container_makers  # (offered to other modules: codemod.flow.ContainerFactory)
  in_tuples: dict[str, int] = {}  # `return model, TrainState(...)`: the position it is at
  changed = True
  while changed:
    changed = False
    new = {name for name, values in f.top_returns.items()
           if name not in makers and all(gives_one(v) for v in values)}
    if new:
      makers |= new
      changed = True
    for name, values in f.top_returns.items():
      if name not in makers and name not in in_tuples and (
          at := _tuple_position(values, gives_one)) is not None:
        in_tuples[name] = at
        changed = True
    for targets, value in f.assignments:  # `model, state = create_train_state(...)`
      if (len(targets) == 1 and isinstance(targets[0], (cst.Tuple, cst.List))
          and isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
          and value.func.value in in_tuples
          and len(targets[0].elements) > in_tuples[value.func.value]):
        element = targets[0].elements[in_tuples[value.func.value]]
        if (isinstance(element.value, cst.Name) and not isinstance(element, cst.StarredElement)
            and (b := n.binding(element.value)) is not None and b not in f.container_vars):
          f.container_vars.add(b)
          changed = True
    for b, assigned in analyzer.assign_sites.items():
      if b not in f.container_vars and any(  # (as `state = TrainState(...)`: any assignment)
          isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value in makers
          for _, v, _ in assigned):
        f.container_vars.add(b)
        changed = True
    for fn, calls in sites:
      for param in _parameters(fn):
        b = n.binding(param.name)
        if b is None or b in f.container_vars:
          continue
        args = [_argument(n, fn, param, call) for call in calls]
        if all(isinstance(a, cst.Name) and n.binding(a) in f.container_vars for a in args):
          f.container_vars.add(b)
          changed = True


def _tuple_position(values, gives_one) -> Optional[int]:
  """The one position at which every returned value, a tuple display of one length, holds
  an instance of a class with optimizer fields (``return model, TrainState(...)``)."""
  if not values or not all(isinstance(v, cst.Tuple) for v in values):
    return None
  sizes = {len(v.elements) for v in values}
  if len(sizes) != 1 or any(isinstance(e, cst.StarredElement) for v in values for e in v.elements):
    return None
  found = [i for i in range(sizes.pop()) if all(gives_one(v.elements[i].value) for v in values)]
  return found[0] if len(found) == 1 else None


# -- a name holding a def, then the optimizer its create returns ---------------------------
def _split_def_rebinds(n: Names, assign_sites: dict) -> None:
  """``opt = Adam(1e-3)`` then ``opt = opt.create(p)``: one name, two values in time.

  When the def's assignment is the name's first and the create's its next, both plain
  assignments in the same block, and every read of the name is in its own scope after
  the def's, the reads after the create are the optimizer's: they are not taken for the
  def (passing the optimizer on or calling its ``apply_gradient`` converts; the def
  becomes the Optax transformation and ``tx=opt`` reads it before the rebind). Any other
  such name is flagged with what happened (``Facts.mixed_defs``) and keeps the file legacy.
  """
  f = n.facts
  for b in sorted(set(f.def_vars) & f.opt_vars - f.rebound, key=str):
    sites = assign_sites.get(b, [])
    if not any(m.matches(v, m.Call(func=m.Attribute(value=m.Name(t.value), attr=m.Name('create'))))
               for t, v, _ in sites[1:]):
      continue  # no `x = x.create(...)`: not this case
    after = _optimizer_reads(n, sites)
    reads = {id(r.node) for t, _, _ in sites for r in _accesses(n, t)}
    if after is None:
      defs = [f.def_defaults.get(id(v), v) for _, v, _ in sites
              if n.legacy_def(v) or n.is_user_def(v) or id(v) in f.def_defaults]
      if defs:
        f.mixed_defs[id(defs[0])] = sites[0][0].value
      after = reads  # its uses are flagged there, not as a def's
    f.escaping = {k: v for k, v in f.escaping.items() if k not in after}
    f.def_attrs = [a for a in f.def_attrs if id(a.value) not in after]


def _other_values_of_defs(n: Names, assign_sites: dict) -> None:
  """Names holding a def that are also assigned something this file cannot tell is one
  (``d = Adam(1e-3)`` in one branch, ``d = MyDef(0.1)`` of a class imported from another
  module in the other): ``Facts.def_var_others``. A ``d.create(p)`` converted to
  ``TrainState.create(..., tx=d)`` would fail on the other value (it has no ``init``), so
  that create is flagged (OM118) and the file keeps its legacy code."""
  f = n.facts
  for b in f.def_vars:
    users, others = [], False
    for target, value, _ in assign_sites.get(b, []):
      if m.matches(value, m.Call(func=m.Attribute(value=m.Name(target.value),
                                                   attr=m.Name('create')))):
        break  # `d = d.create(p)`: the values after it are the optimizer's (_split_def_rebinds)
      if n.is_user_def(value):
        users.append(value)
      elif n.is_def(value) or id(value) in f.def_defaults:
        others = True  # (`params.get('optimizer', Adam(lr))`: its default a table def)
      elif not m.matches(value, m.Name('None')):
        f.def_var_others.setdefault(b, value)  # (None: no create then, in legacy either)
    if users and others:
      # a table def in one branch, a user def in another (efficientnet-jax's optimizer
      # factory): each user def is wrapped where it is assigned, `tx=d` left as is
      f.mixed_user_bindings.add(b)
      f.user_def_wraps.update(id(v) for v in users)


def _weight_norm_rebinds(n: Names, assign_sites: dict) -> None:
  """``d = Adam(lr)`` then, where the config asks, ``d = WeightNorm(d)`` (nerfies' and
  hypernerf's ``train.py``): ``d`` becomes Adam's Optax transformation and the wrap
  ``optim_compat.transforms.weight_norm(d)`` (``Facts.wn_rebinds``), so its ``.create``
  takes ``tx=d`` either way. Every plain assignment of the name before a
  ``d = d.create(p)`` must be a table def or such a wrap."""
  from optim_compat import spec as spec_lib
  f = n.facts
  for b in f.def_vars:
    values = []
    for target, value, _ in assign_sites.get(b, []):
      if m.matches(value, m.Call(func=m.Attribute(value=m.Name(target.value),
                                                   attr=m.Name('create')))):
        break
      values.append(value)
    wraps = [v for v in values if n.legacy_def(v) == api.WEIGHT_NORM and v.args
             and v.args[0].keyword is None and not v.args[0].star
             and isinstance(v.args[0].value, cst.Name) and n.binding(v.args[0].value) == b]
    if wraps and b not in f.rebound and all(
        any(v is w for w in wraps) or n.legacy_def(v) in spec_lib.SPECS for v in values):
      f.wn_rebinds.update(id(w) for w in wraps)


def _accesses(n: Names, name: cst.Name):
  scope = n.scope(name)
  if scope is None:
    return []
  # (a read before every assignment is linked to none of them: the scope's own list has it)
  reads = {id(r): r for r in scope.accesses[name.value]}
  reads.update((id(r), r) for a in scope.assignments[name.value] for r in a.references)
  return list(reads.values())


def _optimizer_reads(n: Names, sites) -> Optional[set[int]]:
  """ids of the reads of a def name that see the optimizer (see :func:`_split_def_rebinds`),
  or None when that cannot be told."""
  if len(sites) < 2:
    return None
  (d_name, d_value, d_block), (c_name, c_value, c_block) = sites[:2]
  scope = n.scope(d_name)
  is_def = lambda v: n.legacy_def(v) or n.is_user_def(v) or id(v) in n.facts.def_defaults
  if (scope is None or len(list(scope.assignments[d_name.value])) != len(sites)
      or not is_def(d_value) or any(is_def(v) for _, v, _ in sites[1:])
      or d_block != c_block
      or not m.matches(c_value, m.Call(func=m.Attribute(value=m.Name(d_name.value),
                                                        attr=m.Name('create'))))):
    return None
  d_end, c_end = n.position(d_value), n.position(c_value)
  if d_end is None or c_end is None:
    return None
  d_end, c_end = (d_end.end.line, d_end.end.column), (c_end.end.line, c_end.end.column)
  after = set()
  for read in _accesses(n, d_name):
    where = n.position(read.node)
    if read.scope is not scope or where is None:
      return None  # a closure or comprehension: read when it runs
    at = (where.start.line, where.start.column)
    if at < d_end:
      return None  # before the def (a loop's next round sees the optimizer)
    if at > c_end:
      after.add(id(read.node))
  return after


# -- parameters that receive optimizers -------------------------------------------------------
def _parameters(fn):  # a FunctionDef or a Lambda
  return [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]


def _follow_parameters(n: Names, sites) -> None:
  """Parameters proven to hold optimizers join ``opt_vars``.

  A parameter is proven when its function (not a method) is only ever called
  in this file, directly or through ``jax.jit``/``jax.pmap`` bound to a name,
  and every call passes it a proven optimizer (``evaluate(optimizer, batch)``
  after ``optimizer = Adam(...).create(p)``). A function used any other way
  (passed as a value, called with ``*args``) proves nothing. Repeated until
  nothing changes, so a helper called by a proven function is followed too.
  ``sites``: each such function with its calls (``_call_sites``).
  """
  f = n.facts
  changed = True
  while changed:
    changed = False
    for fn, calls in sites:
      for param in _parameters(fn):
        b = n.binding(param.name)
        if b is None or b in f.rebound or b in f.flow_vars:
          continue
        args = [_argument(n, fn, param, call) for call in calls]
        sources = {n.name_factory(a) for a in args}
        if len(sources) == 1 and (factory := sources.pop()) is not None and factory.converted:
          f.flow_vars[b] = factory  # `step(opt, g)` with `opt = create_optimizer(p)`
          changed = True
        elif b in f.opt_vars:
          continue
        elif f.uses_legacy and all(a is not None and holds_optimizer(n, a) for a in args):
          f.opt_vars.add(b)
          changed = True
  changed = True
  while changed:  # parameters every call passes an optimizer made in this file (or a factory's)
    changed = False
    for fn, calls in sites:
      for param in _parameters(fn):
        b = n.binding(param.name)
        if b is None or b in f.made_here_params:
          continue
        args = [_argument(n, fn, param, call) for call in calls]
        if all(a is not None and (made_here(n, a) or n.name_factory(a) is not None)
               for a in args):
          f.made_here_params.add(b)
          changed = True


#: A parameter named as an optimizer is (``optimizer``, ``opt``, ``new_optimizer``, ``opt_g``).
_OPTIMIZER_PARAM = re.compile(r'(?:\w+_)?(?:optimizer|opt)(?:_\w+)?')


def _follow_uncalled(n: Names) -> None:
  """A module-level function that nothing in this file names, in a file that creates its own
  optimizers, or whose only training state is a ``TrainState.create(..., params=..., tx=...)``
  and which steps no flax.optim Optimizer (alpa's benchmarks each define
  ``compute_data_parallel_cost(optimizer, ...)`` and call none; ``benchmark_gpt_bert.py``
  already builds an Optax TrainState): a parameter named as an optimizer
  (:data:`_OPTIMIZER_PARAM`, not annotated) holds this file's kind of optimizer, a ``TrainState`` once rewritten, when it is used only for ``.target``
  and ``.apply_gradient(...)`` (which convert: were OM117); any other use (``.state``, a
  restore into it, passed on) proves nothing. Another module calling it is the flow's
  (:class:`codemod.flow.Step`)."""
  f = n.facts
  members = {id(a.value) for a in f.member_attrs if a.attr.value in ('target', 'apply_gradient')}
  for fn in f.top_functions:
    if _call_sites(n, fn.name) != []:
      continue  # called here (followed by its arguments), or used as a value
    for param in _parameters(fn):
      b = n.binding(param.name)
      if (b is None or b in f.rebound or b in f.flow_vars
          or not _OPTIMIZER_PARAM.fullmatch(param.name.value)):
        continue
      if param.annotation is not None:  # its annotation says what it holds (`opt: Tracked`, a
        continue  # user Optimizer subclass kept on the shim; `optim.Optimizer`: the analyzer's)
      scope = n.scope(param.name)
      uses = [a.node for binding in (scope[param.name.value] if scope is not None else ())
              if getattr(binding, 'node', None) is param for a in binding.references]
      if uses and all(id(u) in members for u in uses):
        f.opt_vars.add(b)


def _call_sites(n: Names, name: cst.Name, methods=()) -> Optional[list[cst.Call]]:
  """Every call of the function ``name`` defines, or None when it is used otherwise.

  A call of ``name``, of a name a wrapper bound it to (``p_step = jax.pmap(step)``), of a
  wrapper inline (``jax.make_jaxpr(step)(opt, b)``), or of one of ``methods`` on it (the
  wrapper's methods that take its arguments: ``train_step.get_executable(opt, b)`` under
  alpa's ``@parallelize``) counts (:data:`codemod.legacy_api.WRAPPERS`)."""
  scope = n.scope(name)
  assignments = list(scope[name.value]) if scope is not None else []
  if len(assignments) != 1:
    return None  # redefined or rebound: cannot tell which one a call reaches
  f = n.facts
  calls = []
  for access in assignments[0].references:
    node = access.node
    call = f.calls_by_func.get(id(node))
    if call is not None:
      calls.append(call)
      continue
    if (via := _method_call(n, node, methods)) is not None:
      calls.append(via)
      continue
    if (inline := _inline_wrapper_call(n, node)) is not None:
      calls.append(inline)
      continue
    alias = _wrapper_alias(n, node)
    if alias is None:
      if (closure := _closure_calls(n, node)) is None:
        return None
      calls.extend(closure)
      continue
    assign, wrap = alias
    more = _call_sites(n, assign.targets[0].target, api.WRAPPERS[wrapper_of(n, wrap)].methods)
    if more is None:
      return None
    calls.extend(more)
  return calls


def _closure_calls(n: Names, node) -> Optional[list[cst.Call]]:
  """The calls of a nested function that a module-level function returns (a step factory:
  vit's ``make_update_fn(...)`` ends ``return jax.pmap(update_fn, ...)``) when ``node`` is
  that return's name: every call of the factory is assigned to a name
  (``update_fn_repl = make_update_fn(...)``), whose calls are the function's; else None."""
  f = n.facts
  if f.closure_returns is None:
    f.closure_returns = {}
    for top, values in f.top_returns.items():
      for value in values:
        if isinstance(value, cst.Name):
          f.closure_returns[id(value)] = (top, ())
        elif (isinstance(value, cst.Call) and value.args and value.args[0].keyword is None
              and isinstance(value.args[0].value, cst.Name)
              and (wrapper := wrapper_of(n, value)) is not None):
          f.closure_returns[id(value.args[0].value)] = (top, api.WRAPPERS[wrapper].methods)
  found = f.closure_returns.get(id(node))
  if found is None:
    return None
  top, methods = found
  fn = next((fn for fn in f.top_functions if fn.name.value == top), None)
  outer = _call_sites(n, fn.name) if fn is not None else None
  if not outer:
    return None
  assigned = {id(value): targets for targets, value in f.assignments}
  calls = []
  for call in outer:
    targets = assigned.get(id(call))
    if not targets or len(targets) != 1 or not isinstance(targets[0], cst.Name):
      return None  # (used otherwise: passed on, unpacked, called in place)
    more = _call_sites(n, targets[0], methods)
    if more is None:
      return None
    calls.extend(more)
  return calls


def _decorator_methods(n: Names, fn: cst.FunctionDef) -> tuple[str, ...]:
  """The argument-taking methods the wrappers decorating ``fn`` give it (``@jax.jit``:
  ``lower``; ``@parallelize(donate_argnums=())``: ``get_executable``)."""
  out = []
  for d in fn.decorators:
    expr = d.decorator
    if isinstance(expr, cst.Call) and all(a.keyword is not None for a in expr.args):
      expr = expr.func
    for q in sorted(n.qnames(expr) & api.CALL_WRAPPERS):
      out.extend(api.WRAPPERS[q].methods)
  return tuple(out)


def _method_call(n: Names, node, methods) -> Optional[cst.Call]:
  """The call ``node.METHOD(...)`` for a METHOD in ``methods``, or None."""
  if not methods:
    return None
  f = n.facts
  if f.receiver_calls is None:
    f.receiver_calls = {}
    for call in f.calls_by_func.values():
      if isinstance(call.func, cst.Attribute):
        f.receiver_calls.setdefault(id(call.func.value), []).append(call)
  return next((c for c in f.receiver_calls.get(id(node), ()) if c.func.attr.value in methods),
              None)


def _inline_wrapper_call(n: Names, node) -> Optional[cst.Call]:
  """``jax.make_jaxpr(step, ...)(opt, b)`` when ``node`` is that ``step``: the outer call."""
  f = n.facts
  if f.wrapper_calls is None:
    f.wrapper_calls = {id(c.args[0].value): c for c in f.calls_by_func.values()
                       if wrapper_of(n, c) is not None}
  wrap = f.wrapper_calls.get(id(node))
  return None if wrap is None else f.calls_by_func.get(id(wrap))


def _wrapper_alias(n: Names, node):
  """``(assignment, wrapper call)`` of ``p_step = jax.pmap(step, ...)`` when ``node`` is that
  ``step``, else None."""
  for (assign, call) in n.facts.wrapped:
    if call.args and call.args[0].value is node and call.args[0].keyword is None:
      return assign, call
  return None


def _argument(n: Names, fn, param: cst.Param, call: cst.Call):
  """The expression ``call`` passes to ``param`` (None: a default, or cannot tell); a call
  ``step(*args)`` with ``args`` a tuple display assigned once passes its items."""
  positional = [*fn.params.posonly_params, *fn.params.params]
  index = next((i for i, p in enumerate(positional) if p is param), None)
  keyword = None if any(param is p for p in fn.params.posonly_params) else param.name.value
  if (index is not None and len(call.args) == 1 and call.args[0].star == '*'
      and isinstance(call.args[0].value, cst.Name)
      and (items := _tuple_items(n, call.args[0].value)) is not None):
    return items[index] if index < len(items) else None
  return call_argument(call, index, keyword)


def _tuple_items(n: Names, name: cst.Name):
  """The items of the tuple display ``name`` is bound to by its only assignment (``args =
  (opt, batch)``), or None."""
  found = n.assignment(name)
  value = found[1] if found is not None else None
  if isinstance(value, cst.Tuple) and not any(isinstance(e, cst.StarredElement)
                                               for e in value.elements):
    return [e.value for e in value.elements]
  return None


def _step_params(n: Names) -> dict[str, tuple[tuple[Optional[int], str], ...]]:
  """Module-level functions with parameters this file treats as optimizers (``def
  train_step(opt, batch)`` that calls ``opt.apply_gradient``): ``{function: ((position
  among the positional parameters or None, name), ...)}``, for :mod:`codemod.flow`."""
  f = n.facts
  names = collections.Counter(fn.name.value for fn in f.top_functions)  # once, not per function
  # (in a module using flax.optim, a parameter whose legacy-only members are read, `opt.state`
  # / `opt.optimizer_def`, or whose state is written back, `opt.replace(state=...)`: state
  # surgery a caller hands its optimizer to (helper-22's `surgery.skip(opt)`))
  surgery = {n.binding(a.value) for a in f.legacy_attrs
             if isinstance(a.value, cst.Name) and a.attr.value in ('state', 'optimizer_def')}
  surgery |= {n.binding(c.func.value) for c in f.state_writes.values()
              if isinstance(c.func.value, cst.Name)}
  surgery = surgery - {None} if f.uses_legacy else set()
  out = {}
  for fn in f.top_functions:
    if names[fn.name.value] > 1:
      continue  # defined twice: which one a caller reaches cannot be told
    positional = [*fn.params.posonly_params, *fn.params.params]
    found = []
    for index, param in [*enumerate(positional), *((None, p) for p in fn.params.kwonly_params)]:
      b = n.binding(param.name)
      if b is not None and b not in f.rebound and (
          b in f.opt_vars or b in surgery
          or (b in f.flow_vars and f.flow_vars[b].converted)):
        found.append((index, param.name.value))
    if found:
      out[fn.name.value] = tuple(found)
  return out
