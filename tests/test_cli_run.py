"""``optim-migrate run SCRIPT`` sets up ``__main__`` as ``python SCRIPT`` does (CPython >= 3.9)."""
import ast
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROBE = ('import os, sys\n'
         'print(repr(__file__))\n'
         'print(repr(sys.argv[0]))\n'
         'print(repr(sys.path[0]))\n'
         'print(os.path.dirname(__file__) == sys.path[0])\n')


def _both(tmp_path, script_arg, cwd):
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))}
  tool = subprocess.run([sys.executable, '-m', 'codemod.cli', 'run', script_arg], capture_output=True,
                        text=True, cwd=cwd, env=env)
  python = subprocess.run([sys.executable, script_arg], capture_output=True, text=True, cwd=cwd)
  return tool, python


def test_run_with_a_relative_path_gives_the_script_an_absolute_file(tmp_path):
  """Found on the flax examples: ``optim-migrate run train_test.py`` left ``__file__`` relative
  (``'train_test.py'``), so code taking ``os.path.dirname(__file__)`` got '' and an
  IndexError followed; ``python train_test.py`` makes it absolute."""
  sub = tmp_path / 'example'
  sub.mkdir()
  (sub / 'train_test.py').write_text(PROBE)
  for cwd, arg in ((sub, 'train_test.py'), (tmp_path, 'example/train_test.py'),
                   (sub, './train_test.py'), (sub, str(sub / 'train_test.py'))):
    tool, python = _both(tmp_path, arg, cwd)
    assert tool.returncode == python.returncode == 0, tool.stderr
    assert tool.stdout == python.stdout, (arg, tool.stdout, python.stdout)
    assert os.path.normpath(ast.literal_eval(tool.stdout.splitlines()[0])) == str(sub / 'train_test.py'), tool.stdout
    assert tool.stdout.splitlines()[1] == repr(arg)


def test_a_relative_script_that_raises_shows_its_absolute_path_as_python_does(tmp_path):
  (tmp_path / 'boom.py').write_text('def f():\n  raise ValueError("boom")\nf()\n')
  tool, python = _both(tmp_path, 'boom.py', tmp_path)
  assert tool.returncode == python.returncode == 1
  assert tool.stderr == python.stderr, tool.stderr
  assert f'File "{tmp_path / "boom.py"}", line 3' in tool.stderr
  assert 'runpy' not in tool.stderr and 'codemod' not in tool.stderr


def test_a_script_dying_on_an_api_removed_beside_flax_optim_is_pointed_at_rewrite(tmp_path):
  """Found by the new-user trial: `run` of a 2021 script ended on `module 'jax' has no
  attribute 'tree_map'` with no word that `rewrite` migrates it (run patches flax.optim only)."""
  cases = {'tree.py': ('import jax\njax.tree_map(lambda x: x, [1])\n', '`jax.tree_map`', 'OM201'),
           'cfg.py': ('from jax.config import config\n', '`jax.config`', 'OM203'),
           'nn.py': ('import flax\nflax.nn.relu(1.0)\n', '`flax.nn`', 'OM214')}
  for name, (source, shown, rule) in cases.items():
    (tmp_path / name).write_text(source)
    tool, python = _both(tmp_path, name, tmp_path)
    assert tool.returncode == python.returncode == 1, tool.stderr
    assert tool.stderr.startswith(python.stderr), (tool.stderr, python.stderr)  # its error first
    hint = tool.stderr[len(python.stderr):]
    assert shown in hint and f'rewrite --write {name}' in hint and f'({rule}:' in hint, hint
  (tmp_path / 'other.py').write_text('import jax\njax.not_an_api_we_know\n')
  tool, python = _both(tmp_path, 'other.py', tmp_path)
  assert tool.returncode == 1 and tool.stderr == python.stderr  # no hint for other errors


def test_the_hint_names_the_module_that_failed_and_knows_unfreeze_of_a_dict(tmp_path):
  """Found by the new-user trial: a script whose helper module died on `jax.tree_map` was
  told to rewrite the script (which needs nothing); and `.unfreeze()` of what today's `init`
  returns (a dict) got no hint at all."""
  pkg = tmp_path / 'pkg'
  pkg.mkdir()
  (pkg / '__init__.py').write_text('')
  (pkg / 'helpers.py').write_text('import jax\n\n\ndef leaves(t):\n  return jax.tree_map(len, t)\n')
  (tmp_path / 'main.py').write_text('from pkg import helpers\nhelpers.leaves([[1]])\n')
  tool, python = _both(tmp_path, 'main.py', tmp_path)
  assert tool.returncode == python.returncode == 1
  hint = tool.stderr[len(python.stderr):]
  assert f"rewrite --write {os.path.join('pkg', 'helpers.py')}`" in hint, hint
  assert 'rewrite --write main.py' not in hint
  (tmp_path / 'frozen.py').write_text(
      'def count(variables):\n  return len(variables.unfreeze())\n\n\n'
      "print(count({'params': {}}))\n")
  tool, python = _both(tmp_path, 'frozen.py', tmp_path)
  assert tool.returncode == python.returncode == 1
  hint = tool.stderr[len(python.stderr):]
  assert '`.unfreeze()` of a dict' in hint and '(OM207)' in hint, hint
  assert 'rewrite --write frozen.py' in hint and '`flax.core.unfreeze(...)`' in hint, hint
  (tmp_path / 'attr.py').write_text("{'a': 1}.keys().nothing\n")  # another dict-ish error
  tool, python = _both(tmp_path, 'attr.py', tmp_path)
  assert tool.returncode == 1 and tool.stderr == python.stderr


def test_the_usage_line_shows_the_script_arguments_optional(capsys):
  """helper-25: argparse wrote `run [-h] script ...`, as if arguments were required."""
  from codemod import cli
  import pytest
  with pytest.raises(SystemExit) as exit_:
    cli.main(['run', '--help'])
  assert exit_.value.code == 0
  assert capsys.readouterr().out.startswith('usage: optim-migrate run [-h] SCRIPT [ARGS ...]\n')
