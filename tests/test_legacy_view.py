"""The legacy view of a TrainState (``optim_compat.legacy_view``, issue 17).

In process (modern stack): the view is the checkpoint converter's mapping (bitwise the
same legacy state as ``to_legacy``, a bitwise round trip, under ``jit`` too), the shim's
state where the tx is the shim's own transformation, and the hyper-parameter helpers set
what the codemod's OM002 form sets. Programs (``tests/fixtures/programs/legacy_view/``):
each legacy program runs on real flax.optim 0.5.3 (old stack) and, with its migrated copy,
on the modern stack in one process (``run_modern.py``): migrated vs shim bitwise (or the
table's bound where the tx is stock Optax), migrated vs real flax.optim within the
table's per-def bound.
"""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import jax_utils, serialization
from flax.training import train_state

import optim_compat as oc
from equivalence_tests import cases, core
from optim_compat import checkpoint as ck
from optim_compat import emitted, spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / 'tests' / 'fixtures' / 'programs' / 'legacy_view'
#: the shim against real flax.optim on the modern stack: README <= 3 ulp; 4 with a margin
SHIM_ULP = 4.0
STEPS = 2


def _leaves_equal(a, b, ignore_step_type=False) -> bool:
  la, ta = jax.tree_util.tree_flatten(a)
  lb, tb = jax.tree_util.tree_flatten(b)
  if ta != tb:
    return False
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or not np.array_equal(x, y, equal_nan=True):
      return False
    if x.dtype != y.dtype and not (ignore_step_type and x.dtype.kind == y.dtype.kind == 'i'):
      return False
  return True


def _build(def_name, kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    return cases.build(oc, def_name, dict(kwargs))


def _emitted(def_name, kwargs, injected=False):
  args = {k: repr(v) for k, v in kwargs.items()}
  return emitted.tx_from_source(spec.SPECS[def_name].emit(args, injected))


def _multi_transform(kwargs, injected=False):
  """The codemod's MultiOptimizer / focus form (OM008): multi_transform of the groups'
  emitted txs labelled by the traversal filters' names, the rest frozen."""
  if 'groups' in kwargs:
    groups = [(f, _emitted(name, kw, injected)) for f, name, kw in kwargs['groups']]
  else:
    groups = [('focus', _emitted('Adam', {k: v for k, v in kwargs.items() if k != 'focus'},
                                 injected))]
    filters = {'focus': kwargs['focus']}

  def labels(params):
    tree = jax.tree_util.tree_map(lambda _: 'frozen', params)
    for f, _ in groups:
      name = filters[f] if 'groups' not in kwargs else f
      tree = oc.ModelParamTraversal(cases.FILTERS[name]).update(lambda _, f=f: f, tree)
    return tree
  return optax.multi_transform({**dict(groups), 'frozen': optax.set_to_zero()}, labels)


def _txs(case_id, def_name, kwargs):
  """Every tx the view must read for a case: the emitted chain (plain and injected), the
  multi_transform form, and ``to_optax`` of the def."""
  opt_def, focus = _build(def_name, kwargs)
  full = oc.MultiOptimizer((focus, opt_def)) if focus is not None else opt_def
  out = {'to_optax': oc.to_optax(full)}
  if def_name in spec.SPECS and focus is None:
    out['emitted'] = _emitted(def_name, kwargs)
    out['injected'] = _emitted(def_name, kwargs, True)
  if def_name == 'MultiOptimizer' or focus is not None:
    out['multi_transform'] = _multi_transform(kwargs)
    out['multi_transform_injected'] = _multi_transform(kwargs, True)
  return opt_def, focus, out


def _trained(tx, params, steps=STEPS):
  state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  step = jax.jit(lambda s, g: s.apply_gradients(grads=g))
  for i in range(steps):
    state = step(state, core.reference_grads(params, i))
  return state


def _shim(opt_def, params, focus=None, steps=STEPS):
  opt = opt_def.create(params, focus=focus)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(steps):
    opt = step(opt, core.reference_grads(params, i))
  return opt


PLAIN = [c for c in cases.CASES if not {'apply', 'grads'} & set(c[2])]


@pytest.mark.parametrize('case_id,def_name,kwargs', PLAIN, ids=[c[0] for c in PLAIN])
def test_view_is_the_converters_mapping_and_round_trips_bitwise(case_id, def_name, kwargs):
  """legacy_state is to_legacy's state, bit for bit and dtype for dtype, for every tx the
  codemod emits; writing it back changes nothing (eager and jitted); and where the tx is the
  shim's own transformation, it is the shim Optimizer's state after the same steps."""
  params = cases.params_for(case_id)
  opt_def, focus, txs = _txs(case_id, def_name, kwargs)
  full = oc.MultiOptimizer((focus, opt_def)) if focus is not None else opt_def
  shim = _shim(opt_def, params, focus)
  for name, tx in txs.items():
    state = _trained(tx, params)
    view = oc.legacy_state(state, opt_def, focus=focus)
    assert view.step.dtype == jnp.int32 and int(view.step) == STEPS, name
    assert _leaves_equal(view, ck.to_legacy(state, full).state), name
    assert _leaves_equal(oc.with_legacy_state(state, view, opt_def, focus=focus), state), name
    if name == list(txs)[-1]:  # the most nested form: inject_hyperparams / multi_transform
      jitted = jax.jit(lambda s: oc.with_legacy_state(
          s, oc.legacy_state(s, opt_def, focus=focus), opt_def, focus=focus))(state)
      assert _leaves_equal(jitted, state), name
    if name == 'to_optax' and not def_name.startswith('user:'):
      assert _leaves_equal(view, shim.state), name
    if focus is None and def_name != 'MultiOptimizer':  # the layout read off the opt_state
      free = oc.legacy_state(state)
      assert jax.tree_util.tree_structure(free) == jax.tree_util.tree_structure(view), name
      assert _leaves_equal(free, view), name
      moved = view.replace(step=view.step + 3)
      assert _leaves_equal(oc.with_legacy_state(state, moved),
                           oc.with_legacy_state(state, moved, opt_def)), name


STOCK = [c for c in PLAIN if c[1] in spec.SPECS and 'focus' not in c[2]
         and 'optim_compat' not in spec.SPECS[c[1]].emit({k: repr(v) for k, v in c[2].items()})
         and c[0] not in cases.DTYPES]


@pytest.mark.parametrize('case_id,def_name,kwargs', STOCK, ids=[c[0] for c in STOCK])
def test_stock_optax_state_read_as_the_legacy_fields(case_id, def_name, kwargs):
  """Through stock Optax (optax.adam, optax.lars, optax.rmsprop ...) each legacy field reads
  the Optax field that tracks it: within rounding of the shim's (a swapped or un-negated
  field, e.g. LARS's trace, would be off by the field's whole size)."""
  params = cases.params_for(case_id)
  opt_def, _ = _build(def_name, kwargs)
  view = oc.legacy_state(_trained(_emitted(def_name, kwargs), params), opt_def)
  shim = _shim(opt_def, params).state
  assert int(view.step) == int(shim.step) == STEPS
  for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(view.param_states)[0],
                               jax.tree_util.tree_leaves(shim.param_states)):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=scale * 1e-5,
                               err_msg=f'{case_id} {jax.tree_util.keystr(path)}')


