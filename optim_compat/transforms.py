"""Faithful Optax transformations of legacy ``flax.optim`` update rules.

The shim runs every legacy def through :func:`from_legacy_rule`: the def's
per-parameter rule (``optim_compat.rules``), keeping the legacy *order of
operations*, so the shim reproduces real ``flax.optim`` 0.5.3 bit for bit on the
same jax version. Its state is :class:`LegacyRuleState`, i.e. the legacy
``OptimizerState`` (step, per-parameter states with the legacy field names), so
converting between the legacy layout and ``opt_state`` is a re-labelling.

``optim_compat.transforms.<name>(...)`` (e.g. ``lamb``) builds the same
transformation from the legacy arguments; the codemod emits it where stock
Optax differs intrinsically (see ``spec.py``).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


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
    flat_g = flatten_like(treedef, updates)
    out = [param_update(opt_def, state.count, hyper_params, p, s, g)
           for p, s, g in zip(flat_p, flat_s, flat_g)]
    flat_u = [u for u, _ in out]
    new_states = treedef.unflatten([s for _, s in out])
    return treedef.unflatten(flat_u), LegacyRuleState(state.count + 1, new_states)

  return optax.GradientTransformation(init_fn, update_fn)


def flatten_like(treedef, tree):
  """``treedef.flatten_up_to(tree)`` with an error that shows both structures."""
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
