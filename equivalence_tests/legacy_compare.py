"""Shim vs live ``flax.optim`` side by side, in the old stack.

    .legacy-venv/bin/python -m equivalence_tests.legacy_compare

For every case of ``cases.py`` runs the real ``flax.optim`` def and the
``optim_compat`` def in the same process (same jax 0.4.13) and prints one JSON
object: ``{case_id: {"bitwise": bool, "max_ulp": float, "worst": [step, leaf],
"state_dict_layout_equal": bool, "golden_ulp": float, "golden_state_ulp": float}}``.
``bitwise`` / ``max_ulp``: shim vs live flax.optim, two computations in this
process. ``golden_ulp`` / ``golden_state_ulp``: live flax.optim vs the committed
golden file (recorded on another machine, maybe another CPU: compared with
``cases.golden_bound``, not bitwise).
"""
from __future__ import annotations

import json
import sys

import jax
import numpy as np
from flax import serialization

from equivalence_tests import cases, core, golden_drift, record_golden


def _layout(tree):
  return jax.tree_util.tree_map(lambda x: (np.shape(x), str(np.asarray(x).dtype)), tree)


def main() -> int:
  from flax import optim as real
  import optim_compat as shim
  result = {}
  for case_id, def_name, kwargs in cases.CASES:
    real_traj, real_opt = cases.run_case(real, case_id)
    shim_traj, shim_opt = cases.run_case(shim, case_id)
    worst, where = core.compare(shim_traj, real_traj, cases.DTYPES.get(case_id))
    golden, golden_state = record_golden.load(case_id)
    dtype = cases.DTYPES.get(case_id)
    result[case_id] = {
        'bitwise': core.bitwise_equal(shim_traj, real_traj),
        'max_ulp': worst,
        'worst': list(where) if where else None,
        'state_dict_layout_equal': _layout(serialization.to_state_dict(shim_opt))
                                   == _layout(serialization.to_state_dict(real_opt)),
        'golden_ulp': core.compare(real_traj, golden, dtype)[0],
        'golden_state_ulp': golden_drift.state_distance(real_opt, golden_state, dtype),
        'jax': jax.__version__,
    }
  json.dump(result, sys.stdout, indent=1)
  print()
  return 0


if __name__ == '__main__':
  sys.exit(main())
