"""Run a module's JSON-printing ``main`` in parallel subprocesses, one share of the cases each.

The grids are compile-bound (one XLA compile per case, device count, mode and
optimizer, single-threaded): with one worker process per usable core they
share the machine's cores. Used by ``grid.run`` and ``pmap_run.run_device_counts``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

#: e.g. ``OPTIM_MIGRATE_GRID_WORKERS=1`` to run a grid in one process.
WORKERS_ENV = 'OPTIM_MIGRATE_GRID_WORKERS'


def default_workers() -> int:
  """``$OPTIM_MIGRATE_GRID_WORKERS``, else the number of cores this process may use.

  Raises:
    ValueError: the variable is set but is not an integer >= 1.
  """
  value = os.environ.get(WORKERS_ENV)
  if value is None:
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
  try:
    workers = int(value)
  except ValueError:
    workers = 0
  if workers < 1:
    raise ValueError(f'{WORKERS_ENV} must be an integer >= 1, got {value!r}')
  return workers


def split(items, workers: int) -> list[list]:
  """``items`` dealt round-robin into at most ``workers`` non-empty shares (order kept per share)."""
  shares = [list(items[i::workers]) for i in range(max(1, workers))]
  return [s for s in shares if s]


def run_json(module: str, args_per_worker: list[list[str]], *, xla_flags: str, devices: int,
             python=sys.executable, cwd=None, timeout: float = 1800) -> list:
  """Start ``python -m module *args`` once per entry, all at once; their parsed stdout JSON.

  Each subprocess gets ``XLA_FLAGS`` = the caller's plus ``xla_flags`` plus
  ``--xla_force_host_platform_device_count=devices``, and ``JAX_PLATFORMS=cpu``.
  A subprocess killed by a signal (seen once: 8 host devices on 2 cores,
  empty stderr) is run once more; any other failure is final.

  Raises:
    RuntimeError: a subprocess failed or timed out (its stderr is in the message).
  """
  env = dict(os.environ)
  flags = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                   if not f.startswith('--xla_force_host_platform_device_count'))
  env['XLA_FLAGS'] = (f'{flags} {xla_flags} '
                      f'--xla_force_host_platform_device_count={devices}').strip()
  env['JAX_PLATFORMS'] = 'cpu'

  def start(args):
    return subprocess.Popen([str(python), '-m', module, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
  deadline = time.monotonic() + timeout
  procs = [start(args) for args in args_per_worker]
  results = []
  try:
    for i, args in enumerate(args_per_worker):
      for attempt in range(2):
        try:
          out, err = procs[i].communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          raise RuntimeError(f'{module} {" ".join(args)} timed out after {timeout} s') from None
        if procs[i].returncode >= 0 or attempt:
          break
        procs[i] = start(args)
      if procs[i].returncode != 0:
        raise RuntimeError(f'{module} {" ".join(args)} failed with exit status '
                           f'{procs[i].returncode}:\n{err[-4000:]}{out[-1000:]}')
      results.append(json.loads(out))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return results
