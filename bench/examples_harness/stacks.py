"""The two virtualenvs the examples run in (built outside the repository).

``old``: the project's LEGACY_PINS (jax 0.4.13, flax 0.5.3 with the real
flax.optim, numpy<2) plus the examples' test dependencies at versions that
install on Python 3.11 with numpy<2. ``modern``: today's jax / flax / optax,
this project (editable: its dependencies) and the same dependencies at current
versions.

The project a modern run measures is the checkout running the harness
(:data:`REPO`, put on the run's PYTHONPATH by :func:`project_path`), not the
one the venv was built from: a venv built by another worktree serves as is,
and its marker matches whatever checkout it was built from
(:func:`marker_pins`).
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from equivalence_tests.legacy_env import LEGACY_PINS  # noqa: E402

#: Test dependencies of the examples (flax v0.3.0 setup.py ``tests_require``
#: and the examples' requirements.txt), minus pytype / pytest-cov / svn / atari-py
#: (atari-py does not build on 3.11; ppo's two Atari tests need ROMs anyway).
OLD_EXTRAS = ('tensorflow==2.15.0', 'tensorflow-text==2.15.0', 'tensorflow-datasets==4.9.3',
              'clu==0.0.9', 'ml-collections==0.1.1', 'sentencepiece==0.2.0', 'pillow<11',
              'gym==0.26.2', 'opencv-python-headless==4.8.1.78', 'pytest<9', 'absl-py',
              'protobuf<4.24')
MODERN_EXTRAS = ('tensorflow==2.21.0', 'tensorflow-text==2.21.1', 'tensorflow-datasets==4.9.10',
                 'clu==0.0.12', 'ml-collections==1.1.0', 'sentencepiece==0.2.1', 'pillow',
                 'gym==0.26.2', 'opencv-python-headless==4.12.0.88', 'pytest', 'absl-py',
                 'tensorboard')


def pins(stack: str) -> list[str]:
  if stack == 'old':
    return [*LEGACY_PINS, *OLD_EXTRAS]
  if stack == 'modern':
    return [*MODERN_EXTRAS, '-e', str(REPO)]
  raise ValueError(f'unknown stack {stack!r} (old or modern)')


def marker_pins(pins_: list[str]) -> list[str]:
  """``pins_`` without the editable project (``-e PATH``): what a built venv is compared on, so
  that a modern venv built from another checkout of this project is reused."""
  out, skip = [], False
  for p in pins_:
    if skip:
      skip = False
    elif p == '-e':
      skip = True
    else:
      out.append(p)
  return out


def project_path(stack: str) -> list[str]:
  """PYTHONPATH entries a run on ``stack`` needs: the modern stack imports this checkout's
  codemod / optim_compat / equivalence_tests ahead of whatever the venv has installed."""
  return [str(REPO)] if stack == 'modern' else []


def nice() -> list[str]:
  """A ``nice`` prefix that runs a child at niceness 10 whatever this process's own niceness is
  (nested ``nice -n 10`` calls would push it to 19, where the other jobs of a shared machine starve it)."""
  import os
  return ['nice', '-n', str(max(0, 10 - os.nice(0)))]


def python(venv: pathlib.Path) -> pathlib.Path:
  return venv / 'bin' / 'python'


def ensure(stack: str, venv: pathlib.Path, log=print) -> pathlib.Path:
  """Build ``venv`` for ``stack`` unless its marker says it is built with these pins.

  Raises:
    RuntimeError: a pip step failed (its output's tail is in the message).
  """
  want = pins(stack)
  marker = venv / 'examples-pins.json'
  if marker.exists() and marker_pins(json.loads(marker.read_text())) == marker_pins(want):
    return python(venv)
  log(f'building the {stack} stack in {venv} (pip; several minutes the first time)')
  steps = [] if python(venv).exists() else [[sys.executable, '-m', 'venv', str(venv)]]
  steps.append([str(python(venv)), '-m', 'pip', 'install', '-q', '--disable-pip-version-check', *want])
  for cmd in steps:
    proc = subprocess.run([*nice(), *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f'building the {stack} stack failed: {" ".join(cmd)}\n'
                         f'{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
  marker.write_text(json.dumps(want))
  return python(venv)


def measured(root: pathlib.Path) -> str:
  """When, under what load and against which codemod a run in ``root`` (a run tree) was measured:
  'YYYY-MM-DD HH:MM, load 9.8 / 8.1 (1 / 15 min), codemod at <commit>[ (modified)][, tfds splits
  of N]'. The codemod is the one the tree was rewritten with (its ``codemod-at`` file), else this
  checkout's now; '(modified)': codemod/ or optim_compat/ had uncommitted changes."""
  import os
  import time
  at = pathlib.Path(root) / 'codemod-at'   # written when the tree was rewritten; else now
  codemod = at.read_text().strip() if at.exists() else codemod_at()
  size_file = pathlib.Path(root) / 'tfds-split-size'
  size = size_file.read_text().strip() if size_file.exists() else 'published'
  one, _, fifteen = os.getloadavg()
  return (f'{time.strftime("%Y-%m-%d %H:%M")}, load {one:.1f} / {fifteen:.1f} (1 / 15 min), '
          f'codemod at {codemod}' + ('' if size == 'published' else f', tfds splits of {size}'))


def codemod_at() -> str:
  """'<commit>' of this checkout, with ' (modified)' when codemod/ or optim_compat/ have
  uncommitted changes."""
  proc = subprocess.run(['git', '-C', str(REPO), 'rev-parse', 'HEAD'], capture_output=True, text=True)
  head = proc.stdout.strip() if proc.returncode == 0 else 'unknown commit'
  dirty = subprocess.run(['git', '-C', str(REPO), 'status', '--porcelain', '--', 'codemod', 'optim_compat'],
                         capture_output=True, text=True).stdout.strip()
  return f'{head[:7]}{" (modified)" if dirty else ""}'


def tree_age(root: pathlib.Path) -> str:
  """When a run tree was prepared ('YYYY-MM-DD HH:MM', from its tfds-split-size file, written last;
  copytree keeps the sources' own 2020 mtimes); 'unknown' for a tree without it."""
  import time
  marker = pathlib.Path(root) / 'tfds-split-size'
  return time.strftime('%Y-%m-%d %H:%M', time.localtime(marker.stat().st_mtime)) if marker.exists() else 'unknown'

