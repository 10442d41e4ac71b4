"""pytest plugin: the ``optim_equivalence`` fixture (entry point ``pytest11``).

    def test_migration(optim_equivalence):
      optim_equivalence(legacy=optim_compat.Adam(1e-3), tx=optax.adam(1e-3),
                        params=my_params, devices=(1, 2))

The fixture calls :func:`equivalence_tests.check` with the same arguments (so the
same defaults: ``grads='mixed'``, the draws that expose a wrong epsilon) and
fails the test with the report's table when ``report.ok`` is false; it
returns the :class:`~equivalence_tests.checker.Report` otherwise. Device
counts the test process lacks run in subprocesses, so no ``XLA_FLAGS`` are
needed.
"""
from __future__ import annotations

import pytest


@pytest.fixture
def optim_equivalence():
  """``(legacy, tx, params, **check_kwargs) -> Report``; fails the test on a difference."""

  def run(legacy, tx, params, **kwargs):
    from equivalence_tests import checker
    report = checker.check(legacy, tx, params, **kwargs)
    if not report.ok:
      pytest.fail(str(report), pytrace=False)
    return report
  return run
