"""The engine's last check: a rewrite that would leave a name undefined is not written."""
import subprocess
import sys

import pytest

from codemod import engine, undefined
from codemod.modern import rewrite as om2xx


@pytest.mark.parametrize('original, new, expected', [
    # the import moved below its use (ladax's examples, before the OM203 fix)
    ('from jax.config import config; config.update("x", 1)\n',
     'config.update("x", 1)\nfrom jax import config\n', [('config', 1)]),
    # an import dropped while a use stays
    ('from flax import optim\nimport optax\nopt = optim.Adam(0.1)\ntx = optax.adam(0.1)\n',
     'import optax\nopt = optim.Adam(0.1)\ntx = optax.adam(0.1)\n', [('optim', 2)]),
    # a name undefined before stays out of it (a star import, a builtin of another version)
    ('from m import *\nx = y + zz\n', 'from m import *\nx = y + zz + 1\n', []),
    ('x = never_bound\n', 'x = never_bound  # kept\n', []),
    # a function body runs later: an import after the def binds its names
    ('import optax\n\ndef f():\n  return optax.adam(1)\n',
     'def f():\n  return optax.adam(1)\nimport optax\n', []),
    # a local read before its assignment in the same function
    ('def f(g):\n  s = 0\n  s = s + g\n  return s\n',
     'import jax\nx = 1\n\ndef f(g):\n  s = s + g\n  return s\n', [('s', 5)]),
])
def test_names_a_rewrite_leaves_undefined(original, new, expected):
  assert undefined.introduced(original, new) == expected
  assert (undefined.problem(original, new) is None) == (not expected)


def test_unparsable_text_is_not_checked():
  assert undefined.undefined_names('def f(:\n') is None
  assert undefined.introduced('x = 1\n', 'def f(:\n') == []


def _misplace_imports(monkeypatch):
  """Make the OM2xx pass write its moved import after the line using it (the fault fixed in
  codemod.modern.imports, put back here to see the check stop it)."""
  real = om2xx.rewrite_source

  def misplaced(text, options=None):
    new, findings = real(text, options)
    lines = new.splitlines(keepends=True)
    return ''.join(lines[1:2] + lines[:1] + lines[2:]), findings
  monkeypatch.setattr(om2xx, 'rewrite_source', misplaced)


SOURCE = 'from jax.config import config; config.update("jax_enable_x64", True)\nimport jax\n'


def test_a_rewrite_with_a_new_undefined_name_is_an_error_and_not_written(monkeypatch, tmp_path):
  assert engine.rewrite_source(SOURCE, 'a.py').new == (
      'from jax import config\nconfig.update("jax_enable_x64", True)\nimport jax\n')
  _misplace_imports(monkeypatch)
  result = engine.rewrite_source(SOURCE, 'a.py')
  assert result.new is None
  assert result.error == ('a.py: internal error, in the rewrite line 1: `config` would be '
                          'undefined (a NameError when it runs); file left as is')
  path = tmp_path / 'a.py'
  path.write_text(SOURCE)
  result = engine.rewrite_file(path)
  assert result.new is None and 'line 1: `config` would be undefined' in result.error
  assert path.read_text() == SOURCE


def test_the_cli_reports_it_and_leaves_the_file(tmp_path):
  """End to end in a subprocess (the fault injected through a sitecustomize module)."""
  path = tmp_path / 'a.py'
  path.write_text(SOURCE)
  (tmp_path / 'site').mkdir()
  (tmp_path / 'site' / 'sitecustomize.py').write_text(
      'from codemod.modern import rewrite as om2xx\n'
      'real = om2xx.rewrite_source\n'
      'def misplaced(text, options=None):\n'
      '  new, findings = real(text, options)\n'
      '  lines = new.splitlines(keepends=True)\n'
      '  return "".join(lines[1:2] + lines[:1] + lines[2:]), findings\n'
      'om2xx.rewrite_source = misplaced\n')
  import os
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / 'site'), *sys.path]))
  proc = subprocess.run([sys.executable, '-m', 'codemod.cli', 'rewrite', '--write', '--no-cache',
                         str(path)], capture_output=True, text=True, env=env)
  assert proc.returncode == 2, proc.stderr
  assert '`config` would be undefined' in proc.stderr
  assert path.read_text() == SOURCE
