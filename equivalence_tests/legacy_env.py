"""Build the old-stack virtualenv: the real ``flax.optim`` (Flax 0.5.3).

``python -m equivalence_tests.legacy_env`` creates it (idempotent) and prints
its Python. The location is ``$OPTIM_MIGRATE_LEGACY_VENV`` or ``.legacy-venv``
in the current directory. It needs Python 3.11 (``$OPTIM_MIGRATE_LEGACY_PYTHON``,
default: the running interpreter) and access to the package index.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

#: The old stack: the last Flax with flax.optim, on the oldest jax served for 3.11.
LEGACY_PINS = ('jax==0.4.13', 'jaxlib==0.4.13', 'flax==0.5.3', 'optax==0.1.5',
               'numpy<2', 'scipy<1.12', 'ml_dtypes<0.3', 'scikit-learn<1.6', 'libcst')


def venv_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get('OPTIM_MIGRATE_LEGACY_VENV', '.legacy-venv')).resolve()


def python_path(venv: pathlib.Path | None = None) -> pathlib.Path:
  return (venv or venv_dir()) / 'bin' / 'python'


def ensure(venv: pathlib.Path | None = None, quiet: bool = True) -> pathlib.Path:
  """Create the old-stack virtualenv if missing; return its interpreter.

  Safe when several processes call it at once (pytest-xdist workers, parallel CI
  jobs): the first builds it under an exclusive lock on ``<venv>.lock``, the
  others wait for it and then find it built.

  Raises:
    RuntimeError: the venv could not be created or a pin failed to install
      (the message includes pip's output).
  """
  import fcntl
  venv = venv or venv_dir()
  venv.parent.mkdir(parents=True, exist_ok=True)
  with open(venv.with_name(venv.name + '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    return _ensure_locked(venv, quiet)


def _ensure_locked(venv: pathlib.Path, quiet: bool) -> pathlib.Path:
  marker = venv / 'optim-migrate-pins.json'
  if marker.exists() and json.loads(marker.read_text()) == list(LEGACY_PINS):
    return python_path(venv)
  base = os.environ.get('OPTIM_MIGRATE_LEGACY_PYTHON', sys.executable)
  steps = [[base, '-m', 'venv', '--clear', str(venv)],
           [str(python_path(venv)), '-m', 'pip', 'install', '--disable-pip-version-check',
            *(['-q'] if quiet else []), *LEGACY_PINS]]
  for cmd in steps:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f'building the legacy env failed: {" ".join(cmd)}\n'
                         f'{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
  check = subprocess.run([str(python_path(venv)), '-c',
                          'import flax.optim, jax; print(flax.__version__, jax.__version__)'],
                         capture_output=True, text=True)
  if check.returncode != 0 or not check.stdout.startswith('0.5.3 0.4.13'):
    raise RuntimeError(f'legacy env has no flax.optim 0.5.3: {check.stdout}{check.stderr}')
  marker.write_text(json.dumps(list(LEGACY_PINS)))
  return python_path(venv)


if __name__ == '__main__':
  print(ensure(quiet=False))
