"""codemod.import_scope.drop_unread_legacy_imports: a flax.optim import that no code reads
(CPython's symtable decides) leaves a converted file; one read anywhere stays."""
import libcst as cst
import pytest

from codemod import import_scope

REMOVALS = [('flax', 'optim', None), ('flax.optim', 'Adam', None)]


def _drop(source: str) -> str:
  return import_scope.drop_unread_legacy_imports(cst.parse_module(source), REMOVALS).code


def test_a_parameter_rebound_in_its_function_is_not_a_read():
  source = ('import jax\nfrom flax import optim\n\n\ndef step(optim, g):\n'
            '  optim = optim.apply_gradient(g)\n  return optim\n')
  assert _drop(source) == source.replace('from flax import optim\n', '')


def test_only_the_unread_name_of_a_line_goes():
  # (Momentum is not on the removal list: only the listed names are candidates)
  source = 'from flax.optim import Adam, Momentum\nfrom flax import optim\nx = optim\n'
  assert _drop(source) == 'from flax.optim import Momentum\nfrom flax import optim\nx = optim\n'


@pytest.mark.parametrize('use', [
    'x = optim.Adam',                                  # module level
    'def f():\n  return optim.Adam',                   # implicit global in a function
    'class C:\n  opt = optim.Adam',                    # a class body
    'def f():\n  global optim\n  optim = optim.Adam',  # declared global
    "__all__ = ['optim']",                             # a re-export
    "def f(o: 'optim.Optimizer'):\n  return o",        # a string annotation
    'def f():\n  def g():\n    return optim\n  return g',  # nested
])
def test_a_read_keeps_the_import(use):
  source = f'from flax import optim\n{use}\n'
  assert _drop(source) == source


def test_code_that_does_not_compile_is_left_as_is():
  source = 'from flax import optim\ndef f():\n  return 1\n  nonlocal optim\n'
  assert _drop(source) == source


@pytest.mark.parametrize('head, expected', [
    # helper-28's D3: isort's sections, third-party then first-party
    ('import numpy as np\nimport jax\nfrom flax import optim\n\nfrom mypkg import models\n',
     'import numpy as np\nimport jax\nimport optax\nfrom flax.training import train_state\n\n'
     'from mypkg import models\n'),
    # a section of its own: the new imports take its blank line
    ('import functools\n\nfrom flax import optim\n\nfrom mypkg import models\n',
     'import functools\n\nimport optax\nfrom flax.training import train_state\n\n'
     'from mypkg import models\n'),
    # one section: after it, as LibCST's AddImportsVisitor places them
    ('import jax\nfrom flax import optim\nfrom mypkg import models\n',
     'import jax\nfrom mypkg import models\nimport optax\nfrom flax.training import train_state\n'),
])
def test_added_imports_close_the_flax_optim_imports_section(head, expected):
  from codemod import engine
  source = head + '\n\ndef make(params):\n  return optim.Adam(1e-3).create(params), models\n'
  result = engine.rewrite_source(source, 'train.py')
  assert result.error is None, result.error
  assert result.new.split('\n\n\ndef make')[0] + '\n' == expected, result.new
