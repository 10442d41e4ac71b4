"""``equivalence_grid_seconds``: wall time of the full pmap equivalence grid;
``equivalence_table_grid_seconds``: of ``equivalence_tests.grid`` (shim and
emitted chain, pmap and sharded, what CI runs).

Full run: ``equivalence_tests.pmap_run.run_device_counts([1, 2, 4, 8])``, i.e.
every case of ``equivalence_tests/cases.py`` on 1, 2, 4 and 8 host CPU devices,
one subprocess per device count, default XLA flags, on this machine; one
measurement (it takes minutes), in seconds. Goal in issue 7: <= 60 s on 2 cores.

``--quick``: one device count (1) and the first 3 cases only, in one subprocess
(the same ``pmap_run.main`` with ``cases.CASES`` cut down), so the number is not
comparable to the full one.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUNTS = (1, 2, 4, 8)


def run(quick: bool) -> list[tuple[str, float, str]]:
  from equivalence_tests import cases, pmap_run
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
  t0 = time.perf_counter()
  result = pmap_run.run_device_counts(list(COUNTS), cwd=str(ROOT))
  seconds = time.perf_counter() - t0
  n_cases = len(cases.CASES)
  ok = all(v['replicas_bitwise'] for per_n in result.values() for v in per_n.values())
  from equivalence_tests import grid
  t0 = time.perf_counter()
  table = grid.run()
  table_seconds = time.perf_counter() - t0
  return [('equivalence_grid_seconds', seconds,
           f'seconds, one run of pmap_run.run_device_counts({list(COUNTS)}): {n_cases} cases x '
           f'{len(COUNTS)} device counts, {os.cpu_count()} cores, default XLA flags; '
           f'all replicas bitwise: {ok}; goal <= 60'),
          ('equivalence_table_grid_seconds', table_seconds,
           f'seconds, one run of equivalence_tests.grid.run(): {len(grid.REPRESENTATIVE)} cases x '
           f'{len(grid.DEVICES)} device counts x {len(grid.MODES)} modes, shim and emitted Optax '
           f'chain (the grid CI runs; {table["_seconds"]:.0f} s inside the subprocess)')]


if __name__ == '__main__':
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