def test_view_without_the_def_refuses_groups_and_focus():
  """The layout read off the opt_state (no def given) needs one def: a state with groups
  (`optax.multi_transform`, the codemod's MultiOptimizer / focus= form) says to pass it."""
  params = {'a': jnp.ones(3), 'b': jnp.ones(2)}
  tx = optax.multi_transform({'x': optax.adam(0.1), 'frozen': optax.set_to_zero()},
                             {'a': 'x', 'b': 'frozen'})
  state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  with pytest.raises(TypeError, match='pass the optimizer_def'):
    oc.legacy_state(state)
  plain = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(0.1))
  with pytest.raises(TypeError, match='focus= needs the optimizer_def'):
    oc.legacy_state(plain, focus=object())


def test_replicated_state_viewed_with_its_device_axis():
  """A jax_utils.replicate'd TrainState (leading device axis on every leaf): legacy_state
  keeps the axis (int32 step of shape (n,)), a write-back round-trips, Adafactor's shapes
  are decided per device (its factoring depends on the leaf shape), and per device (inside
  pmap) the view equals the unreplicated one."""
  params = cases.params_for('adafactor_momentum')
  kwargs = cases.CASE_BY_ID['adafactor_momentum'][2]
  opt_def, _ = _build('Adafactor', kwargs)
  state = _trained(_emitted('Adafactor', kwargs, True), params)
  n = jax.local_device_count()
  replicated = jax_utils.replicate(state)
  view = oc.legacy_state(replicated, opt_def)
  assert view.step.shape == (n,) and view.step.dtype == jnp.int32
  single = oc.legacy_state(state, opt_def)
  for a, b in zip(jax.tree_util.tree_leaves(view), jax.tree_util.tree_leaves(single)):
    assert a.shape == (n,) + b.shape and np.array_equal(a[0], b)
  assert _leaves_equal(oc.with_legacy_state(replicated, view, opt_def), replicated)
  per_device = jax.pmap(lambda s: oc.legacy_state(s, opt_def))(replicated)
  assert _leaves_equal(per_device, view)
  assert oc.hyper_params(replicated, opt_def).learning_rate.shape == (n,)
  lr = oc.set_hyper_params(replicated, opt_def.hyper_params.replace(learning_rate=0.5),
                           opt_def).opt_state.hyperparams['learning_rate']
  assert lr.shape == (n,) and lr.dtype == jnp.float32 and (np.asarray(lr) == 0.5).all()


