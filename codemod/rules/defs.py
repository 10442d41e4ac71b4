"""Rule family *defs*: optimizer defs, ``MultiOptimizer`` / ``WeightNorm``, ``create`` and the
def's hyper-parameters.

OM001 (``Def(...)`` -> the table's Optax chain, ``.create(p)`` ->
``TrainState.create``), OM008 (``MultiOptimizer`` / ``focus=`` ->
``optax.multi_transform``), OM012 (``hyper_params.<name>`` -> the literal),
OM101 (defs outside the table), OM104 (user subclasses, see ``annotations``),
OM114 (a def handed to other code), OM115 (a name holding a def, then its
optimizer), OM116 (def-only attributes), OM118 (arguments that cannot be
converted), OM119 (hyper-parameter reads with no literal).
"""
from __future__ import annotations

import re
from typing import NamedTuple, Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.facts.values import create_receiver, is_bare_array, jitted_create
from codemod.names import call_argument, code, create_focus, kwargs, template
from optim_compat import spec as spec_lib


class Problem(NamedTuple):
  """Why a site cannot be converted: its rule and text (``note``: the text ends with the
  keeps-legacy note)."""
  rule: str
  text: str
  note: bool = True


# -- checks -----------------------------------------------------------------------------------
def unpacked_dicts(n, call: cst.Call) -> dict:
  """``{argument index: [(key, value)]}`` of the ``**name`` arguments of ``call`` whose dict is
  known (:meth:`codemod.names.Names.keyword_dict`: ``adam_kwargs = {'beta1': 0.9}`` bound
  once, used only so); read on the original call, passed to :func:`def_args`."""
  found = {}
  for i, a in enumerate(call.args):
    if a.star == '**' and (items := n.keyword_dict(a.value)) is not None:
      found[i] = items
  return found


def def_args(call: cst.Call, spec, unpacked=None) -> dict[str, str]:
  """Legacy keyword -> source text of the def call's arguments (``unpacked``: what
  :func:`unpacked_dicts` found of the original call).

  Raises:
    TypeError: star-args (other than a known dict), too many positionals, unknown or
      repeated keywords.
  """
  args, names = {}, spec.hyper_param_names
  for i, a in enumerate(call.args):
    if a.star == '**' and unpacked and i in unpacked:
      for key, value in unpacked[i]:
        if key in args:
          raise TypeError(f'{spec.name}() got multiple values for argument {key!r}')
        args[key] = code(value)
      continue
    if a.star:
      raise TypeError(f'{spec.name}(*args/**kwargs) cannot be converted statically')
    if a.keyword is not None and a.keyword.value in args:
      raise TypeError(f'{spec.name}() got multiple values for argument {a.keyword.value!r}')
    if a.keyword is None and i >= len(names):
      raise TypeError(f'{spec.name}() takes at most {len(names)} arguments')
    key = a.keyword.value if a.keyword is not None else names[i]
    args[key] = code(a.value)
  spec.emit(args)  # validates the keywords
  return args


def dynamic_args(n, call: cst.Call, spec) -> bool:
  """``call`` (a def of the migration table) has ``*args`` / ``**kw`` whose values the codemod
  cannot read (:func:`unpacked_dicts` knows none of them), and nothing else wrong: too many
  positionals or an unknown keyword stay a :func:`def_args` error. Such a def becomes the
  shim's own def wrapped for a TrainState (:func:`dynamic_source`): its hyper-parameters are
  read when the program runs, as legacy read them."""
  unpacked = unpacked_dicts(n, call)
  stars = [i for i, a in enumerate(call.args) if a.star and i not in unpacked]
  if not stars or spec is None:
    return False
  rest = call.with_changes(args=[a for i, a in enumerate(call.args) if i not in stars])
  try:
    def_args(rest, spec, {i - sum(1 for s in stars if s < i): v for i, v in unpacked.items()})
  except TypeError:
    return False
  if any(a.keyword is None and not a.star for a in call.args[stars[0]:]):
    return False  # (a positional after `*args`: its position is unknown)
  return True


