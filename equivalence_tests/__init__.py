"""equivalence_tests: numeric proof that a migration changed nothing.

``check(legacy, tx, params, ...)`` runs a legacy def and an Optax ``tx``
side by side (one device, ``pmap`` or sharded ``jit``, any device count) and
returns a :class:`~equivalence_tests.checker.Report`. ``core`` holds the
trajectory runner of the recorded cases and the ulp comparison;
``legacy_env`` builds the old-stack virtualenv (real ``flax.optim`` 0.5.3);
``record_golden`` records golden trajectories there.
"""


from equivalence_tests.checker import Report, check  # noqa: E402,F401
