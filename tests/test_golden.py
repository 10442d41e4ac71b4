"""Shim and emitted Optax chains vs golden trajectories of real flax.optim 0.5.3.

The golden files were recorded on one machine; these runs may be on another CPU,
so every comparison with them is within the case's cross-machine bound
(``cases.golden_bound``), never bitwise. Bitwise asserts here are between two
computations of this run (the emitted chain vs the shim).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import optim_compat as optim
from equivalence_tests import cases, core, golden_drift, grid, record_golden
from optim_compat import emitted, spec

ROOT = __import__('pathlib').Path(__file__).resolve().parents[1]
IDS = [c[0] for c in cases.CASES]


@pytest.mark.parametrize('case_id,def_name,kwargs', cases.CASES, ids=IDS)
def test_shim_matches_golden(case_id, def_name, kwargs):
  golden, golden_state = record_golden.load(case_id)
  bound = cases.golden_bound(case_id)
  traj, opt = cases.run_case(optim, case_id, record=cases.RECORDED_STEPS)
  worst, where = core.compare(traj, golden, cases.DTYPES.get(case_id))
  assert worst <= bound.shim, f'{case_id}: {worst} ulp at step/leaf {where}'
  # the final optimizer state too (moments are checkpoint data)
  from flax import serialization, traverse_util
  flat = {'/'.join(k): v for k, v in traverse_util.flatten_dict(
      serialization.to_state_dict(opt)['state']).items()}
  assert int(flat['step']) == int(golden_state['step']) == cases.STEPS
  for key, value in golden_state.items():
    if value.size and key != 'step':
      assert core.ulp_distance(core.storable(flat[key]), value,
                               dtype=cases.DTYPES.get(case_id)) <= bound.shim_state, key


# single-def cases the codemod converts: no focus, and per-call overrides of the learning
# rate only (a per-call beta is flagged OM102 for a human, so it has no emitted form)
SINGLE = [c for c in cases.CASES if grid.converted(c)]


@pytest.mark.parametrize('case_id,def_name,kwargs', SINGLE, ids=[c[0] for c in SINGLE])
def test_emitted_optax_chain_matches_golden(case_id, def_name, kwargs):
  """The Optax source the codemod writes, evaluated, against real flax.optim."""
  entry = spec.SPECS.get(def_name)  # (None: WeightNorm, around a table def's chain)
  schedule = cases.APPLY[kwargs['apply']][0] if 'apply' in kwargs else None
  source = grid.emitted_source((case_id, def_name, kwargs))
  traj = core.run_optax(emitted.tx_from_source(source), cases.params_for(case_id),
                        cases.STEPS, cases.SEED, record=cases.RECORDED_STEPS,
                        hyperparams=schedule, corrupt_grads=cases.GRADS.get(kwargs.get('grads')))
  golden, _ = record_golden.load(case_id)
  dtype = cases.DTYPES.get(case_id)
  worst, where = core.compare(traj, golden, dtype)
  if entry is not None and case_id in entry.diverges_on:  # a named difference: still there
    assert worst > 1000 and case_id in entry.differences, (worst, entry.differences)
    assert cases.golden_bound(case_id).emitted is None
    return
  assert worst <= cases.golden_bound(case_id).emitted, f'{source}: {worst} ulp at {where}'
  if entry is not None and (
      entry.stock_max_ulp if dtype is None else entry.stock_max_ulp_low_precision) == 0:
    # the table says bitwise: the emitted chain and the shim, both run here, agree bitwise
    shim_traj, _ = cases.run_case(optim, case_id, record=cases.RECORDED_STEPS)
    assert core.bitwise_equal(traj, shim_traj), source


USER = [c for c in cases.CASES if c[1].startswith('user:')]


@pytest.mark.parametrize('case_id,def_name,kwargs', USER, ids=[c[0] for c in USER])
def test_to_optax_of_a_user_def_matches_golden(case_id, def_name, kwargs):
  """``to_optax(user_def)`` (what the codemod wraps user defs in) against real flax.optim."""
  opt_def, _ = cases.build(optim, def_name, kwargs)
  traj = core.run_optax(optim.to_optax(opt_def), cases.params_for(case_id), cases.STEPS,
                        cases.SEED, record=cases.RECORDED_STEPS)
  worst, where = core.compare(traj, record_golden.load(case_id)[0])
  assert worst <= cases.golden_bound(case_id).emitted, f'{case_id}: {worst} ulp at {where}'


def test_nonfinite_cases_really_carry_nan_and_inf():
  golden, _ = record_golden.load('adam_nonfinite')
  kernel = golden[cases.STEPS]['encoder/dense/kernel']
  assert np.isnan(kernel[0, 0]) and np.isnan(kernel[1, 1]) and np.isfinite(kernel[2:]).all()
  lamb = record_golden.load('lamb_nonfinite')[0][cases.STEPS]
  # LAMB: a NaN norm makes legacy's `where(||p|| + ||u|| > 0, ...)` pick a trust ratio of 1,
  # so only the poisoned elements go NaN; the rest of the leaf keeps moving
  poisoned = np.isnan(lamb['encoder/dense/kernel'])
  assert poisoned[0, 0] and poisoned[1, 1] and poisoned.sum() == 2
  assert np.isfinite(lamb['head/kernel']).all()


@pytest.mark.parametrize('def_name,kwargs', [
    ('Momentum', {'beta': 0.9, 'weight_decay': 5e-4, 'nesterov': True}),
    ('Momentum', {'beta': 0.8}),
    ('GradientDescent', {}),
    ('Adam', {'beta1': 0.85}),
    ('Adagrad', {'eps': 1e-6}),
    ('LAMB', {'weight_decay': 1e-2}),
    ('LARS', {'weight_decay': 1e-3, 'trust_coefficient': 0.01}),
    ('RMSProp', {'centered': True}),
    ('Adafactor', {'beta1': 0.9}),
])
def test_learning_rate_at_apply_time_matches_injected_form(def_name, kwargs):
  """`apply_gradient(g, learning_rate=lr)` vs the codemod's inject_hyperparams + tree_set."""
  schedule = lambda step: float(np.float32(0.1 * 0.9 ** step))
  params = core.reference_params(cases.SEED)
  shim_traj, _ = core.run_legacy(getattr(optim, def_name)(**kwargs), params, 10, cases.SEED,
                                 apply_kwargs=lambda s: {'learning_rate': np.float32(schedule(s))})
  entry = spec.SPECS[def_name]
  source = entry.emit({k: repr(v) for k, v in kwargs.items()}, learning_rate_injected=True)
  assert 'inject_hyperparams' in source
  tx_traj = core.run_optax(emitted.tx_from_source(source), params, 10, cases.SEED,
                           hyperparams=lambda s: {'learning_rate': schedule(s)})
  worst, where = core.compare(tx_traj, shim_traj)
  bound = 4 if entry.stock_max_ulp == 0 else entry.stock_max_ulp
  assert worst <= bound, f'{source}: {worst} ulp at {where}'
  if entry.stock_max_ulp == 0:
    assert core.bitwise_equal(tx_traj, shim_traj), source