def dynamic_source(call: cst.Call, name: str, inject_lr: bool) -> str:
  """``optim_compat.to_optax(optim_compat.<name>(<the call's arguments>))``, with
  ``inject=('learning_rate',)`` when the file sets the rate at apply time (the state then has
  ``hyperparams['learning_rate']``, which the apply rewrite sets)."""
  args = ', '.join(code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in call.args)
  inject = ", inject=('learning_rate',)" if inject_lr else ''
  return f'optim_compat.to_optax(optim_compat.{name}({args}){inject})'


def def_problem(q, call: cst.Call) -> Optional[Problem]:
  """Why the def call cannot be converted, else None."""
  name = q.n.legacy_def(call)
  if name == api.MULTI:
    return multi_problem(q, call)
  if name == api.WEIGHT_NORM:
    inner = call.args[0].value if call.args and call.args[0].keyword is None else None
    if id(call) in q.f.wn_rebinds:
      return None  # `d = WeightNorm(d)` of a name holding table defs
    if inner is None or q.n.legacy_def(inner) not in spec_lib.SPECS:
      return Problem('OM101', 'WeightNorm is converted only around a def of the migration '
                              'table; use optim_compat.WeightNorm meanwhile')
    return def_problem(q, inner)
  spec = spec_lib.SPECS.get(name)
  if dynamic_args(q.n, call, spec):
    return None  # (the shim's def, its values read at run time: dynamic_source)
  try:
    args = def_args(call, spec, unpacked_dicts(q.n, call))
  except TypeError as e:
    return Problem('OM118', str(e))
  if 'learning_rate' not in args and not q.inject_lr:
    return Problem('OM118', f'{name} has no learning rate and none is passed at apply time '
                            'in this file; set learning_rate explicitly')
  return None


def multi_problem(q, call) -> Optional[Problem]:
  n = q.n
  for i, arg in enumerate(call.args):
    group = arg.value
    if (arg.keyword is not None or arg.star or not isinstance(group, cst.Tuple)
        or len(group.elements) != 2
        or not all(isinstance(e, cst.Element) for e in group.elements)):
      return Problem('OM118', f'MultiOptimizer argument {i} is not a literal (traversal, def) pair')
    traversal, sub = (e.value for e in group.elements)
    if not n.is_traversal(traversal):
      return Problem('OM118', f'MultiOptimizer group {i}: `{code(traversal)}` is not a '
                              'ModelParamTraversal built in this file')
    sub_call = sub
    if isinstance(sub, cst.Name) and n.binding(sub) in q.f.def_vars:
      sub_call = q.f.def_vars[n.binding(sub)]
    if n.legacy_def(sub_call) not in spec_lib.SPECS and not n.is_user_def(sub_call) and not (
        _factory_def(q, sub)):
      kept = q.f.flow_def_vars.get(n.binding(sub)) if isinstance(sub, cst.Name) else None
      if kept is not None:  # (helper-34's D2: "only defs of the migration table" misled)
        return Problem('OM101', f'MultiOptimizer group {i}: `{code(sub)}` is the def '
                                f'{kept.where} returns, which this run keeps legacy (its '
                                'TODOs and its callers\' say why): convert them together')
      return Problem('OM101', f'MultiOptimizer group {i}: only defs of the migration table are '
                              'converted')
  if not call.args:
    return Problem('OM118', 'MultiOptimizer() without groups', note=False)
  return None


def _factory_def(q, sub) -> bool:
  """``sub`` (a MultiOptimizer group's def) is what a def factory the run converts returns: a
  call of it (``optimizers.get_optimizer(cfg)``) or a name bound to one (directly, or through
  another such name): an Optax transformation once converted, the group's as it is."""
  if isinstance(sub, cst.Name):
    return q.f.def_var_factories.get(q.n.binding(sub)) is not None
  return q.n.converted_def_factory(sub) is not None


def multi_labels(call: cst.Call, positional: bool = False) -> list[str]:
  """The multi_transform label of each group: the traversal's name, else (or ``positional``:
  a file whose apply calls set per-group rates on any of several MultiOptimizers)
  ``group_<i>``."""
  labels = []
  for i, arg in enumerate(call.args):
    traversal = arg.value.elements[0].value
    labels.append(traversal.value if isinstance(traversal, cst.Name) and not positional
                  else f'group_{i}')
  return [f'group_{i}' if labels.count(label) > 1 or label == api.FROZEN else label
          for i, label in enumerate(labels)]


