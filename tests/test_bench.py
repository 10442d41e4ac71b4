"""Smoke run of ``bench/run.py --quick``: it runs and prints well-formed metrics.

Benchmarks never assert timings; this only checks the harness and the format.
"""
import math
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINE = re.compile(r'^(?P<name>[\w\[\]/.\-]+): (?P<value>\S+) \((?P<details>.*)\)$')
EXPECTED = ('shim_vs_optax_step[', 'shim_vs_legacy_step[', 'codemod_vs_libcst_noop',
            'codemod_parse_floor_vs_libcst_noop', 'codemod_large_file_time_growth',
            'codemod_large_file_s[',
            'equivalence_grid_seconds', 'faithful_vs_optax_step[lamb]',
            'faithful_vs_optax_step[adafactor_momentum]', 'faithful_vs_optax_compile',
            'check_1m_adam_devices_1248_seconds', 'check_1m_adam_floor_seconds',
            'check_1m_adam_vs_floor')


def test_quick_run_prints_finite_positive_metrics(tmp_path):
  out = tmp_path / 'results.md'
  proc = subprocess.run([sys.executable, str(ROOT / 'bench' / 'run.py'), '--quick', '--jobs', '2',
                         '--out', str(out)],
                        capture_output=True, text=True, cwd=str(ROOT), timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = [l for l in proc.stdout.splitlines() if l.strip()]
  assert lines
  names = []
  for line in lines:
    m = LINE.match(line)
    assert m, f'malformed metric line: {line!r}'
    value = float(m['value'])
    assert math.isfinite(value) and value > 0, line
    names.append(m['name'])
    if m['name'].startswith(('shim_vs_optax_step[', 'faithful_vs_optax_step[')):
      # the step ratios come with both compiled programs' HLO instruction counts
      assert re.search(r'HLO ops \w+ \d+ \(\d+ in ENTRY\) / stock \d+', m['details']), line
    if m['name'].startswith('check_1m_adam'):
      # the check's rows say the CPU seconds and the load beside the wall seconds
      assert re.search(r'CPU s? ?\d', m['details']) and 'load average' in m['details'], line
    if m['name'] == 'check_1m_adam_devices_1248_seconds':
      for part in ('startup', 'draws', 'legacy: first steps', 'tx: first steps', 'XLA compile'):
        assert part in m['details'], (part, line)
  for prefix in EXPECTED:
    assert any(n.startswith(prefix) for n in names), (prefix, names)
  table = out.read_text()
  assert '| module | metric |' in table and 'machine:' in table
  assert all(f'`{n}`' in table for n in names)


def test_timed_subprocess_with_a_long_report_does_not_hang():
  """Found by running bench/run.py: `rewrite --check` on the ecosystem tree wrote more than a
  pipe's 64 KiB to stderr, and the timer waited on the child before reading it: both hung."""
  sys.path.insert(0, str(ROOT / 'bench'))
  try:
    import bench_codemod
  finally:
    sys.path.remove(str(ROOT / 'bench'))
  cmd = [sys.executable, '-c', 'import sys; sys.stderr.write("x" * 300000); sys.exit(1)']
  seconds, cpu, rss, status = bench_codemod._run_usage(cmd, ROOT)
  assert status == 1 and seconds > 0 and cpu >= 0 and rss > 0
