"""A legacy view of a ``TrainState``: optimizer state surgery and hyper-parameters.

Legacy ``flax.optim`` code does things Optax has no word for: it reads and rewrites
``opt.state`` (``OptimizerState(step, param_states)``, ``_AdamParamState(...)``, moments
reset to zero, a skip branch that only advances ``state.step``), and it reads
``opt.optimizer_def.hyper_params`` and passes new ones per call
(``apply_gradient(g, hyper_params=[...])``, ``apply_gradient(g, temperature=t)``). These
helpers give a migrated program the legacy view of a ``TrainState`` built with the tx
the codemod emits, so such code can be emitted line for line (``opt`` an Optimizer of the
legacy def ``d``, ``state`` its TrainState):

* ``opt.state`` -> ``optim_compat.legacy_state(state, d)``;
* ``opt.state_dict()`` -> ``optim_compat.legacy_state_dict(state, d)``;
* ``opt.replace(state=s)`` -> ``optim_compat.with_legacy_state(state, s, d)``;
* ``opt.optimizer_def.hyper_params`` -> ``optim_compat.hyper_params(state, d)``;
* ``opt.apply_gradient(g, **overrides)`` -> ``optim_compat.apply_gradients(state, g, d,
  **overrides)`` (or ``set_hyper_params`` then ``state.apply_gradients``);
* the tx of a user def whose own hyper-parameters are overridden per call ->
  ``optim_compat.to_optax(d, inject=('temperature',))``.

``d`` is the legacy def, built with the shim (``optim_compat.Adam(...)``, a user
``OptimizerDef``, ``optim_compat.MultiOptimizer(...)``); ``create(params, focus=f)``
is ``focus=f`` here. The TrainState's tx may be the table entry's emitted chain
(``optim_compat.spec.SPECS[name].emit``, ``inject_hyperparams`` wrapped or not),
``optax.multi_transform`` of those with a ``'frozen'`` ``set_to_zero`` group (the
codemod's MultiOptimizer / ``focus=`` form), or ``optim_compat.to_optax(d)``.

Which Optax field holds which legacy field is the checkpoint converter's mapping
(``optim_compat.state_map``), applied by the same two functions the converter uses
(``checkpoint_layout.opt_state_from_legacy`` / ``legacy_from_opt_state``). Everything
here is a pytree re-arrangement: it runs under ``jit`` / ``pmap`` on traced values, and a
replicated state (every leaf with a leading device axis, ``jax_utils.replicate``) is
viewed with that axis on every leaf.

Per-call semantics: a legacy override holds for that call only; a value set in an
``inject_hyperparams`` state holds until set again. :func:`apply_gradients` restores
the per-call semantics exactly (sets the call's values, applies, puts the previous
values back); :func:`set_hyper_params` is the persistent form, exact where every
apply call sets every overridden value first.
"""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from optim_compat import base
from optim_compat import checkpoint_layout as layout
from optim_compat import transforms

__all__ = ['legacy_state', 'legacy_state_dict', 'with_legacy_state', 'hyper_params', 'set_hyper_params',
           'apply_gradients', 'to_optax']

#: The multi_transform label of the leaves no group selects (codemod/transform.py FROZEN).
FROZEN = 'frozen'

_LEGACY_LAYOUT = (transforms.LegacyRuleState, base.OptimizerState)


def _def(optimizer_def, focus):
  if not isinstance(optimizer_def, base.OptimizerDef):
    raise TypeError(f'optimizer_def must be a legacy def (optim_compat.Adam(...), a user '
                    f'OptimizerDef, optim_compat.MultiOptimizer(...)), not '
                    f'{type(optimizer_def).__name__}')
  return base.MultiOptimizer((focus, optimizer_def)) if focus is not None else optimizer_def


