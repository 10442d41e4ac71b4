"""Run every benchmark: ``python bench/run.py [--quick] [--out PATH] [--only NAME ...] [--jobs N]``.

Discovers ``bench/bench_*.py``; each module exposes ``run(quick: bool) ->
list[tuple[str, float, str]]`` (metric name, value, details). Each module runs
in its own subprocess (a crash or a hung import cannot hide the others), and
the lines are printed as ``name: value (details)``. Afterwards a Markdown table
(machine, versions, date, each metric) is written to ``bench/results.md``, or
``bench/results-quick.md`` with ``--quick``, or ``--out``.

Exit status: 0 if every module ran, 1 if any failed (its error is printed and
recorded in the table; the other modules still run).

Values are what each module reports: ratios are medians of per-round ratios
of interleaved contenders, times are seconds; min–max are in the details.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
_RESULT_TAG = 'BENCH-RESULT-JSON:'


def discover(only=None) -> list[pathlib.Path]:
  """``bench/bench_*.py`` sorted by name, optionally filtered by module names."""
  mods = sorted(BENCH_DIR.glob('bench_*.py'))
  if only:
    mods = [m for m in mods if m.stem in only or m.stem.removeprefix('bench_') in only]
  return mods


def _load(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location(f'bench.{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def _child(path: str, quick: bool) -> int:
  """In the subprocess: run one module, print its metrics as one tagged JSON line."""
  for p in (str(ROOT), str(BENCH_DIR)):
    if p not in sys.path:
      sys.path.insert(0, p)
  metrics = _load(pathlib.Path(path)).run(quick)
  rows = [[str(n), float(v), str(d)] for n, v, d in metrics]
  sys.stdout.flush()
  print(_RESULT_TAG + json.dumps(rows), flush=True)
  return 0


def run_module(path: pathlib.Path, quick: bool, timeout: float) -> tuple[list, str | None, float]:
  """``(metrics, error or None, seconds)`` for one module, run in a subprocess."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (str(ROOT), env.get('PYTHONPATH')) if p)
  env.setdefault('JAX_PLATFORMS', 'cpu')
  cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), '--child', str(path)]
  if quick:
    cmd.append('--quick')
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT),
                          timeout=timeout)
  except subprocess.TimeoutExpired:
    return [], f'timed out after {timeout:.0f} s', time.perf_counter() - t0
  seconds = time.perf_counter() - t0
  tagged = [l for l in proc.stdout.splitlines() if l.startswith(_RESULT_TAG)]
  if proc.returncode != 0 or not tagged:
    return [], (f'exit status {proc.returncode}\n{proc.stderr[-3000:]}'
                f'{proc.stdout[-1000:]}').rstrip(), seconds
  metrics = [tuple(r) for r in json.loads(tagged[-1][len(_RESULT_TAG):])]
  bad = [n for n, v, _ in metrics if not (isinstance(v, float) and math.isfinite(v))]
  if bad:
    return metrics, f'non-finite value(s) for {bad}', seconds
  return metrics, None, seconds


def fmt_value(v: float) -> str:
  return f'{v:.4g}'


def machine_info() -> dict[str, str]:
  """Machine, Python and library versions (of this interpreter's stack)."""
  cpu = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        cpu = line.split(':', 1)[1].strip()
        break
  except OSError:
    pass
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  from importlib import metadata
  versions = []
  for dist in ('jax', 'jaxlib', 'flax', 'optax', 'libcst', 'numpy'):
    try:
      versions.append(f'{dist} {metadata.version(dist)}')
    except metadata.PackageNotFoundError:
      versions.append(f'{dist} (not installed)')
  return {'machine': f'{cpu}, {cores} usable cores, {platform.system()} {platform.release()}',
          'python': platform.python_version(),
          'versions': ', '.join(versions)}


def _loadavg() -> str:
  try:
    return ' / '.join(f'{x:.1f}' for x in os.getloadavg())
  except OSError:
    return 'n/a'


def write_results(out: pathlib.Path, quick: bool, results: list, total_s: float,
                  load_start: str = 'n/a') -> None:
  """The Markdown table of all metrics (value = median, min–max in the details)."""
  info = machine_info()
  now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
  lines = [f'# Benchmark results{" (--quick: reduced sizes, not for quoting)" if quick else ""}',
           '',
           f'- command: `python bench/run.py{" --quick" if quick else ""}` ({total_s:.0f} s in all)',
           f'- date: {now}',
           f'- machine: {info["machine"]}',
           f'- Python {info["python"]}; {info["versions"]}',
           f'- load average (1/5/15 min) at start {load_start}, at end {_loadavg()} '
           '(other processes on the machine add noise; ratios of interleaved runs share it)',
           '- per-module wall time: ' + ', '.join(f'{m} {s:.0f} s' for m, _, _, s in results),
           '',
           'Ratios are contender / reference, median of per-round ratios of interleaved runs in '
           'one process (below 1 means faster); seconds are wall clock.',
           '',
           '| module | metric | value (median) | details (min–max, sizes, notes) |',
           '|---|---|---|---|']
  for module, metrics, error, _ in results:
    for name, value, details in metrics:
      lines.append(f'| {module} | `{name}` | {fmt_value(value)} | {details.replace("|", "/")} |')
    if error:
      first = error.strip().splitlines()[-1] if error.strip() else 'failed'
      lines.append(f'| {module} | (failed) | – | {first.replace("|", "/")} |')
  out.write_text('\n'.join(lines) + '\n')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='reduced sizes (seconds): a smoke run')
  parser.add_argument('--out', help='results file (default bench/results.md, or results-quick.md)')
  parser.add_argument('--only', nargs='*', help='module names to run (e.g. shim_step)')
  parser.add_argument('--timeout', type=float, default=None,
                      help='per-module limit in seconds (default 120 quick, 1800 full)')
  parser.add_argument('--jobs', type=int, default=1,
                      help='modules run at once (default 1; more only for smoke runs: '
                           'concurrent modules disturb each other\'s timings)')
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.child, args.quick)
  timeout = args.timeout or (120 if args.quick else 1800)
  results = []
  failed = False
  t_all = time.perf_counter()
  load_start = _loadavg()
  paths = discover(args.only)
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
    futures = [pool.submit(run_module, path, args.quick, timeout) for path in paths]
    for path, future in zip(paths, futures):  # printed in discovery order
      metrics, error, seconds = future.result()
      for name, value, details in metrics:
        print(f'{name}: {fmt_value(value)} ({details})', flush=True)
      print(f'[{path.name}: {len(metrics)} metric(s) in {seconds:.1f} s]', file=sys.stderr, flush=True)
      if error:
        failed = True
        print(f'{path.name} FAILED after {seconds:.1f} s: {error}', file=sys.stderr, flush=True)
      results.append((path.stem, metrics, error, seconds))
  out = pathlib.Path(args.out) if args.out else BENCH_DIR / (
      'results-quick.md' if args.quick else 'results.md')
  write_results(out, args.quick, results, time.perf_counter() - t_all, load_start)
  print(f'wrote {out}', file=sys.stderr)
  return 1 if failed else 0


if __name__ == '__main__':
  try:
    sys.exit(main())
  except Exception:  # noqa: BLE001 - report, then fail
    traceback.print_exc()
    sys.exit(1)