def create_problem(q, call: cst.Call) -> Optional[str]:
  recv = create_receiver(q.n, call)
  if isinstance(recv, cst.Name) and (other := q.f.def_var_others.get(q.n.binding(recv))) \
      is not None:
    return (f'`{recv.value}` is also assigned `{code(other)}`, which this file cannot tell is '
            'a flax.optim def of the migration table (a class of another module?): as '
            f'TrainState.create(..., tx={recv.value}) it would have no init; convert both '
            'values together (a user OptimizerDef: wrap it in optim_compat.to_optax)')
  kw = kwargs(call)
  positional = [a for a in call.args if a.keyword is None]
  if any(a.star for a in call.args) or set(kw) - {'target', 'focus'} or \
      len(positional) + len(kw) not in (1, 2) or len(positional) > 2:
    return 'create(...) with these arguments is not converted'
  if jitted_create(q.n, call) is not None and len(positional) + len(kw) != 1:
    return 'a jitted create(...) given more than the target is not converted'
  focus = create_focus(call)
  if focus is not None and not m.matches(focus, m.Name('None')) and not q.n.is_traversal(focus):
    return (f'create(..., focus={code(focus)}): not a ModelParamTraversal built in this '
            'file (it may be None, which legacy read as "all params"), so its labels cannot '
            'be derived: convert by hand')
  return None


def array_create(q, call: cst.Call) -> bool:
  """``call`` (``<def>.create(target)``) is to give an ``optim_compat.ArrayTrainState``: its
  target is a bare array (``jnp.zeros(1)``, or a name every ``=`` of which gives one), or it
  is stored where such a create is stored too (``self.alpha_optimizer``, the same name), as
  a restore re-creating the optimizer from a checkpoint's array does. Flax's
  ``TrainState.apply_gradients`` is a TypeError on a bare array (Flax >= 0.8)."""
  if _bare_create(q, call):
    return True
  keys = q.f.create_keys.get(id(call))
  return bool(keys) and any(keys & q.f.create_keys.get(id(c), frozenset())
                            and _bare_create(q, c) for c in q.f.create_calls if c is not call)


def _bare_create(q, call: cst.Call) -> bool:
  """``call``'s target is a bare array (decided once per create: a module of hundreds of
  creates asked of every other one, each scan of the module's calls, took minutes)."""
  cache = q.__dict__.setdefault('_bare_creates', {})
  if id(call) not in cache:
    target = call_argument(call, 0, 'target')
    cache[id(call)] = target is not None and (is_bare_array(q.n, target)
                                              or _parameter_given_bare_arrays(q, target))
  return cache[id(call)]


def _parameter_given_bare_arrays(q, name) -> bool:
  """``name`` is a parameter of a function of this module (not a method) that every call of
  it here gives a bare array (``def make_alpha_opt(log_alpha): return Adam(...).create(
  log_alpha)`` called with ``jnp.zeros(1)``); False when the function is called nowhere
  here, or once with anything else (its value is then unknown: a plain ``TrainState``)."""
  if not isinstance(name, cst.Name):
    return False
  scope = q.n.scope(name)
  assignments = list(scope[name.value]) if scope is not None else []
  if len(assignments) != 1 or not isinstance(getattr(assignments[0], 'node', None), cst.Param):
    return False
  function = getattr(assignments[0].scope, 'node', None)
  if not isinstance(function, cst.FunctionDef):
    return False
  params = list(function.params.params)
  param = assignments[0].node
  if param not in params and param not in function.params.kwonly_params:
    return False
  position = params.index(param) if param in params else None
  fname, calls = function.name.value, []
  by_name = q.__dict__.get('_calls_by_name')
  if by_name is None:  # (once per module: each call's function name)
    by_name = q.__dict__['_calls_by_name'] = {}
    for call in q.f.calls_by_func.values():
      if isinstance(call.func, cst.Name):
        by_name.setdefault(call.func.value, []).append(call)
  for call in by_name.get(fname, ()):
    bound = q.n.scope(call.func)
    defs = list(bound[fname]) if bound is not None else []
    if len(defs) != 1 or getattr(defs[0], 'node', None) is not function:
      continue
    if any(a.star for a in call.args):
      return False
    calls.append(call)
  if not calls:
    return False
  for call in calls:
    given = call_argument(call, position, param.name.value)
    if given is None or not is_bare_array(q.n, given):
      return False
  return True


