"""How far live runs are from the committed golden files (any stack, any XLA flags).

    python -m equivalence_tests.golden_drift --impl real|shim|emitted|stock [--cases ID...]

Runs each case of ``cases.py`` (``real``: the live ``flax.optim``, old stack
only; ``shim``: ``optim_compat``; ``emitted``: what the codemod writes (the
Optax source of a table def, ``to_optax`` of a user def), cases with an
emitted form only, modern stack; ``stock``: the
``--prefer-stock-optax`` source, cases of a def in ``spec.STOCK_ALTERNATIVES``
without overrides, modern stack) and prints one JSON
object ``{case_id: {"params": ulp, "state": ulp or null, "where": [step, leaf]}}``:
the distance of the recorded steps' params (and, for ``real`` / ``shim``, of
the final per-parameter state) from ``golden/<case_id>.npz``, in ulps of each
leaf's largest magnitude (``core.compare``). Run it under other ``XLA_FLAGS``
(another codegen: what another CPU gives) to measure how far the numbers move
from the recording machine's; ``cases.GOLDEN_BOUNDS`` holds the bounds.
"""
from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from equivalence_tests import cases, core, record_golden


def digest(traj: dict) -> str:
  """SHA-256 of a trajectory's bytes (steps and leaf paths in sorted order)."""
  import hashlib
  h = hashlib.sha256()
  for step in sorted(traj):
    for path in sorted(traj[step]):
      h.update(f'{step}/{path}'.encode())
      h.update(np.ascontiguousarray(traj[step][path]).tobytes())
  return h.hexdigest()


def state_distance(opt, golden_state: dict, dtype) -> float:
  """Largest ulp distance of the final optimizer state's leaves from a golden file's."""
  from flax import serialization, traverse_util
  flat = {'/'.join(k): v for k, v in traverse_util.flatten_dict(
      serialization.to_state_dict(opt)['state']).items()}
  worst = 0.0
  for key, value in golden_state.items():
    if value.size and key != 'step':
      worst = max(worst, core.ulp_distance(core.storable(flat[key]), value, dtype=dtype))
  return worst


def emitted_trajectory(case) -> dict:
  """What the codemod writes for ``case`` (its Optax source; ``to_optax(def)`` for a
  user def), run as ``tests/test_golden.py`` runs it."""
  from equivalence_tests import grid
  from optim_compat import emitted, spec
  case_id, def_name, kwargs = case
  if def_name.startswith('user:'):
    import optim_compat
    opt_def, _ = cases.build(optim_compat, def_name, kwargs)
    return core.run_optax(optim_compat.to_optax(opt_def), cases.params_for(case_id), cases.STEPS,
                          cases.SEED, record=cases.RECORDED_STEPS)
  schedule = cases.APPLY[kwargs['apply']][0] if 'apply' in kwargs else None
  return core.run_optax(emitted.tx_from_source(grid.emitted_source(case)), cases.params_for(case_id),
                        cases.STEPS, cases.SEED, record=cases.RECORDED_STEPS, hyperparams=schedule,
                        corrupt_grads=cases.GRADS.get(kwargs.get('grads')))


def stock_trajectory(case) -> dict:
  """The ``--prefer-stock-optax`` source for ``case``, 20 jitted steps."""
  from optim_compat import emitted, spec
  case_id, def_name, kwargs = case
  alt = spec.STOCK_ALTERNATIVES[def_name]
  source = alt.emit(spec.SPECS[def_name], {k: repr(v) for k, v in kwargs.items()})
  return core.run_optax(emitted.tx_from_source(source), cases.params_for(case_id), cases.STEPS,
                        cases.SEED, record=cases.RECORDED_STEPS)


def measure(impl: str, case_ids=None) -> dict:
  """``{case_id: {"params", "state", "where"}}`` for ``impl`` in ``real|shim|emitted|stock``."""
  if impl == 'real':
    from flax import optim as module
  elif impl == 'shim':
    import optim_compat as module
  result = {}
  for case in cases.CASES:
    case_id, def_name, kwargs = case
    if case_ids and case_id not in case_ids:
      continue
    golden, golden_state = record_golden.load(case_id)
    dtype = cases.DTYPES.get(case_id)
    state = None
    if impl == 'emitted':
      from equivalence_tests import grid
      if not (grid.converted(case) or def_name.startswith('user:')):
        continue
      traj = emitted_trajectory(case)
    elif impl == 'stock':
      from optim_compat import spec
      if def_name not in spec.STOCK_ALTERNATIVES or set(kwargs) & {'apply', 'grads', 'focus'}:
        continue
      traj = stock_trajectory(case)
    else:
      traj, opt = cases.run_case(module, case_id, record=cases.RECORDED_STEPS)
      state = state_distance(opt, golden_state, dtype)
    worst, where = core.compare(traj, golden, dtype)
    result[case_id] = {'params': worst, 'state': state, 'where': list(where) if where else None,
                       'digest': digest(traj)}
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--impl', choices=('real', 'shim', 'emitted', 'stock'), required=True)
  parser.add_argument('--cases', nargs='+', metavar='CASE_ID')
  args = parser.parse_args(argv)
  unknown = set(args.cases or ()) - set(cases.CASE_BY_ID)
  if unknown:
    parser.error(f'unknown case id(s) {sorted(unknown)}')
  out = measure(args.impl, args.cases)
  json.dump({'jax': jax.__version__, 'cases': out}, sys.stdout, indent=1)
  print()
  return 0


if __name__ == '__main__':
  sys.exit(main())