def test_surgery_in_process_matches_the_shim_bitwise():
  """A skip branch under lax.cond and a moment reset, on a TrainState through the view and
  on the shim Optimizer: the same trajectory bit for bit (LAMB: the emitted tx is the
  faithful transformation), and with the multi_transform form of a MultiOptimizer whose
  frozen leaves (legacy state None) stay frozen."""
  params = cases.params_for('lamb_wd')
  kwargs = cases.CASE_BY_ID['lamb_wd'][2]
  opt_def, _ = _build('LAMB', kwargs)
  multi_kw = cases.CASE_BY_ID['multi_lars_lamb'][2]  # both groups faithful transformations
  multi_def, _ = _build('MultiOptimizer', multi_kw)
  for d, tx in ((opt_def, _emitted('LAMB', kwargs)), (multi_def, _multi_transform(multi_kw))):
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
    opt = d.create(params)
    zero = lambda s: s.replace(**{f: jnp.zeros_like(getattr(s, f)) for f in ('grad_ema',)}) \
        if hasattr(s, 'grad_ema') else s.replace(momentum=jnp.zeros_like(s.momentum))
    is_state = lambda x: hasattr(x, '__dataclass_fields__')

    @jax.jit
    def new_step(state, g, skip):
      def skipped(s):
        legacy = oc.legacy_state(s, d)
        return oc.with_legacy_state(s, legacy.replace(step=legacy.step + 1), d)
      return jax.lax.cond(skip, skipped, lambda s: s.apply_gradients(grads=g), state)

    @jax.jit
    def old_step(opt, g, skip):
      return jax.lax.cond(skip, lambda o: o.replace(state=o.state.replace(step=o.state.step + 1)),
                          lambda o: o.apply_gradient(g), opt)

    for i in range(7):
      g = core.reference_grads(params, i)
      state, opt = new_step(state, g, i == 2), old_step(opt, g, i == 2)
      if i == 4:
        legacy = oc.legacy_state(state, d)
        ps = jax.tree_util.tree_map(zero, legacy.param_states, is_leaf=is_state)
        state = oc.with_legacy_state(state, oc.OptimizerState(legacy.step, ps), d)
        opt = opt.replace(state=oc.OptimizerState(opt.state.step, jax.tree_util.tree_map(
            zero, opt.state.param_states, is_leaf=is_state)))
      assert _leaves_equal(state.params, opt.target), (type(d).__name__, i)
      assert _leaves_equal(oc.legacy_state(state, d), opt.state), (type(d).__name__, i)
    assert int(state.step) == 7
    assert not np.array_equal(state.params['head']['kernel'], params['head']['kernel'])
    if d is multi_def:  # not selected by any group: frozen
      np.testing.assert_array_equal(state.params['encoder']['conv']['kernel'],
                                    params['encoder']['conv']['kernel'])


def test_legacy_state_dict_is_the_optimizers_state_dict():
  """``legacy_state_dict(state, d)`` is ``opt.state_dict()`` of the shim Optimizer trained
  alike: the same nested keys (``target``; ``state`` with ``step`` and ``param_states``) and
  the same leaves bit for bit; replicated, every leaf keeps its device axis."""
  params = cases.params_for('lamb_wd')
  kwargs = cases.CASE_BY_ID['lamb_wd'][2]
  opt_def, _ = _build('LAMB', kwargs)
  state = train_state.TrainState.create(apply_fn=None, params=params,
                                        tx=_emitted('LAMB', kwargs))
  opt = opt_def.create(params)
  for i in range(3):
    g = core.reference_grads(params, i)
    state, opt = state.apply_gradients(grads=g), opt.apply_gradient(g)
  new, old = oc.legacy_state_dict(state, opt_def), opt.state_dict()
  assert sorted(new) == ['state', 'target'] and sorted(new['state']) == ['param_states', 'step']
  assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(old)
  assert _leaves_equal(new, old) and int(new['state']['step']) == 3
  n = jax.local_device_count()
  replicated = oc.legacy_state_dict(jax_utils.replicate(state), opt_def)
  for a, b in zip(jax.tree_util.tree_leaves(replicated), jax.tree_util.tree_leaves(new)):
    assert np.shape(a) == (n,) + np.shape(b) and np.array_equal(a[0], b)