def hp_value(q, recv, name, via_opt) -> tuple[Optional[str], Optional[Problem]]:
  """Source text of the def's ``name`` (a literal), or why it cannot be told."""
  if name == 'replace':  # the hyper-parameters dataclass's replace, not a hyper-parameter
    return None, Problem('OM119', 'hyper_params.replace(...) is a dataclass replace of the def\'s '
                                  'hyper-parameters (new values for apply_gradient(hyper_params=...)), '
                                  'and an Optax transformation takes no hyper-parameters when it is '
                                  'applied: migrate it by hand: wrap the transformation in '
                                  'optax.inject_hyperparams and set the new value in '
                                  'opt_state.hyperparams')
  n = q.n
  calls = [c for c in q.f.def_calls if n.legacy_def(c) in spec_lib.SPECS]
  if not via_opt:
    calls = [q.f.def_vars[n.binding(recv)]]
    if calls[0] is None:
      calls = []
  if len(calls) != 1 or n.legacy_def(calls[0]) not in spec_lib.SPECS:
    return None, Problem('OM119', 'hyper_params read: no single def in this file says which '
                                  'value it is')
  spec = spec_lib.SPECS[n.legacy_def(calls[0])]
  try:
    args = def_args(calls[0], spec, unpacked_dicts(n, calls[0]))
  except TypeError as e:
    return None, Problem('OM119', str(e), note=False)
  if name not in spec.hyper_param_names:
    return None, Problem('OM119', f'{spec.name} has no hyper-parameter {name!r}', note=False)
  src = args.get(name, repr(spec.defaults()[name]))
  if spec_lib.literal(src) is None and src != 'None':
    return None, Problem('OM119', f'hyper_params.{name} is `{src}`, not a literal: read the value '
                                  'where the def is built')
  return src, None


def _hp_owner(q, attr_id):
  """The ``.optimizer_def.hyper_params`` chain's ``optimizer_def`` attribute node."""
  for attr in q.f.legacy_attrs:
    if attr.attr.value == 'optimizer_def':
      recv = q.f.hp_reads[attr_id][0]
      if attr.value is recv:
        return attr
  return None


def prepare(q) -> None:
  """The hyper-parameter reads that resolve to a literal (OM012) and those that do not."""
  n, f = q.n, q.f
  for attr_id, (recv, name, via_opt) in f.hp_reads.items():
    if via_opt and not q.is_optimizer(recv):
      continue
    if not via_opt and not (isinstance(recv, cst.Name) and n.binding(recv) in f.def_vars):
      continue
    value, problem = hp_value(q, recv, name, via_opt)
    if attr_id in f.stored:  # `opt.optimizer_def.hyper_params.learning_rate = x`
      value, problem = None, Problem(
          'OM119', f'hyper_params.{name} is assigned here: a def\'s hyper-parameters are a '
                   'frozen dataclass (this fails on flax.optim too); an Optax transformation '
                   'built with optax.inject_hyperparams takes a new value in '
                   'opt_state.hyperparams: migrate it by hand')
    if problem:
      q.bad_hp[attr_id] = problem
    else:
      q.hp_values[attr_id] = value
      if via_opt:
        q.handled.add(id(f.ref_nodes.get(attr_id, recv)))
  # `opt.optimizer_def` consumed by a hyper_params read: converted, or flagged with its own
  # message (a second, generic flag on `.optimizer_def` would say nothing more)
  q.hp_owner_ids = {id(_hp_owner(q, i)) for i in [*q.hp_values, *q.bad_hp]}


