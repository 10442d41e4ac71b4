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


# -- the imports a conversion adds and drops, as isort (or a careful human) leaves them -----
def _rewritten(source: str) -> str:
  """``source`` after one rewrite, checked to be what a second rewrite leaves as it is."""
  from codemod import engine
  result = engine.rewrite_source(source, 'train.py')
  assert result.error is None, result.error
  again = engine.rewrite_source(result.new, 'train.py')
  assert again.error is None and again.new == result.new, 'not idempotent'
  return result.new


STEP = ('\n\ndef train(params, grads):\n  opt = optim.Adam(1e-3).create(params)\n'
        '  return opt.apply_gradient(grads)\n')
STEPPED = ('\n\ndef train(params, grads):\n  opt = train_state.TrainState.create(apply_fn=None, '
           'params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n'
           '  return opt.apply_gradients(grads=grads)\n')


@pytest.mark.parametrize('head, expected', [
    ('import functools\n\nimport flax.optim as fo\nimport jax\nimport numpy as np\n',
     'import functools\n\nimport jax\nimport numpy as np\nimport optax\n'
     'from flax.training import train_state\n'),
    ('import functools\n\nfrom flax import optim\nimport jax\n',
     'import functools\n\nimport jax\nimport optax\nfrom flax.training import train_state\n'),
    # the last of its section, nothing after it in the imports: the new imports take the line
    ('import functools\nimport os\n\nfrom flax import optim\n',
     'import functools\nimport os\n\nimport optax\nfrom flax.training import train_state\n'),
    # a comment right above the removed import was about it: it goes, the blank line stays
    ('import functools\n\n# the legacy optimizer\nfrom flax import optim\nimport jax\n',
     'import functools\n\nimport jax\nimport optax\nfrom flax.training import train_state\n'),
])
def test_removing_a_section_leading_flax_optim_import_keeps_the_blank_line(head, expected):
  step = STEP.replace('optim.', 'fo.') if ' as fo\n' in head else STEP
  assert _rewritten(head + step) == expected + STEPPED


def test_an_om2xx_import_removal_keeps_the_blank_line_too():
  source = ('import functools\n\nfrom jax.ops import index_update, index\nimport jax\n'
            'import jax.numpy as jnp\n\nx = index_update(jnp.zeros(3), index[0], 1.0)\n')
  assert _rewritten(source) == ('import functools\n\nimport jax\nimport jax.numpy as jnp\n\n'
                                'x = jnp.zeros(3).at[0].set(1.0)\n')
