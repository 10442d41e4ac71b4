"""``OptimizerState``, ``OptimizerDef`` and ``Optimizer`` with the legacy API.

The legacy layout is kept on purpose: ``Optimizer`` is a ``flax.struct``
pytree with a static ``optimizer_def`` and pytree fields ``state`` and
``target``, and ``state`` is ``OptimizerState(step, param_states)`` with the
legacy per-parameter field names, so ``flax.serialization.to_state_dict`` gives
exactly the legacy checkpoint layout::

    {'target': <params>, 'state': {'step': int32, 'param_states': <mirror of params,
                                    each leaf a dict of legacy state fields>}}

Table-backed defs (``spec.py``) convert that state to an Optax ``opt_state``
inside :meth:`OptimizerDef.apply_gradient`, run ``tx.update`` and
``optax.apply_updates``, and convert back: under ``jit`` this is only a pytree
re-arrangement.
"""
from __future__ import annotations

import dataclasses
import numbers
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import jax_utils, serialization, struct

from optim_compat import spec as spec_lib
from optim_compat import legacy_rule
from optim_compat import restore_guard


@struct.dataclass
class OptimizerState:
  """Legacy optimizer state.

  Attributes:
    step: int32 scalar, number of ``apply_gradient`` calls so far (shape
      ``(n_devices,)`` when replicated).
    param_states: pytree mirroring the target; each leaf is the def's
      per-parameter state dataclass (e.g. ``_AdamParamState``).
  """
  step: jnp.ndarray
  param_states: Any


