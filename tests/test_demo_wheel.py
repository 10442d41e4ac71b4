"""``optim-migrate demo`` and ``rewrite`` from a built wheel (not the source tree), and the
demo's errors for bad ``--devices`` / ``--examples``.

The wheel test builds the project's wheel from a copy of its sources, installs it with
``--no-deps`` into a fresh virtualenv, and runs the console script from a directory outside
the source tree. The dependencies (jax, flax, scikit-learn, ...) are this interpreter's: a
``.pth`` file of the new environment names this interpreter's site-packages as a plain path
(the ``.pth`` files there, such as an editable install's finder, are not run), so the project
itself can only come from the wheel, which the test asserts. About 45 s wall (15 s CPU) on
a loaded 2-core machine, most of it the wheel build; the whole demo from the wheel (two
training subprocesses of 5 steps) takes about 60 s more.
"""
import os
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig

import pytest

from codemod import cli, demo, engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / 'examples'
#: What a wheel is built from: pyproject.toml's packages, its readme, the demo's examples.
SOURCES = ('pyproject.toml', 'README.md', 'optim_compat', 'codemod', 'equivalence_tests',
           'examples')
LEGACY = ('import jax\nfrom flax import optim\n\n\ndef make(params):\n'
          '  return optim.Adam(learning_rate=1e-3).create(params)\n\n\n'
          'def step(opt, grads):\n  return opt.apply_gradient(grads)\n')


