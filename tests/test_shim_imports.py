"""Code a user pointed at the shim by hand (``import optim_compat as optim``, the transition
the docs describe) is converted by a later ``rewrite`` as its flax.optim original is
(``codemod.shim_imports``). Found by helper-22: such a file was not legacy to the codemod,
and ``rewrite`` left it as it was."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

from codemod import engine, shim_imports

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / 'tests' / 'fixtures' / 'programs'
LEGACY_IMPORT = 'from flax import optim\n'
INSTALL = 'import optim_compat\noptim_compat.install()'


@pytest.mark.parametrize('program', sorted(p.stem for p in PROGRAMS.glob('legacy_*.py')
                                           if LEGACY_IMPORT in p.read_text().splitlines(True)))
def test_each_program_pointed_at_the_shim_rewrites_as_its_flax_optim_original(program):
  """Each realistic program (each checked against real flax.optim, converted or kept on the
  shim) with `from flax import optim` replaced by `import optim_compat as optim`: the rewrite
  is the original's, but for that line (kept as written where the file keeps its legacy
  code, with no `optim_compat.install()`: it runs on the shim already)."""
  original = (PROGRAMS / f'{program}.py').read_text()
  shimmed = original.replace(LEGACY_IMPORT, 'import optim_compat as optim\n', 1)
  want = engine.rewrite_source(original, f'{program}.py')
  got = engine.rewrite_source(shimmed, f'{program}.py')
  assert want.error is None and got.error is None, (want.error, got.error)
  assert got.original == shimmed
  rules = lambda r: [(f.line, f.rule, f.fixed) for f in r.findings if f.rule != 'OM014']
  assert rules(got) == rules(want)
  if LEGACY_IMPORT in want.new.splitlines(True):  # kept on legacy code, behind install()
    assert INSTALL in want.new
    expected = want.new.replace(LEGACY_IMPORT, 'import optim_compat as optim\n', 1)
    if not shim_imports.names_flax_optim(shimmed):  # on the shim already: nothing installed
      assert INSTALL not in got.new
      expected = expected.replace(next(line for line in want.new.splitlines(True)
                                       if line.startswith('optim_compat.install()')), '', 1)
      expected = expected.replace('import optim_compat\n', '', 1)
    assert got.new == expected
  else:  # (LibCST may merge an added import into another `from flax import` line)
    assert _imports(got.new) == _imports(want.new)
    assert _without_imports(got.new) == _without_imports(want.new)
  assert engine.rewrite_source(got.new, 'again.py').new == got.new  # idempotent


def _imports(text: str) -> set:
  """``(module, name, as)`` of every import of ``text``, one per name."""
  found = set()
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.Import):
      found.update((a.name, None, a.asname) for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      found.update((node.module, a.name, a.asname) for a in node.names)
  return found


def _without_imports(text: str) -> list:
  return [line for line in text.splitlines()
          if not line.lstrip().startswith(('import ', 'from '))]


@pytest.mark.parametrize('written, analysed', [
    ('import optim_compat as optim\n', 'import flax.optim as optim\n'),
    ('  import optim_compat as legacy  # transition\n',
     '  import flax.optim as legacy  # transition\n'),
    ('from optim_compat import Adam, Optimizer as Opt\n',
     'from flax.optim import Adam, Optimizer as Opt\n'),
    ('from optim_compat import (\n    Adam,\n    Momentum)\n',
     'from flax.optim import (\n    Adam,\n    Momentum)\n'),
    ('from optim_compat.adam import _AdamParamState\n',
     'from flax.optim.adam import _AdamParamState\n'),
    # what the codemod itself writes, and what is not flax.optim's, stays the shim
    ('import optim_compat\ntx = optim_compat.to_optax(optim_compat.Adam(0.1))\n', None),
    ('from optim_compat import Adam, to_optax\n', None),
    ('from optim_compat import checkpoint\n', None),
    ('from optim_compat.transforms import lamb\n', None),
    ('from optim_compat import *\n', 'from flax.optim import *\n'),
    # beside flax.optim's own import (a fallback): each put back as it was
    ('try:\n  import flax.optim as optim\nexcept ImportError:\n  import optim_compat as optim\n',
     'try:\n  import flax.optim as optim\nexcept ImportError:\n  import flax.optim as optim\n'),
])
def test_the_shim_imports_read_as_flax_optim_and_put_back(written, analysed):
  """Each analysed line carries a marking comment (appended to a comment the line has)."""
  text = shim_imports.analysed(written)
  unmarked = text.replace(f'  # {shim_imports.MARK}', '').replace(f' {shim_imports.MARK}', '')
  assert unmarked == (written if analysed is None else analysed)
  assert shim_imports.restore(text) == written
  assert (text != written) == (analysed is not None)
  if analysed is not None:  # a marked line the rewrite changed gets the shim back
    changed = text.replace('Adam, Optimizer as Opt', 'Adam').replace('_AdamParamState', '_X')
    restored = shim_imports.restore(changed)
    assert restored.count('flax.optim') == written.count('flax.optim')
    assert shim_imports.MARK not in restored


def test_a_file_kept_on_the_shim_is_left_as_written_and_a_rerun_changes_nothing(tmp_path):
  """A file whose state surgery keeps its legacy code gets its TODOs only: its imports stay
  the shim's, nothing is installed; `--write` then a second run write nothing more."""
  path = tmp_path / 'keep.py'
  path.write_text('from optim_compat import Adam  # the shim\n'
                  'opt = Adam(learning_rate=0.1).create(params)\n'
                  'moments = opt.state.param_states\n'
                  'opt = opt.apply_gradient(grads)\n')
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}
  run = lambda: subprocess.run([sys.executable, '-m', 'codemod.cli', 'rewrite', '--write',
                                '--no-cache', str(path)], capture_output=True, text=True,
                               env=env)
  assert run().returncode == 1
  first = path.read_text()
  assert first.startswith('from optim_compat import Adam  # the shim\n')
  assert 'OM103' in first and 'install' not in first and 'flax.optim import' not in first
  assert run().returncode == 1 and path.read_text() == first