class OptimizerDef:
  """Base class of optimizer definitions (legacy ``flax.optim.OptimizerDef``).

  A subclass either is backed by a table entry (``_spec`` set: the update runs
  through that entry's Optax transformation) or implements the legacy per-leaf
  protocol ``init_param_state(param)`` / ``apply_param_gradient(step,
  hyper_params, param, state, grad) -> (new_param, new_state)``.
  """

  _spec: spec_lib.OptimizerSpec | None = None

  def __init__(self, hyper_params):
    self.hyper_params = hyper_params

  # -- legacy per-leaf protocol (user subclasses) ---------------------------
  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    raise NotImplementedError()

  def init_param_state(self, param):
    raise NotImplementedError()

  # -- whole-tree operations -------------------------------------------------
  def init_state(self, params) -> OptimizerState:
    """``OptimizerState(int32 0, tree_map(init_param_state, params))``."""
    param_states = jax.tree_util.tree_map(self.init_param_state, params)
    return OptimizerState(jnp.asarray(0, dtype=jnp.int32), param_states)

  def apply_gradient(self, hyper_params, params, state, grads):
    """One update of the whole tree; returns ``(new_params, new_state)``.

    Dtypes are legacy flax.optim 0.5.3's: a rule computes ``p - X`` in the wider of
    the param's and the gradient's dtype, so bfloat16 / float16 params given
    float32 gradients come back float32 (and so do their state fields), except
    under Adafactor, which casts the new params back to the params' dtype. (An
    Optax ``TrainState`` keeps the params' dtype: ``optax.apply_updates`` casts.)

    Raises:
      ValueError: ``grads`` do not match the structure of ``params`` (the
        message shows both structures).
      TypeError: a gradient leaf is ``None`` or not an array or number (table
        defs; the message names its path).
    """
    if self._spec is not None:
      # fields, not dataclasses.asdict: that deep-copies every (possibly traced) value
      check_hyper_params(self._spec, {f.name: getattr(hyper_params, f.name)
                                      for f in dataclasses.fields(hyper_params)})
    if params is None and self._spec is not None:  # an empty tree, as legacy takes it
      legacy_rule.flatten_like(jax.tree_util.tree_structure(None), grads)
      return None, OptimizerState(state.step + 1, state.param_states)
    if self._spec is None:  # a user's per-leaf def: the legacy loop, exactly
      treedef = jax.tree_util.tree_structure(params)
      flat_states = legacy_rule.flatten_up_to(treedef, state.param_states)
      flat_params = treedef.flatten_up_to(params)
      flat_grads = legacy_rule.flatten_like(treedef, grads, flat_params)
      out = [self.apply_param_gradient(state.step, hyper_params, p, s, g)
             for p, s, g in zip(flat_params, flat_states, flat_grads)]
      new_params_flat, new_states_flat = list(zip(*out)) if out else ((), ())
      return (treedef.unflatten(new_params_flat),
              OptimizerState(state.step + 1, treedef.unflatten(new_states_flat)))
    if type(self).__name__ in _READS_PARAM_DTYPE:
      leaves, _ = jax.tree_util.tree_flatten_with_path(params)
      check_param_leaves(self, [jax.tree_util.keystr(k) for k, _ in leaves],
                         [v for _, v in leaves], 'apply_gradient(target)', stepping=True)
    rule = self._spec.param_update
    new_param_rule = getattr(rule, 'new_param', None)  # the new value itself, exactly
    tx = legacy_rule.from_legacy_rule(self, hyper_params, new_param_rule or rule)
    opt_state = legacy_rule.LegacyRuleState(state.step, state.param_states)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    if new_param_rule is not None:
      new_params = updates
    else:
      # `p + u` without optax.apply_updates' cast back to p's dtype: legacy returns the
      # rule's result dtype (an int32 leaf under SGD becomes float32, as in 0.5.3; bfloat16
      # params given float32 gradients become float32)
      new_params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    return new_params, OptimizerState(new_opt_state.count, new_opt_state.param_states)

  def update_hyper_params(self, **hyper_param_overrides):
    """Hyper-parameters for one step: the def's, with per-call overrides.

    Pass ``hyper_params=...`` to replace them all. Values may be traced.

    Raises:
      TypeError: an override names a hyper-parameter the def does not have
        (the message lists the valid ones).
    """
    hp = hyper_param_overrides.pop('hyper_params', self.hyper_params)
    if hyper_param_overrides:
      valid = [f.name for f in dataclasses.fields(hp)]
      unknown = sorted(set(hyper_param_overrides) - set(valid))
      if unknown:
        raise TypeError(f'{type(self).__name__}.apply_gradient() got unknown '
                        f'hyper-parameter(s) {unknown}; valid: {valid}')
      hp = hp.replace(**hyper_param_overrides)
    return hp

  def create(self, target, focus=None) -> 'Optimizer':
    """A new :class:`Optimizer` for ``target`` (a pytree of arrays).

    With ``focus`` (a traversal such as ``ModelParamTraversal``) only the
    selected leaves are optimized: the def is wrapped as
    ``MultiOptimizer((focus, self))``, as in legacy flax.optim. ``None`` in
    ``target`` is an empty subtree (it stays ``None``), as in legacy.

    Raises:
      TypeError: (table defs) ``target`` or a leaf of it is not an array or a
        number (``create('hello')``; legacy failed with ``Cannot determine dtype
        of hello``, or not at all until the first step), or is a Python number
        under a def whose rule reads the parameter's dtype or shape (Adam,
        AdaBelief, LAMB, Adafactor; legacy failed at the first step with
        ``AttributeError``); the message names the argument and the leaf's path.
    """
    if focus is None and self._spec is not None:
      leaves, _ = jax.tree_util.tree_flatten_with_path(target)
      check_param_leaves(self, [jax.tree_util.keystr(k) for k, _ in leaves],
                         [v for _, v in leaves], 'create(target)')
    opt_def = MultiOptimizer((focus, self)) if focus is not None else self
    restore_guard.install_if_imported()  # flax's restore_checkpoint into this optimizer
    return Optimizer(opt_def, opt_def.init_state(target), target)

  def state_dict(self, target, state):
    return serialization.to_state_dict({
        'target': serialization.to_state_dict(target),
        'state': serialization.to_state_dict(state)})

  def restore_state(self, opt_target, opt_state, state_dict):
    return (serialization.from_state_dict(opt_target, state_dict['target']),
            serialization.from_state_dict(opt_state, state_dict['state']))


