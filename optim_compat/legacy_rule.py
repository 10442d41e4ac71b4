"""A legacy per-parameter update rule as an Optax ``GradientTransformation``.

The shim runs every legacy def through :func:`from_legacy_rule`: the def's
per-parameter rule (``optim_compat.update_rules``), keeping the legacy *order of
operations*, so the shim reproduces real ``flax.optim`` 0.5.3 bit for bit on the
same jax version. Its state is :class:`LegacyRuleState`, i.e. the legacy
``OptimizerState`` (step, per-parameter states with the legacy field names), so
converting between the legacy layout and ``opt_state`` is a re-labelling. The
public names are ``optim_compat.transforms``'s.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax.core import FrozenDict


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
      new_state)``; see ``optim_compat.update_rules``.

  Returns:
    A transformation whose state is :class:`LegacyRuleState`; ``update``
    requires ``params``.

  Raises:
    ValueError (from ``update``): ``params`` missing, or gradients whose tree
      differs from the params tree (the message names both structures).
  """

  def init_fn(params):
    # flax.nnx.Optimizer passes params wrapped in nnx Variables: the state mirrors the
    # values (the per-parameter states are the nodes, as optax's own states are)
    states = jax.tree_util.tree_map(lambda p: opt_def.init_param_state(_unwrap(p)), params,
                                    is_leaf=_is_nnx_variable)
    return LegacyRuleState(jnp.zeros([], jnp.int32), states)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('legacy optimizer rules need params: call tx.update(grads, state, params)')
    treedef = jax.tree_util.tree_structure(params)
    flat_p = treedef.flatten_up_to(params)
    flat_s = flatten_up_to(treedef, state.param_states)
    # the table's rules need an array or number per leaf; a user's rule may take None
    flat_g = flatten_like(treedef, updates, flat_p,
                          strict=getattr(opt_def, '_spec', None) is not None)
    out = [param_update(opt_def, state.count, hyper_params, p, s, g)
           for p, s, g in zip(flat_p, flat_s, flat_g)]
    flat_u = [u for u, _ in out]
    new_states = treedef.unflatten([s for _, s in out])
    return treedef.unflatten(flat_u), LegacyRuleState(state.count + 1, new_states)

  return optax.GradientTransformation(init_fn, update_fn)


def _is_nnx_variable(x) -> bool:
  return type(x).__module__.startswith('flax.nnx') and hasattr(x, 'get_value')


def _unwrap(x):
  return x.get_value() if _is_nnx_variable(x) else x


def flatten_up_to(treedef, tree):
  """``treedef.flatten_up_to(tree)``, where a ``dict`` of ``tree`` may stand for a
  ``FrozenDict`` of the params' structure and the other way round (same keys).

  Flax's ``init`` returns a dict since flax 0.7.1 and a FrozenDict before: legacy code that
  re-freezes its params (``opt.replace(target=flax.core.freeze(p))``), or unfreezes its
  gradients, paired the same kinds on flax 0.5.3 and mixes them on today's stack. The
  per-parameter states and gradients are flattened as if they had the params' kinds.

  Args:
    treedef: the params' tree structure.
    tree: a tree with the params' structure up to its leaves (per-parameter states,
      gradients).

  Returns:
    The list of ``tree``'s subtrees at the params' leaves.

  Raises:
    ValueError / TypeError: the structures differ beyond the mapping kinds (jax's error).
  """
  try:
    return treedef.flatten_up_to(tree)
  except (ValueError, TypeError):
    recast = _mapping_kinds_like(treedef.unflatten([0] * treedef.num_leaves), tree)
    if recast is tree:
      raise
    return treedef.flatten_up_to(recast)


def _mapping_kinds_like(skeleton, tree):
  """``tree`` with each ``dict`` / ``FrozenDict`` node of the same keys as ``skeleton``'s node
  at its path made that node's kind (``tree`` itself when nothing changes)."""
  if not (isinstance(skeleton, Mapping) and isinstance(tree, Mapping)
          and set(skeleton) == set(tree)):
    return tree
  items = {k: _mapping_kinds_like(skeleton[k], v) for k, v in tree.items()}
  if isinstance(skeleton, FrozenDict) and not isinstance(tree, FrozenDict):
    return FrozenDict(items)
  if type(skeleton) is dict and isinstance(tree, FrozenDict):
    return items
  if all(items[k] is tree[k] for k in items):
    return tree
  if isinstance(tree, FrozenDict):
    return FrozenDict(items)
  return type(tree)(items) if isinstance(tree, dict) else tree