def test_ulp_distance_detects_one_ulp():
  x = np.float32([1.0, -2.0, 0.5])
  y = x.copy()
  y[1] = np.nextafter(np.float32(-2.0), np.float32(0))
  # one float32 step just below 2.0 is 2**-23; the leaf's largest magnitude is 2.0,
  # whose spacing is 2**-22: half an ulp
  assert core.ulp_distance(y, x) == 0.5
  assert core.ulp_distance(x, x) == 0.0
  assert core.ulp_distance(np.float32([1.0 + 2**-23 * 4]), np.float32([1.0])) == 4.0


def test_ulp_distance_of_nan_and_inf():
  x = np.float32([1.0, np.nan, np.inf, -np.inf])
  assert core.ulp_distance(x, x) == 0.0
  for i, other in [(0, np.nan), (1, 1.0), (2, -np.inf), (3, 3.0), (0, np.inf)]:
    y = x.copy()
    y[i] = other
    assert core.ulp_distance(y, x) == np.inf, (i, other)
  worst, where = core.compare({1: {'w': np.float32([np.nan, 2.0])}}, {1: {'w': np.float32([1.0, 2.0])}})
  assert worst == np.inf and where == (1, 'w')


@pytest.mark.parametrize('case_id,nans', [('adam_bf16_default_beta2', 2),
                                          ('adabelief_bf16_default_beta2', 0)])