def inferred_def(opt_state) -> base.OptimizerDef:
  """The legacy def whose state layout ``opt_state`` has, for a view without the def.

  Each Optax state class of ``optim_compat.state_map`` belongs to one table def
  (``ScaleByAdamState``: Adam; ``TraceState``: Momentum, or LARS beside a
  ``MaskedState``; ``ScaleByRStdDevState``: centered RMSProp; no class of the table:
  GradientDescent), a ``to_optax(d)`` state holds the legacy layout itself, and a
  ``transforms.weight_norm`` state is a ``WeightNorm`` of its inner state's def; only the
  layout is read, so the def has its default hyper-parameters.

  Args:
    opt_state: a ``TrainState.opt_state`` of the tx the codemod emits for a table def, or
      of ``optim_compat.to_optax(d)``.

  Returns:
    A shim def laying out that state (``optim_compat.Adam()``, ...), or, for a
    ``to_optax(d)`` state, a stand-in that reads its legacy layout as it is.

  Raises:
    TypeError: ``opt_state`` holds groups (``optax.multi_transform``, the codemod's
      MultiOptimizer / ``focus=`` form): pass the def (its groups are not in the state).
  """
  from optim_compat import defs, state_map
  classes = layout._classes(opt_state)
  if classes & layout._PARTITION:
    raise TypeError('this opt_state holds optimizer groups (optax.multi_transform: a '
                    'MultiOptimizer or create(..., focus=...)): pass the optimizer_def')
  if _laid_out(opt_state) is not None:
    return _AsLaidOut()
  if isinstance(opt_state, transforms.WeightNormState):  # (transforms.weight_norm's)
    from optim_compat.weight_norm import WeightNorm
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      return WeightNorm(inferred_def(opt_state.inner_state))
  fields = {f for spec_row in state_map.OPTAX_STATE_SOURCES.values()
            for sources in spec_row.values() for f in sources.values()}
  row = layout.choose_row(opt_state, {f.lstrip('-') for f in fields})
  name = next((n for n, r in state_map.OPTAX_STATE_SOURCES.items() if r is row and r),
              'GradientDescent')
  if name == 'RMSProp':
    return defs.RMSProp(centered='ScaleByRStdDevState' in classes)
  return getattr(defs, name)()


class _AsLaidOut(base.OptimizerDef):
  """Stands for the def of a ``to_optax(d)`` state, whose legacy layout is in the state."""

  def __init__(self):
    super().__init__(None)


def _layout_def(train_state, optimizer_def, focus):
  """The def laying out ``train_state``'s legacy view: the given one, else inferred."""
  if optimizer_def is None:
    if focus is not None:
      raise TypeError('focus= needs the optimizer_def (its groups are not in the opt_state)')
    return inferred_def(train_state.opt_state)
  return _def(optimizer_def, focus)


def _laid_out(opt_state):
  """The legacy-layout state (``LegacyRuleState`` / ``OptimizerState``) in ``opt_state``."""
  if isinstance(opt_state, _LEGACY_LAYOUT):
    return opt_state
  children = (opt_state.values() if isinstance(opt_state, Mapping) else
              opt_state if isinstance(opt_state, (tuple, list)) else ())
  for child in children:
    if (found := _laid_out(child)) is not None:
      return found
  return None


def _replicas(train_state) -> int | None:
  shape = np.shape(train_state.step)
  return shape[0] if len(shape) == 1 else None


def _concrete(*xs) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _def_names(d) -> set:
  return {type(s).__name__ for s in getattr(d, 'sub_optimizers', (d,))}


def _param_states_template(d, params, replicas):
  """The legacy ``param_states`` structure of ``d`` for ``params`` (shapes only)."""
  if replicas is None:
    return jax.eval_shape(d.init_state, params).param_states
  one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), params)
  return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((replicas,) + s.shape, s.dtype),
                                jax.eval_shape(d.init_state, one).param_states)


