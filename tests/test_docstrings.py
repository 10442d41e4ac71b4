"""codemod.docstrings: the parameter types a docstring documents (evidence for OM207 and the
cross-module field flow)."""
import libcst as cst
import pytest

from codemod import docstrings


def _types(source: str) -> dict:
  fn = cst.parse_module(source).body[0]
  return docstrings.parameter_types(fn)


@pytest.mark.parametrize('doc, expected', [
    ('Args:\n    p (frozen_dict.FrozenDict): the tree.', {'p': 'frozen_dict.FrozenDict'}),
    ('Args:\n    p (FrozenDict, optional): the tree.', {'p': 'FrozenDict'}),
    ('Args:\n    p: model_utils.TrainState.', {'p': 'model_utils.TrainState'}),
    ('Args:\n    p: dict, test example.', {'p': 'dict'}),
    # the type alone on the description's first line, prose below (jeta's opti_trainer.py)
    ('Args:\n    p: flax.optim.Optimizer\n        An optimizer object.', {'p': 'flax.optim.Optimizer'}),
    ('Args:\n    p: the optimizer\n        to step.', {}),   # prose on the first line
    ('Args:\n    p: the parameters of the model.', {}),        # a description, no type
    ('Args:\n    p (Optional[FrozenDict]): the tree.', {}),     # not a plain dotted name
    ('Args:\n    p (dict or FrozenDict): the tree.', {}),
    ('Args:\n    q (FrozenDict): not a parameter of f.', {}),
    ('Parameters\n    ----------\n    p : flax.core.FrozenDict\n        the tree', {'p': 'flax.core.FrozenDict'}),
    (':param p: the tree\n    :type p: FrozenDict', {'p': 'FrozenDict'}),
    ('No sections at all.', {}),
])
def test_parameter_types(doc, expected):
  assert _types(f'def f(p, k=1):\n  """{doc}\n  """\n  return p\n') == expected


def test_no_docstring_and_documents():
  fn = cst.parse_module('def f(p):\n  return p\n').body[0]
  assert docstrings.parameter_types(fn) == {}
  fn = cst.parse_module('def f(p):\n  """Args:\n    p (core.FrozenDict): t."""\n').body[0]
  assert docstrings.documents(fn, 'p', {'FrozenDict'}) == 'core.FrozenDict'
  assert docstrings.documents(fn, 'p', {'TrainState'}) is None
  assert docstrings.documents(None, 'p', {'FrozenDict'}) is None


def test_the_converted_file_that_never_imported_flax_runs_on_dicts_and_frozendicts():
  """The fixture whose only evidence is a docstring (no flax import): the converted helpers
  accept what today's `init` returns (a dict) and a FrozenDict alike; the original fails on
  the dict (`AttributeError: 'dict' object has no attribute 'unfreeze'`)."""
  import pathlib
  import jax.numpy as jnp
  from flax.core import FrozenDict
  case = pathlib.Path(__file__).parent / 'fixtures' / 'codemod' / \
      'om2xx_frozendict_documented_no_flax_import'
  before, after = {}, {}
  exec(compile((case / 'before.py').read_text(), 'before.py', 'exec'), before)
  exec(compile((case / 'after.py').read_text(), 'after.py', 'exec'), after)
  variables = {'params': {'w': jnp.ones((2, 3))}, 'batch_stats': {'mean': jnp.zeros(3)}}
  with pytest.raises(AttributeError, match='unfreeze'):
    before['param_count'](variables['params'])
  for tree in (variables, FrozenDict(variables)):
    assert after['param_count'](tree['params']) == 6
    state, params = after['split_state'](tree)
    assert set(state) == {'batch_stats'} and params['w'].shape == (2, 3)
    head = {'head': {'w': jnp.ones(2), 'b': jnp.zeros(1)}, 'body': {}}
    assert after['head_size'](head if isinstance(tree, dict) else FrozenDict(head)) == 2


def test_a_file_that_never_says_flax_is_not_skipped_by_the_prefilter():
  """The docstring's word `FrozenDict` is the only evidence and the word `flax` occurs
  nowhere: the prefilter still lets `.unfreeze(` / `FrozenDict` + `.pop(` through."""
  from codemod import engine
  source = ('import jax\n\n\ndef count(params):\n  """Args:\n    params (FrozenDict): all.\n'
            '  """\n  rest, p = params.pop("params")\n'
            '  return len(jax.tree_util.tree_leaves(p.unfreeze()))\n')
  assert 'flax' not in source
  result = engine.rewrite_source(source, 'm.py')
  assert 'rest, p = flax.core.pop(params, "params")' in result.new
  assert 'jax.tree_util.tree_leaves(flax.core.unfreeze(p))' in result.new
  assert 'import flax\n' in result.new
  assert [(f.rule, f.fixed) for f in result.findings] == [('OM207', True)] * 2
