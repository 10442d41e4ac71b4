"""``equivalence_grid_seconds``: wall time of the project's full equivalence grid.

Full run, on this machine, one measurement each (they take a minute or more),
in seconds, one after the other:

* ``equivalence_table_grid_seconds``: ``equivalence_tests.grid.run(case_ids='all')``,
  every eligible case x 1, 2, 4, 8 devices x {pmap, sharded} x 20 steps, the
  shim and the emitted Optax chain (XLA backend optimisation off, as CI runs it);
* ``equivalence_pmap_grid_seconds``: ``equivalence_tests.pmap_run.run_device_counts([1, 2, 4, 8])``,
  the shim on every case (overrides and ``focus=`` included), default XLA flags;
* ``equivalence_grid_seconds``: their sum. Goal in issue 7: <= 60 s on 2 cores.

Both start one worker process per usable core (``equivalence_tests/workers.py``).
The details give the load average and the CPU seconds the workers used (less
sensitive to other load than the wall time).

``--quick``: one device count (1) and the first 3 cases only, in one subprocess
(the same ``pmap_run.main`` with ``cases.CASES`` cut down), so the number is not
comparable to the full one.
"""
from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUNTS = (1, 2, 4, 8)


def _child_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _load() -> str:
  one, five, _ = os.getloadavg()
  return f'{one:.1f}/{five:.1f}'


def run(quick: bool) -> list[tuple[str, float, str]]:
  from equivalence_tests import cases, grid, pmap_run, workers
  if quick:
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT),
               XLA_FLAGS=(os.environ.get('XLA_FLAGS', '') +
                          ' --xla_force_host_platform_device_count=1').strip())
    code = ('import sys; from equivalence_tests import cases, pmap_run; '
            'cases.CASES = cases.CASES[:3]; sys.exit(pmap_run.main(["1"]))')
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=300)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
      raise RuntimeError(f'quick pmap grid failed ({proc.returncode}): {proc.stderr[-2000:]}')
    return [('equivalence_grid_seconds', seconds,
             f'seconds; --quick: 3 of {len(cases.CASES)} cases on 1 device only, '
             f'not the full grid')]
  n_workers = workers.default_workers()
  load_before = _load()
  t0, c0 = time.perf_counter(), _child_cpu()
  table = grid.run(case_ids='all', timeout=1800)
  table_seconds, table_cpu = time.perf_counter() - t0, _child_cpu() - c0
  load_mid = _load()
  t0, c0 = time.perf_counter(), _child_cpu()
  result = pmap_run.run_device_counts(list(COUNTS), cwd=str(ROOT))
  pmap_seconds, pmap_cpu = time.perf_counter() - t0, _child_cpu() - c0
  load_after = _load()
  n_cases = len(cases.CASES)
  n_table = len([k for k in table if not k.startswith('_')])
  pmap_ok = all(v['replicas_bitwise'] for per_n in result.values() for v in per_n.values())
  table_ok = all(all(r['replicas'].values()) for k, per in table.items() if not k.startswith('_')
                 for r in per.values())
  loads = f'load average (1/5 min) {load_before} at start, {load_mid} between, {load_after} at end'
  return [('equivalence_grid_seconds', table_seconds + pmap_seconds,
           f'seconds, the two grids below one after the other ({table_seconds:.1f} + '
           f'{pmap_seconds:.1f}); {os.cpu_count()} cores, {n_workers} worker processes each, '
           f'{table_cpu + pmap_cpu:.0f} CPU seconds in them; {loads}; goal <= 60'),
          ('equivalence_table_grid_seconds', table_seconds,
           f'seconds, one run of equivalence_tests.grid.run(case_ids="all"): {n_table} cases x '
           f'{len(grid.DEVICES)} device counts x {len(grid.MODES)} modes x {cases.STEPS} steps, '
           f'shim and emitted Optax chain, XLA backend optimisation off; workers '
           f'{", ".join(f"{s:.1f}" for s in table["_worker_seconds"])} s; all replicas bitwise: '
           f'{table_ok}'),
          ('equivalence_pmap_grid_seconds', pmap_seconds,
           f'seconds, one run of pmap_run.run_device_counts({list(COUNTS)}): {n_cases} cases x '
           f'{len(COUNTS)} device counts x {cases.STEPS} steps, the shim, default XLA flags; '
           f'{pmap_cpu:.0f} CPU s; all replicas bitwise: {pmap_ok}')]


if __name__ == '__main__':
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