def test_view_errors_name_what_is_wrong():
  params = cases.params_for('adam_betas')
  kwargs = cases.CASE_BY_ID['adam_betas'][2]
  opt_def, _ = _build('Adam', kwargs)
  state = _trained(_emitted('Adam', kwargs), params, steps=2)
  with pytest.raises(ValueError, match=r'opt_state\[0\]\.count = 2 differs from TrainState\.step = 5'):
    oc.legacy_state(state.replace(step=5), opt_def)
  legacy = oc.legacy_state(state, opt_def)
  ps = dict(legacy.param_states)
  ps['head'] = {**ps['head'], 'kernel': ps['head']['kernel'].replace(grad_ema=jnp.zeros((3,)))}
  with pytest.raises(ValueError, match=r'state/param_states/head/kernel/grad_ema: expected '
                                       r'float32\[128, 10\], found float32\[3\]'):
    oc.with_legacy_state(state, legacy.replace(param_states=ps), opt_def)
  momentum, _ = _build('Momentum', {'learning_rate': 0.1})
  with pytest.raises(ValueError, match='momentum'):
    oc.legacy_state(state, momentum)  # an Adam tx read as Momentum's
  with pytest.raises(TypeError, match='legacy def'):
    oc.legacy_state(state, optax.adam(0.1))
  with pytest.raises(TypeError, match='OptimizerState'):
    oc.with_legacy_state(state, legacy.param_states, opt_def)


# --------------------------------------------------------------------------
# hyper-parameters


def _group_def():
  groups = cases.CASE_BY_ID['multi_group_hyper_params'][2]['groups']
  return _build('MultiOptimizer', {'groups': groups})[0], groups


def test_hyper_params_layout_is_the_codemods():
  """The codemod's OM008/OM002 output for a MultiOptimizer with per-group learning rates
  (groups labelled by the traversal names) is the tx of the migrated program, and
  set_hyper_params writes what its per-group tree_set writes."""
  from codemod import engine
  legacy = (PROGRAMS / 'group_hyper_params.py').read_text()
  make = legacy[legacy.index('def make_optimizer'):legacy.index('@jax.jit')]
  source = ('from flax import optim\n\n\n' + make + '\n\ndef step(opt, grads, a, b):\n'
            '  return opt.apply_gradient(grads, hyper_params=[\n'
            '      opt.optimizer_def.hyper_params[0].replace(learning_rate=a),\n'
            '      opt.optimizer_def.hyper_params[1].replace(learning_rate=b)])\n')
  result = engine.rewrite_source(source, 'group.py')
  assert result.error is None and not result.manual, result.findings
  migrated = (PROGRAMS / 'group_hyper_params_migrated.py').read_text()
  tx_source = next(ast.get_source_segment(migrated, n.value) for n in ast.parse(migrated).body
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'TX')
  assert tx_source in result.new
  namespace = {}
  exec(compile(result.new, 'group.py', 'exec'), namespace)  # noqa: S102 - our codemod's output
  params = core.reference_params(0)
  state = namespace['make_optimizer'](params)
  sys.path.insert(0, str(PROGRAMS))
  try:
    import group_hyper_params_migrated as program
  finally:
    sys.path.remove(str(PROGRAMS))
  g = core.reference_grads(params, 0)
  a, b = jnp.float32(0.02), jnp.float32(0.3)
  by_codemod = jax.jit(namespace['step'])(state, g, a, b)

  @jax.jit
  def view_step(state, g, a, b):
    hp0, hp1 = oc.hyper_params(state, program.D, labels=program.LABELS)
    return oc.set_hyper_params(state, [hp0.replace(learning_rate=a), hp1.replace(learning_rate=b)],
                               program.D, labels=program.LABELS).apply_gradients(grads=g)
  assert _leaves_equal(view_step(state, g, a, b), by_codemod)


