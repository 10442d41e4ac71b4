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