@pytest.mark.parametrize('legacy', ['from flax import optim', 'import flax.optim as optim'])
def test_an_import_fallback_converts_in_one_run(legacy):
  """helper-24: `try: import flax.optim as optim` / `except ImportError: import optim_compat as
  optim` left `try: pass / except ImportError: import optim_compat as optim` (the shim line was
  not read as flax.optim beside the same flax.optim line), and a second run removed it."""
  source = (f'try:\n  {legacy}\nexcept ImportError:\n  import optim_compat as optim\n\n\n'
            'def make(params):\n  return optim.Adam(0.1).create(params)\n')
  first = engine.rewrite_source(source, 'both.py')
  assert first.manual == [] and 'try' not in first.new and 'optim_compat' not in first.new
  assert engine.rewrite_source(first.new, 'both.py').new == first.new


def test_imports_replacing_a_legacy_import_inside_a_block_come_before_it():
  """helper-24: `if __name__ == '__main__': from flax import optim ...` (or the import in a
  `try` / `with` block, or a function): `import optax` and `train_state` were added after
  the block (a NameError in it on the first run, with nothing flagged)."""
  source = ('import jax.numpy as jnp\n\nif __name__ == "__main__":\n  from flax import optim\n'
            '  opt = optim.Adam(1e-3).create({"w": jnp.ones(2)})\n  print(opt.target)\n')
  new = engine.rewrite_source(source, 'i2.py').new
  assert new.index('import optax') < new.index('if __name__')
  assert new.index('from flax.training import train_state') < new.index('if __name__')
  compile(new, 'i2.py', 'exec')


def test_an_import_fallback_of_flax_optim_and_the_shim_goes_when_the_file_converts():
  """`try: from flax import optim` / `except ImportError: import optim_compat as optim` (code
  written to run on both stacks): the converted file keeps neither (the except branch's
  import was left, unused, in a converted file), nor an empty `try`."""
  source = ('try:\n  from flax import optim\nexcept ImportError:\n'
            '  import optim_compat as optim\n\n\n'
            'def make(params):\n  return optim.Adam(0.1).create(params)\n')
  result = engine.rewrite_source(source, 'both.py')
  assert result.manual == []
  assert 'optim_compat' not in result.new and 'try' not in result.new, result.new
  assert 'optax.adam(learning_rate=0.1' in result.new
  for legacy in ('from flax import optim', 'import flax.optim as optim'):
    result = engine.rewrite_source(source.replace('import optim_compat as optim', legacy),
                                   'both.py')
    assert 'optim' not in result.new.split('def make')[0].replace('optax', ''), result.new


def test_a_factory_module_on_the_shim_converts_with_its_users(tmp_path):
  """The cross-module flow reads a factory module pointed at the shim as it reads the
  flax.optim one: the factory returns a TrainState and its user's `.apply_gradient` /
  `.target` convert with it, in one run."""
  (tmp_path / 'pkg').mkdir()
  (tmp_path / 'pkg' / '__init__.py').write_text('')
  (tmp_path / 'pkg' / 'opt.py').write_text(
      'import optim_compat as optim\n\n\ndef make_optimizer(params):\n'
      '  return optim.Adam(learning_rate=0.1).create(params)\n')
  (tmp_path / 'pkg' / 'train.py').write_text(
      'from pkg.opt import make_optimizer\n\n\ndef train(params, grads):\n'
      '  opt = make_optimizer(params)\n  opt = opt.apply_gradient(grads)\n'
      '  return opt.target\n')
  proc = subprocess.run([sys.executable, '-m', 'codemod.cli', 'rewrite', '--write', '--no-cache',
                         'pkg'], capture_output=True, text=True, cwd=tmp_path,
                        env={**os.environ, 'PYTHONPATH': str(ROOT)})
  assert proc.returncode == 1 and '2 rewritten, 0 flagged' in proc.stderr, proc.stderr
  factory = (tmp_path / 'pkg' / 'opt.py').read_text()
  assert 'optim_compat' not in factory and 'TrainState.create(' in factory
  assert 'optax.adam(learning_rate=0.1' in factory
  user = (tmp_path / 'pkg' / 'train.py').read_text()
  assert 'opt.apply_gradients(grads=grads)' in user and 'return opt.params' in user