def flatten_like(treedef, tree, flat_params=None, strict: bool = False):
  """``treedef.flatten_up_to(tree)`` for a gradient tree, with clear errors.

  Args:
    treedef: the params' tree structure.
    tree: the gradients.
    flat_params: the params' leaves; when given, each gradient leaf must
      broadcast to its parameter's shape without changing it.
    strict: every gradient leaf must be an array or a number (the table's rules;
      a user's own rule may accept ``None``).

  Raises:
    ValueError: the trees differ (the message names the first differing
      pytree path and shows both structures), or a gradient leaf's shape would
      change its parameter's shape (legacy flax.optim broadcast it silently:
      a (3,) parameter took a (3, 3) gradient and became (3, 3)).
    TypeError: with ``strict``, a gradient leaf that is ``None`` or not an array
      or number (:func:`check_gradient_leaves`; names its path).
  """
  try:
    flat = flatten_up_to(treedef, tree)
  except (ValueError, TypeError) as e:
    other = jax.tree_util.tree_structure(tree)
    raise ValueError(f'gradient tree does not match the params tree at '
                     f'{_first_difference(treedef, tree)}:\n  params: {treedef}\n'
                     f'  grads:  {other}') from e
  if strict:
    check_gradient_leaves([jax.tree_util.keystr(k) for k in _paths(treedef)], flat_params, flat)
  if flat_params is not None:
    for i, (p, g) in enumerate(zip(flat_params, flat)):
      p_shape, g_shape = jnp.shape(p), jnp.shape(g)
      if p_shape != g_shape and _broadcast(p_shape, g_shape) != p_shape:
        path = jax.tree_util.keystr(_paths(treedef)[i])
        raise ValueError(f'gradient at {path or "the root"} has shape {g_shape}, but the '
                         f'parameter has shape {p_shape}')
  return flat


def is_array_or_number(x) -> bool:
  """A jax/numpy array, tracer or numpy scalar of a numeric dtype, or a Python number."""
  if isinstance(x, (bool, int, float, complex)):
    return True
  dtype = getattr(x, 'dtype', None)
  return (dtype is not None and hasattr(x, 'shape')
          and getattr(dtype, 'kind', None) in tuple('biufcV'))  # V: bfloat16's numpy kind


def describe_leaf(x) -> str:
  """``x`` for a message: ``a float32[3, 2] array``, ``a str 'hello'``, ``None``."""
  if x is None:
    return 'None'
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return f'a {x.dtype}{list(x.shape)} array'
  text, kind = repr(x), type(x).__name__
  article = 'an' if kind[:1].lower() in 'aeiou' else 'a'
  return f'{article} {kind} {text if len(text) <= 60 else text[:57] + "..."}'


def check_gradient_leaves(paths, flat_params, flat_grads) -> None:
  """Every gradient leaf is an array or a number (``paths``: the leaves' ``keystr``).

  Raises:
    TypeError: a leaf is ``None`` (legacy flax.optim 0.5.3 failed inside the update
      rule, e.g. ``unsupported operand type(s) for *: 'float' and 'NoneType'``) or
      something else (a str, an object); the message names its path and its parameter.
  """
  flat_params = flat_params if flat_params is not None else [None] * len(flat_grads)
  for path, p, g in zip(paths, flat_params, flat_grads):
    if is_array_or_number(g):
      continue
    where = path or 'the root'
    param = f' (the parameter there is {describe_leaf(p)})' if p is not None else ''
    if g is None:
      raise TypeError(f'gradient at {where} is None{param}: every parameter needs a gradient '
                      'array; pass zeros (jnp.zeros_like) for one that gets none, or leave it '
                      'out of the optimizer (MultiOptimizer or create(focus=...) leave '
                      'unselected parameters alone)')
    raise TypeError(f'gradient at {where} is {describe_leaf(g)}, not an array or a '
                    f'number{param}')


def _broadcast(a, b):
  try:
    return tuple(jnp.broadcast_shapes(a, b))
  except ValueError:
    return None


def _paths(treedef):
  skeleton = treedef.unflatten([0] * treedef.num_leaves)
  return [path for path, _ in jax.tree_util.tree_flatten_with_path(skeleton)[0]]


def _first_difference(treedef, tree) -> str:
  """``keystr`` of the first leaf path where ``tree`` departs from ``treedef``."""
  expected = _paths(treedef)
  found = [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  for a, b in zip(expected, found):
    if a != b:
      return f'{jax.tree_util.keystr(a)} (grads have {jax.tree_util.keystr(b)})'
  if len(expected) > len(found):
    return f'{jax.tree_util.keystr(expected[len(found)])} (missing from the grads)'
  if len(found) > len(expected):
    return f'{jax.tree_util.keystr(found[len(expected)])} (not in the params)'
  return 'a container of a different type'