def legacy_state(train_state, optimizer_def=None, *, focus=None) -> base.OptimizerState:
  """The legacy ``opt.state`` of a ``TrainState``.

  Args:
    train_state: a ``flax.training.train_state.TrainState`` whose tx is the one the
      codemod emits for ``optimizer_def`` (module docstring) or
      ``optim_compat.to_optax(optimizer_def)``; replicated or not; traced values
      are fine.
    optimizer_def: the legacy def (only its state layout is used); None: the layout
      the opt_state's Optax classes say (:func:`inferred_def`; not for groups).
    focus: the traversal of ``create(params, focus=...)``, if the optimizer had one.

  Returns:
    ``optim_compat.OptimizerState(step, param_states)``: ``step`` is int32
    ``train_state.step`` (shape ``()``, or ``(n_devices,)`` replicated);
    ``param_states`` mirrors the params, each leaf the def's legacy per-parameter
    state (e.g. ``_AdamParamState(grad_ema, grad_sq_ema)``, the values of the
    Optax fields of ``optim_compat.state_map``, same shapes and dtypes; ``None``
    for a leaf no MultiOptimizer group selects; ``()`` for GradientDescent).

  Raises:
    ValueError (``optim_compat.checkpoint.CheckpointError``): an Optax ``count``
      differs from ``train_state.step`` (checked where both are concrete: the
      legacy layout has one step; the message names the path), or the
      opt_state has no field for a legacy field of the def (a tx that does not
      match the def).
    TypeError: ``optimizer_def`` is not a legacy def, or is None for an opt_state with
      groups.
  """
  d = _layout_def(train_state, optimizer_def, focus)
  step = train_state.step
  if isinstance(d, _AsLaidOut):  # to_optax(d): the legacy layout is in the state
    return base.OptimizerState(jnp.asarray(step, jnp.int32),
                               _laid_out(train_state.opt_state).param_states)

  def check_count(v, path):
    if _concrete(v, step) and not np.array_equal(np.asarray(v), np.asarray(step)):
      raise layout.CheckpointError(
          f'{path} = {np.asarray(v).tolist()} differs from TrainState.step = '
          f'{np.asarray(step).tolist()}: the legacy layout has one step')

  template = _param_states_template(d, train_state.params, _replicas(train_state))
  ps = layout.legacy_from_opt_state(train_state.opt_state, d, template, check_count)
  ps = layout._conform(serialization.to_state_dict(template), ps, 'state/param_states')
  return base.OptimizerState(jnp.asarray(step, jnp.int32),
                             serialization.from_state_dict(template, ps))


def legacy_state_dict(train_state, optimizer_def=None, *, focus=None) -> dict:
  """The legacy ``opt.state_dict()`` of a ``TrainState``.

  Args:
    train_state, optimizer_def, focus: as for :func:`legacy_state`.

  Returns:
    ``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``: nested dicts
    (``flax.serialization.to_state_dict`` of the params and of
    :func:`legacy_state`, as flax.optim 0.5.3's ``OptimizerDef.state_dict`` builds
    them); leaves are the TrainState's arrays (a replicated one keeps its device
    axis, as ``state_dict()`` of a replicated flax.optim Optimizer does).

  Raises:
    as :func:`legacy_state`.
  """
  return {'target': serialization.to_state_dict(train_state.params),
          'state': serialization.to_state_dict(
              legacy_state(train_state, optimizer_def, focus=focus))}


def _step_like(template, step):
  if isinstance(template, (int, np.integer)) and not hasattr(template, 'shape'):
    return int(step) if _concrete(step) else step
  return layout._cast(step, getattr(template, 'dtype', np.int32))


def with_legacy_state(train_state, state, optimizer_def=None, *, focus=None):
  """``train_state`` with a (modified) legacy state written back: ``opt.replace(state=s)``.

  Args:
    train_state: as for :func:`legacy_state`.
    state: a legacy ``OptimizerState`` (``step``, ``param_states``), e.g. from
      :func:`legacy_state` after ``.replace(step=...)`` or new moments, or built
      as ``optim_compat.OptimizerState(step, param_states)`` with the def's state
      classes (``optim_compat.adam._AdamParamState(...)``); each moment with the
      shape and dtype of the TrainState's (replicated: the same leading axis).
    optimizer_def: the legacy def; None: as for :func:`legacy_state`.
    focus: as for :func:`legacy_state`.

  Returns:
    The TrainState with ``step`` = ``state.step`` (in ``train_state.step``'s
    dtype, or a Python int where it is one), every Optax ``count`` = ``state.step``,
    every moment from ``state.param_states`` (Optax fields of
    ``optim_compat.state_map``); params, ``inject_hyperparams`` values and tx kept.

  Raises:
    ValueError (``optim_compat.checkpoint.CheckpointError``): a legacy field is
      missing, has another shape / dtype than the TrainState's, or has no place
      in its opt_state (the message names the ``state/param_states/...`` path).
    TypeError: ``optimizer_def`` is not a legacy def.
  """
  d = _layout_def(train_state, optimizer_def, focus)
  if not (hasattr(state, 'step') and hasattr(state, 'param_states')):
    raise TypeError(f'state must be a legacy OptimizerState (step, param_states), not '
                    f'{type(state).__name__}')
  ps = serialization.to_state_dict(state.param_states)
  opt_state = layout.opt_state_from_legacy(
      train_state.opt_state, state.step, ps, None if isinstance(d, _AsLaidOut) else d,
      where='', candidates=None if isinstance(d, _AsLaidOut) else _def_names(d),
      source='the legacy state')
  return train_state.replace(step=_step_like(train_state.step, state.step), opt_state=opt_state)


