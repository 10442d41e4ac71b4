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
SAVE = ('\n\ndef train(params, grads, ckpt_dir):\n  opt = optim.Adam(1e-3).create(params)\n'
        '  opt = opt.apply_gradient(grads)\n  checkpoints.save_checkpoint(ckpt_dir, opt, step=0)\n'
        '  return opt\n')
SAVED = ('\n\ndef train(params, grads, ckpt_dir):\n  opt = train_state.TrainState.create('
         'apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, '
         'eps=1e-08))\n  opt = opt.apply_gradients(grads=grads)\n'
         '  checkpoints.save_checkpoint(os.path.abspath(ckpt_dir), opt, step=0)\n  return opt\n')


def _rewritten(source: str) -> str:
  """``source`` after one rewrite, checked to be what a second rewrite leaves as it is."""
  from codemod import engine
  result = engine.rewrite_source(source, 'train.py')
  assert result.error is None, result.error
  again = engine.rewrite_source(result.new, 'train.py')
  assert again.error is None and again.new == result.new, 'not idempotent'
  return result.new


@pytest.mark.parametrize('head, expected', [
    # sorted: the new name in its place (LibCST put it first: `train_state, checkpoints`)
    ('import functools\n\nimport jax\nfrom flax import optim\nfrom flax.training import checkpoints\n',
     'import functools\nimport os\n\nimport jax\nfrom flax.training import checkpoints, train_state\n'
     'import optax\n'),
    # not sorted: after the names there
    ('import functools\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import common_utils, checkpoints\n',
     'import functools\nimport os\n\nimport jax\n'
     'from flax.training import common_utils, checkpoints, train_state\nimport optax\n'),
    # a parenthesized list, one name a line, keeps its layout
    ('import functools\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import (\n    checkpoints,\n    lr_schedule,\n)\n',
     'import functools\nimport os\n\nimport jax\n'
     'from flax.training import (\n    checkpoints,\n    lr_schedule,\n    train_state,\n)\n'
     'import optax\n'),
])
def test_a_name_added_to_an_existing_from_import_keeps_its_names_sorted(head, expected):
  assert _rewritten(head + SAVE) == expected + SAVED


@pytest.mark.parametrize('head, expected', [
    # the stdlib section, sorted: in its sorted place, not after the third-party imports
    ('import functools\nimport sys\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import checkpoints\n\nfrom mypkg import models\n',
     'import functools\nimport os\nimport sys\n\nimport jax\n'
     'from flax.training import checkpoints, train_state\nimport optax\n\nfrom mypkg import models\n'),
    # not sorted: at its end
    ('import sys\nimport functools\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import checkpoints\n',
     'import sys\nimport functools\nimport os\n\nimport jax\n'
     'from flax.training import checkpoints, train_state\nimport optax\n'),
    # isort's default order: `import` lines, then `from` lines
    ('import sys\nfrom typing import Any\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import checkpoints\n',
     'import os\nimport sys\nfrom typing import Any\n\nimport jax\n'
     'from flax.training import checkpoints, train_state\nimport optax\n'),
    # one section for all: beside the stdlib imports
    ('import functools\nimport jax\nimport numpy as np\nfrom flax import optim\n'
     'from flax.training import checkpoints\n',
     'import functools\nimport os\nimport jax\nimport numpy as np\n'
     'from flax.training import checkpoints, train_state\nimport optax\n'),
    # no stdlib section: a section of its own at the top of the imports (after a docstring,
    # after `from __future__` imports)
    ('"""Train."""\n\nimport jax\nfrom flax import optim\nfrom flax.training import checkpoints\n\n'
     'from mypkg import models\n',
     '"""Train."""\n\nimport os\n\nimport jax\nfrom flax.training import checkpoints, train_state\n'
     'import optax\n\nfrom mypkg import models\n'),
    ('from __future__ import annotations\n\nimport jax\nfrom flax import optim\n'
     'from flax.training import checkpoints\n',
     'from __future__ import annotations\n\nimport os\n\nimport jax\n'
     'from flax.training import checkpoints, train_state\nimport optax\n'),
])
def test_an_added_stdlib_import_goes_to_the_stdlib_section(head, expected):
  assert _rewritten(head + SAVE) == expected + SAVED


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


@pytest.mark.parametrize('line, expected', [
    ('from m import a, c', 'from m import a, b, c'),
    ('from m import c, a', 'from m import c, a, b'),                     # not sorted: after
    ('from m import A, Z, c', 'from m import A, Z, b, c'),               # isort's order_by_type
    ('from m import (a, c,)', 'from m import (a, b, c,)'),
    ('from m import (\n    a,  # about a\n    c,\n)', 'from m import (\n    a,  # about a\n    b,\n    c,\n)'),
    ('from m import (\n    c,\n)', 'from m import (\n    b,\n    c,\n)'),
    ('from m import (\n    a,\n)', 'from m import (\n    a,\n    b,\n)'),
])
def test_merge_names_keeps_the_order_and_the_layout(line, expected):
  node = cst.parse_statement(line + '\n').body[0]
  merged = import_scope.merge_names(node, [cst.ImportAlias(name=cst.Name('b'))])
  assert cst.Module(body=[cst.SimpleStatementLine(body=[merged])]).code == expected + '\n'
