"""Evaluate the Optax source the codemod emits (``OptimizerSpec.emit``) into a transformation.

Used by the tests, the equivalence grid and ``convert-checkpoint``; it sits above the
shim (the emitted code names ``optim_compat``), so the migration table itself
(``spec``) imports none of it.
"""
from __future__ import annotations


def tx_from_source(source: str):
  """The ``optax.GradientTransformation`` that ``source`` (emitted Optax code) builds.

  Raises:
    SyntaxError, NameError, TypeError: ``source`` is not code the codemod emits.
  """
  import jax
  import optax

  import optim_compat
  return eval(source, {'optax': optax, 'jax': jax, 'optim_compat': optim_compat})  # noqa: S307
