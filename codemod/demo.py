"""The main job: migrate the bundled legacy example and prove both train alike.

1. rewrites ``examples/legacy/train_digits.py`` with the codemod and prints the
   diff (and checks ``examples/migrated/train_digits.py`` is that output);
2. trains the legacy program through the shim (``optim-migrate run``) and the
   migrated program, each in a subprocess with N CPU devices for ``pmap``;
3. prints both loss curves and their largest difference.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = 'train_digits.py'


def find_examples(explicit: str | None = None) -> pathlib.Path:
  """The examples directory: ``explicit``, ``./examples`` or the source checkout's.

  Raises:
    FileNotFoundError: none of them holds ``legacy/train_digits.py``.
  """
  candidates = [pathlib.Path(explicit)] if explicit else [
      pathlib.Path.cwd() / 'examples', pathlib.Path(__file__).resolve().parents[1] / 'examples']
  for c in candidates:
    if (c / 'legacy' / SCRIPT).is_file():
      return c
  raise FileNotFoundError(f'no legacy/{SCRIPT} under {[str(c) for c in candidates]}; '
                          'run from the repository root or pass --examples')


def train(cmd: list[str], devices: int, out: pathlib.Path) -> dict:
  env = dict(os.environ)
  env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}'
  env['JAX_PLATFORMS'] = 'cpu'
  proc = subprocess.run([*cmd, '--out', str(out)], env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f'{" ".join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
  return json.loads(out.read_text())


def run_pair(examples: pathlib.Path, steps: int, devices: int) -> tuple[dict, dict]:
  """Train legacy (through the shim) and migrated; return both JSON results."""
  with tempfile.TemporaryDirectory() as tmp:
    legacy = train([sys.executable, '-m', 'codemod.cli', 'run',
                    str(examples / 'legacy' / SCRIPT), '--steps', str(steps)],
                   devices, pathlib.Path(tmp) / 'legacy.json')
    migrated = train([sys.executable, str(examples / 'migrated' / SCRIPT), '--steps', str(steps)],
                     devices, pathlib.Path(tmp) / 'migrated.json')
  return legacy, migrated


def main(steps: int = 200, devices: int = 2, examples: str | None = None) -> int:
  from codemod import engine
  ex = find_examples(examples)
  result = engine.rewrite_file(ex / 'legacy' / SCRIPT)
  if result.error:
    print(result.error, file=sys.stderr)
    return 2
  print('== codemod: examples/legacy -> examples/migrated ==')
  print(result.diff())
  for f in result.findings:
    print(' ', f.format(f'legacy/{SCRIPT}'))
  committed = (ex / 'migrated' / SCRIPT).read_text()
  current = committed == result.new
  print(f'examples/migrated/{SCRIPT} is {"current" if current else "STALE"} codemod output')

  print(f'\n== training both on sklearn digits, {devices} CPU devices, {steps} steps ==')
  legacy, migrated = run_pair(ex, steps, devices)
  diffs = [abs(a - b) for a, b in zip(legacy['losses'], migrated['losses'])]
  print(f'{"step":>5} {"legacy (shim)":>15} {"migrated":>15} {"|diff|":>10}')
  n = len(diffs)
  for i in sorted({0, 1, 2, 4, 9, 19, 49, 99, 149, n - 1} & set(range(n))):
    print(f'{i + 1:>5} {legacy["losses"][i]:>15.8f} {migrated["losses"][i]:>15.8f} {diffs[i]:>10.3g}')
  print(f'\nmax |loss difference| over {n} steps: {max(diffs):.3g} '
        f'({"bitwise equal" if max(diffs) == 0 else "differs"})')
  print(f'test accuracy: legacy {legacy["test_accuracy"]:.4f}, migrated '
        f'{migrated["test_accuracy"]:.4f}; final step {legacy["final_step"]} / '
        f'{migrated["final_step"]}')
  ok = current and len(legacy['losses']) == len(migrated['losses']) == steps and max(diffs) == 0
  return 0 if ok else 1
