"""Legacy ``flax.optim.WeightNorm``: any def run on a (direction, scale) split.

Legacy flax.optim 0.5.3 semantics: each leaf with ``size > shape[-1]`` is
``w = scale * v / sqrt(sum_{axes != last} v**2 + wn_eps)``; ``scale`` has shape
``(1, ..., 1, out)`` and starts at ``sqrt(sum w**2 + wn_eps)``, ``v = w / scale``.
Other leaves are kept whole (``scale = ()``). Gradients reach ``v`` and ``scale``
through ``jax.vjp`` of that map, ``wn_decay * v`` is added to ``v``'s gradient,
and the wrapped def updates ``{'direction': v, 'scale': scale}``. A 0-d leaf
raises ``IndexError`` as in legacy. No Optax alias exists; ``to_optax`` wraps it.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
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
    eps = self.hyper_params.wn_eps

    def split(p):
      if _is_split(p):
        norms = jnp.sqrt(jnp.square(p).sum(tuple(range(p.ndim - 1)), keepdims=True) + eps)
        return p / norms, norms
      return p, ()
    leaves, treedef = jax.tree_util.tree_flatten(params)
    directions, scales = zip(*(split(p) for p in leaves)) if leaves else ((), ())
    directions, scales = treedef.unflatten(directions), treedef.unflatten(scales)
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

    def merge(d, s):
      if _is_split(d):
        norm = jnp.square(d).sum(tuple(range(d.ndim - 1)), keepdims=True) + eps
        return d * (s * lax.rsqrt(norm))
      return d
    merge_all = lambda d, s: jax.tree_util.tree_map(merge, d, s)
    _, vjp = jax.vjp(merge_all, direction, scale)
    dir_grad, scale_grad = vjp(grads)
    dir_grad = jax.tree_util.tree_map(
        lambda d, g: g + decay * d if _is_split(d) else g, direction, dir_grad)
    inner_state = state.replace(param_states={'direction': pick('direction_state'),
                                              'scale': pick('scale_state')})
    new_wn, new_state = self.wrapped_optimizer.apply_gradient(
        hyper_params.inner, {'direction': direction, 'scale': scale}, inner_state,
        {'direction': dir_grad, 'scale': scale_grad})
    new_params = merge_all(new_wn['direction'], new_wn['scale'])
    return new_params, new_state.replace(param_states=self._states(
        params, new_state, new_wn['direction'], new_wn['scale']))
