"""equivalence_tests: numeric proof that a migration changed nothing.

``check(legacy, tx, params, ...)`` runs a legacy def and an Optax ``tx``
side by side (one device, ``pmap`` or sharded ``jit``, any device count) and
returns a :class:`~equivalence_tests.checker.Report`. ``core`` holds the
trajectory runner of the recorded cases and the ulp comparison;
``legacy_env`` builds the old-stack virtualenv (real ``flax.optim`` 0.5.3);
``record_golden`` records golden trajectories there.
"""

__all__ = ['Report', 'check']


def __getattr__(name):
  """``Report`` and ``check`` import the checker (and jax) at their first use, so that
  ``optim-migrate rewrite``, which registers the ``check`` command, starts without jax."""
  if name in __all__:
    from equivalence_tests import checker
    return getattr(checker, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
