"""equivalence_tests: numeric proof that a migration changed nothing.

``core`` runs parameter trajectories (legacy def, shim or Optax ``tx``; one
device, ``jit``, or ``pmap`` over N devices) and compares them in ulps;
``legacy_env`` builds the old-stack virtualenv (real ``flax.optim`` 0.5.3);
``record_golden`` records golden trajectories there.
"""
