"""The main job: migrate the bundled legacy example and prove both train alike.

1. rewrites ``examples/legacy/train_digits.py`` with the codemod and prints the
   diff (and checks ``examples/migrated/train_digits.py`` is that output); the examples
   are ``--examples DIR``, else ``./examples``, else the installed package
   ``optim_migrate_examples`` (the repository's ``examples/``, shipped in the wheel);
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


class DemoError(Exception):
  """A bad ``--examples`` or ``--devices``, a missing dependency, or a failed training run
  (the message says which; ``optim-migrate demo`` prints it and exits 2)."""


def packaged_examples() -> pathlib.Path | None:
  """The examples installed with this package (``optim_migrate_examples``: the repository's
  ``examples/`` in a checkout, package data in a wheel), or None when absent."""
  try:
    import optim_migrate_examples
  except ImportError:
    return None
  return pathlib.Path(optim_migrate_examples.__file__).resolve().parent


def find_examples(explicit: str | None = None) -> pathlib.Path:
  """The examples directory: ``explicit``, else ``./examples`` or the installed ones.

  Raises:
    DemoError: ``explicit`` (or, without it, none of the candidates) holds no
      ``legacy/train_digits.py`` and ``migrated/train_digits.py``.
  """
  if explicit:
    c = pathlib.Path(explicit)
    missing = [f'{d}/{SCRIPT}' for d in ('legacy', 'migrated') if not (c / d / SCRIPT).is_file()]
    if missing:
      why = 'does not exist' if not c.exists() else (
          'is not a directory' if not c.is_dir() else f'has no {" and no ".join(missing)}')
      raise DemoError(f'--examples {explicit}: {why}; it must hold legacy/{SCRIPT} and '
                      f'migrated/{SCRIPT}')
    return c
  candidates = [pathlib.Path.cwd() / 'examples', packaged_examples()]
  candidates = [c for c in candidates if c is not None]
  for c in candidates:
    if (c / 'legacy' / SCRIPT).is_file() and (c / 'migrated' / SCRIPT).is_file():
      return c
  raise DemoError(f'no legacy/{SCRIPT} and migrated/{SCRIPT} under '
                  f'{" or ".join(map(str, candidates))}; pass --examples DIR')


def global_batch(script: pathlib.Path) -> int | None:
  """The ``GLOBAL_BATCH = N`` constant of the example ``script`` (what ``--devices`` must
  divide), or None when it has no such integer constant."""
  import ast
  try:
    tree = ast.parse(script.read_text(encoding='utf-8'))
  except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
    return None
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name) and node.targets[0].id == 'GLOBAL_BATCH'
        and isinstance(node.value, ast.Constant) and type(node.value.value) is int):
      return node.value.value
  return None


def check_devices(examples: pathlib.Path, devices: int) -> None:
  """Raises DemoError unless ``devices`` (>= 1) divides the example's global batch (each
  device gets an equal share)."""
  batch = global_batch(examples / 'legacy' / SCRIPT)
  if batch is not None and (devices < 1 or batch % devices):
    ok = [d for d in range(1, batch + 1) if batch % d == 0]
    raise DemoError(f'--devices {devices}: the example splits its batch of {batch} equally '
                    f'over the devices; use one of {", ".join(map(str, ok))}')


def train(cmd: list[str], devices: int, out: pathlib.Path) -> dict:
  env = dict(os.environ)
  env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={devices}'
  env['JAX_PLATFORMS'] = 'cpu'
  proc = subprocess.run([*cmd, '--out', str(out)], env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    raise DemoError(f'{" ".join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
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
  """Run the demo (module docstring); prints as it goes. Returns the exit status: 0 the
  committed migrated example is current and both train to bitwise-equal losses, 1 not,
  2 a :class:`DemoError` (printed as one ``demo: ...`` message, no traceback)."""
  try:
    return _main(steps, devices, examples)
  except DemoError as e:
    print(f'demo: {e}', file=sys.stderr)
    return 2


def _main(steps: int, devices: int, examples: str | None) -> int:
  from codemod import engine
  ex = find_examples(examples)
  check_devices(ex, devices)
  import importlib.util
  if importlib.util.find_spec('sklearn') is None:
    raise DemoError("the example trains on scikit-learn's digits, and scikit-learn is not "
                    "installed: pip install 'flax-optim-migrate[examples]'")
  legacy_path, migrated_path = ex / 'legacy' / SCRIPT, ex / 'migrated' / SCRIPT
  result = engine.rewrite_file(legacy_path)
  if result.error:
    raise DemoError(result.error)
  print(f'== codemod: {legacy_path} -> {migrated_path} ==')
  print(result.diff())
  for f in result.findings:
    print(' ', f.format(str(legacy_path)))
  try:
    committed = migrated_path.read_text(encoding='utf-8')
  except (OSError, UnicodeDecodeError) as e:
    raise DemoError(f'{migrated_path}: cannot read: {e}') from e
  current = committed == result.new
  print(f'{migrated_path} is {"current" if current else "STALE"} codemod output of '
        f'{legacy_path}')

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