# --------------------------------------------------------------------------
# hyper-parameters


def _is_inject(node) -> bool:
  return (layout._is_namedtuple(node) and type(node).__name__.startswith('Inject')
          and 'hyperparams' in node._fields)


def _rebuild(node, visit: Callable, path: tuple = ()):
  """``node`` with every sub-tree for which ``visit(sub_tree, path)`` returns a value
  replaced by it (else recursed into); ``path`` is the tuple of field names, keys and
  indices leading there. Legacy-layout states (their per-parameter states) are not entered."""
  new = visit(node, path)
  if new is not None:
    return new
  if isinstance(node, _LEGACY_LAYOUT):
    return node
  if layout._is_namedtuple(node):
    return type(node)(*(_rebuild(v, visit, path + (f,)) for f, v in zip(node._fields, node)))
  if isinstance(node, (tuple, list)):
    return type(node)(_rebuild(v, visit, path + (i,)) for i, v in enumerate(node))
  if isinstance(node, Mapping):
    return type(node)({k: _rebuild(v, visit, path + (k,)) for k, v in node.items()})
  return node


def _injects(node) -> dict:
  """``{path: state}`` of every ``inject_hyperparams`` state in ``node``, outermost first."""
  out = {}

  def visit(n, path):
    if _is_inject(n):
      out[path] = n
    return None
  _rebuild(node, visit)
  return out


def _legacy_names(inject) -> dict:
  """Legacy hyper-parameter name -> key of ``inject.hyperparams``.

  Around a legacy-layout transformation (``optim_compat.transforms.<name>``,
  ``to_optax(def, inject=...)``) every injected name is the legacy one. Around a
  stock Optax one only ``learning_rate`` is (the codemod injects nothing else; an
  Optax-only argument it leaves at its default, such as ``optax.adam``'s
  ``eps_root`` or ``optax.adadelta``'s coupled ``weight_decay``, is injected by
  ``inject_hyperparams`` too but is no legacy hyper-parameter).
  """
  if isinstance(inject.inner_state, _LEGACY_LAYOUT):
    return {k: k for k in inject.hyperparams}
  return {'learning_rate': 'learning_rate'} if 'learning_rate' in inject.hyperparams else {}


def _partition(opt_state):
  found = []

  def visit(n, path):
    if layout._is_namedtuple(n) and type(n).__name__ in layout._PARTITION:
      found.append(n)
      return n
    return None
  _rebuild(opt_state, visit)
  return found[0] if found else None


def _labels(d, keys: list, labels) -> list:
  groups = len(d.sub_optimizers)
  if labels is None:
    named = [k for k in keys if k != FROZEN]
    if groups == 1 and len(named) == 1:
      return named
    if sorted(named) == sorted(f'group_{i}' for i in range(groups)):
      return [f'group_{i}' for i in range(groups)]
    raise ValueError(f'MultiOptimizer with {groups} groups and multi_transform labels '
                     f'{sorted(keys)}: pass labels=[...] (the label of each group, in the '
                     f'order of the MultiOptimizer\'s groups; the codemod\'s are the traversal '
                     f'names)')
  labels = list(labels)
  if len(labels) != groups or any(label not in keys for label in labels):
    raise ValueError(f'labels={labels}: expected {groups} labels (one per MultiOptimizer group, '
                     f'in order) among the opt_state\'s multi_transform labels {sorted(keys)}')
  return labels