def test_legacy_bfloat16_with_default_beta2_never_trains(case_id, nans):
  """Recorded from real flax.optim 0.5.3: 0.999 is 1.0 in bfloat16, so 1 - beta2**t = 0."""
  golden, _ = record_golden.load(case_id)
  start = core.flat(core.reference_params(cases.SEED, 'bfloat16'))
  for path, value in golden[cases.STEPS].items():
    moved = ~((value == start[path]) | np.isnan(value))
    assert not moved.any(), path
  # Adam: elements whose first gradient is exactly 0 become 0/0 = NaN
  assert np.isnan(golden[cases.STEPS]['encoder/dense/kernel']).sum() == nans


def test_every_case_has_cross_machine_bounds():
  """One row per recorded case; an emitted bound exactly where the codemod writes code
  whose numbers are legacy's (none for a named divergence, the test above asserts it)."""
  assert set(cases.GOLDEN_BOUNDS) == set(cases.CASE_BY_ID)
  for case in cases.CASES:
    case_id, def_name, _ = case
    emitted = ((grid.converted(case) and case_id not in getattr(
        spec.SPECS.get(def_name), 'diverges_on', ())) or def_name.startswith('user:'))
    bound = cases.golden_bound(case_id)
    assert (bound.emitted is not None) == emitted, case_id
    assert min(b for b in bound if b is not None) > 0, case_id


#: Representative cases run under another codegen (norms and reductions, and elementwise
#: defs, which move without FMA; a few, to keep it cheap).
OTHER_CODEGEN_CASES = ('lamb_wd', 'lars_wd', 'adafactor_momentum', 'weightnorm_default',
                       'adam_wd', 'adagrad_large')


@pytest.mark.parametrize('impl', ['shim', 'emitted'])
def test_golden_bounds_hold_under_another_codegen(impl):
  """"Another CPU" here: XLA limited to AVX (no FMA, no AVX2, vectors of at most 256 bits;
  this CPU has AVX-512), so multiply-adds round twice. The numbers really move (else this
  proves nothing) and stay within the bounds every golden comparison above uses."""
  def drift(flags, case_ids):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=flags, PYTHONPATH=path)
    proc = subprocess.run([sys.executable, '-W', 'ignore', '-m', 'equivalence_tests.golden_drift',
                           '--impl', impl, '--cases', *case_ids],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)['cases']
    assert sorted(out) == sorted(case_ids)
    return out
  out = drift(cases.OTHER_CODEGEN['modern'],
              [c for c in OTHER_CODEGEN_CASES if impl == 'shim' or cases.golden_bound(c).emitted])
  probe = 'adafactor_momentum'  # measured: 1.5 ulp from its golden file here, 6 under AVX
  default = drift('', [probe])
  assert out[probe]['digest'] != default[probe]['digest'], 'the flags changed no bits'
  for case_id, r in out.items():
    bound = cases.golden_bound(case_id)
    assert r['params'] <= (bound.shim if impl == 'shim' else bound.emitted), (case_id, r, bound)
    if impl == 'shim':
      assert r['state'] <= bound.shim_state, (case_id, r, bound)