def test_hyper_params_read_set_and_restored():
  params = cases.params_for('multi_group_hyper_params')
  d, groups = _group_def()
  labels = [f for f, _, _ in groups]
  state = _trained(_multi_transform({'groups': groups}, injected=True), params, steps=1)
  hp = oc.hyper_params(state, d, labels=labels)
  assert [type(h) for h in hp] == [type(h) for h in d.hyper_params]
  assert [float(h.learning_rate) for h in hp] == [np.float32(0.01), np.float32(0.05)]
  assert hp[0].beta1 is d.hyper_params[0].beta1  # not injected: the def's own Python value
  new = oc.set_hyper_params(state, [hp[0].replace(learning_rate=0.5), hp[1]], d, labels=labels)
  assert [float(h.learning_rate) for h in oc.hyper_params(new, d, labels=labels)] == [
      0.5, np.float32(0.05)]
  stored = new.opt_state.inner_states[labels[0]].inner_state.hyperparams['learning_rate']
  assert stored.dtype == jnp.float32 and stored.shape == ()
  # per call: the values held before the call are back afterwards
  g = core.reference_grads(params, 1)
  after = oc.apply_gradients(new, g, d, labels=labels, learning_rate=0.25)
  assert [float(h.learning_rate) for h in oc.hyper_params(after, d, labels=labels)] == [
      0.5, np.float32(0.05)]
  assert _leaves_equal(after.params, oc.set_hyper_params(
      new, [h.replace(learning_rate=0.25) for h in d.hyper_params], d,
      labels=labels).apply_gradients(grads=g).params)
  # keyword overrides go to every group, hyper_params= replaces them: as legacy's
  with pytest.raises(TypeError, match='beta'):
    oc.apply_gradients(state, g, d, labels=labels, beta=0.5)
  with pytest.raises(ValueError, match=r"inner_states\['kernels_except_conv'\]: hyper-parameter "
                                       r"'beta1' of LAMB is not injected"):
    oc.set_hyper_params(state, [hp[0].replace(beta1=0.5), hp[1]], d, labels=labels)
  with pytest.raises(TypeError, match='expected _LAMBHyperParams'):
    oc.set_hyper_params(state, hp[::-1], d, labels=labels)
  with pytest.raises(TypeError, match='a list of 2'):
    oc.set_hyper_params(state, hp[0], d, labels=labels)
  with pytest.raises(ValueError, match=r'pass labels=\[\.\.\.\]'):
    oc.hyper_params(state, d)
  with pytest.raises(ValueError, match='expected 2 labels'):
    oc.hyper_params(state, d, labels=['biases', 'nope'])
  with pytest.raises(TypeError, match="'learning_rate'.*must be a number"):
    oc.set_hyper_params(state, [hp[0].replace(learning_rate='0.1'), hp[1]], d, labels=labels)


def test_hyper_params_of_single_defs_and_focus():
  """A single def: the emitted chain injects learning_rate only (optax.adam's own injected
  eps_root is no legacy hyper-parameter); a faithful transformation injects legacy names;
  focus= is a MultiOptimizer of one group (legacy: a list of one); to_optax injects nothing."""
  params = cases.params_for('adam_betas')
  kwargs = cases.CASE_BY_ID['adam_betas'][2]
  adam, _ = _build('Adam', kwargs)
  state = _trained(_emitted('Adam', kwargs, True), params, steps=1)
  assert 'eps_root' in state.opt_state.hyperparams
  hp = oc.hyper_params(state, adam)
  assert float(hp.learning_rate) == np.float32(0.01) and hp.eps == 1e-6
  set_ = oc.set_hyper_params(state, hp.replace(learning_rate=jnp.float32(0.5)), adam)
  assert float(set_.opt_state.hyperparams['learning_rate']) == 0.5
  assert set_.opt_state.hyperparams['eps_root'] is state.opt_state.hyperparams['eps_root']
  with pytest.raises(ValueError, match="'beta1' of Adam is not injected"):
    oc.set_hyper_params(state, hp.replace(beta1=0.5), adam)
  focus_kw = cases.CASE_BY_ID['focus_adam_head'][2]
  inner, focus = _build('Adam', focus_kw)
  fstate = _trained(_multi_transform(focus_kw, injected=True), params, steps=1)
  [fhp] = oc.hyper_params(fstate, inner, focus=focus)
  fnew = oc.set_hyper_params(fstate, [fhp.replace(learning_rate=0.125)], inner, focus=focus)
  assert float(fnew.opt_state.inner_states['focus'].inner_state.hyperparams['learning_rate']) \
      == 0.125
  plain = _trained(oc.to_optax(adam), params, steps=1)
  assert oc.hyper_params(plain, adam) is adam.hyper_params
  with pytest.raises(ValueError, match="'learning_rate' of Adam is not injected"):
    oc.apply_gradients(plain, core.reference_grads(params, 1), adam, learning_rate=0.5)


def test_injected_table_def_override_matches_the_shim_bitwise():
  """to_optax(def, inject=...) for a table def: per-call beta and learning_rate (traced)
  through apply_gradients equal the shim Optimizer's apply_gradient(g, beta=b, ...) bit for
  bit, calls without overrides use the def's values again, and the state is the legacy
  layout inside inject_hyperparams (legacy_state reads it)."""
  params = cases.params_for('momentum_beta_override')
  d = oc.Momentum(learning_rate=0.05, nesterov=True)
  tx = oc.to_optax(d, inject=('learning_rate', 'beta'))
  state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  assert isinstance(state.opt_state.inner_state, oc.transforms.LegacyRuleState)
  opt = d.create(params)
  new_step = jax.jit(lambda s, g, lr, b: oc.apply_gradients(s, g, d, learning_rate=lr, beta=b))
  old_step = jax.jit(lambda o, g, lr, b: o.apply_gradient(g, learning_rate=lr, beta=b))
  plain_new = jax.jit(lambda s, g: s.apply_gradients(grads=g))
  plain_old = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(6):
    g = core.reference_grads(params, i)
    if i % 2:
      state, opt = plain_new(state, g), plain_old(opt, g)
    else:
      lr, beta = jnp.float32(0.05 * 0.9 ** i), jnp.float32(0.5 + 0.05 * i)
      state, opt = new_step(state, g, lr, beta), old_step(opt, g, lr, beta)
    assert _leaves_equal(state.params, opt.target), i
    assert _leaves_equal(oc.legacy_state(state, d), opt.state), i
    assert float(state.opt_state.hyperparams['beta']) == np.float32(0.9)