def _groups(train_state, d, labels) -> list:
  """``[(sub_def, its opt_state sub-tree or None, where)]``, one per legacy group."""
  opt_state = train_state.opt_state
  if not isinstance(d, base.MultiOptimizer):
    return [(d, opt_state, 'opt_state')]
  part = _partition(opt_state)
  if part is None:  # to_optax(MultiOptimizer(...)): the whole-tree form injects nothing
    return [(sub, None, 'opt_state') for sub in d.sub_optimizers]
  chosen = _labels(d, list(part.inner_states), labels)
  return [(sub, part.inner_states[label], f'opt_state.inner_states[{label!r}]')
          for sub, label in zip(d.sub_optimizers, chosen)]


def _injected_values(subtree) -> dict:
  values = {}
  for inject in _injects(subtree).values() if subtree is not None else ():
    for name, key in _legacy_names(inject).items():
      values.setdefault(name, inject.hyperparams[key])
  return values


def hyper_params(train_state, optimizer_def, *, focus=None, labels: Sequence[str] | None = None):
  """The legacy ``opt.optimizer_def.hyper_params`` of a ``TrainState``.

  Args:
    train_state: as for :func:`legacy_state`.
    optimizer_def: the legacy def (its hyper-parameters are the defaults).
    focus: as for :func:`legacy_state` (the result is then a list of one, as in
      legacy, where ``create(focus=)`` makes a MultiOptimizer).
    labels: for a MultiOptimizer, the ``multi_transform`` label of each group, in
      group order (the codemod's: the traversal names, ``group_<i>`` otherwise;
      not needed for one group or ``group_<i>`` labels).

  Returns:
    The def's hyper-parameter dataclass (a list of them, one per group, for a
    MultiOptimizer) with each hyper-parameter the tx injects replaced by its
    current value in the opt_state (a 0-d array in the params' dtype, or with
    the leading device axis when replicated). With the legacy per-call form
    (:func:`apply_gradients`) these are always the def's values, as in legacy.

  Raises:
    ValueError: MultiOptimizer labels that cannot be told or do not fit.
    TypeError: ``optimizer_def`` is not a legacy def.
  """
  d = _def(optimizer_def, focus)
  out = []
  for sub, subtree, _ in _groups(train_state, d, labels):
    hp = sub.hyper_params
    fields = {f.name for f in dataclasses.fields(hp)}
    values = {k: v for k, v in _injected_values(subtree).items() if k in fields}
    out.append(hp.replace(**values) if values else hp)
  return out if isinstance(d, base.MultiOptimizer) else out[0]


def _same(a, b) -> bool:
  """Whether two hyper-parameter values are the same Python-level value."""
  if a is b:
    return True
  la, ta = jax.tree_util.tree_flatten(a)
  lb, tb = jax.tree_util.tree_flatten(b)
  if ta != tb or not _concrete(*la, *lb):
    return False
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _like(value, old, what: str):
  if not base._is_number_like(value) or value is None:
    raise TypeError(f'{what}: an injected hyper-parameter must be a number or numeric array, '
                    f'got {type(value).__name__} {value!r}')
  dtype = getattr(old, 'dtype', None)
  new = jnp.asarray(value, dtype) if dtype is not None else value
  if np.shape(new) != np.shape(old):
    new = jnp.broadcast_to(new, np.shape(old))  # a replicated state: one value per device
  return new