def _is_hp_chain_part(q, attr) -> bool:
  return any(r[0] is attr.value and attr.attr.value == 'hyper_params'
             for i, r in q.f.hp_reads.items() if i in q.hp_values or i in q.bad_hp)


def def_only_uses(q) -> list[cst.Attribute]:
  """Attributes of a def that an Optax transformation does not have (``opt_def.init_state``)."""
  if q.def_only is None:
    q.def_only = [a for a in q.f.def_attrs
                  if id(a) not in q.f.hp_reads and q.n.binding(a.value) in q.f.def_vars
                  and not _is_hp_chain_part(q, a)]
  return q.def_only


def def_factory_of_create(q, call: cst.Call):
  """The converted def factory (``codemod.flow.DefFactory``) whose transformation ``call``
  (``d.create(p)``) is given, directly or through a name, else None."""
  recv = create_receiver(q.n, call)
  if isinstance(recv, cst.Name):
    return q.f.def_var_factories.get(q.n.binding(recv))
  return q.n.converted_def_factory(recv)


def _shimmed_groups(q, call: cst.Call):
  """The def factory left on the shim (``codemod.flow.DefFactory.shimmed``) returning a
  MultiOptimizer whose def ``call`` (``d.create(p)``) creates, directly or through a name
  bound to its call, else None."""
  recv = q.n.def_call(create_receiver(q.n, call))
  found = q.n.shimmed_def_factory(recv) if recv is not None else None
  return found if found is not None and found.groups else None


def injection_problem(q, call: cst.Call) -> Optional[str]:
  """``call`` creates from another module's converted def factory whose transformation is
  not built with ``inject_hyperparams`` while this module sets the rate at apply time."""
  if q.inject_lr and (shimmed := _shimmed_groups(q, call)) is not None:
    return (f'`{code(create_receiver(q.n, call))}` is the MultiOptimizer {shimmed.where} '
            'returns, which this run leaves on the shim (its TODOs say why), and this file '
            'passes learning_rate at apply time: optim_compat.to_optax injects no rate into '
            'its groups; migrate them together')
  made = def_factory_of_create(q, call) if q.inject_lr else None
  if made is None or made.inject_lr:
    return None
  return (f'`{code(create_receiver(q.n, call))}` is the transformation {made.where} returns, '
          'built without optax.inject_hyperparams, and this file passes learning_rate at apply '
          'time: migrate them together')


def blocks(q) -> bool:
  f = q.f
  return bool(q.bad_hp or any(def_problem(q, c) for c in f.def_calls)
              or any(create_problem(q, c) for c in f.create_calls)
              or def_only_uses(q) or f.mixed_defs or f.escaping
              or any(injection_problem(q, c) for c in f.create_calls))


# -- sites --------------------------------------------------------------------------------
def visit_statement_node(p, node) -> None:
  """Flags on a node when it is entered: a def rebound to its optimizer, a def handed on."""
  f = p.q.f
  if id(node) in f.mixed_defs:
    name = f.mixed_defs[id(node)]
    p.flag(node, 'OM115', f'`{name}` holds this flax.optim def and later an optimizer '
                          f'(`{name} = {name}.create(...)`), and the codemod cannot tell '
                          'which of the two each use reads (a use before the def or in a '
                          'closure, or the two assignments not one after the other in one '
                          f'block): give the def its own name (`{name}_def = ...`), then rerun',
           blocks=True, data={'name': name})
  if id(node) in f.escaping and isinstance(node, cst.Attribute):  # (`f = d.create`)
    p.flag(node, 'OM114', f'`{code(node)}`, a flax.optim def\'s bound create, is handed to '
                          'other code: an Optax transformation has no .create() (only '
                          '`d.create(p)` and `jax.jit(d.create, ...)(p)` are converted); '
                          'call it in place', blocks=True)
  elif id(node) in f.escaping:
    p.flag(node, 'OM114', f'`{code(node)}` is an optimizer def handed to other code '
                          '(returned, passed as an argument, kept in an attribute or a '
                          'container): as an Optax transformation it has no .create(); convert '
                          'it where it is used', blocks=True)


