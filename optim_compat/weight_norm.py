"""Legacy ``flax.optim.WeightNorm``: any def run on a (direction, scale) split.

Legacy flax.optim 0.5.3 semantics: each leaf with ``size > shape[-1]`` is
``w = scale * v / sqrt(sum_{axes != last} v**2 + wn_eps)``; ``scale`` has shape
``(1, ..., 1, out)`` and starts at ``sqrt(sum w**2 + wn_eps)``, ``v = w / scale``.
Other leaves are kept whole (``scale = ()``). Gradients reach ``v`` and ``scale``
through ``jax.vjp`` of that map, ``wn_decay * v`` is added to ``v``'s gradient,
and the wrapped def updates ``{'direction': v, 'scale': scale}``. A 0-d leaf
raises ``IndexError`` as in legacy. No Optax alias exists: the shim's def (``to_optax``
wraps it), and :func:`weight_norm`, the same map around any Optax transformation.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
import optax
from jax import lax

from optim_compat import legacy_rule
from optim_compat.base import OptimizerDef, _deprecation_warning


@struct.dataclass
class _WeightNormHyperParams:
  inner: Any
  wn_decay: Any
  wn_eps: Any


@struct.dataclass
class _WeightNormParamState:
  direction_state: Any
  scale_state: Any
  direction: Any
  scale: Any


def _is_split(x) -> bool:
  return x.size > x.shape[-1]


def _split_all(params, eps):
  """``(directions, scales)``: each leaf ``p`` with size > shape[-1] as ``p / n, n``, ``n =
  sqrt(sum_{axes != last} p**2 + eps)`` (shape ``(1, ..., 1, out)``); other leaves ``p, ()``."""
  def split(p):
    if _is_split(p):
      norms = jnp.sqrt(jnp.square(p).sum(tuple(range(p.ndim - 1)), keepdims=True) + eps)
      return p / norms, norms
    return p, ()
  leaves, treedef = jax.tree_util.tree_flatten(params)
  directions, scales = zip(*(split(p) for p in leaves)) if leaves else ((), ())
  return treedef.unflatten(directions), treedef.unflatten(scales)


def _merge_all(directions, scales, eps):
  """The weights of a (direction, scale) split: ``d * (s * rsqrt(sum_{axes != last} d**2 +
  eps))`` for split leaves, ``d`` for the others (legacy's order of operations)."""
  def merge(d, s):
    if _is_split(d):
      norm = jnp.square(d).sum(tuple(range(d.ndim - 1)), keepdims=True) + eps
      return d * (s * lax.rsqrt(norm))
    return d
  return jax.tree_util.tree_map(merge, directions, scales)


def _split_gradients(grads, directions, scales, decay, eps):
  """The gradients of ``direction`` and ``scale`` (the vjp of :func:`_merge_all` at them,
  applied to ``grads``), ``decay * direction`` added to the split leaves' direction's."""
  _, vjp = jax.vjp(lambda d, s: _merge_all(d, s, eps), directions, scales)
  dir_grad, scale_grad = vjp(grads)
  dir_grad = jax.tree_util.tree_map(
      lambda d, g: g + decay * d if _is_split(d) else g, directions, dir_grad)
  return dir_grad, scale_grad


def holds_weight_norm_states(fields) -> bool:
  """Legacy per-parameter state field names (a set) include a WeightNorm's own."""
  return {'direction', 'scale'} <= set(fields)


class WeightNormState(NamedTuple):
  """State of :func:`weight_norm`.

  Attributes:
    direction: the params' tree: ``v`` of each split leaf (its shape), the leaf itself else.
    scale: the params' tree: ``s`` of each split leaf (shape ``(1, ..., 1, out)``), ``()``
      else.
    inner_state: the wrapped transformation's state over ``{'direction': ..., 'scale':
      ...}``.
  """
  direction: Any
  scale: Any
  inner_state: Any


def weight_norm(inner: optax.GradientTransformation, wn_decay: float = 0.,
                wn_eps: float = 1e-8) -> optax.GradientTransformation:
  """Legacy ``flax.optim.WeightNorm`` (0.5.3) around an Optax transformation.

  ``WeightNorm(Adam(...), wn_decay, wn_eps)`` is ``weight_norm(<Adam's Optax chain>,
  wn_decay, wn_eps)``: ``inner`` updates ``{'direction': v, 'scale': s}`` (kept in the
  state, as legacy keeps them in its per-parameter states), and the update is the new
  weights minus the old (``new - params``; ``TrainState.apply_gradients`` adds it back, so
  a param may be 1 ulp from legacy's ``w(v', s')``, as for every rule that subtracts twice:
  shared/optax-mapping.md). Equations: the :class:`WeightNorm` docstring (source: legacy
  ``flax/optim/weight_norm.py``).

  Args:
    inner: the transformation of the wrapped def (e.g. ``optax.adam(...)``, or one built
      with ``optax.inject_hyperparams``: its ``learning_rate`` is found in
      ``inner_state`` by ``optax.tree_utils.tree_set``).
    wn_decay: L2 added to the direction's gradient (``wn_decay * v``).
    wn_eps: added under the norm's square root.

  Returns:
    A GradientTransformation whose state is :class:`WeightNormState`; its ``update``
    needs ``params`` (``TrainState.apply_gradients`` passes them).

  Raises:
    IndexError: at ``init``, a 0-d leaf (as legacy).
    ValueError: ``update`` called without ``params``.
  """
  def init_fn(params):
    directions, scales = _split_all(params, wn_eps)
    return WeightNormState(directions, scales,
                           inner.init({'direction': directions, 'scale': scales}))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('weight_norm: update needs params (the current weights)')
    dir_grad, scale_grad = _split_gradients(updates, state.direction, state.scale, wn_decay,
                                            wn_eps)
    split = {'direction': state.direction, 'scale': state.scale}
    inner_updates, inner_state = inner.update({'direction': dir_grad, 'scale': scale_grad},
                                              state.inner_state, split)
    new = optax.apply_updates(split, inner_updates)
    weights = _merge_all(new['direction'], new['scale'], wn_eps)
    out = jax.tree_util.tree_map(lambda w, p: (w - p).astype(p.dtype), weights, params)
    return out, WeightNormState(new['direction'], new['scale'], inner_state)

  return optax.GradientTransformation(init_fn, update_fn)


class WeightNorm(OptimizerDef):
  """Legacy ``flax.optim.WeightNorm`` (flax.optim 0.5.3): any def run on a (direction, scale) split.

  Args:
    wrapped_optimizer: the def that updates ``direction`` and ``scale``.
    wn_decay: L2 added to the direction's gradient, ``wn_decay * v`` (default 0).
    wn_eps: added under the norm's square root (default 1e-8).

  Per-parameter state (checkpoint keys under ``state/param_states/<path>/``):
  ``direction_state``, ``scale_state`` (the wrapped def's states), ``direction``,
  ``scale``. Hyper-parameters: ``_WeightNormHyperParams(inner, wn_decay, wn_eps)``;
  per-call overrides other than ``wn_decay`` / ``wn_eps`` go to the wrapped def.

  Update (source: legacy ``flax/optim/weight_norm.py``)::

      leaves with size > shape[-1]: w = s * v / sqrt(sum_{axes != last} v^2 + wn_eps)
      g_v, g_s = vjp of that map at (v, s), applied to g;  g_v += wn_decay * v
      (v, s) <- wrapped def's step on {'direction': v, 'scale': s};  p = w(v, s)
      other leaves: v = p, s = () and the wrapped def's step on p

  Optax: there is no stock form; the shim runs this class, and ``to_optax`` wraps
  it (state: the legacy ``OptimizerState``), which the codemod emits for it.

  Raises:
    IndexError: a 0-d leaf at ``create``, as in legacy.
  """

  def __init__(self, wrapped_optimizer, wn_decay=0, wn_eps=1e-8):
    _deprecation_warning()
    super().__init__(_WeightNormHyperParams(wrapped_optimizer.hyper_params, wn_decay, wn_eps))
    self.wrapped_optimizer = wrapped_optimizer

  def update_hyper_params(self, **overrides):
    """``wn_decay`` / ``wn_eps`` are ours; every other override goes to the wrapped def."""
    decay = overrides.pop('wn_decay', self.hyper_params.wn_decay)
    eps = overrides.pop('wn_eps', self.hyper_params.wn_eps)
    inner = self.wrapped_optimizer.update_hyper_params(**overrides)
    return self.hyper_params.replace(inner=inner, wn_decay=decay, wn_eps=eps)

  @staticmethod
  def _states(params, inner_state, directions, scales):
    return jax.tree_util.tree_map(
        lambda _, *fields: _WeightNormParamState(*fields), params,
        inner_state.param_states['direction'], inner_state.param_states['scale'],
        directions, scales)

  def init_state(self, params):
    directions, scales = _split_all(params, self.hyper_params.wn_eps)
    state = self.wrapped_optimizer.init_state({'direction': directions, 'scale': scales})
    return state.replace(param_states=self._states(params, state, directions, scales))

  def apply_gradient(self, hyper_params, params, state, grads):
    treedef = jax.tree_util.tree_structure(params)
    # (the gradients in the params' kinds: a dict may stand for a FrozenDict, flatten_up_to)
    grads = treedef.unflatten(
        legacy_rule.flatten_like(treedef, grads, treedef.flatten_up_to(params), strict=True))
    leaves = legacy_rule.flatten_up_to(treedef, state.param_states)
    pick = lambda name: treedef.unflatten([getattr(s, name) for s in leaves])
    direction, scale = pick('direction'), pick('scale')
    eps, decay = hyper_params.wn_eps, hyper_params.wn_decay
    dir_grad, scale_grad = _split_gradients(grads, direction, scale, decay, eps)
    inner_state = state.replace(param_states={'direction': pick('direction_state'),
                                              'scale': pick('scale_state')})
    new_wn, new_state = self.wrapped_optimizer.apply_gradient(
        hyper_params.inner, {'direction': direction, 'scale': scale}, inner_state,
        {'direction': dir_grad, 'scale': scale_grad})
    new_params = _merge_all(new_wn['direction'], new_wn['scale'], eps)
    return new_params, new_state.replace(param_states=self._states(
        params, new_state, new_wn['direction'], new_wn['scale']))
