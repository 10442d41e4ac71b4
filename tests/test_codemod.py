"""Codemod: before/after fixture pairs, idempotence, CLI exit codes, bad input."""
import pathlib
import subprocess
import sys

import libcst as cst
import pytest

from codemod import engine

FIXTURES = pathlib.Path(__file__).parent / 'fixtures' / 'codemod'
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('case', CASES)
def test_fixture_pair(case):
  before = (FIXTURES / case / 'before.py').read_text()
  after = (FIXTURES / case / 'after.py').read_text()
  result = engine.rewrite_source(before, f'{case}/before.py')
  assert result.error is None
  assert result.new == after
  cst.parse_module(after)
  again = engine.rewrite_source(after, f'{case}/after.py')
  assert again.new == after, 'not idempotent'


def test_manual_items_are_reported_with_position():
  source = (FIXTURES / 'unsupported_def' / 'before.py').read_text()
  result = engine.rewrite_source(source, 'm.py')
  assert [f.format('m.py').split(' [')[0] for f in result.manual] == ['m.py:5:10: OM101']


def test_migrated_momentum_runs_and_matches_the_shim():
  """Execute the rewritten fixture: its tx is the shim's chain, bitwise."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optim_compat as optim
  ns = {}
  exec(compile((FIXTURES / 'from_import_lr_at_apply' / 'after.py').read_text(), 'after.py', 'exec'), ns)
  params = {'w': jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4), 'b': jnp.zeros(4)}
  state = ns['create'](params)
  legacy = optim.Momentum(beta=0.9, nesterov=True).create(params)
  legacy_step = jax.jit(lambda o, g, lr: o.apply_gradient(g, learning_rate=lr))  # both jitted
  for i in range(5):
    grads = jax.tree_util.tree_map(lambda p: jnp.cos(p * (i + 1)) + 0.1, legacy.target)
    lr = jnp.float32(0.1 / (i + 1))
    state, step = ns['step'](state, grads, lr)
    legacy = legacy_step(legacy, grads, lr)
    assert int(step) == int(legacy.state.step) == i + 1
  for k in params:
    np.testing.assert_array_equal(state.params[k], legacy.target[k])


def _cli(*args, cwd=None):
  return subprocess.run([sys.executable, '-m', 'codemod.cli', *args], capture_output=True,
                        text=True, cwd=cwd or ROOT)


def test_cli_exit_codes_diff_write_and_parse_errors(tmp_path):
  legacy = tmp_path / 'legacy.py'
  legacy.write_text((FIXTURES / 'bare_flax_import' / 'before.py').read_text())
  clean = tmp_path / 'clean.py'
  clean.write_text('x = 1\n')
  broken = tmp_path / 'broken.py'
  broken.write_text('from flax import optim\ndef f(:\n')
  broken_bytes = broken.read_bytes()
  legacy_bytes = legacy.read_bytes()

  proc = _cli('rewrite', str(clean))
  assert proc.returncode == 0 and proc.stdout == ''

  proc = _cli('rewrite', str(legacy))  # diff only, writes nothing
  assert proc.returncode == 1
  assert '-  opt = flax.optim.Adam(' in proc.stdout and '+++ b/' in proc.stdout
  assert legacy.read_bytes() == legacy_bytes

  proc = _cli('rewrite', '--write', str(tmp_path))  # one file cannot parse
  assert proc.returncode == 2
  assert f'{broken}:2:' in proc.stderr and 'cannot parse' in proc.stderr
  assert broken.read_bytes() == broken_bytes
  assert legacy.read_text() == (FIXTURES / 'bare_flax_import' / 'after.py').read_text()
  assert not list(tmp_path.glob('.*.tmp'))

  broken.unlink()
  proc = _cli('rewrite', str(tmp_path))
  assert proc.returncode == 0, proc.stderr

  unsupported = tmp_path / 'u.py'
  unsupported.write_text((FIXTURES / 'unsupported_def' / 'before.py').read_text())
  proc = _cli('rewrite', '--write', str(unsupported))
  assert proc.returncode == 1 and 'OM101' in proc.stderr
  assert unsupported.read_text() == (FIXTURES / 'unsupported_def' / 'after.py').read_text()
  proc = _cli('rewrite', str(tmp_path / 'missing.py'))
  assert proc.returncode == 2 and 'no such file' in proc.stderr


def test_run_preserves_argv_main_and_exit_code(tmp_path):
  script = tmp_path / 'legacy_script.py'
  script.write_text(
      'import sys\nfrom flax import optim\n'
      'assert __name__ == "__main__"\n'
      'print(sys.argv[1:], optim.Momentum.__module__)\n'
      'sys.exit(int(sys.argv[1]))\n')
  proc = _cli('run', str(script), '3', '--flag')
  assert proc.returncode == 3, proc.stderr
  assert "['3', '--flag'] optim_compat.defs" in proc.stdout