def leave_def_call(p, original) -> bool:
  """``Def(...)``: converted to its Optax form, or flagged. Ends the call's chain."""
  q = p.q
  if id(original) in q.f.user_def_wraps:
    if not q.blocked:
      p.fix(original, apply_user_wrap, [('OM001', f'{code(original.func)}(...) -> '
                                                  f'{_to_optax(q, "...")}: a user OptimizerDef '
                                                  '(on the shim) as an Optax transformation')])
    return True
  name = q.n.legacy_def(original)
  if name is None:
    return False
  problem = def_problem(q, original)
  if problem:
    p.flag(original, problem.rule, problem.text, blocks=True, note=problem.note)
    return True
  if q.blocked or id(original) in q.f.wn_inner:
    return True
  if name == api.WEIGHT_NORM:
    p.fix(original, apply_weight_norm, [('OM001', None)])
  elif name == api.MULTI:
    p.fix(original, apply_multi, [('OM008', 'MultiOptimizer -> optax.multi_transform, labels from '
                                            'the traversal filters, unselected leaves frozen '
                                            '(set_to_zero); a leaf two filters select, which '
                                            'legacy refused at create (ValueError), gets the '
                                            'later group here: keep the filters disjoint')])
  else:
    findings = [('OM001', None)]
    if (get := q.f.def_default_calls.get(id(original))) is not None:
      findings.append(('OM016', f'`{code(get)}`: the default is its Optax transformation now, '
                                'so a value callers put under that key must be one too (with '
                                'optax.inject_hyperparams where this file sets a rate at apply '
                                'time; a flax.optim def there fails at TrainState.create: it '
                                'has no `init`; wrap a user def in optim_compat.to_optax)'))
    p.fix(original, apply_def, findings, data={'name': name})
  return True


def leave_create(p, original) -> bool:
  """``<def>.create(params[, focus])`` (OM001, OM008 for ``focus=``)."""
  q = p.q
  recv = create_receiver(q.n, original)
  if recv is None or not q.n.is_def(recv):
    return False
  problem = create_problem(q, original)
  if problem:
    p.flag(original, 'OM118', problem, blocks=True)
  elif (problem := injection_problem(q, original)) is not None:
    p.flag(original, 'OM122', problem, blocks=True)
  elif not q.blocked:
    focus = create_focus(original)
    findings = [('OM001', '.create(params) -> train_state.TrainState.create(...)')]
    array = array_create(q, original)
    if array:
      findings = [('OM001', '.create(array) -> optim_compat.ArrayTrainState.create(...): the '
                            "params are a bare array, on which Flax's "
                            'TrainState.apply_gradients fails (a TypeError since Flax 0.8); '
                            'ArrayTrainState is that TrainState, applying the same Optax update')]
    made = def_factory_of_create(q, original)
    if made is not None and made.upstream:
      findings = [('OM001', f'{findings[0][1]}: `{code(recv)}` is what '
                            f'{made.function} of {made.path} returns, an Optax transformation '
                            f'there ({made.why})')]
    if jitted_create(q.n, original) is not None:
      findings[0] = ('OM001', f'{findings[0][1]}, jitted as the legacy create was (a '
                              'function of the target: the state is made where jax.jit '
                              'places it)')
    if focus is not None and not m.matches(focus, m.Name('None')):
      findings.insert(0, ('OM008', 'create(params, focus=traversal) -> optax.multi_transform, '
                                   'unfocused leaves frozen (set_to_zero)'))
    p.fix(original, apply_create, findings, data={'array': array})
    return True
  return False


def leave_def_attribute(p, original) -> None:
  """A def's attribute an Optax transformation lacks (OM116)."""
  if original.attr.value in api.DEF_ONLY_ATTRS and any(original is a for a in def_only_uses(p.q)):
    p.flag(original, 'OM116', f'`.{original.attr.value}` of a flax.optim def has no Optax '
                              'equivalent', blocks=True)


