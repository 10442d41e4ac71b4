"""``optim_compat.transforms.weight_norm``: legacy WeightNorm around an Optax transformation
(what the codemod writes for ``WeightNorm(def)``), against the shim's WeightNorm run here, its
legacy checkpoints both ways, and the legacy view of its state. Against real flax.optim:
``tests/test_golden.py`` (the weightnorm cases' emitted rows) and the
``legacy_weight_norm_checkpoint`` program of ``tests/test_codemod.py``."""
import warnings

import jax
import numpy as np
import optax
import pytest
from flax import serialization, traverse_util
from flax.training import train_state

import optim_compat as oc
from equivalence_tests import core
from optim_compat import checkpoint, transforms

RNG = np.random.RandomState(7)
PARAMS = {'dense': {'kernel': RNG.randn(4, 3).astype(np.float32),
                    'bias': RNG.randn(3).astype(np.float32)},
          'conv': RNG.randn(2, 3, 5).astype(np.float32)}
GRADS = [jax.tree_util.tree_map(lambda p: RNG.randn(*p.shape).astype(np.float32), PARAMS)
         for _ in range(8)]

CASES = [  # (the wrapped shim def, the Optax chain the codemod writes for it)
    (lambda: oc.Adam(1e-2, beta1=0.85), lambda: optax.adam(1e-2, b1=0.85, b2=0.999, eps=1e-8)),
    (lambda: oc.Momentum(0.05, beta=0.8), lambda: optax.sgd(0.05, momentum=0.8, nesterov=False)),
    (lambda: oc.GradientDescent(0.1), lambda: optax.sgd(0.1)),
]


def _shim(make_def, decay=1e-3):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    return oc.WeightNorm(make_def(), wn_decay=decay)


