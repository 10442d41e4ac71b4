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


def test_write_keeps_crlf_bom_and_declared_encoding(tmp_path):
  crlf = tmp_path / 'crlf.py'
  crlf.write_bytes(b'from flax import optim\r\n\r\n\r\ndef f(p):\r\n'
                   b'  return optim.GradientDescent(0.1).create(p).target\r\n')
  bom = tmp_path / 'bom.py'
  bom.write_bytes(b'\xef\xbb\xbffrom flax import optim\nx = optim.Adam(0.1)\n')
  latin = tmp_path / 'latin.py'
  latin.write_bytes(b'# -*- coding: latin-1 -*-\n# caf\xe9\nfrom flax import optim\nx = optim.Adam(0.1)\n')
  proc = _cli('rewrite', '--write', str(tmp_path))
  assert proc.returncode == 1, proc.stderr
  data = crlf.read_bytes()
  assert b'optax.sgd(learning_rate=0.1)' in data and b'.params\r\n' in data
  assert data.count(b'\n') == data.count(b'\r\n')
  assert bom.read_bytes().startswith(b'\xef\xbb\xbfimport optax\n')
  assert b'# caf\xe9\n' in latin.read_bytes() and b'optax.adam(' in latin.read_bytes()


def test_a_name_rebound_to_another_object_is_flagged_not_rewritten():
  source = ('from flax import optim\n\n'
            'opt = optim.Adam(0.1).create(p)\n'
            'opt = Thing()\n'
            'print(opt.target)\n')
  result = engine.rewrite_source(source, 'r.py')
  assert 'print(opt.target)' in result.new and 'opt.params' not in result.new
  assert [f.rule for f in result.manual] == ['OM100']


def test_run_passes_every_argument_after_the_script(tmp_path):
  script = tmp_path / 's.py'
  script.write_text('import sys\nprint(sys.argv[1:])\n')
  proc = _cli('run', str(script), '--', 'a', '--b')
  assert proc.returncode == 0 and "['--', 'a', '--b']" in proc.stdout


def test_parse_error_names_file_and_line():
  result = engine.rewrite_source('from flax import optim\ndef f(:\n', 'b.py')
  assert result.error.startswith('b.py:2:') and 'cannot parse' in result.error
  assert result.new is None


def test_apply_gradient_in_a_file_without_flax_optim_is_flagged_not_rewritten():
  source = 'def train(opt, g):\n  opt = opt.apply_gradient(g)\n  return opt.target\n'
  result = engine.rewrite_source(source, 'o.py')
  assert 'opt.apply_gradient(g)' in result.new and 'apply_gradients' not in result.new
  assert [f.rule for f in result.manual] == ['OM100']
  assert not [f for f in result.findings if f.fixed]


def test_write_goes_through_a_symlink_and_missing_paths_count_once(tmp_path):
  real = tmp_path / 'real.py'
  real.write_text((FIXTURES / 'bare_flax_import' / 'before.py').read_text())
  link = tmp_path / 'link.py'
  link.symlink_to(real)
  proc = _cli('rewrite', '--write', str(link))
  assert proc.returncode == 1, proc.stderr
  assert link.is_symlink()
  assert real.read_text() == (FIXTURES / 'bare_flax_import' / 'after.py').read_text()
  proc = _cli('rewrite', str(tmp_path / 'nope.py'))
  assert proc.returncode == 2 and proc.stderr.count('nope.py') == 1
  assert '1 error(s)' in proc.stderr


def test_demo_rejects_zero_steps():
  proc = _cli('demo', '--steps', '0')
  assert proc.returncode == 2 and '--steps' in proc.stderr