def leave_hp_read(p, original) -> bool:
  """``opt.optimizer_def.hyper_params.<name>`` -> the literal the def was built with (OM012)."""
  q = p.q
  if id(original) not in q.hp_values:
    return False
  _, name, _ = q.f.hp_reads[id(original)]
  value = q.hp_values[id(original)]
  p.fix(original, apply_hp_value, [('OM012', f'hyper_params.{name} -> {value} (the value the def '
                                             'was built with; legacy per-call overrides never '
                                             'changed it)')], data={'value': value})
  recv = q.f.hp_reads[id(original)][0]
  root = recv
  while isinstance(root, cst.Attribute):
    root = root.value
  if isinstance(root, cst.Name) and root.value == 'self' and root is not recv:
    # an attribute of an instance: a subclass (in another module too) may store an optimizer
    # of another def there, whose value this literal is not
    p.flag(original, 'OM119', f'`{code(recv)}` may hold an optimizer of another def than this '
                              'file\'s (a subclass, here or in another module, that builds its '
                              f'own): the read became {value}, the value of this file\'s def; '
                              'keep it only if no subclass stores another def there')
  return True


# -- fixes ----------------------------------------------------------------------------------
def def_source(q, original, updated, name) -> tuple[str, str]:
  """``(Optax source, how far it is from legacy)`` of the table def call ``updated``
  (``original`` its node before this pass): the table's chain (the stock alternative under
  ``--prefer-stock-optax``), or the shim's def as a transformation where its arguments are
  read at run time."""
  spec = spec_lib.SPECS[name]
  if dynamic_args(q.n, original, spec):
    return dynamic_source(updated, name, q.inject_lr), (
        'its arguments are read when the program runs: the shim\'s own def, bitwise equal to '
        'legacy, as an Optax transformation')
  args = def_args(updated, spec, unpacked_dicts(q.n, original))
  source = spec.emit(args, learning_rate_injected=q.inject_lr)
  stock = None
  if q.opts.prefer_stock_optax and 'optim_compat.' in source:
    stock = getattr(spec_lib, 'STOCK_ALTERNATIVES', {}).get(name)
  if stock is not None:
    return stock.emit(spec, args, q.inject_lr), f'stock Optax, preferred: measured {stock.measured}'
  return source, ('bitwise equal to legacy' if spec.stock_max_ulp == 0 else
                  f'measured <= {spec.stock_max_ulp} ulp from legacy') + f': {spec.differences}'


def _add_imports(ctx, source: str) -> None:
  for module in ('optax', 'optim_compat'):
    if f'{module}.' in source:
      ctx.add_import(module)


def apply_def(ctx, original, updated, fix):
  name = fix.data['name']
  source, distance = def_source(ctx.q, original, updated, name)
  _add_imports(ctx, source)
  fix.findings[0].message = f'flax.optim.{name}(...) -> {source} ({distance})'
  return cst.parse_expression(source)


def apply_weight_norm(ctx, original, updated, fix):
  """``WeightNorm(Adam(...), wn_decay, wn_eps)`` -> ``optim_compat.transforms.weight_norm(
  <Adam's Optax source>, wn_decay, wn_eps)``; ``WeightNorm(d)`` of a name holding table defs
  (``Facts.wn_rebinds``) -> ``weight_norm(d)``."""
  inner = updated.args[0].value
  if id(original) in ctx.q.f.wn_rebinds:
    inner_src, distance = code(inner), 'around the Optax form of the defs the name holds'
  else:
    name = ctx.q.n.legacy_def(original.args[0].value)
    inner_src, distance = def_source(ctx.q, original.args[0].value, inner, name)
    distance = f'around {name}, {distance}'
  source = spec_lib.weight_norm_emit(
      inner_src, [code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in updated.args[1:]])
  _add_imports(ctx, source)
  fix.findings[0].message = (f'flax.optim.WeightNorm(...) -> {source} (legacy WeightNorm as an '
                             f'Optax transformation, {distance}; params within 1 ulp of it)')
  return cst.parse_expression(source)


def labels_source(ctx, traversals: list[tuple[str, str]]) -> str:
  """``lambda`` building the label tree: each traversal labels what it selects."""
  expr = f'jax.tree_util.tree_map(lambda _: {api.FROZEN!r}, params_)'
  for traversal, label in traversals:
    expr = f'{traversal}.update(lambda _: {label!r}, {expr})'
  ctx.add_import('jax')
  return f'lambda params_: {expr}'


