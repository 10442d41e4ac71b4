"""Faithful Optax transformations of legacy ``flax.optim`` update rules.

Stock Optax is used wherever it reproduces a legacy optimizer to rounding level
(see ``spec.py``); the transformations here exist for the cases where the legacy
*order of operations* matters for bit-exactness, so that the shim reproduces real
``flax.optim`` 0.5.3 bit for bit on the same jax version.

Each transformation's state is a ``NamedTuple`` whose ``count`` is the legacy
``OptimizerState.step`` (int32, pre-increment) and whose other fields carry the
legacy per-parameter state field names (the checkpoint keys), so converting
between the legacy layout and ``opt_state`` is a pytree re-arrangement.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax


class LegacyAdamState(NamedTuple):
  """State of :func:`legacy_adam`.

  Attributes:
    count: int32 scalar, number of updates applied so far (legacy ``step``).
    grad_ema: pytree like params, first moment (legacy field ``grad_ema``).
    grad_sq_ema: pytree like params, second moment (legacy field ``grad_sq_ema``).
  """
  count: Any
  grad_ema: Any
  grad_sq_ema: Any


def _is_zero_literal(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def legacy_adam(learning_rate, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.0) -> optax.GradientTransformation:
  """Adam exactly as legacy ``flax.optim.Adam`` (flax 0.5.3) computes it.

  Source of the formula: flax 0.5.3 ``flax/optim/adam.py``::

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g**2
    t = step + 1  (in the parameter's dtype, so bf16 rounds 257 to 256)
    p_new = p - lr*(m/(1-b1**t)) / (sqrt(v/(1-b2**t)) + eps) - lr*wd*p

  Weight decay is decoupled from the moments but scaled by the learning rate,
  which is what ``optax.adamw`` does; the two differ only in operation order
  (measured <= 6 ulp of a leaf's largest magnitude).

  Args:
    learning_rate: float or traced scalar (step size; no unit).
    beta1, beta2: moment decay rates in [0, 1).
    eps: added to ``sqrt(v_hat)`` (outside the square root).
    weight_decay: coefficient of ``lr * wd * p``; ``0`` skips the term.

  Returns:
    An ``optax.GradientTransformation`` whose updates ``u`` satisfy
    ``p + u == p_new`` bitwise when ``weight_decay == 0``; with weight decay the
    legacy rule subtracts twice, and ``p + (p_new - p)`` can differ from
    ``p_new`` by 1 ulp where an element changes sign (named in the table).
  """

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p)
    return LegacyAdamState(
        count=jnp.zeros([], jnp.int32),
        grad_ema=jax.tree_util.tree_map(zeros, params),
        grad_sq_ema=jax.tree_util.tree_map(zeros, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('legacy_adam needs params (pass them to tx.update).')
    step = state.count
    treedef = jax.tree_util.tree_structure(params)
    flat_p = treedef.flatten_up_to(params)
    flat_g = treedef.flatten_up_to(updates)
    flat_m = treedef.flatten_up_to(state.grad_ema)
    flat_v = treedef.flatten_up_to(state.grad_sq_ema)
    out_u, out_m, out_v = [], [], []
    for p, g, m, v in zip(flat_p, flat_g, flat_m, flat_v):
      m = beta1 * m + (1. - beta1) * g
      v = beta2 * v + (1. - beta2) * lax.square(g)
      t = jnp.array(step + 1, lax.dtype(p.dtype))
      m_hat = m / (1 - beta1 ** t)
      v_hat = v / (1 - beta2 ** t)
      denom = jnp.sqrt(v_hat) + eps
      step_term = learning_rate * m_hat / denom
      if _is_zero_literal(weight_decay):
        u = -step_term
      else:
        new_p = p - step_term
        new_p = new_p - learning_rate * weight_decay * p
        u = new_p - p
      out_u.append(u)
      out_m.append(m)
      out_v.append(v)
    unflat = treedef.unflatten
    new_state = LegacyAdamState(step + 1, unflat(out_m), unflat(out_v))
    return unflat(out_u), new_state

  return optax.GradientTransformation(init_fn, update_fn)


class LegacyRuleState(NamedTuple):
  """State of :func:`from_legacy_rule`: exactly the legacy ``OptimizerState``.

  Attributes:
    count: int32 scalar, the legacy ``step`` (pre-increment at each update).
    param_states: pytree like params whose leaves are the legacy per-parameter
      state objects (legacy field names, e.g. ``_LAMBParamState``).
  """
  count: Any
  param_states: Any


def from_legacy_rule(opt_def, hyper_params, param_update) -> optax.GradientTransformation:
  """An Optax ``GradientTransformation`` running a legacy per-parameter rule.

  Args:
    opt_def: the legacy ``OptimizerDef`` (its ``init_param_state`` builds the
      state; rules may read construction-time settings from it).
    hyper_params: the legacy hyper-parameter dataclass for these updates
      (values may be traced).
    param_update: ``(opt_def, step, hp, param, state, grad) -> (update,
      new_state)``; see ``optim_compat.rules``.

  Returns:
    A transformation whose state is :class:`LegacyRuleState`; ``update``
    requires ``params``.

  Raises:
    ValueError (from ``update``): ``params`` missing, or gradients whose tree
      differs from the params tree (the message names both structures).
  """

  def init_fn(params):
    return LegacyRuleState(jnp.zeros([], jnp.int32),
                           jax.tree_util.tree_map(opt_def.init_param_state, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('legacy optimizer rules need params: call tx.update(grads, state, params)')
    treedef = jax.tree_util.tree_structure(params)
    flat_p = treedef.flatten_up_to(params)
    flat_s = treedef.flatten_up_to(state.param_states)
    flat_g = _flatten_like(treedef, updates)
    out = [param_update(opt_def, state.count, hyper_params, p, s, g)
           for p, s, g in zip(flat_p, flat_s, flat_g)]
    flat_u = [u for u, _ in out]
    new_states = treedef.unflatten([s for _, s in out])
    return treedef.unflatten(flat_u), LegacyRuleState(state.count + 1, new_states)

  return optax.GradientTransformation(init_fn, update_fn)


def _flatten_like(treedef, tree):
  try:
    return treedef.flatten_up_to(tree)
  except (ValueError, TypeError) as e:
    other = jax.tree_util.tree_structure(tree)
    raise ValueError(f'gradient tree does not match the params tree:\n  params: {treedef}\n'
                     f'  grads:  {other}\n  ({e})') from e


_FACTORIES: dict = {}


def __getattr__(name: str):
  """``optim_compat.transforms.<lowercase def name>``: the faithful factories.

  E.g. ``optim_compat.transforms.lamb(learning_rate=1e-3, weight_decay=1e-2)``;
  the arguments are the legacy def's (see the migration table), so
  ``optax.inject_hyperparams`` can inject ``learning_rate``.
  """
  if name not in _FACTORIES:
    from optim_compat import base, spec
    entries = {e.name.lower(): e for e in spec.SPECS.values() if e.param_update is not None}
    if name not in entries:
      raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    _FACTORIES[name] = base.faithful_factory(entries[name])
  return _FACTORIES[name]