class _Flagged(oc.OptimizerDef):
  """A user def with a bool hyper-parameter (inject_hyperparams stores numbers only)."""

  def __init__(self):
    from flax import struct

    @struct.dataclass
    class _HP:
      learning_rate: float
      flag: bool
    super().__init__(_HP(0.1, False))


def test_injected_none_learning_rate_is_set_per_call_as_legacy():
  """A def built without a learning rate (legacy allows None when every apply_gradient
  passes one: efficientnet-jax's `create_optim(..., learning_rate=None)`, its schedule at
  apply time) injects it starting at 0.0; set before each update through `tree_set` (what
  the codemod emits) it steps bitwise as the shim's apply_gradient(g, learning_rate=lr)."""
  params = cases.params_for('momentum_beta_override')
  d = oc.Adam(beta2=0.99, weight_decay=1e-3)
  state = train_state.TrainState.create(
      apply_fn=None, params=params, tx=oc.to_optax(d, inject=('learning_rate',)))
  assert float(state.opt_state.hyperparams['learning_rate']) == 0.0
  opt = d.create(params)
  new_step = jax.jit(lambda s, g, lr: s.replace(opt_state=optax.tree_utils.tree_set(
      s.opt_state, learning_rate=lr)).apply_gradients(grads=g))
  old_step = jax.jit(lambda o, g, lr: o.apply_gradient(g, learning_rate=lr))
  for i in range(4):
    g, lr = core.reference_grads(params, i), jnp.float32(0.01 * 0.8 ** i)
    state, opt = new_step(state, g, lr), old_step(opt, g, lr)
    assert _leaves_equal(state.params, opt.target), i
  with pytest.raises(TypeError, match="'learning_rate' must be a number"):
    oc.to_optax(oc.Adam(learning_rate='x'), inject=('learning_rate',))