def apply_multi(ctx, original, updated, fix):
  n, f = ctx.q.n, ctx.q.f
  ctx.add_import('optax')
  groups = []
  for i, (o_arg, u_arg) in enumerate(zip(original.args, updated.args)):
    o_trav = o_arg.value.elements[0].value
    u_trav, u_sub = (e.value for e in u_arg.value.elements)
    label = o_trav.value if isinstance(o_trav, cst.Name) else f'group_{i}'
    sub = code(u_sub)
    o_sub = o_arg.value.elements[1].value
    if n.is_user_def(o_sub) or (isinstance(o_sub, cst.Name) and
                                n.is_user_def(f.def_vars[n.binding(o_sub)])):
      sub = _to_optax(ctx.q, sub)  # (its rate injected as the table groups' are)
      ctx.add_import('optim_compat')
    groups.append([label, code(u_trav), sub])
  for g, label in zip(groups, multi_labels(original, ctx.q.positional_labels)):
    g[0] = label
  txs = ', '.join(f'{g[0]!r}: {g[2]}' for g in groups)
  source = (f'optax.multi_transform({{{txs}, {api.FROZEN!r}: optax.set_to_zero()}}, '
            f'{labels_source(ctx, [(g[1], g[0]) for g in groups])})')
  return cst.parse_expression(source)


def apply_create(ctx, original, updated, fix):
  n, f = ctx.q.n, ctx.q.f
  positional = [a for a in updated.args if a.keyword is None]
  kw = kwargs(updated)
  target = (positional[0] if positional else kw['target']).value
  focus = create_focus(updated)
  if focus is not None and m.matches(focus, m.Name('None')):
    focus = None  # legacy: every param
  jitted = jitted_create(n, original) is not None
  tx = code(updated.func.args[0].value.value if jitted else updated.func.value)
  o_recv = create_receiver(n, original)
  if n.is_user_def(o_recv) or (isinstance(o_recv, cst.Name) and (
      n.binding(o_recv) not in f.mixed_user_bindings
      and n.is_user_def(f.def_vars.get(n.binding(o_recv))))):
    tx = _to_optax(ctx.q, tx)
    ctx.add_import('optim_compat')
  if focus is not None:
    tx = (f"optax.multi_transform({{'focus': {tx}, {api.FROZEN!r}: optax.set_to_zero()}}, "
          f"{labels_source(ctx, [(code(focus), 'focus')])})")
    ctx.add_import('optax')
  if fix.data['array']:  # (decided once, by leave_create)
    ctx.add_import('optim_compat')
    made = 'optim_compat.ArrayTrainState.create'
  else:
    ctx.add_import('flax.training', 'train_state')
    made = 'train_state.TrainState.create'
  if jitted:  # `jax.jit(d.create, backend='cpu')(p)`: jit a function of the target instead
    wrap = updated.func
    arg = 'params' if not re.search(r'\bparams\b', tx) else 'target_params'
    function = cst.parse_expression(f'lambda {arg}: {made}(apply_fn=None, params={arg}, tx={tx})')
    return updated.with_changes(func=wrap.with_changes(
        args=[wrap.args[0].with_changes(value=function), *wrap.args[1:]]))
  return template(f'{made}(apply_fn=None, params=P, tx={tx})', P=target)


def _to_optax(q, source: str) -> str:
  """``optim_compat.to_optax(<source>)`` for a user def (the shim runs it), its learning
  rate injected where the file sets one at apply time (``legacy_view.to_optax``: the
  def's hyper-parameter dataclass holds it in ``opt_state.hyperparams``)."""
  inject = ", inject=('learning_rate',)" if q.inject_lr else ''
  return f'optim_compat.to_optax({source}{inject})'


def apply_user_wrap(ctx, original, updated, fix):
  ctx.add_import('optim_compat')
  return cst.parse_expression(_to_optax(ctx.q, code(updated)))


def apply_hp_value(ctx, original, updated, fix):
  return cst.parse_expression(fix.data['value'])