@pytest.fixture(scope='module')
def wheel_env(tmp_path_factory):
  """``(bin directory, environment, cwd)`` of a fresh virtualenv holding the built wheel."""
  tmp = tmp_path_factory.mktemp('wheel')
  src = tmp / 'src'
  src.mkdir()
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info', 'build')
  for name in SOURCES:
    (shutil.copytree(ROOT / name, src / name, ignore=ignore) if (ROOT / name).is_dir()
     else shutil.copy2(ROOT / name, src / name))
  dist = tmp / 'dist'
  build = [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '-w', str(dist), str(src)]
  # this interpreter's setuptools when it can build the wheel (no download), else pip's
  # isolated build environment (setuptools from the pip cache or the index)
  if subprocess.run([*build, '--no-build-isolation'], capture_output=True, cwd=tmp).returncode:
    proc = subprocess.run(build, capture_output=True, text=True, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
  wheels = list(dist.glob('flax_optim_migrate-*.whl'))
  assert len(wheels) == 1, wheels
  venv = tmp / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = venv / 'bin' / 'python'
  subprocess.run([sys.executable, '-m', 'pip', '--python', str(python), 'install', '-q',
                  '--no-deps', '--no-index', str(wheels[0])], check=True, capture_output=True)
  purelib = pathlib.Path(subprocess.run(
      [str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
      check=True, capture_output=True, text=True).stdout.strip())
  ours = {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib'],
          *site.getsitepackages()}
  (purelib / 'zz_test_dependencies.pth').write_text(''.join(f'{p}\n' for p in sorted(ours)))
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
  env['PATH'] = f'{venv / "bin"}{os.pathsep}{env.get("PATH", "")}'
  cwd = tmp / 'work'
  cwd.mkdir()
  return venv / 'bin', env, cwd


def _run(wheel_env, *args, timeout=300):
  bin_dir, env, cwd = wheel_env
  return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                        env=env, cwd=cwd, timeout=timeout)


def test_the_wheel_is_what_runs_and_holds_the_examples(wheel_env):
  bin_dir, _, _ = wheel_env
  venv = bin_dir.parent.resolve()
  proc = _run(wheel_env, 'python', '-c',
              'import codemod, optim_compat, optim_migrate_examples as e, pathlib\n'
              'print(codemod.__file__); print(optim_compat.__file__)\n'
              'print(sorted(str(p.relative_to(pathlib.Path(e.__file__).parent))\n'
              '             for p in pathlib.Path(e.__file__).parent.rglob("*.py")))')
  assert proc.returncode == 0, proc.stderr
  codemod_file, compat_file, listed = proc.stdout.splitlines()
  for f in (codemod_file, compat_file):
    assert venv in pathlib.Path(f).resolve().parents, f
  assert listed == "['__init__.py', 'legacy/train_digits.py', 'migrated/train_digits.py']"
  assert _run(wheel_env, 'optim-migrate', '--version').stdout == 'optim-migrate 0.1.0\n'


def test_demo_from_the_wheel_finds_its_examples_and_they_are_current(wheel_env):
  """The demo's first step from the wheel, outside the source tree: the examples it finds
  are the installed ones, and the installed migrated program is the codemod's output of the
  installed legacy one. Before: FileNotFoundError (no legacy/train_digits.py), the examples
  were not in the wheel. (The training runs are the same code as from a checkout; the
  whole demo from the wheel is the test below, opt-in: about 60 s more.)"""
  bin_dir, _, _ = wheel_env
  proc = _run(wheel_env, 'python', '-c',
              'from codemod import demo, engine\n'
              'ex = demo.find_examples()\n'
              'result = engine.rewrite_file(ex / "legacy" / demo.SCRIPT)\n'
              'print(ex)\n'
              'print(result.error, result.new == (ex / "migrated" / demo.SCRIPT).read_text())')
  assert proc.returncode == 0, proc.stderr[-3000:]
  installed = next(bin_dir.parent.glob('lib/python*/site-packages/optim_migrate_examples'))
  assert proc.stdout == f'{installed.resolve()}\nNone True\n'


def test_demo_from_the_wheel_runs_end_to_end(wheel_env):
  """Before: a traceback (FileNotFoundError: no legacy/train_digits.py), the examples were
  not in the wheel."""
  bin_dir, _, _ = wheel_env
  proc = _run(wheel_env, 'optim-migrate', 'demo', '--steps', '5')
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  installed = next(bin_dir.parent.glob('lib/python*/site-packages/optim_migrate_examples'))
  assert (f'{installed / "migrated" / "train_digits.py"} is current codemod output of '
          f'{installed / "legacy" / "train_digits.py"}') in proc.stdout
  assert 'max |loss difference| over 5 steps: 0 (bitwise equal)' in proc.stdout


def test_rewrite_from_the_wheel_writes_the_single_file_rewrite(wheel_env):
  _, _, cwd = wheel_env
  legacy = cwd / 'legacy_train.py'
  legacy.write_text(LEGACY)
  proc = _run(wheel_env, 'optim-migrate', 'rewrite', '--write', 'legacy_train.py')
  assert proc.returncode == 1, proc.stderr  # changes were written
  want = engine.rewrite_source(LEGACY, 'legacy_train.py').new
  assert want != LEGACY and legacy.read_text() == want
  assert 'optax.adam' in want


def test_demo_bad_devices_or_examples_exit_2_with_one_line(wheel_env):
  """Before: --devices 3 crashed in the training subprocess and --examples DIR without the
  programs raised FileNotFoundError, both with a traceback."""
  for args, message in (
      (['--devices', '3'], 'demo: --devices 3: the example splits its batch of 64 equally over '
                           'the devices; use one of 1, 2, 4, 8, 16, 32, 64\n'),
      (['--examples', 'nowhere'], 'demo: --examples nowhere: does not exist; it must hold '
                                  'legacy/train_digits.py and migrated/train_digits.py\n')):
    proc = _run(wheel_env, 'optim-migrate', 'demo', *args)
    assert (proc.returncode, proc.stderr) == (2, message)


def test_demo_examples_without_the_programs_and_bad_devices_in_process(tmp_path, capsys):
  (tmp_path / 'legacy').mkdir()
  shutil.copy2(EXAMPLES / 'legacy' / 'train_digits.py', tmp_path / 'legacy')
  assert cli.main(['demo', '--examples', str(tmp_path)]) == 2
  assert capsys.readouterr().err == (
      f'demo: --examples {tmp_path}: has no migrated/train_digits.py; it must hold '
      'legacy/train_digits.py and migrated/train_digits.py\n')
  assert cli.main(['demo', '--examples', str(tmp_path / 'legacy' / 'train_digits.py')]) == 2
  assert 'is not a directory' in capsys.readouterr().err
  for devices in ('5', '128', '48'):
    assert cli.main(['demo', '--examples', str(EXAMPLES), '--devices', devices]) == 2
    assert capsys.readouterr().err.startswith(f'demo: --devices {devices}: the example splits')


def test_demo_stale_message_names_the_examples_given(tmp_path, capsys, monkeypatch):
  """Before: the line said ``examples/migrated/train_digits.py is STALE`` whatever
  ``--examples`` was."""
  for d in ('legacy', 'migrated'):
    (tmp_path / d).mkdir()
    shutil.copy2(EXAMPLES / d / 'train_digits.py', tmp_path / d)
  migrated = tmp_path / 'migrated' / 'train_digits.py'
  migrated.write_text(migrated.read_text().replace('BASE_LR = 0.1', 'BASE_LR = 0.2'))
  same = {'losses': [1.0, 0.5], 'test_accuracy': 0.5, 'final_step': 2, 'devices': 2}
  monkeypatch.setattr(demo, 'run_pair', lambda ex, steps, devices: (same, same))
  assert cli.main(['demo', '--examples', str(tmp_path), '--steps', '2']) == 1
  out = capsys.readouterr().out
  assert (f'{migrated} is STALE codemod output of {tmp_path / "legacy" / "train_digits.py"}\n'
          in out)
  assert f'== codemod: {tmp_path / "legacy" / "train_digits.py"} -> {migrated} ==' in out


def test_the_package_list_names_every_package_of_the_tree():
  """``[tool.setuptools] packages`` is a list (the demo's examples are mapped from
  ``examples/``, which a ``find`` cannot do): it must name every package directory, or the
  wheel lacks it (as it lacked codemod.facts, .plan and .modern before they were found by
  pattern)."""
  try:
    import tomllib
  except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
  config = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools']
  on_disk = {'.'.join(p.parent.relative_to(ROOT).parts)
             for top in ('optim_compat', 'codemod', 'equivalence_tests')
             for p in (ROOT / top).rglob('__init__.py') if '__pycache__' not in p.parts}
  assert set(config['packages']) == on_disk | {'optim_migrate_examples'}
  assert config['package-dir'] == {'optim_migrate_examples': 'examples'}