def _ulp(a, b) -> float:
  return max(core.ulp_distance(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _train(state, grads):
  step = jax.jit(lambda s, g: s.apply_gradients(grads=g))
  for g in grads:
    state = step(state, g)
  return state


@pytest.mark.parametrize('case', range(len(CASES)), ids=['adam', 'momentum', 'sgd'])
def test_weight_norm_matches_the_shims_weight_norm(case):
  make_def, make_tx = CASES[case]
  opt = _shim(make_def).create(PARAMS)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for g in GRADS:
    opt = step(opt, g)
  # around the shim's own def (to_optax): the same rule, the update added back (<= 1 ulp)
  inner = _train(train_state.TrainState.create(
      apply_fn=None, params=PARAMS,
      tx=transforms.weight_norm(oc.to_optax(make_def()), wn_decay=1e-3)), GRADS)
  assert _ulp(inner.params, opt.target) <= 1
  # around the Optax chain the codemod writes (its own distance from legacy, table-bounded)
  emitted = _train(train_state.TrainState.create(
      apply_fn=None, params=PARAMS, tx=transforms.weight_norm(make_tx(), wn_decay=1e-3)), GRADS)
  assert _ulp(emitted.params, opt.target) <= 4
  assert int(emitted.step) == len(GRADS)


@pytest.mark.parametrize('case', range(len(CASES)), ids=['adam', 'momentum', 'sgd'])
def test_a_legacy_weight_norm_checkpoint_restores_resumes_and_goes_back(case):
  make_def, make_tx = CASES[case]
  opt = _shim(make_def).create(PARAMS)
  for g in GRADS[:4]:
    opt = opt.apply_gradient(g)
  saved = serialization.to_state_dict(opt)
  target = train_state.TrainState.create(
      apply_fn=None, params=jax.tree_util.tree_map(np.zeros_like, PARAMS),
      tx=transforms.weight_norm(make_tx(), wn_decay=1e-3))
  state = checkpoint.restore_legacy(saved, target)
  assert int(state.step) == 4 and isinstance(state.opt_state, transforms.WeightNormState)
  assert _ulp(state.params, opt.target) == 0
  # direction and scale are the legacy per-parameter ones, not re-derived from the params
  kernel = saved['state']['param_states']['dense']['kernel']
  np.testing.assert_array_equal(state.opt_state.direction['dense']['kernel'], kernel['direction'])
  np.testing.assert_array_equal(state.opt_state.scale['dense']['kernel'], kernel['scale'])
  # back to the legacy layout: every field, bitwise
  back = serialization.to_state_dict(checkpoint.to_legacy(state, _shim(make_def)))
  want = traverse_util.flatten_dict(saved, keep_empty_nodes=True)
  got = traverse_util.flatten_dict(back, keep_empty_nodes=True)
  assert set(got) == set(want)
  for key, value in want.items():
    if hasattr(value, 'shape'):
      np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(value), err_msg=str(key))
  # resumed: as the shim continuing from the same checkpoint
  for g in GRADS[4:]:
    opt = opt.apply_gradient(g)
  assert _ulp(_train(state, GRADS[4:]).params, opt.target) <= 4


def test_the_legacy_view_of_a_weight_norm_state_round_trips():
  _, make_tx = CASES[0]
  state = _train(train_state.TrainState.create(
      apply_fn=None, params=PARAMS, tx=transforms.weight_norm(make_tx(), wn_decay=1e-3)),
      GRADS[:3])
  view = oc.legacy_state(state)  # the def inferred from the state: WeightNorm(Adam)
  assert int(view.step) == 3
  kernel = view.param_states['dense']['kernel']
  np.testing.assert_array_equal(kernel.direction, state.opt_state.direction['dense']['kernel'])
  np.testing.assert_array_equal(kernel.direction_state.grad_ema,
                                state.opt_state.inner_state[0].mu['direction']['dense']['kernel'])
  again = oc.with_legacy_state(state, view)
  for a, b in zip(jax.tree_util.tree_leaves(again.opt_state),
                  jax.tree_util.tree_leaves(state.opt_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_use_raises_as_documented():
  tx = transforms.weight_norm(optax.sgd(0.1))
  state = tx.init(PARAMS)
  with pytest.raises(ValueError, match='needs params'):
    tx.update(GRADS[0], state)
  with pytest.raises(IndexError):  # a 0-d leaf, as legacy
    tx.init({'scalar': np.float32(1.0)})


def test_convert_checkpoint_takes_a_weight_norm_and_the_state_resumes(tmp_path, capsys):
  """``convert-checkpoint --optimizer 'WeightNorm(Adam(...), wn_decay=...)'`` writes the state
  ``transforms.weight_norm`` restores (it refused WeightNorm before); without --optimizer a
  WeightNorm checkpoint is named as one; bad WeightNorm arguments exit 2, nothing written."""
  from codemod import cli
  from flax.training import checkpoints
  make_def, make_tx = CASES[0]
  opt = _shim(make_def).create(PARAMS)
  for g in GRADS[:3]:
    opt = opt.apply_gradient(g)
  src, dst = tmp_path / 'legacy.msgpack', tmp_path / 'converted'
  src.write_bytes(serialization.to_bytes(opt))
  assert cli.main(['convert-checkpoint', str(src), str(dst), '--optimizer',
                   'WeightNorm(Adam(learning_rate=1e-2, beta1=0.85), wn_decay=1e-3)']) == 0
  assert 'optim_compat.transforms.weight_norm(optax.adam(' in capsys.readouterr().err
  target = train_state.TrainState.create(
      apply_fn=None, params=jax.tree_util.tree_map(np.zeros_like, PARAMS),
      tx=transforms.weight_norm(make_tx(), wn_decay=1e-3))
  state = checkpoints.restore_checkpoint(str(dst), target=target)
  assert int(state.step) == 3 and _ulp(state.params, opt.target) == 0
  for g in GRADS[3:]:
    opt = opt.apply_gradient(g)
  assert _ulp(_train(state, GRADS[3:]).params, opt.target) <= 4
  assert cli.main(['convert-checkpoint', str(src), str(tmp_path / 'x')]) == 2
  assert 'a WeightNorm checkpoint' in capsys.readouterr().err
  # as a plain Adam: named a WeightNorm checkpoint (helper-38: it said MultiOptimizer)
  assert cli.main(['convert-checkpoint', str(src), str(tmp_path / 'x'), '--optimizer',
                   'Adam(3e-3)']) == 2
  err = capsys.readouterr().err
  assert 'hold WeightNorm states' in err and 'MultiOptimizer' not in err, err
  # the wrapped def mistaken, or a plain Adam checkpoint taken as a WeightNorm: SRC and the
  # path named (helper-39: "the target opt_state (['TraceState']) cannot hold ...")
  plain = tmp_path / 'plain.msgpack'
  plain.write_bytes(serialization.to_bytes(oc.Adam(1e-2).create(PARAMS)))
  for ck, inner, said in ((src, 'Momentum(0.1)', 'opt_state.inner_state (the def WeightNorm wraps)'),
                          (plain, 'Adam(0.1)', 'opt_state: a weight_norm state, and the '
                           'checkpoint holds no WeightNorm state'),
                          (plain, 'Momentum(0.1)', 'holds no WeightNorm state')):
    assert cli.main(['convert-checkpoint', str(ck), str(tmp_path / 'x'), '--optimizer',
                     f'WeightNorm({inner})']) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'convert-checkpoint: {ck}: ') and said in err, err
  for bad in ('WeightNorm()', "WeightNorm(Adam(1e-2), wn_decay='x')", 'WeightNorm(Adam(), foo=1)',
              'WeightNorm(Adam(), wn_decay=1, wn_decay=2)'):
    assert cli.main(['convert-checkpoint', str(src), str(tmp_path / 'y'), '--optimizer', bad]) == 2
    assert '--optimizer' in capsys.readouterr().err
  assert not (tmp_path / 'x').exists() and not (tmp_path / 'y').exists()


@pytest.mark.parametrize('injected', [False, True])
def test_legacy_code_on_the_shim_restores_what_the_migrated_weight_norm_saved(tmp_path, injected):
  """Rollback (helper-38): the migrated program's TrainState checkpoint of
  `transforms.weight_norm(<Adam's chain, injected or not>)` restores into the shim's
  WeightNorm(Adam) optimizer (it fit no candidate transformation before)."""
  from flax.training import checkpoints
  inner = (optax.inject_hyperparams(optax.adam, static_args=('b1', 'b2', 'eps'))(
      learning_rate=1e-2, b1=0.85, b2=0.999, eps=1e-8) if injected else CASES[0][1]())
  state = _train(train_state.TrainState.create(
      apply_fn=None, params=PARAMS, tx=transforms.weight_norm(inner, wn_decay=1e-3)), GRADS[:3])
  checkpoints.save_checkpoint(str(tmp_path), state, 3)
  target = _shim(CASES[0][0]).create(jax.tree_util.tree_map(np.zeros_like, PARAMS))
  opt = checkpoint.restore_legacy(str(tmp_path), target)
  assert int(opt.state.step) == 3 and _ulp(opt.target, state.params) == 0
  kernel = opt.state.param_states['dense']['kernel']
  np.testing.assert_array_equal(kernel.scale, state.opt_state.scale['dense']['kernel'])
  mu = (state.opt_state.inner_state.inner_state if injected else state.opt_state.inner_state)[0].mu
  np.testing.assert_array_equal(kernel.direction_state.grad_ema, mu['direction']['dense']['kernel'])