def _set_group(subtree, sub, hp, where: str):
  """``subtree`` with ``hp``'s injected values set; every other field must be the def's."""
  if type(hp) is not type(sub.hyper_params):
    raise TypeError(f'{where}: expected {type(sub.hyper_params).__name__} (the hyper-parameters '
                    f'of {type(sub).__name__}), got {type(hp).__name__}')
  injects = _injects(subtree) if subtree is not None else {}
  injected = {n for i in injects.values() for n in _legacy_names(i)}
  for f in dataclasses.fields(hp):
    value, default = getattr(hp, f.name), getattr(sub.hyper_params, f.name)
    if f.name not in injected and not _same(value, default):
      raise ValueError(f'{where}: hyper-parameter {f.name!r} of {type(sub).__name__} is not '
                       f'injected in this TrainState\'s tx (it stays {default!r}); build the tx '
                       f'with it injected (optim_compat.to_optax(def, inject=({f.name!r},)), or '
                       f'optax.inject_hyperparams without it in static_args) to change it per call')
  if not injects:
    return subtree

  def visit(n, path):
    if not _is_inject(n):
      return None
    scheduled = getattr(n, 'hyperparams_states', None) or {}
    new = dict(n.hyperparams)
    for name, key in _legacy_names(n).items():
      if key in scheduled:
        if not _same(getattr(hp, name), getattr(sub.hyper_params, name)):
          raise ValueError(f'{where}: {name!r} follows a schedule in this tx; setting it has no '
                           f'effect (optax recomputes it from the step)')
        continue
      new[key] = _like(getattr(hp, name), n.hyperparams[key], f'{where}: {name!r}')
    return n._replace(hyperparams=new, inner_state=_rebuild(n.inner_state, visit))
  return _rebuild(subtree, visit)


def _with_groups(train_state, d, new_subtrees, labels):
  if not isinstance(d, base.MultiOptimizer):
    return train_state.replace(opt_state=new_subtrees[0])
  part = _partition(train_state.opt_state)
  if part is None:
    return train_state
  chosen = _labels(d, list(part.inner_states), labels)
  inner = dict(part.inner_states)
  inner.update(zip(chosen, new_subtrees))
  new_part = part._replace(inner_states=type(part.inner_states)(inner))
  return train_state.replace(opt_state=_rebuild(
      train_state.opt_state, lambda n, path: new_part if n is part else None))


def set_hyper_params(train_state, hyper_params, optimizer_def, *, focus=None,
                     labels: Sequence[str] | None = None):
  """``train_state`` with the legacy hyper-parameters ``hyper_params`` set in its opt_state.

  The persistent form of ``apply_gradient(g, hyper_params=...)``: the values stay
  set for the following steps (see :func:`apply_gradients` for the per-call form).

  Args:
    train_state: as for :func:`legacy_state`.
    hyper_params: the def's hyper-parameter dataclass (e.g. from
      :func:`hyper_params` ``.replace(learning_rate=lr)``); a list of them, one per
      group in order, for a MultiOptimizer (or ``focus=``). Values may be traced.
    optimizer_def: the legacy def.
    focus, labels: as for :func:`hyper_params`.

  Returns:
    The TrainState with each injected hyper-parameter (``opt_state.hyperparams``,
    or each group's ``opt_state.inner_states[label]`` ones) set, cast to the
    stored value's dtype (the params' dtype, as ``inject_hyperparams`` casts it).

  Raises:
    ValueError: a field that the tx does not inject differs from the def's value
      (it cannot be changed after the tx is built: the message names the field
      and the group), a scheduled one is set, or MultiOptimizer labels that do
      not fit.
    TypeError: the wrong dataclass, a list of the wrong length, or a
      non-numeric value for an injected field.
  """
  d = _def(optimizer_def, focus)
  multi = isinstance(d, base.MultiOptimizer)
  hps = hyper_params if multi else [hyper_params]
  groups = _groups(train_state, d, labels)
  if multi and (not isinstance(hps, (list, tuple)) or len(hps) != len(groups)):
    raise TypeError(f'MultiOptimizer hyper_params must be a list of {len(groups)} (one per '
                    f'group), got {hps!r}')
  new = [_set_group(subtree, sub, hp, where) for (sub, subtree, where), hp in zip(groups, hps)]
  return _with_groups(train_state, d, new, labels)


