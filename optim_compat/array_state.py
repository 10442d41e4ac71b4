"""A ``TrainState`` whose ``params`` may be a bare array.

Legacy code creates optimizers on bare arrays (dopamine's and brax's SAC:
``alpha_optimizer = optimizer_def.create(jnp.zeros(1))`` for the entropy temperature).
Flax's ``flax.training.train_state.TrainState`` holds one, but its ``apply_gradients``
starts with ``OVERWRITE_WITH_GRADIENT in grads`` (the fp8 collection check, Flax >= 0.8),
which is a ``TypeError`` when ``grads`` is a ``jax.Array`` (measured on Flax 0.12.8:
``Array.__contains__: unsupported operand type <class 'str'>``).

:class:`ArrayTrainState` is that ``TrainState`` with the check made only on a mapping; on
any other pytree it applies the Optax update as Flax does (``tx.update``, then
``optax.apply_updates``, ``step + 1``). It is what the codemod emits for a ``.create`` on a
bare array (``OM001``), and everything else about it is Flax's class: fields, ``create``,
``replace``, checkpoints (``flax.training.checkpoints`` / ``flax.serialization``).
"""
from __future__ import annotations

from collections.abc import Mapping

import optax
from flax.training import train_state


class ArrayTrainState(train_state.TrainState):
  """``flax.training.train_state.TrainState`` for any pytree of params, a bare array too.

  ``ArrayTrainState.create(apply_fn=None, params=jnp.zeros(1), tx=optax.adam(1e-3))``
  then ``state.apply_gradients(grads=g)`` with ``g`` of the params' shape and dtype.
  On a mapping of params (a dict, a ``FrozenDict``) it is Flax's ``apply_gradients``
  unchanged, so the two classes give bitwise the same states on the same inputs.
  """

  def apply_gradients(self, *, grads, **kwargs):
    """``self`` with ``step + 1`` and ``params`` / ``opt_state`` updated by ``grads``.

    Args:
      grads: a pytree of the structure, shapes and dtypes of ``params`` (a
        ``jax.Array`` when the params are one).
      **kwargs: other fields to ``replace``, as Flax's method takes them.

    Returns:
      A new ``ArrayTrainState``.

    Raises:
      ValueError / TypeError: from Optax when ``grads`` does not match ``params``.
    """
    if isinstance(grads, Mapping):
      return super().apply_gradients(grads=grads, **kwargs)
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, updates),
                        opt_state=opt_state, **kwargs)