class Optimizer(struct.PyTreeNode):
  """Legacy ``flax.optim.Optimizer``: ``optimizer_def`` (static), ``state``, ``target``."""

  optimizer_def: OptimizerDef = struct.field(pytree_node=False)
  state: Any = struct.field(pytree_node=True)
  target: Any = struct.field(pytree_node=True)

  def apply_gradient(self, grads, **hyper_param_overrides) -> 'Optimizer':
    """Apply one step of ``grads`` (a pytree like ``target``).

    Keyword overrides (e.g. ``learning_rate=lr``, traced values allowed) apply
    to this call only, as in legacy flax.optim.

    Dtypes follow legacy flax.optim 0.5.3: bfloat16 / float16 params given
    float32 gradients come back float32, state included (Adafactor: in the
    params' own dtype), where an Optax ``TrainState`` keeps the params' dtype
    (each def's docstring, "Differences", gives the measured gap).

    Raises:
      TypeError: unknown hyper-parameter name.
    """
    hp = self.optimizer_def.update_hyper_params(**hyper_param_overrides)
    new_target, new_state = self.optimizer_def.apply_gradient(
        hp, self.target, self.state, grads)
    return self.replace(target=new_target, state=new_state)

  def compute_gradient(self, loss_fn):
    """Deprecated legacy helper: ``(loss, grad)`` or ``(loss, aux, grad)``."""
    warnings.warn('compute_gradient() is deprecated; use jax.value_and_grad().',
                  DeprecationWarning, stacklevel=2)
    out = loss_fn(self.target)
    has_aux = isinstance(out, tuple)
    fn = loss_fn if has_aux else (lambda t: (loss_fn(t), None))
    (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(self.target)
    return (loss, aux, grad) if has_aux else (loss, grad)

  compute_gradients = compute_gradient

  def optimize(self, loss_fn, **hyper_param_overrides):
    """Deprecated legacy helper: ``(new_optimizer, loss[, aux])`` after one step."""
    warnings.warn('optimize() is deprecated; use jax.value_and_grad() and apply_gradient().',
                  DeprecationWarning, stacklevel=2)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      out = self.compute_gradient(loss_fn)
    return (self.apply_gradient(out[-1], **hyper_param_overrides),) + tuple(out[:-1])

  def replicate(self, devices=None, axis_name='batch') -> 'Optimizer':
    """Deprecated legacy method: replicate over ``devices`` (default: all local).

    As in legacy flax.optim, the def is wrapped in :class:`ReplicatedOptimizer`,
    so ``apply_gradient`` inside ``pmap(..., axis_name=axis_name)`` averages the
    gradients with ``jax.lax.pmean`` itself.
    """
    if devices is None:
      devices = jax.local_devices()
    replicated = jax_utils.replicate(self, devices=devices)
    return replicated.replace(optimizer_def=ReplicatedOptimizer(self.optimizer_def, devices, axis_name))

  def unreplicate(self) -> 'Optimizer':
    """Deprecated legacy method: the first device's copy, with the inner def.

    Raises:
      ValueError: the optimizer was not made by :meth:`replicate`.
    """
    if not isinstance(self.optimizer_def, ReplicatedOptimizer):
      raise ValueError('Expected an optimizer that was replicated with replicate()')
    return jax_utils.unreplicate(self).replace(optimizer_def=self.optimizer_def.optimizer_def)

  def state_dict(self):
    return self.optimizer_def.state_dict(self.target, self.state)

  def restore_state(self, state):
    target, state = self.optimizer_def.restore_state(self.target, self.state, state)
    return self.replace(target=target, state=state)


class ReplicatedOptimizer(OptimizerDef):
  """Legacy ``flax.optim.base.ReplicatedOptimizer``: pmean gradients, then the inner def."""

  def __init__(self, optimizer_def, devices=None, axis_name='batch'):
    super().__init__(optimizer_def.hyper_params)
    self.optimizer_def = optimizer_def
    self.devices = devices
    self.axis_name = axis_name

  def init_state(self, params):
    return self.optimizer_def.init_state(params)

  def update_hyper_params(self, **overrides):
    return self.optimizer_def.update_hyper_params(**overrides)

  def apply_gradient(self, hyper_params, params, state, grads):
    grads = jax.lax.pmean(grads, self.axis_name)
    return self.optimizer_def.apply_gradient(hyper_params, params, state, grads)


class _Slot:
  """Placeholder leaf while grouping (legacy passes ``_ShapeDtype`` to filters too)."""

  def __init__(self, value, path: str = ''):
    self.value = value
    self.path = path
    self.shape = getattr(value, 'shape', ())
    self.dtype = getattr(value, 'dtype', None)
    self.groups: list[int] = []


def _slots(params):
  """``params`` with each leaf a :class:`_Slot` that knows its path."""
  return jax.tree_util.tree_map_with_path(
      lambda k, v: _Slot(v, jax.tree_util.keystr(k)), params)


#: Table defs whose rules read each parameter's dtype or shape (a Python number has neither).
_READS_PARAM_DTYPE = frozenset({'Adam', 'AdaBelief', 'LAMB', 'Adafactor'})
#: ... and those whose state init reads its shape (0.5.3 failed at ``create`` there)
_INIT_READS_SHAPE = frozenset({'Adafactor'})


def check_param_leaves(opt_def, paths, values, what: str, stepping: bool = False) -> None:
  """Every parameter leaf a table def's rule will see is an array or a number; with
  ``stepping`` (at ``apply_gradient``), an array where the rule reads its dtype. ``what``
  names the argument (``create(target)``). As in flax.optim 0.5.3, ``Adam().create({'w':
  1.0})`` creates (a placeholder a checkpoint restore fills with arrays); only a step on
  such a leaf fails (there with AttributeError), or Adafactor's ``create`` (its state init
  reads the shape).

  Raises:
    TypeError: names the argument, the leaf's path (or that it is the whole
      argument) and what it is.
  """
  name = type(opt_def).__name__
  for path, value in zip(paths, values):
    where = f'{name}.{what}: ' + (f'the leaf at {path} is' if path else
                                  f'{what.split("(")[1].rstrip(")")} is')
    if not legacy_rule.is_array_or_number(value):
      raise TypeError(f'{where} {legacy_rule.describe_leaf(value)}, not '
                      f'{"an array or a number" if path else "a pytree of arrays"} (the '
                      'parameters to optimize)')
    if (stepping or name in _INIT_READS_SHAPE) and not hasattr(value, 'dtype') and \
        name in _READS_PARAM_DTYPE:
      raise TypeError(f'{where} a Python {type(value).__name__} ({value!r}), not an array: '
                      f'{name}\'s update reads each parameter\'s dtype and shape (legacy '
                      'flax.optim 0.5.3 failed here with AttributeError); create the optimizer '
                      'from jnp.asarray(...)')


def _unslot(tree):
  return jax.tree_util.tree_map(lambda x: None if isinstance(x, _Slot) else x, tree,
                                is_leaf=lambda x: isinstance(x, _Slot))


class MultiOptimizer(OptimizerDef):
  """Legacy ``flax.optim.MultiOptimizer``: one def per traversal-selected group.

  Args:
    *traversals_and_optimizers: ``(traversal, opt_def)`` pairs; traversals are
      ``flax.traverse_util.ModelParamTraversal`` (dict/FrozenDict targets).

  Attributes:
    hyper_params: a *list*, one entry per sub-optimizer (legacy layout).
    traversals, sub_optimizers: tuples.

  Semantics (legacy flax.optim 0.5.3): a leaf no traversal selects gets state
  ``None`` and never changes; a leaf selected twice raises ``ValueError`` at
  ``create``; keyword overrides go to every group (``TypeError`` if one lacks
  the key); ``hyper_params=[hp0, hp1, ...]`` overrides per group. Each group
  runs its def on the tuple of its leaves in sorted-path order, with the
  shared ``step``.
  """

  def __init__(self, *traversals_and_optimizers):
    traversals, sub_optimizers = zip(*traversals_and_optimizers)
    super().__init__([opt.hyper_params for opt in sub_optimizers])
    self.traversals = tuple(traversals)
    self.sub_optimizers = tuple(sub_optimizers)

  def init_state(self, params):
    slots = _slots(params)
    for idx, traversal in enumerate(self.traversals):
      for slot in traversal.iterate(slots):
        slot.groups.append(idx)
    for traversal, opt in zip(self.traversals, self.sub_optimizers):
      if opt._spec is not None:  # only the leaves a group selects meet its rule
        picked = list(traversal.iterate(slots))
        check_param_leaves(opt, [s.path for s in picked], [s.value for s in picked],
                           'create(target)')
    overlap = jax.tree_util.tree_map(lambda s: s.groups, slots,
                                     is_leaf=lambda x: isinstance(x, _Slot))
    if any(len(g) > 1 for g in jax.tree_util.tree_leaves(
        overlap, is_leaf=lambda x: isinstance(x, list))):
      raise ValueError(f'Multiple optimizers match the same leaves: {overlap}')
    param_states = slots
    for traversal, opt in zip(self.traversals, self.sub_optimizers):
      param_states = traversal.update(lambda s, opt=opt: opt.init_param_state(s.value),
                                      param_states)
    return OptimizerState(jnp.asarray(0, dtype=jnp.int32), _unslot(param_states))

  def update_hyper_params(self, **hyper_param_overrides):
    """Per-group hyper-parameters; keywords go to every group.

    Raises:
      TypeError: a keyword some group's def lacks (the message names the group).
    """
    hps = hyper_param_overrides.pop('hyper_params', self.hyper_params)
    if not hyper_param_overrides:
      return hps
    out = []
    for i, hp in enumerate(hps):
      valid = [f.name for f in dataclasses.fields(hp)]
      unknown = sorted(set(hyper_param_overrides) - set(valid))
      if unknown:
        raise TypeError(f'MultiOptimizer group {i} ({type(self.sub_optimizers[i]).__name__}) '
                        f'has no hyper-parameter(s) {unknown}; valid: {valid}')
      out.append(hp.replace(**hyper_param_overrides))
    return out

  def apply_gradient(self, hyper_params, params, state, grads):
    new_params = params
    new_states = jax.tree_util.tree_map(_Slot, params)
    names = _slots(params)
    for focus, opt, hp in zip(self.traversals, self.sub_optimizers, hyper_params):
      ps = tuple(focus.iterate(params))
      gs = tuple(focus.iterate(grads))
      if opt._spec is not None:  # a leaf no group selects may have a None gradient, as legacy
        legacy_rule.check_gradient_leaves([s.path for s in focus.iterate(names)], ps, gs)
      ss = tuple(focus.iterate(state.param_states))
      group_params, group_state = opt.apply_gradient(hp, ps, OptimizerState(state.step, ss), gs)
      new_params = focus.set(list(group_params), new_params)
      new_states = focus.set(list(group_state.param_states), new_states)
    return new_params, OptimizerState(state.step + 1, _unslot(new_states))


def _deprecation_warning():
  """DeprecationWarning at the code constructing a def (two frames up), unless that code
  binds ``optim_compat`` itself: code the codemod wrote (``optim_compat.to_optax(
  optim_compat.Adam(**kw))``, ``optim_compat.legacy_state(opt, optim_compat.Adam(1e-2))``)
  uses the shim's defs on purpose, and a file it kept on the shim says why in its TODOs."""
  caller = sys._getframe(2)
  if caller.f_globals.get('optim_compat') is sys.modules.get('optim_compat'):
    return
  warnings.warn('optim_compat: flax.optim is deprecated; migrate to optax with '
                '`optim-migrate rewrite`.', DeprecationWarning, stacklevel=3)


def _struct_class(name: str, module: str, fields: dict) -> type:
  """A ``flax.struct.dataclass`` named ``name`` with ``fields`` (name -> default)."""
  namespace = {'__annotations__': {f: Any for f in fields}, '__module__': module,
               '__qualname__': name}
  namespace.update({f: d for f, d in fields.items() if d is not dataclasses.MISSING})
  return struct.dataclass(type(name, (), namespace))


def make_def_class(entry: spec_lib.OptimizerSpec, module: str) -> tuple[type, type, type]:
  """Build ``(Def, _DefHyperParams, _DefParamState)`` from a table entry.

  The def's constructor takes the legacy arguments in the legacy order with the
  legacy defaults; its hyper-parameter and per-parameter state classes are
  ``flax.struct`` dataclasses with the legacy field names.
  """
  hp_cls = _struct_class(f'_{entry.name}HyperParams', module,
                         {h.name: h.default for h in entry.hyper_params})
  state_cls = None
  if entry.state_fields:
    state_cls = _struct_class(f'_{entry.name}ParamState', module,
                              dict.fromkeys(entry.state_fields, dataclasses.MISSING))

  extra = dict(entry.extra_args)
  names = entry.hyper_param_names + tuple(extra)

  def __init__(self, *args, **kwargs):
    if len(args) > len(names):
      raise TypeError(f'{entry.name}() takes at most {len(names)} positional '
                      f'arguments ({len(args)} given)')
    values = {**entry.defaults(), **extra}
    for name, value in zip(names, args):
      values[name] = value
    for key, value in kwargs.items():
      if key not in values:
        raise TypeError(f'{entry.name}() got an unexpected keyword argument '
                        f'{key!r}; valid: {list(names)}')
      if names.index(key) < len(args):
        raise TypeError(f'{entry.name}() got multiple values for argument {key!r}')
      values[key] = value
    _deprecation_warning()
    check_hyper_params(entry, values, traced_ok=True)
    for key in extra:
      value = values.pop(key)
      setattr(self, key, jax.dtypes.canonicalize_dtype(value) if 'dtype' in key else value)
    OptimizerDef.__init__(self, hp_cls(**values))

  if entry.init_param_state is not None:
    _init = entry.init_param_state(state_cls)

    def init_param_state(self, param):
      return _init(self, param)
  else:
    def init_param_state(self, param):
      if state_cls is None:
        return ()
      return state_cls(**{f: jnp.zeros_like(param) for f in entry.state_fields})

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    """Legacy per-leaf protocol: ``(new_param, new_state)`` for one leaf."""
    new_param_rule = getattr(entry.param_update, 'new_param', None)
    if new_param_rule is not None:
      return new_param_rule(self, step, hyper_params, param, state, grad)
    update, new_state = entry.param_update(self, step, hyper_params, param, state, grad)
    return param + update, new_state

  doc = def_docstring(entry)
  cls = type(entry.name, (OptimizerDef,), {
      '__init__': __init__, 'init_param_state': init_param_state, '__doc__': doc,
      'apply_param_gradient': apply_param_gradient,
      '__module__': module, '_spec': entry,
      '_hyper_params_cls': hp_cls})
  return cls, hp_cls, state_cls


def _is_number_like(value) -> bool:
  if value is None or isinstance(value, (numbers.Number, jax.core.Tracer)):
    return True
  dtype = getattr(value, 'dtype', None)
  return dtype is not None and getattr(dtype, 'kind', 'V') in 'biufcV' and hasattr(value, 'shape')


def check_hyper_params(entry: spec_lib.OptimizerSpec, values: dict, traced_ok: bool = False):
  """Reject hyper-parameter values legacy flax.optim would fail on obscurely.

  Args:
    entry: the def's table entry.
    values: hyper-parameter name -> value (extra constructor args are skipped).
    traced_ok: skip the traced-value check (at construction, where a traced
      value may still be replaced per call).

  Raises:
    TypeError: a value that is not a number, bool, ``None`` or numeric array
      (e.g. the string ``'1e-3'``); the message names the hyper-parameter.
    jax.errors.ConcretizationTypeError: a traced value for a hyper-parameter
      the legacy rule branches on in Python (``HyperParam.static``: Momentum
      ``weight_decay`` / ``nesterov``, RMSProp ``centered``, LAMB
      ``weight_decay``, LARS ``weight_decay`` / ``nesterov``); legacy raised
      the same error type without naming it.
  """
  for hp in entry.hyper_params:
    value = values.get(hp.name)
    if not _is_number_like(value):
      raise TypeError(f'{entry.name}: hyper-parameter {hp.name!r} must be a number, bool, '
                      f'None or a numeric array, got {type(value).__name__} {value!r}')
    if hp.static and not traced_ok and isinstance(value, jax.core.Tracer):
      raise jax.errors.ConcretizationTypeError(
          value, f'{entry.name}: hyper-parameter {hp.name!r} is traced, but legacy flax.optim '
                 f'0.5.3 branches on its value in Python; pass a Python value (not an argument '
                 f'of the jitted/pmapped function) for {hp.name!r}')


def def_docstring(entry: spec_lib.OptimizerSpec) -> str:
  """The docstring of a generated def: arguments, state, equation, Optax forms."""
  import textwrap
  wrap = lambda text, indent: textwrap.fill(text, 88, initial_indent=indent,
                                            subsequent_indent=indent + '  ')
  lines = [wrap(f'{h.name}: {h.describe()} (default {h.default!r}).', '  ')
           for h in entry.hyper_params]
  lines += [wrap(f'{k}: constructor argument kept as an attribute (default {v!r}).', '  ')
            for k, v in entry.extra_args]
  args = '\n'.join(lines)
  fields = ', '.join(entry.state_fields) or '() -- saved as {} in checkpoints'
  static = [h.name for h in entry.hyper_params if h.static]
  bound = ('bitwise equal to legacy' if entry.stock_max_ulp == 0 else
           f"within {entry.stock_max_ulp} ulp of each leaf's largest magnitude of legacy")
  raises = ('  TypeError: an unknown argument, or a hyper-parameter value that is not a number,\n'
            '    bool, None or numeric array.\n'
            '  ValueError: no learning rate, neither here nor per call.\n')
  if static:
    raises += (f'  jax.errors.ConcretizationTypeError: a traced {" / ".join(static)} at apply time\n'
               '    (legacy branches on it in Python).\n')
  return (
      f'Legacy ``flax.optim.{entry.name}`` (flax.optim 0.5.3), running on Optax.\n\n'
      f'Args:\n{args}\n\n'
      f'Per-parameter state (checkpoint keys under ``state/param_states/<path>/``): {fields}.\n'
      f'The global state is the int32 ``step``.\n\n'
      f'Update, per parameter leaf ``p`` with gradient ``g`` (source: legacy flax.optim\n'
      f'0.5.3, ``flax/optim/{entry.module_name}.py``)::\n\n{wrap(entry.equation, "    ")}\n\n'
      f'Optax: the shim runs this rule, in the legacy operation order, as a\n'
      f'GradientTransformation of ours (``optim_compat.transforms.{entry.name.lower()}``),\n'
      f'so that it matches legacy flax.optim bit for bit where one update can (see\n'
      f'docs/numerics.md). The codemod emits ``{entry.emit({"learning_rate": "lr"})}``,\n'
      f'measured {bound} over 20 steps.\n'
      f'{wrap("Differences: " + entry.differences + ".", "")}\n\n'
      f'Raises:\n{raises}')


def to_optax(opt_def: OptimizerDef, **hyper_param_overrides) -> optax.GradientTransformation:
  """An Optax ``GradientTransformation`` for any legacy def, ours or a user's.

  Usable with ``TrainState`` (``tx=to_optax(def)``). For table entries it is
  the shim's own transformation; for a user subclass of ``OptimizerDef`` its
  ``init_param_state`` / ``apply_param_gradient`` run per leaf (the update is
  ``new_param - param``); whole-tree defs (WeightNorm, MultiOptimizer, an
  overridden ``apply_gradient``) update the tree at once. The state is the
  legacy step and per-parameter states (``legacy_rule.LegacyRuleState``, or the
  ``OptimizerState`` itself for whole-tree defs).

  Raises:
    TypeError: unknown hyper-parameter override.
  """
  hp = opt_def.update_hyper_params(**hyper_param_overrides)
  if opt_def._spec is not None:
    return legacy_rule.from_legacy_rule(opt_def, hp, opt_def._spec.param_update)
  if type(opt_def).apply_gradient is not OptimizerDef.apply_gradient:
    return _whole_tree_tx(opt_def, hp)

  def user_rule(d, step, hp, param, state, grad):
    new_param, new_state = d.apply_param_gradient(step, hp, param, state, grad)
    return new_param - param, new_state
  return legacy_rule.from_legacy_rule(opt_def, hp, user_rule)


def _whole_tree_tx(opt_def: OptimizerDef, hyper_params) -> optax.GradientTransformation:
  """Optax wrapper for defs that update the whole tree (WeightNorm,
  MultiOptimizer, a user's overridden ``apply_gradient``): the state is the
  legacy ``OptimizerState`` and the update is ``new_params - params``."""

  def init_fn(params):
    return opt_def.init_state(params)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(f'{type(opt_def).__name__} needs params: call tx.update(grads, state, params)')
    new_params, new_state = opt_def.apply_gradient(hyper_params, params, state, updates)
    return jax.tree_util.tree_map(lambda n, p: n - p, new_params, params), new_state

  return optax.GradientTransformation(init_fn, update_fn)