def apply_gradients(train_state, grads, optimizer_def, *, focus=None,
                    labels: Sequence[str] | None = None, **hyper_param_overrides):
  """Legacy ``opt.apply_gradient(grads, **overrides)`` on a ``TrainState``, per call.

  Without overrides this is ``train_state.apply_gradients(grads=grads)``. With
  them (keywords such as ``learning_rate=lr`` or a user def's ``temperature=t``;
  ``hyper_params=hp`` or, for a MultiOptimizer, ``hyper_params=[hp0, hp1]``;
  keywords go to every group, as in legacy), the hyper-parameters for this call
  are computed from the def's as legacy does (``optimizer_def.update_hyper_params``),
  set in the opt_state (:func:`set_hyper_params`), the gradients applied, and the
  injected values held before the call put back: the override holds for this call
  only, as in legacy.

  Args:
    train_state, optimizer_def, focus, labels: as for :func:`set_hyper_params`.
    grads: a pytree like ``train_state.params``.
    **hyper_param_overrides: the legacy per-call overrides (values may be traced).

  Returns:
    The updated TrainState (step + 1).

  Raises:
    TypeError: an override the def does not have (legacy's error).
    ValueError: an override of a hyper-parameter the tx does not inject (see
      :func:`set_hyper_params`).
  """
  if not hyper_param_overrides:
    return train_state.apply_gradients(grads=grads)
  d = _def(optimizer_def, focus)
  hp = d.update_hyper_params(**hyper_param_overrides)
  saved = _injects(train_state.opt_state)
  new = set_hyper_params(train_state, hp, d, labels=labels).apply_gradients(grads=grads)

  def restore(n, path):
    if not _is_inject(n) or path not in saved:
      return None
    old = saved[path]
    scheduled = getattr(old, 'hyperparams_states', None) or {}
    kept = {k: v for k, v in old.hyperparams.items() if k not in scheduled}
    return n._replace(hyperparams={**n.hyperparams, **kept},
                      inner_state=_rebuild(n.inner_state, restore, path + ('inner_state',)))
  return new.replace(opt_state=_rebuild(new.opt_state, restore))


# --------------------------------------------------------------------------
# any hyper-parameter of a def injectable


