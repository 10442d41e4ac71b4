"""The project's own equivalence grid: every recorded case x devices x {pmap, sharded}.

    python -m equivalence_tests.grid [--devices 1,2,4,8] [--modes pmap,sharded] [--cases ID... | all]

(started without ``max(devices)`` host devices it runs :func:`run`, which
starts worker processes of itself with ``XLA_FLAGS="--xla_backend_optimization_level=0
--xla_force_host_platform_device_count=8"``).

For each case of ``cases.py`` without ``focus=`` or per-call overrides (those
run in the shim's pmap grid, ``pmap_run``) and each ``(mode, n)``, the shim
runs 20 steps through :func:`equivalence_tests.checker.run_pair`; for table
defs the emitted Optax chain runs beside it. Prints one JSON object::

    {case_id: {"<mode>/<n>": {"shim_vs_golden": ulp, "shim_vs_fewest_devices": ulp,
                              "tx_vs_shim": ulp or null,
                              "replicas": {"legacy": bool, "tx": bool}}}, "_seconds": s}

``shim_vs_golden`` compares the recorded steps with the golden file of real
flax.optim (recorded with XLA's default optimisation; measured <= 6 ulp from
it in float32, bitwise for Adam in bfloat16). The gradient shares average
exactly, in the params' dtype (``core.reference_grads``), so with XLA's backend optimisation
off (it contracts multiply-adds differently per program) every device count
must give the numbers of the smallest one (``shim_vs_fewest_devices``).

For each ``(mode, n)``, :data:`BATCH` cases (shim and emitted chain each) are
one compiled program for all 20 steps (``checker.run_batch``: one ``lax.scan``;
the gradient shares are drawn up front, once per case for both optimizers and
all modes), which gives the per-step programs' numbers bitwise (``cases.PER_STEP``
says where that was checked; the Adadelta cases run one call per step). Batched
and one case per program, the whole grid's JSON is identical (42 cases,
2026-11-30). :func:`run` starts the subprocesses for you, one per usable core,
the cases dealt between them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

DEVICES = (1, 2, 4, 8)
#: The cases CI runs (one per emitted Optax form and per kind of def; ``--cases all``
#: runs every eligible case).
REPRESENTATIVE = ('sgd_default', 'momentum_wd_nesterov', 'adam_wd', 'adam_bf16', 'adabelief_wd',
                  'adadelta_wd', 'adagrad_eps', 'rmsprop_centered', 'lamb_wd', 'lars_nesterov',
                  'lars_wd', 'adafactor_momentum', 'multi_lars_lamb', 'weightnorm_adam',
                  'user_global_clip_sgd')
MODES = ('pmap', 'sharded')
#: Cases per compiled program (``checker.run_batch``); XLA's compile time grows
#: faster than linearly with a program's size, so not all at once (see ``--batch``).
BATCH = 4
NO_BACKEND_OPT = '--xla_backend_optimization_level=0'


def converted(case) -> bool:
  """Cases with an emitted Optax form (what the codemod rewrites): a table def, or
  WeightNorm around one (``optim_compat.transforms.weight_norm``)."""
  from optim_compat import spec
  _, def_name, kwargs = case
  if def_name == 'WeightNorm':
    return kwargs['inner'][0] in spec.SPECS
  return (def_name in spec.SPECS and 'focus' not in kwargs
          and kwargs.get('apply') in (None, 'lr_decay'))


def emitted_source(case) -> str:
  """The Optax source the codemod emits for a converted case (lr injected with a schedule)."""
  from optim_compat import spec
  case_id, def_name, kwargs = case
  if def_name == 'WeightNorm':
    inner_name, inner_kwargs = kwargs['inner']
    return spec.weight_norm_emit(emitted_source((case_id, inner_name, inner_kwargs)),
                                 [f'{k}={v!r}' for k, v in kwargs.items() if k != 'inner'])
  args = {k: repr(v) for k, v in kwargs.items() if k not in ('apply', 'grads')}
  return spec.SPECS[def_name].emit(args, learning_rate_injected='apply' in kwargs)


def emitted_tx(case):
  """The Optax transformation the codemod emits for a converted case."""
  from optim_compat import emitted
  return emitted.tx_from_source(emitted_source(case))


def eligible(case) -> bool:
  """Cases the grid runs: no ``focus=`` and no per-call overrides (those run in
  the shim's pmap grid, ``pmap_run``)."""
  _, _, kwargs = case
  return 'focus' not in kwargs and 'apply' not in kwargs


def run(devices=DEVICES, modes=MODES, case_ids=None, timeout=1800, workers=None,
        batch: int = BATCH) -> dict:
  """Run the grid in ``workers`` subprocesses (default: one per usable core, see
  ``workers.default_workers``) with ``max(devices)`` CPU devices each, the cases
  dealt between them; the merged JSON (``_seconds``: wall time of them all).

  ``case_ids``: ids to run (default :data:`REPRESENTATIVE`; ``'all'``: every
  eligible case). ``batch``: cases compiled as one program per mode and device
  count (:data:`BATCH`).

  Raises:
    RuntimeError: a subprocess failed (its stderr is in the message).
  """
  from equivalence_tests import cases
  from equivalence_tests import workers as _workers
  if case_ids is None:
    case_ids = REPRESENTATIVE
  ids = [c[0] for c in cases.CASES if eligible(c) and (case_ids == 'all' or c[0] in case_ids)]
  args = ['--devices', ','.join(map(str, devices)), '--modes', ','.join(modes),
          '--batch', str(batch), '--cases']
  start = time.perf_counter()
  parts = _workers.run_json('equivalence_tests.grid',
                            [args + share for share in
                             _workers.split(ids, workers or _workers.default_workers())],
                            xla_flags=NO_BACKEND_OPT, devices=max(devices), timeout=timeout)
  seconds = time.perf_counter() - start
  merged = {k: v for part in parts for k, v in part.items() if not k.startswith('_')}
  out = {i: merged[i] for i in ids if i in merged}
  out['_seconds'] = seconds
  out['_worker_seconds'] = [part['_seconds'] for part in parts]
  return out


def steps_as_golden(traj: dict) -> dict:
  """checker paths (``['a']['b']``) -> golden paths (``a/b``)."""
  return {step: {path.replace("']['", '/').strip("[]'"): v for path, v in leaves.items()}
          for step, leaves in traj.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--devices', default=','.join(map(str, DEVICES)))
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--cases', nargs='+', default=list(REPRESENTATIVE),
                      help='case ids, or "all" (default: REPRESENTATIVE)')
  parser.add_argument('--batch', type=int, default=BATCH,
                      help=f'cases compiled as one program per mode and device count '
                           f'(default {BATCH})')
  args = parser.parse_args(argv)
  if args.batch < 1:
    parser.error(f'--batch must be >= 1, got {args.batch}')
  if args.cases == ['all']:
    args.cases = None
  import warnings

  import optim_compat as shim
  from equivalence_tests import cases, checker, core, record_golden
  devices = [int(n) for n in args.devices.split(',')]
  modes = args.modes.split(',')
  import jax
  if jax.local_device_count() < max(devices):  # started by hand: the workers get the flags
    json.dump(run(devices, modes, args.cases or 'all', batch=args.batch), sys.stdout)
    return 0
  start = time.perf_counter()
  out: dict = {}
  prepared = {}
  for case in cases.CASES:
    case_id, def_name, kwargs = case
    if (args.cases and case_id not in args.cases) or not eligible(case):
      continue  # focus= and per-call overrides run in the shim's pmap grid (tests/test_pmap.py)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      opt_def, _ = cases.build(shim, def_name, kwargs)
    prepared[case_id] = (opt_def, emitted_tx(case) if converted(case) else None,
                         reference_shares(cases.GRADS.get(kwargs.get('grads'))))
  scanned = [i for i in prepared if i not in cases.PER_STEP]
  batches = [scanned[i:i + args.batch] for i in range(0, len(scanned), args.batch)]
  for mode in modes:
    single: dict = {}
    for n in sorted(devices):
      runs = {}
      for batch in batches:
        members = {}
        for case_id in batch:
          opt_def, tx, grads = prepared[case_id]
          members[f'{case_id}/legacy'] = (opt_def, cases.params_for(case_id), grads)
          if tx is not None:
            members[f'{case_id}/tx'] = (tx, cases.params_for(case_id), grads)
        got = checker.run_batch(members, cases.STEPS, n, mode, cases.SEED)
        for case_id in batch:
          runs[case_id] = {who: got[f'{case_id}/{who}'][0] for who in ('legacy', 'tx')
                           if f'{case_id}/{who}' in got}
          runs[case_id]['replicas'] = {who: got[f'{case_id}/{who}'][1]
                                       for who in ('legacy', 'tx') if f'{case_id}/{who}' in got}
      for case_id in prepared:
        if case_id in cases.PER_STEP:  # one compiled call per step (see cases.PER_STEP)
          opt_def, tx, grads = prepared[case_id]
          runs[case_id] = checker.run_pair(opt_def, tx, cases.params_for(case_id), grads,
                                           cases.STEPS, n, mode, cases.SEED, scan=False)
      for case_id in prepared:
        r = runs[case_id]
        golden, _ = record_golden.load(case_id)
        dtype = cases.DTYPES.get(case_id)
        shim_traj = steps_as_golden(r['legacy'])
        single.setdefault(case_id, shim_traj)
        vs_golden, _ = core.compare({s: shim_traj[s] for s in golden}, golden, dtype)
        vs_single, _ = core.compare(shim_traj, single[case_id], dtype)
        vs_shim = None
        if 'tx' in r:
          vs_shim, _ = core.compare(steps_as_golden(r['tx']), shim_traj, dtype)
        out.setdefault(case_id, {})[f'{mode}/{n}'] = {
            'shim_vs_golden': vs_golden, 'shim_vs_fewest_devices': vs_single,
            'tx_vs_shim': vs_shim, 'replicas': r['replicas']}
  out['_seconds'] = time.perf_counter() - start
  json.dump(out, sys.stdout)
  return 0


def reference_shares(corrupt):
  """Reference gradient shares (as ``checker``'s random grads), optionally corrupted by
  ``corrupt(step, grads)``: a ``PerDeviceGrads(params_free=True)`` that draws each
  ``(step, device, device count, shapes and dtypes)`` once (the shim and the Optax
  chain of a case, and every mode, get the same arrays)."""
  import jax
  import numpy as np

  from equivalence_tests import cases, checker, core

  drawn = {}  # the shim and the Optax chain of a case get the same arrays, drawn once

  def fn(step, params, device=None, n_devices=1):
    leaves, tree = jax.tree_util.tree_flatten(params)
    key = (step, device, n_devices, tree,
           tuple((np.shape(x), str(np.asarray(x).dtype)) for x in leaves))
    if key not in drawn:
      g = core.reference_grads(params, step, cases.SEED, device, n_devices)
      drawn[key] = corrupt(step, g) if corrupt else g
    return drawn[key]
  return checker.PerDeviceGrads(fn, params_free=True)


if __name__ == '__main__':
  sys.exit(main())
