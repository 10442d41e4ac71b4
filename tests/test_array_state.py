"""optim_compat.ArrayTrainState: Flax's TrainState for params that are a bare array.

Flax's own ``TrainState.apply_gradients`` raises on a bare ``jax.Array`` (its fp8 check
``'overwrite_with_gradient' in grads``); the subclass applies the same Optax update there, and
is Flax's method unchanged on a mapping of params.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

import optim_compat


def _steps(state, grads_of, n=5):
  for i in range(n):
    state = state.apply_gradients(grads=grads_of(state.params, i))
  return state


def test_flax_train_state_still_refuses_a_bare_array():
  """The reason for the class: if Flax ever accepts one, the codemod can emit its TrainState."""
  state = train_state.TrainState.create(apply_fn=None, params=jnp.zeros(3), tx=optax.adam(0.1))
  with pytest.raises(TypeError):
    state.apply_gradients(grads=jnp.ones(3))


def test_a_bare_array_trains_as_the_optax_update_says():
  tx = optax.adam(0.1)
  grads_of = lambda p, i: jnp.cos(p + i)
  state = _steps(optim_compat.ArrayTrainState.create(apply_fn=None, params=jnp.zeros(3), tx=tx),
                 grads_of)
  params, opt_state = jnp.zeros(3), tx.init(jnp.zeros(3))
  for i in range(5):  # the update by hand, in the same process: bitwise
    updates, opt_state = tx.update(grads_of(params, i), opt_state, params)
    params = optax.apply_updates(params, updates)
  assert isinstance(state, optim_compat.ArrayTrainState) and int(state.step) == 5
  np.testing.assert_array_equal(state.params, params)


def test_a_mapping_of_params_is_flax_s_method_unchanged():
  params = {'w': jnp.arange(4.0), 'b': jnp.ones(2)}
  grads_of = lambda p, i: jax.tree_util.tree_map(lambda x: jnp.sin(x * (i + 1)), p)
  ours = _steps(optim_compat.ArrayTrainState.create(apply_fn=None, params=params,
                                                    tx=optax.sgd(0.1, momentum=0.9)), grads_of)
  flax_ = _steps(train_state.TrainState.create(apply_fn=None, params=params,
                                               tx=optax.sgd(0.1, momentum=0.9)), grads_of)
  for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(flax_)):
    np.testing.assert_array_equal(a, b)


def test_it_jits_and_keeps_other_fields_given_to_apply_gradients():
  state = optim_compat.ArrayTrainState.create(apply_fn=None, params=jnp.zeros(2),
                                              tx=optax.sgd(0.5))
  step = jax.jit(lambda s, g: s.apply_gradients(grads=g))
  state = step(state, jnp.array([1.0, -2.0]))
  np.testing.assert_array_equal(state.params, np.array([-0.5, 1.0], np.float32))
  with pytest.raises((ValueError, TypeError)):
    state.apply_gradients(grads=jnp.ones(5))  # a gradient of another shape: Optax refuses
