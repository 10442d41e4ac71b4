"""The grids' one-program-per-run scan, and several cases' runs compiled as one program
(``checker.run_batch``), give the per-step programs' numbers bitwise."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from equivalence_tests import workers

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Run with 2 host devices: every case's shim and emitted chain, as one scan and as
# one jitted call per step (the grads callable then sees each step's params), in
# single, pmap and sharded mode. adam_bf16: the gradient shares are bfloat16, as
# the params (core.reference_grads), so the params stay bfloat16 in every mode.
SCRIPT = r'''
import json, sys, warnings
import numpy as np
import optim_compat as shim
from equivalence_tests import cases, checker, core, grid

def equal(a, b):
  return sorted(a) == sorted(b) == list(range(1, 7)) and all(
      a[s].keys() == b[s].keys() and all(
          a[s][k].dtype == b[s][k].dtype and np.array_equal(a[s][k], b[s][k], equal_nan=True)
          for k in a[s]) for s in a)

out, per_step, members = {}, {}, {}
for case_id in sys.argv[1:]:
  case = cases.CASE_BY_ID[case_id]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    opt_def, _ = cases.build(shim, case[1], case[2])
  tx = grid.emitted_tx(case) if grid.converted(case) else None
  corrupt = cases.GRADS.get(case[2].get('grads'))
  def fn(step, params, device=None, n_devices=1, corrupt=corrupt):
    g = core.reference_grads(params, step, cases.SEED, device, n_devices)
    return corrupt(step, g) if corrupt else g
  for mode, n in (('single', 1), ('pmap', 2), ('sharded', 2)):
    runs = [checker.run_pair(opt_def, tx, cases.params_for(case_id),
                             checker.PerDeviceGrads(fn, params_free=free), 6, n, mode,
                             scan=True)
            for free in (True, False)]  # steps: 6 (the nonfinite step is 5)
    same = {who: equal(runs[0][who], runs[1][who]) for who in ('legacy', 'tx') if who in runs[0]}
    out[f'{case_id} {mode}/{n}'] = {'same': same, 'replicas': runs[0]['replicas']}
    per_step[(case_id, mode)] = runs[1]
  grads = checker.PerDeviceGrads(fn, params_free=True)
  members[f'{case_id}/legacy'] = (opt_def, cases.params_for(case_id), grads)
  if tx is not None:
    members[f'{case_id}/tx'] = (tx, cases.params_for(case_id), grads)
# all cases as one program per mode (the grid's checker.run_batch)
for mode, n in (('single', 1), ('pmap', 2), ('sharded', 2)):
  got = checker.run_batch(members, 6, n, mode)
  for key, (traj, replicas, _) in got.items():
    case_id, who = key.split('/')
    r = out[f'{case_id} {mode}/{n}']
    r.setdefault('batch_same', {})[who] = equal(traj, per_step[(case_id, mode)][who])
    r.setdefault('batch_replicas', {})[who] = replicas
json.dump(out, sys.stdout)
'''


def test_scan_equals_per_step_programs_bitwise():
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT),
             XLA_FLAGS='--xla_force_host_platform_device_count=2 '
                       '--xla_backend_optimization_level=0')
  ids = ['adam_bf16', 'lamb_wd', 'adafactor_momentum', 'weightnorm_adam', 'adam_nonfinite']
  proc = subprocess.run([sys.executable, '-c', SCRIPT, *ids], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout)
  assert len(result) == 3 * len(ids)
  for key, r in result.items():
    for same in ('same', 'batch_same'):  # scan, and all cases in one scan: per-step numbers
      assert r[same].get('legacy') is True, (key, same)
      if not key.startswith('weightnorm'):  # WeightNorm has no emitted chain
        assert r[same].get('tx') is True, (key, same)
    assert all(r['replicas'].values()) and all(r['batch_replicas'].values()), key


def test_workers_split_and_setting(monkeypatch):
  assert workers.split(list('abcde'), 2) == [['a', 'c', 'e'], ['b', 'd']]
  assert workers.split(['a'], 4) == [['a']]
  monkeypatch.setenv(workers.WORKERS_ENV, '3')
  assert workers.default_workers() == 3
  for bad in ('0', 'two'):
    monkeypatch.setenv(workers.WORKERS_ENV, bad)
    with pytest.raises(ValueError, match=workers.WORKERS_ENV):
      workers.default_workers()


def test_pmap_run_rejects_unknown_case_ids():
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, '-m', 'equivalence_tests.pmap_run', '1', '--cases',
                         'no_such_case'], capture_output=True, text=True, env=env, cwd=ROOT,
                        timeout=300)
  assert proc.returncode == 2
  assert 'unknown case ids: no_such_case' in proc.stderr
