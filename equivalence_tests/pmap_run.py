"""Shim trajectories across pmap devices, every recorded case.

    python -m equivalence_tests.pmap_run 1,2,4,8 [--cases ID...]

(started without ``max(counts)`` host devices, e.g. without
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, it runs
:func:`run_device_counts`, which starts worker processes of itself with them).

Prints JSON ``{n: {case_id: {"replicas_bitwise": bool, "max_ulp_vs_single": float,
"worst": [step, leaf], "step": [...]}}}`` for each device count ``n``: the
replicated optimizer's replicas must be bitwise equal to each other and equal
to the single-device run (``pmap`` over one device, the same program, run
once per case) within the bound; the per-device gradients average exactly
(``core.reference_grads``), so any difference is the optimizer's. Each run
is one compiled ``pmap`` of all 20 steps (``core.pmap_steps``); cases without
``focus=`` or per-call overrides run :data:`BATCH` to a program
(``checker.run_batch``; the JSON of all 47 cases on 1, 2, 4 and 8 devices is
identical to one case per program, measured 2026-11-30 with default XLA flags
and, for 7 cases, with the backend optimisation off).
``run_device_counts`` starts the processes for you (one per usable core, the
cases dealt between them).
"""
from __future__ import annotations

import sys

from equivalence_tests import workers as _workers

#: Cases per compiled program (``checker.run_batch``) for those without ``focus=``
#: or per-call overrides; the rest run one program each (``cases.run_case``).
BATCH = 4


def run_device_counts(counts, python=sys.executable, cwd=None, timeout=900,
                      extra_xla_flags: str = '', workers: int | None = None,
                      case_ids=None) -> dict:
  """Run this module for ``counts`` in ``workers`` subprocesses (default: one per
  usable core, see ``workers.default_workers``), each with ``max(counts)`` host
  devices and a share of the cases; ``{n: {case_id: result}}``.

  ``timeout``: seconds per device count (as when each count had its own
  subprocess); the workers together get ``timeout * len(counts)``.

  ``extra_xla_flags`` e.g. ``--xla_backend_optimization_level=0``, which stops
  XLA's backend from contracting multiply-adds differently in the 1-device and
  N-device programs, so the two must then agree bitwise.

  Raises:
    RuntimeError: a subprocess failed (its stderr is in the message).
    ValueError: a device count < 1.
  """
  from equivalence_tests import cases
  counts = [int(n) for n in counts]
  if not counts or min(counts) < 1:
    raise ValueError(f'device counts must be >= 1, got {counts}')
  ids = [c[0] for c in cases.CASES if case_ids is None or c[0] in case_ids]
  shares = _workers.split(ids, workers or _workers.default_workers())
  parts = _workers.run_json('equivalence_tests.pmap_run',
                            [[','.join(map(str, counts)), '--cases', *share] for share in shares],
                            xla_flags=extra_xla_flags, devices=max(counts), python=python,
                            cwd=cwd, timeout=timeout * len(counts))
  out = {n: {} for n in counts}
  for part in parts:
    for n, per_case in part.items():
      out[int(n)].update(per_case)
  return {n: {i: out[n][i] for i in ids} for n in counts}


def main(argv=None) -> int:
  import argparse
  import json
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('counts', help='device counts, e.g. 8 or 1,2,4,8')
  parser.add_argument('--cases', nargs='+', default=None, help='case ids (default: all)')
  parser.add_argument('--batch', type=int, default=BATCH,
                      help=f'cases compiled as one program per device count (default {BATCH})')
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if args.batch < 1:
    parser.error(f'--batch must be >= 1, got {args.batch}')
  counts = [int(n) for n in args.counts.split(',')]
  import warnings

  import jax
  import numpy as np
  import optim_compat as shim
  from equivalence_tests import cases, checker, core, grid
  unknown = sorted(set(args.cases or ()) - set(cases.CASE_BY_ID))
  if unknown:
    print(f'unknown case ids: {", ".join(unknown)}', file=sys.stderr)
    return 2
  if jax.local_device_count() < max(counts):  # started by hand: the workers get the flag
    json.dump(run_device_counts(counts, case_ids=args.cases), sys.stdout)
    return 0
  result = {n: {} for n in counts}
  selected = [c for c in cases.CASES if args.cases is None or c[0] in args.cases]
  # no focus= or per-call overrides, scanned: several cases compiled as one program
  plain = [c[0] for c in selected if 'focus' not in c[2] and 'apply' not in c[2]
           and c[0] not in cases.PER_STEP]
  batched = {}  # (case_id, n) -> (replica 0's trajectory, replicas bitwise, final steps)
  for start in range(0, len(plain), args.batch):
    members = {}
    for case_id in plain[start:start + args.batch]:
      _, def_name, kwargs = cases.CASE_BY_ID[case_id]
      with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        opt_def, _ = cases.build(shim, def_name, kwargs)
      members[case_id] = (opt_def, cases.params_for(case_id),
                          grid.reference_shares(cases.GRADS.get(kwargs.get('grads'))))
    for n in sorted({1, *counts}):
      got = checker.run_batch(members, cases.STEPS, n, 'pmap', cases.SEED)
      for case_id, (traj, replicas, opt) in got.items():
        batched[case_id, n] = (grid.steps_as_golden(traj), replicas,
                               np.asarray(opt.state.step).tolist())
  for case_id, def_name, kwargs in selected:
    if case_id in plain:
      single0 = batched[case_id, 1][0]
    else:
      scan = case_id not in cases.PER_STEP
      single, single_opt = cases.run_case(shim, case_id, n_devices=1, use_pmap=True, scan=scan)
      single0 = {s: {k: v[0] for k, v in leaves.items()} for s, leaves in single.items()}
    for n in counts:
      if case_id in plain:
        replica0, replicas_equal, step = batched[case_id, n]
      else:
        multi, opt = ((single, single_opt) if n == 1 else
                      cases.run_case(shim, case_id, n_devices=n, use_pmap=True, scan=scan))
        replicas_equal = core.replicas_bitwise(multi)
        replica0 = {s: {k: v[0] for k, v in leaves.items()} for s, leaves in multi.items()}
        step = np.asarray(opt.state.step).tolist()
      worst, where = core.compare(replica0, single0, cases.DTYPES.get(case_id))
      result[n][case_id] = {'replicas_bitwise': replicas_equal, 'max_ulp_vs_single': worst,
                            'worst': list(where) if where else None, 'step': step}
  json.dump(result, sys.stdout)
  return 0


if __name__ == '__main__':
  sys.exit(main())