def test_injected_weight_norm_forwards_the_rate_to_its_wrapped_def_bitwise():
  """to_optax(WeightNorm(Adam(...)), inject=('learning_rate', 'wn_decay')): a WeightNorm's
  injectable names are its wrapped def's (legacy forwards every override but wn_decay /
  wn_eps to it) and its own two; set through `tree_set` (what the codemod emits for
  nerfies' `optimizer_def = WeightNorm(optimizer_def)`) each step's legacy OptimizerState
  (inside inject_hyperparams) equals the shim's apply_gradient(g, learning_rate=lr,
  wn_decay=w) bit for bit, the params within 2 ulp. Wrapped names that legacy branches on stay static."""
  rng = np.random.RandomState(3)  # (no 0-d leaf: WeightNorm refuses one, as legacy does)
  params = {'kernel': jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            'bias': jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
  d = oc.WeightNorm(oc.Adam(0.02, beta2=0.99), wn_decay=1e-3)
  tx = oc.to_optax(d, inject=('learning_rate', 'wn_decay'))
  state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  assert sorted(state.opt_state.hyperparams) == ['learning_rate', 'wn_decay']
  assert isinstance(state.opt_state.inner_state, oc.OptimizerState)
  opt = d.create(params)
  new_step = jax.jit(lambda s, g, lr, w: s.replace(opt_state=optax.tree_utils.tree_set(
      s.opt_state, learning_rate=lr, wn_decay=w)).apply_gradients(grads=g))
  old_step = jax.jit(lambda o, g, lr, w: o.apply_gradient(g, learning_rate=lr, wn_decay=w))
  for i in range(5):
    g = jax.tree_util.tree_map(lambda p: jnp.sin(p * (i + 1)), params)
    lr, w = jnp.float32(0.02 * 0.8 ** i), jnp.float32(1e-3 * (i + 1))
    state, opt = new_step(state, g, lr, w), old_step(opt, g, lr, w)
    # the legacy state (direction, scale, the wrapped Adam's moments) bit for bit; the params
    # within 2 ulp: a whole-tree def's update is `new - p`, added back to p (p + (new - p) is
    # not always new: docs/numerics.md)
    assert _leaves_equal(state.opt_state.inner_state, opt.state), i
    for new, old in zip(jax.tree_util.tree_leaves(state.params),
                        jax.tree_util.tree_leaves(opt.target)):
      np.testing.assert_array_max_ulp(np.asarray(new), np.asarray(old), maxulp=2)
  with pytest.raises(TypeError, match="'nesterov' cannot be injected"):
    oc.to_optax(oc.WeightNorm(oc.Momentum(0.1)), inject=('nesterov',))
  with pytest.raises(TypeError, match=r"no hyper-parameter\(s\) \['inner'\]"):
    oc.to_optax(d, inject=('inner',))


def test_to_optax_inject_refuses_what_it_cannot_inject():
  d = oc.Momentum(learning_rate=0.05)
  with pytest.raises(TypeError, match=r"no hyper-parameter\(s\) \['temperature'\].*valid: "
                                      r"\['learning_rate', 'beta', 'weight_decay', 'nesterov'\]"):
    oc.to_optax(d, inject=('temperature',))
  with pytest.raises(TypeError, match="'weight_decay' cannot be injected: legacy flax.optim "
                                      "branches on its value"):
    oc.to_optax(d, inject='weight_decay')
  with pytest.raises(TypeError, match="'flag' = False cannot be injected"):
    oc.to_optax(_Flagged(), inject='flag')
  multi, _ = _group_def()
  with pytest.raises(TypeError, match='not a dataclass'):
    oc.to_optax(multi, inject=('learning_rate',))
  assert oc.to_optax(d).init(cases.params_for('momentum_default')).count.dtype == jnp.int32


# --------------------------------------------------------------------------
# programs: real flax.optim 0.5.3 (old stack) vs the migrated code (modern stack)


def _run_modern(program, variants, tmp_path, devices=1):
  env = {**os.environ, 'PYTHONPATH': str(ROOT), 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'}
  out = tmp_path / 'modern'
  out.mkdir()
  proc = subprocess.run([sys.executable, str(PROGRAMS / 'run_modern.py'), program, str(out),
                         *variants], capture_output=True, text=True, cwd=tmp_path, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {name: dict(np.load(out / f'{name}.npz')) for name in ('shim', *variants)}


def _run_old(program, legacy_python, tmp_path, devices=1):
  env = {**os.environ, 'PYTHONPATH': str(ROOT), 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'}
  out = tmp_path / 'old.npz'
  proc = subprocess.run([legacy_python, str(PROGRAMS / f'{program}.py'), str(out)],
                        capture_output=True, text=True, cwd=tmp_path, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return dict(np.load(out))


def _traj(record) -> dict:
  out = {}
  for key, value in record.items():
    step, rest = key.split('/', 1)
    if rest != 'step':
      out.setdefault(int(step), {})[rest] = value
  return out


def _check(runs, old, bitwise, bounds):
  """Every run's steps equal real flax.optim's; ``bitwise`` runs equal the shim's bit for bit;
  each run within its ulp bound of real flax.optim (and of the shim)."""
  steps = sorted(k for k in old if k.endswith('/step'))
  worst = {}
  for name, record in runs.items():
    assert sorted(record) == sorted(old), name
    assert all(np.array_equal(record[k], old[k]) for k in steps), name
    if name in bitwise:
      assert all(np.array_equal(record[k], runs['shim'][k]) for k in record), name
    worst[name], where = core.compare(_traj(record), _traj(old))
    assert worst[name] <= bounds[name], (name, worst[name], where)
    assert core.compare(_traj(record), _traj(runs['shim']))[0] <= bounds[name], name
  return worst


def test_surgery_program_on_both_stacks(legacy_python, tmp_path):
  """surgery.py (Adam; a skip branch, param_states reads, _AdamParamState / OptimizerState
  construction, moments reset): migrated with the shim's transformation it is the shim bit
  for bit, with the emitted optax.adam within Adam's table bound; both within their bounds
  of real flax.optim. Measured here: shim and to_optax 1.5 ulp, optax.adam 2 ulp."""
  old = _run_old('surgery', legacy_python, tmp_path)
  runs = _run_modern('surgery', ['to_optax', 'emitted'], tmp_path)
  _check(runs, old, bitwise={'to_optax'},
         bounds={'shim': SHIM_ULP, 'to_optax': SHIM_ULP,
                 'emitted': float(spec.SPECS['Adam'].stock_max_ulp)})
  assert [int(old[f'{s}/step']) for s in (4, 5, 6)] == [4, 5, 6]  # the skipped step counts
  np.testing.assert_array_equal(old['5/params/head/kernel'], old['4/params/head/kernel'])
  assert not old['8/moments/grad_sq_ema'].any() and old['9/moments/grad_sq_ema'].any()


def test_replicated_surgery_program_on_both_stacks(legacy_python, tmp_path):
  """replicated_surgery.py on 2 pmap devices: the skip branch inside pmap, the reset outside
  it on the replicated state (leading device axis). Migrated: bitwise the shim (optax.sgd and
  the shim's transformation); within the bound of real flax.optim (measured: 2 ulp)."""
  old = _run_old('replicated_surgery', legacy_python, tmp_path, devices=2)
  runs = _run_modern('replicated_surgery', ['emitted', 'to_optax'], tmp_path, devices=2)
  assert old['8/params/head/kernel'].shape[0] == 2
  _check(runs, old, bitwise={'emitted', 'to_optax'},
         bounds={'shim': SHIM_ULP, 'emitted': SHIM_ULP, 'to_optax': SHIM_ULP})
  for record in runs.values():
    assert np.array_equal(record['8/params/head/kernel'][0], record['8/params/head/kernel'][1])
  assert not old['6/momentum/head/kernel'].any() and old['7/momentum/head/kernel'].any()


def test_group_hyper_params_program_on_both_stacks(legacy_python, tmp_path):
  """group_hyper_params.py (MultiOptimizer Momentum + Adagrad, per-group learning rates read
  from optimizer_def.hyper_params and rewritten every step but every third): migrated with
  per-call apply_gradients and with set_hyper_params before every apply, both bitwise the
  shim; measured bitwise real flax.optim too (bound: the table's 0 ulp + the shim's margin)."""
  old = _run_old('group_hyper_params', legacy_python, tmp_path)
  runs = _run_modern('group_hyper_params', ['per_call', 'persistent'], tmp_path)
  _check(runs, old, bitwise={'per_call', 'persistent'},
         bounds={'shim': SHIM_ULP, 'per_call': SHIM_ULP, 'persistent': SHIM_ULP})
  frozen = 'params/encoder/conv/kernel'
  np.testing.assert_array_equal(old[f'10/{frozen}'], core.reference_params(0)['encoder']['conv']['kernel'])


def test_user_def_override_program_on_both_stacks(legacy_python, tmp_path):
  """user_def_override.py (a user def's temperature passed per call on even steps): migrated
  with to_optax(D, inject=('temperature',)) and apply_gradients, within 1 ulp of the shim
  Optimizer (to_optax of a per-leaf user rule adds new_param - param to param: measured 0.5
  ulp) and of real flax.optim."""
  old = _run_old('user_def_override', legacy_python, tmp_path)
  runs = _run_modern('user_def_override', ['inject'], tmp_path)
  _check(runs, old, bitwise=set(), bounds={'shim': SHIM_ULP, 'inject': 1.0})


def test_user_def_override_is_the_shims_transformation_bitwise():
  """In process: the injected user def with per-call overrides is bit for bit the shim's own
  Optax transformation built for each call's hyper-parameters (to_optax(D, temperature=t)),
  and an override's value does not outlive its call."""
  sys.path.insert(0, str(PROGRAMS))
  try:
    import user_def_override_migrated as program
  finally:
    sys.path.remove(str(PROGRAMS))
  d, params = program.D, core.reference_params(0)
  state = train_state.TrainState.create(apply_fn=None, params=params,
                                        tx=oc.to_optax(d, inject=('temperature',)))
  ref = train_state.TrainState.create(apply_fn=None, params=params, tx=oc.to_optax(d))

  @jax.jit
  def ref_step(s, g, t):
    updates, opt_state = oc.to_optax(d, temperature=t).update(g, s.opt_state, s.params)
    return s.replace(step=s.step + 1, params=optax.apply_updates(s.params, updates),
                     opt_state=opt_state)
  for i in range(6):
    g = core.reference_grads(params, i)
    if i % 2:
      state, ref = program.plain_step(state, g), program.plain_step(ref, g)
    else:
      t = np.float32(8.0 / (i + 1))
      state, ref = program.annealed_step(state, g, t), ref_step(ref, g, t)
    assert float(state.opt_state.hyperparams['temperature']) == 4.0
    assert _leaves_equal(state.params, ref.params), i
    assert _leaves_equal(oc.legacy_state(state, d), oc.legacy_state(ref, d)), i
    assert oc.hyper_params(state, d).temperature == 4.0


def test_to_optax_of_what_is_already_optax_says_to_drop_the_wrap():
  """helper-42's D4: a def factory ported to Optax after a run whose callers were converted
  around `oc.to_optax(get_optimizer(cfg), inject=...)`: the wrap failed with
  "'GradientTransformationExtraArgs' object has no attribute 'update_hyper_params'". It
  says what to do now; anything else that is no def is named by its type."""
  with pytest.raises(TypeError, match=r'got an optax\.GradientTransformation.*pass it as tx= '
                                      r'directly \(and.*inject_hyperparams'):
    oc.to_optax(optax.adam(1e-3), inject=('learning_rate',))
  with pytest.raises(TypeError, match=r'pass it as tx= directly$'):
    oc.to_optax(optax.sgd(0.1))
  with pytest.raises(TypeError, match=r'not int$'):
    oc.to_optax(3)