def to_optax(opt_def, *, inject: Sequence[str] = (), **hyper_param_overrides
             ) -> optax.GradientTransformation:
  """``base.to_optax`` (any legacy def as an Optax transformation), with ``inject``.

  Without ``inject`` this is ``optim_compat.base.to_optax(opt_def, **overrides)``.
  With ``inject=('temperature', ...)``, the transformation is
  ``optax.inject_hyperparams`` over it: those hyper-parameters (fields of the def's
  hyper-parameter dataclass) live in ``opt_state.hyperparams`` (0-d arrays in the
  params' dtype), so per-call overrides (``apply_gradient(g, temperature=t)``)
  become :func:`apply_gradients` (or ``optax.tree_utils.tree_set(opt_state,
  temperature=t)`` before ``apply_gradients``); the other fields stay Python values.
  The update is the def's own, on the hyper-parameters with the injected values
  replaced: its update (``new - params``) bitwise the shim's ``apply_gradient(g,
  temperature=t)`` (a TrainState adds it back: params within 2 ulp) for a traced
  or array ``t`` (an argument of the jitted step). A Python-float ``t`` that the
  rule combines with other Python numbers (``1 - t``) is rounded to the params'
  dtype first here, where legacy computed in double precision.

  Args:
    opt_def: any legacy def whose ``hyper_params`` is a dataclass (table defs,
      user ``OptimizerDef`` subclasses, ``WeightNorm``, whose injectable names are its
      wrapped def's and ``wn_decay`` / ``wn_eps``; not ``MultiOptimizer``, whose groups
      are injected one by one in the codemod's ``multi_transform``).
    inject: names of the fields to inject; each value must be a number, or None (legacy
      allows a None learning rate when every ``apply_gradient`` passes one): it then
      starts at 0.0, as the codemod's injected Optax chains do, to be set before each
      update.
    **hyper_param_overrides: as for ``base.to_optax``.

  Returns:
    An Optax ``GradientTransformation``; with ``inject`` its state is
    ``optax.InjectStatefulHyperparamsState`` whose ``inner_state`` is the legacy
    layout (``transforms.LegacyRuleState`` or ``OptimizerState``).

  Raises:
    TypeError: ``opt_def`` is no legacy def (an Optax transformation already: the
      message says to drop the wrap), a name that is not a field (the message lists
      them), a non-numeric value for one, a hyper-parameter the legacy rule branches
      on in Python (``spec.HyperParam.static``: Momentum ``weight_decay`` /
      ``nesterov``, RMSProp ``centered``, LAMB ``weight_decay``, LARS
      ``weight_decay`` / ``nesterov``), or a def whose hyper-parameters are a list.
  """
  if not hasattr(opt_def, 'update_hyper_params'):  # (a real flax.optim def works too)
    _not_a_def(opt_def, inject)
  if isinstance(inject, str):
    inject = (inject,)
  inject = tuple(inject)
  if not inject:
    return base.to_optax(opt_def, **hyper_param_overrides)
  hp = opt_def.update_hyper_params(**hyper_param_overrides)
  if not dataclasses.is_dataclass(hp):
    raise TypeError(f'{type(opt_def).__name__}: hyper-parameters are a {type(hp).__name__}, '
                    f'not a dataclass: inject each MultiOptimizer group\'s own def instead')
  values, static = _hyper_param_values(opt_def, hp)
  fields = list(values)
  unknown = [n for n in inject if n not in fields]
  if unknown:
    raise TypeError(f'{type(opt_def).__name__} has no hyper-parameter(s) {unknown} to inject; '
                    f'valid: {fields}')
  for name in inject:
    if name in static:
      raise TypeError(f'{type(opt_def).__name__}: hyper-parameter {name!r} cannot be injected: '
                      f'legacy flax.optim branches on its value in Python (a traced value '
                      f'would take the other branch\'s arithmetic); build one tx per value')
    value = values[name]
    if value is None:
      continue  # (set per call: starts at 0.0 below)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.ndarray, np.generic,
                                                         jax.Array)):
      raise TypeError(f'{type(opt_def).__name__}: hyper-parameter {name!r} = {value!r} cannot be '
                      f'injected (inject_hyperparams stores numbers only)')

  def factory(**values):
    return base.to_optax(opt_def, **values)

  factory.__signature__ = inspect.Signature([
      inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=values[n])
      for n in fields])
  factory.__name__ = factory.__qualname__ = f'{type(opt_def).__name__}_to_optax'
  static = tuple(n for n in fields if n not in inject)
  return optax.inject_hyperparams(factory, static_args=static)(
      **{n: 0.0 if n in inject and values[n] is None else values[n] for n in fields})


def _not_a_def(value, inject) -> None:
  """Raise the TypeError of :func:`to_optax` given ``value``, no legacy def: an Optax
  transformation (a def factory ported to Optax while a caller the codemod converted still
  wraps what it returns) or anything else."""
  if isinstance(value, optax.GradientTransformation):
    rate = (' (and, as the caller sets the rate at apply time, build it with '
            'optax.inject_hyperparams so that opt_state has a learning_rate to set)'
            if inject else '')
    raise TypeError('to_optax got an optax.GradientTransformation, not a flax.optim def: what '
                    'it wraps is Optax already (a def factory ported to Optax?); pass it as '
                    f'tx= directly{rate}')
  raise TypeError(f'to_optax takes a flax.optim optimizer def (optim_compat.Adam(...), a '
                  f'OptimizerDef subclass), not {type(value).__name__}')


def _hyper_param_values(opt_def, hp) -> tuple[dict, set]:
  """``({name: value}, static names)`` of the hyper-parameters ``to_optax`` may override by
  name. A ``WeightNorm``'s are its wrapped def's (legacy forwards every override but
  ``wn_decay`` / ``wn_eps`` to it: ``apply_gradient(g, learning_rate=lr)`` sets the inner
  Adam's rate) beside its own two; its ``inner`` dataclass is not one."""
  from optim_compat.weight_norm import WeightNorm
  if isinstance(opt_def, WeightNorm):
    inner, inner_static = _hyper_param_values(opt_def.wrapped_optimizer, hp.inner)
    return {**inner, 'wn_decay': hp.wn_decay, 'wn_eps': hp.wn_eps}, inner_static
  entry = getattr(opt_def, '_spec', None)
  static = {h.name for h in entry.hyper_params if h.static} if entry is not None else set()
  return {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)}, static
