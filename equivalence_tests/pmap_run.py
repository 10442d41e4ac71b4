"""Shim trajectories across pmap devices (one process per device count).

    XLA_FLAGS=--xla_force_host_platform_device_count=N \\
        python -m equivalence_tests.pmap_run N

Prints JSON ``{case_id: {"replicas_bitwise": bool, "max_ulp_vs_single": float,
"worst": [step, leaf], "step": [...]}}``: the replicated optimizer's replicas must
be bitwise equal to each other and equal to the single-device run (``pmap``
over one device, the same program) within the bound; the per-device gradients
average exactly (``core.reference_grads``), so any difference is the optimizer's. ``run_device_counts`` starts those processes for you.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def run_device_counts(counts, python=sys.executable, cwd=None, timeout=900,
                      extra_xla_flags: str = '') -> dict:
  """Run this module once per device count in a subprocess; ``{n: result}``.

  ``extra_xla_flags`` e.g. ``--xla_backend_optimization_level=0``, which stops
  XLA's backend from contracting multiply-adds differently in the 1-device and
  N-device programs, so the two must then agree bitwise.

  Raises:
    RuntimeError: a subprocess failed (its stderr is in the message).
  """
  out = {}
  for n in counts:
    env = dict(os.environ)
    env['XLA_FLAGS'] = (f'{env.get("XLA_FLAGS", "")} {extra_xla_flags} '
                        f'--xla_force_host_platform_device_count={n}').strip()
    env['JAX_PLATFORMS'] = 'cpu'
    for _attempt in range(2):
      proc = subprocess.run([str(python), '-m', 'equivalence_tests.pmap_run', str(n)],
                            capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
      # a process killed by a signal (seen once, 8 host devices on 2 cores, empty
      # stderr) produced no result at all: run it once more; any other failure is final
      if proc.returncode >= 0:
        break
    if proc.returncode != 0:
      raise RuntimeError(f'pmap_run {n} failed with exit status {proc.returncode}:\n'
                         f'{proc.stderr[-4000:]}{proc.stdout[-1000:]}')
    out[n] = json.loads(proc.stdout)
  return out


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  n = int(argv[0])
  import jax
  import numpy as np
  import optim_compat as shim
  from equivalence_tests import cases, core
  if jax.local_device_count() < n:
    print(f'only {jax.local_device_count()} devices', file=sys.stderr)
    return 2
  result = {}
  for case_id, def_name, kwargs in cases.CASES:
    single, _ = cases.run_case(shim, case_id, n_devices=1, use_pmap=True)
    multi, opt = cases.run_case(shim, case_id, n_devices=n, use_pmap=True)
    replicas_equal = all(np.array_equal(v[d], v[0], equal_nan=True)
                         for leaves in multi.values() for v in leaves.values()
                         for d in range(n))
    replica0 = {s: {k: v[0] for k, v in leaves.items()} for s, leaves in multi.items()}
    single0 = {s: {k: v[0] for k, v in leaves.items()} for s, leaves in single.items()}
    worst, where = core.compare(replica0, single0, cases.DTYPES.get(case_id))
    result[case_id] = {'replicas_bitwise': replicas_equal, 'max_ulp_vs_single': worst,
                       'worst': list(where) if where else None,
                       'step': np.asarray(opt.state.step).tolist()}
  json.dump(result, sys.stdout)
  return 0


if __name__ == '__main__':
  sys.exit(main())
