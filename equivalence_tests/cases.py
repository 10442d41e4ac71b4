"""The hyper-parameter sets recorded from real flax.optim 0.5.3.

Plain Python data: imported by the recorder in the old-stack virtualenv and by
the tests on the modern stack. Each case is ``(case_id, def_name, kwargs)``;
the ids name the golden files ``golden/<case_id>.npz``.
"""
import collections

CASES = (
    ('sgd_default', 'GradientDescent', {'learning_rate': 0.1}),
    ('sgd_small_lr', 'GradientDescent', {'learning_rate': 0.013}),
    ('sgd_large_lr', 'GradientDescent', {'learning_rate': 0.7}),
    ('momentum_default', 'Momentum', {'learning_rate': 0.1}),
    ('momentum_beta', 'Momentum', {'learning_rate': 0.05, 'beta': 0.8}),
    ('momentum_wd_nesterov', 'Momentum',
     {'learning_rate': 0.05, 'beta': 0.85, 'weight_decay': 1e-2, 'nesterov': True}),
    ('adam_default', 'Adam', {'learning_rate': 0.001}),
    ('adam_betas', 'Adam', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99, 'eps': 1e-6}),
    ('adam_wd', 'Adam', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99, 'eps': 1e-6,
                         'weight_decay': 1e-2}),
    ('adam_bf16', 'Adam', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99}),
    # bfloat16 with the default beta2=0.999, which rounds to 1.0 in bfloat16: legacy's bias
    # correction 1 - beta2**t is 0, v_hat is inf and the params never move
    ('adam_bf16_default_beta2', 'Adam', {'learning_rate': 0.01}),
    ('adabelief_bf16_default_beta2', 'AdaBelief', {'learning_rate': 0.01}),
    # AdaBelief: eps inside the state and outside the sqrt; (g - m_new)^2
    ('adabelief_default', 'AdaBelief', {'learning_rate': 0.01}),
    ('adabelief_eps', 'AdaBelief', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99,
                                    'eps': 1e-12}),
    ('adabelief_wd', 'AdaBelief', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99,
                                   'eps': 1e-12, 'weight_decay': 1e-2}),
    # Adadelta: lr-scaled decay after the step
    ('adadelta_default', 'Adadelta', {'learning_rate': 1.0}),
    ('adadelta_params', 'Adadelta', {'learning_rate': 0.7, 'rho': 0.85, 'eps': 1e-5}),
    ('adadelta_wd', 'Adadelta', {'learning_rate': 0.7, 'rho': 0.85, 'eps': 1e-5,
                                 'weight_decay': 1e-2}),
    # Adagrad: accumulator from 0, eps outside the sqrt
    ('adagrad_default', 'Adagrad', {'learning_rate': 0.05}),
    ('adagrad_eps', 'Adagrad', {'learning_rate': 0.05, 'eps': 1e-6}),
    ('adagrad_large', 'Adagrad', {'learning_rate': 0.5, 'eps': 1e-3}),
    # RMSProp: eps outside the sqrt; centered state
    ('rmsprop_default', 'RMSProp', {'learning_rate': 0.01}),
    ('rmsprop_eps', 'RMSProp', {'learning_rate': 0.01, 'beta2': 0.85, 'eps': 1e-4}),
    ('rmsprop_centered', 'RMSProp', {'learning_rate': 0.01, 'beta2': 0.85, 'eps': 1e-4,
                                     'centered': True}),
    # LAMB: zero-initialised leaves never move
    ('lamb_default', 'LAMB', {'learning_rate': 0.01}),
    ('lamb_params', 'LAMB', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99, 'eps': 1e-5}),
    ('lamb_wd', 'LAMB', {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99, 'eps': 1e-5,
                         'weight_decay': 1e-2}),
    # LARS: ||g|| + wd*||p|| in the trust ratio, lr-scaled momentum buffer
    ('lars_params', 'LARS', {'learning_rate': 0.3, 'beta': 0.8, 'trust_coefficient': 0.01,
                             'eps': 1e-6}),
    ('lars_nesterov', 'LARS', {'learning_rate': 0.3, 'beta': 0.8, 'trust_coefficient': 0.01,
                               'eps': 1e-6, 'nesterov': True}),
    ('lars_wd', 'LARS', {'learning_rate': 0.3, 'beta': 0.8, 'trust_coefficient': 0.01,
                         'eps': 1e-6, 'weight_decay': 1e-3}),
    # Adafactor: factored 128x128 kernel; 3-D factoring with min_dim 3; plain
    ('adafactor_default', 'Adafactor', {'learning_rate': 0.05}),
    ('adafactor_momentum', 'Adafactor', {'learning_rate': 0.05, 'beta1': 0.9, 'decay_rate': 0.7,
                                         'weight_decay_rate': 1e-3, 'min_dim_size_to_factor': 3,
                                         'epsilon2': 1e-2}),
    ('adafactor_plain', 'Adafactor', {'learning_rate': 0.05, 'factored': False,
                                      'multiply_by_parameter_scale': False,
                                      'clipping_threshold': None}),
)

# MultiOptimizer / focus cases (def name 'MultiOptimizer', or a 'focus' key): the
# traversal filters below select by path only, as legacy requires.
CASES += (
    ('multi_momentum_adam', 'MultiOptimizer', {'groups': (
        ('kernels_except_conv', 'Momentum', {'learning_rate': 0.05, 'beta': 0.8,
                                            'nesterov': True}),
        ('biases', 'Adam', {'learning_rate': 0.01, 'beta1': 0.85}))}),
    ('multi_lars_lamb', 'MultiOptimizer', {'groups': (
        ('kernels_except_conv', 'LARS', {'learning_rate': 0.3, 'trust_coefficient': 0.01,
                                        'weight_decay': 1e-3}),
        ('scalars', 'LAMB', {'learning_rate': 0.01}))}),
    ('focus_adam_head', 'Adam', {'learning_rate': 0.01, 'focus': 'head'}),
    # WeightNorm (legacy raises IndexError on a 0-d leaf: these run without 'temperature')
    ('weightnorm_adam', 'WeightNorm', {'inner': ('Adam', {'learning_rate': 0.01, 'beta1': 0.85}),
                                       'wn_decay': 1e-3}),
    ('weightnorm_momentum', 'WeightNorm', {'inner': ('Momentum', {'learning_rate': 0.05,
                                                                 'beta': 0.8}),
                                           'wn_decay': 1e-3}),
    ('weightnorm_default', 'WeightNorm', {'inner': ('GradientDescent', {'learning_rate': 0.1})}),
)

# Per-call overrides ('apply': a key of APPLY), user-written OptimizerDef
# subclasses (def name 'user:<name>', see USER_DEFS) and non-finite gradients
# ('grads': a key of GRADS).
CASES += (
    ('adam_lr_schedule', 'Adam', {'learning_rate': 0.01, 'beta1': 0.85, 'apply': 'lr_decay'}),
    ('momentum_beta_override', 'Momentum', {'learning_rate': 0.05, 'nesterov': True,
                                            'apply': 'lr_and_beta'}),
    ('multi_keyword_lr', 'MultiOptimizer', {'apply': 'lr_decay', 'groups': (
        ('kernels_except_conv', 'Momentum', {'learning_rate': 0.05, 'beta': 0.8}),
        ('biases', 'Adam', {'learning_rate': 0.01}))}),
    ('multi_group_hyper_params', 'MultiOptimizer', {'apply': 'group_lrs', 'groups': (
        ('kernels_except_conv', 'LAMB', {'learning_rate': 0.01}),
        ('biases', 'Adagrad', {'learning_rate': 0.05}))}),
    ('user_sign_momentum', 'user:SignMomentum', {'learning_rate': 0.01, 'beta': 0.5}),
    ('user_global_clip_sgd', 'user:GlobalClipSGD', {'learning_rate': 0.1, 'max_norm': 20.0}),
    ('adam_nonfinite', 'Adam', {'learning_rate': 0.01, 'grads': 'nonfinite'}),
    ('lamb_nonfinite', 'LAMB', {'learning_rate': 0.01, 'grads': 'nonfinite'}),
)


def _lr_decay(step):
  return {'learning_rate': 0.01 * 0.9 ** step}


def _lr_and_beta(step):
  return {'learning_rate': 0.05 * 0.95 ** step, 'beta': 0.5 + 0.02 * step}


def _group_lrs(step):
  return {'lr0': 0.02 * 0.9 ** step, 'lr1': 0.1 / (1 + step)}


def _per_group(opt_def, values):
  """``hyper_params=[...]``: each group's hyper-parameters with its own learning rate."""
  hps = opt_def.hyper_params
  return {'hyper_params': [hps[0].replace(learning_rate=values['lr0']),
                           hps[1].replace(learning_rate=values['lr1'])]}


#: ``name -> (schedule: step -> {name: float}, to_kwargs: (opt_def, values) -> kwargs or None)``
APPLY = {
    'lr_decay': (_lr_decay, None),
    'lr_and_beta': (_lr_and_beta, None),
    'group_lrs': (_group_lrs, _per_group),
}


def _nonfinite(step, grads):
  """At step 5: NaN, +inf and -inf in three elements (legacy does not guard)."""
  if step != 5:
    return grads
  import numpy as np
  grads = {k: v for k, v in grads.items()}
  enc = dict(grads['encoder'])
  dense = dict(enc['dense'])
  kernel = np.array(dense['kernel'], copy=True)
  kernel[0, 0], kernel[1, 1] = np.nan, np.inf
  dense['kernel'] = kernel
  enc['dense'] = dense
  grads['encoder'] = enc
  head = dict(grads['head'])
  bias = np.array(head['bias'], copy=True)
  bias[3] = -np.inf
  head['bias'] = bias
  grads['head'] = head
  return grads


#: ``name -> (step, grads) -> grads``
GRADS = {'nonfinite': _nonfinite}


def _sign_momentum(optim_module):
  """A user def with its own hyper-parameter and state dataclasses (per-leaf protocol)."""
  import jax.numpy as jnp
  from flax import struct

  @struct.dataclass
  class _SignMomentumHyperParams:
    learning_rate: float
    beta: float

  @struct.dataclass
  class _SignMomentumState:
    trace: jnp.ndarray

  class SignMomentum(optim_module.OptimizerDef):
    def __init__(self, learning_rate=None, beta=0.9):
      super().__init__(_SignMomentumHyperParams(learning_rate, beta))

    def init_param_state(self, param):
      return _SignMomentumState(jnp.zeros_like(param))

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      trace = hyper_params.beta * state.trace + grad
      new_param = param - hyper_params.learning_rate * jnp.sign(trace) * jnp.sqrt(jnp.abs(trace))
      return new_param, _SignMomentumState(trace)
  return SignMomentum


def _global_clip_sgd(optim_module):
  """A user def overriding the whole-tree ``apply_gradient`` (global-norm clipping)."""
  import jax
  import jax.numpy as jnp
  from flax import struct

  @struct.dataclass
  class _ClipHyperParams:
    learning_rate: float
    max_norm: float

  class GlobalClipSGD(optim_module.OptimizerDef):
    def __init__(self, learning_rate=None, max_norm=1.0):
      super().__init__(_ClipHyperParams(learning_rate, max_norm))

    def init_param_state(self, param):
      return ()

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      raise NotImplementedError('whole-tree def')

    def apply_gradient(self, hyper_params, params, state, grads):
      norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
      scale = jnp.minimum(1.0, hyper_params.max_norm / norm)
      new_params = jax.tree_util.tree_map(
          lambda p, g: p - hyper_params.learning_rate * scale * g, params, grads)
      return new_params, optim_module.OptimizerState(state.step + 1, state.param_states)
  return GlobalClipSGD


#: ``name -> optim_module -> OptimizerDef subclass`` (built against real flax.optim or the shim)
USER_DEFS = {'SignMomentum': _sign_momentum, 'GlobalClipSGD': _global_clip_sgd}

FILTERS = {
    'kernels_except_conv': lambda path, _: path.endswith('/kernel') and '/conv/' not in path,
    'biases': lambda path, _: path.endswith('/bias'),
    'scalars': lambda path, _: path in ('/temperature', '/offset'),
    'head': lambda path, _: path.startswith('/head/'),
}


def build(optim_module, def_name: str, kwargs: dict):
  """``(opt_def, focus)`` for a case, with ``optim_module`` the real flax.optim or the shim."""
  kwargs = {k: v for k, v in kwargs.items() if k not in ('apply', 'grads')}
  traversal = optim_module.ModelParamTraversal
  focus = kwargs.pop('focus', None)
  focus = traversal(FILTERS[focus]) if focus else None
  if def_name.startswith('user:'):
    return USER_DEFS[def_name[5:]](optim_module)(**kwargs), focus
  if def_name == 'WeightNorm':
    name, kw = kwargs.pop('inner')
    return optim_module.WeightNorm(getattr(optim_module, name)(**kw), **kwargs), focus
  if def_name == 'MultiOptimizer':
    groups = [(traversal(FILTERS[f]), getattr(optim_module, name)(**kw))
              for f, name, kw in kwargs['groups']]
    return optim_module.MultiOptimizer(*groups), focus
  return getattr(optim_module, def_name)(**kwargs), focus


def run_case(optim_module, case_id: str, **run_kwargs):
  """``core.run_legacy`` of a case: its def, focus, overrides and gradients.

  ``run_kwargs`` go to ``run_legacy`` (``n_devices``, ``use_pmap``,
  ``record``); returns ``(trajectory, final_optimizer)``.
  """
  import warnings
  from equivalence_tests import core
  _, def_name, kwargs = CASE_BY_ID[case_id]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    opt_def, focus = build(optim_module, def_name, kwargs)
  schedule, to_kwargs = APPLY.get(kwargs.get('apply'), (None, None))
  return core.run_legacy(opt_def, params_for(case_id), STEPS, SEED, focus=focus,
                         apply_kwargs=schedule, overrides=to_kwargs,
                         corrupt_grads=GRADS.get(kwargs.get('grads')), **run_kwargs)


def params_for(case_id: str):
  """The reference params of a case (its dtype; no 0-d leaf for WeightNorm)."""
  from equivalence_tests import core
  params = core.reference_params(SEED, DTYPES.get(case_id, 'float32'))
  if case_id.startswith('weightnorm'):
    params = {k: v for k, v in params.items() if k != 'temperature'}
  return params


#: Cases run in another parameter dtype (default float32).
DTYPES = {'adam_bf16': 'bfloat16', 'adam_bf16_default_beta2': 'bfloat16',
          'adabelief_bf16_default_beta2': 'bfloat16'}

#: Cases whose 20 steps run as one compiled call per step in the grids (``grid``,
#: ``pmap_run``): for them one ``lax.scan`` of all steps does not give the per-step
#: programs' numbers bitwise (measured: Adadelta, up to 3 ulp from step 2, with
#: XLA's backend optimisation off; the cause inside XLA is not identified).
#: Checked bitwise against the per-step runs, every step, with the backend
#: optimisation off (the grid's setting): the grid's path (``checker.run_pair``,
#: both optimizers, single / pmap / sharded on 1 and 2 devices, 6 steps) for all
#: 39 other grid cases (2026-11-30), plus 1, 2 and 8 devices for sgd_default,
#: adam_wd, adam_bf16, lamb_wd and adafactor_momentum; pmap_run's path for the 15
#: cases before Adadelta at 1, 2, 4 and 8 devices. With default XLA flags the scan
#: is NOT bitwise: 19 of the 117 grid-path runs differ, by up to 2 ulp of a leaf's
#: largest magnitude (Adam, Momentum, RMSProp centered, LARS, LAMB, Adafactor,
#: WeightNorm, MultiOptimizer); so ``checker.check`` runs one call per step, and
#: the grid runs with the backend optimisation off.
PER_STEP = ('adadelta_default', 'adadelta_params', 'adadelta_wd')

STEPS = 20
#: Steps (after that many updates) whose parameters the golden files keep.
RECORDED_STEPS = (1, 3, 20)
SEED = 0

#: ``case_id -> (case_id, def_name, kwargs)``
CASE_BY_ID = {c[0]: c for c in CASES}


GoldenBound = collections.namedtuple('GoldenBound', 'legacy legacy_state shim shim_state emitted')
GoldenBound.__doc__ = """A case's cross-machine bounds against its golden file, in ulps of each
leaf's largest magnitude (bfloat16 ulps for the :data:`DTYPES` cases; ``core.compare``).

``legacy``: live flax.optim 0.5.3 (old stack), the recorded params; ``legacy_state``:
its final per-parameter state (each state leaf's own largest magnitude); ``shim`` /
``shim_state``: ``optim_compat`` on the modern stack; ``emitted``: the code the
codemod writes (its Optax source; ``to_optax`` of a user def), ``None`` where it
writes none or the table names a divergence (``spec.OptimizerSpec.diverges_on``).
"""


#: ``case_id -> GoldenBound``: how far a run on another machine (another CPU) may be
#: from the committed golden file. The golden files were recorded on one CPU; another
#: one vectorises reductions (norms, means, sums) with another width and order, and
#: has FMA or not, so its numbers differ by a few roundings: every comparison with a
#: golden file uses these bounds, never bitwise (bitwise asserts are kept for two
#: computations of one run, e.g. the shim vs live flax.optim).
#:
#: Measured 2026-12-01 on "Intel(R) Xeon(R) Processor" (lscpu model name; AVX-512 with
#: FP16 and AMX: Sapphire Rapids or later; the golden files reproduce bitwise there) by
#: ``python -m equivalence_tests.golden_drift --impl real|shim|emitted`` under these
#: XLA_FLAGS, each standing in for another CPU's codegen:
#:   none (this CPU);
#:   --xla_backend_extra_options=-force-vector-width=2|4|16 (LLVM's loop vectoriser at
#:     another width: the reduction order of another vector width; the failure mode seen
#:     on an AMD EPYC with AVX-512: norms and reductions move, elementwise defs do not);
#:   --xla_backend_optimization_level=0 (no multiply-add contraction or fusion: as a CPU
#:     without FMA);
#:   modern stack only (jaxlib 0.4.13 has neither flag): --xla_cpu_max_isa=AVX2 and
#:     =AVX (no FMA, no AVX2), --xla_cpu_prefer_vector_width=512.
#: Each bound is max(2 w, w + 2) rounded up, w the worst distance over those runs (the
#: per-run figures: ``golden_drift``'s module docstring names the script; the table is in
#: the crosscpu report). Left out: --xla_cpu_enable_fast_math (not a CPU: it reassociates
#: freely; up to 286 ulp in a WeightNorm state).
#:
#: Checked 2026-12-07 on a real other CPU (an AMD KVM guest, family 175, AVX2 and FMA, no
#: AVX-512; jax 0.10.2): tests/test_golden.py and the golden cases of the shim and check
#: suites passed, 31 of 85 trajectories differed from these goldens, none beyond its bound;
#: the two closest to theirs (emitted adadelta_params 3 ulp, shim weightnorm_default 4.5)
#: have the formula's bound of that measurement (6, 9) instead of the simulated one.
#: The emitted WeightNorm bounds (``transforms.weight_norm`` around the inner def's Optax
#: chain) were measured 2026-12-07 on the Intel CPU above under the modern flags listed:
#: worst 4 / 3.5 / 4 ulp (adam / momentum / default).
GOLDEN_BOUNDS = {
    # case_id: GoldenBound(legacy, legacy_state, shim, shim_state, emitted)
    'sgd_default': GoldenBound(8, 2, 8, 2, 8),
    'sgd_small_lr': GoldenBound(6, 2, 6, 2, 6),
    'sgd_large_lr': GoldenBound(4, 2, 4, 2, 4),
    'momentum_default': GoldenBound(5, 3, 5, 3, 5),
    'momentum_beta': GoldenBound(6, 4, 6, 4, 6),
    'momentum_wd_nesterov': GoldenBound(4, 4, 4, 4, 4),
    'adam_default': GoldenBound(4, 8, 4, 8, 4),
    'adam_betas': GoldenBound(4, 8, 8, 8, 6),
    'adam_wd': GoldenBound(4, 8, 4, 8, 12),
    'adam_bf16': GoldenBound(2, 2, 2, 2, 34),
    'adam_bf16_default_beta2': GoldenBound(2, 2, 2, 2, None),
    'adabelief_bf16_default_beta2': GoldenBound(2, 2, 2, 2, None),
    'adabelief_default': GoldenBound(6, 4, 6, 10, 6),
    'adabelief_eps': GoldenBound(4, 4, 5, 8, 4),
    'adabelief_wd': GoldenBound(6, 4, 6, 8, 14),
    'adadelta_default': GoldenBound(5, 7, 5, 10, 5),
    'adadelta_params': GoldenBound(4, 14, 4, 14, 6),  # (emitted: 3 on the AMD below)
    'adadelta_wd': GoldenBound(4, 14, 4, 14, 14),
    'adagrad_default': GoldenBound(3, 8, 3, 8, 3),
    'adagrad_eps': GoldenBound(4, 8, 4, 8, 4),
    'adagrad_large': GoldenBound(4, 8, 4, 8, 4),
    'rmsprop_default': GoldenBound(4, 4, 4, 4, 6),
    'rmsprop_eps': GoldenBound(4, 6, 4, 6, 5),
    'rmsprop_centered': GoldenBound(4, 6, 4, 6, 5),
    'lamb_default': GoldenBound(4, 8, 4, 8, 4),
    'lamb_params': GoldenBound(4, 8, 4, 8, 4),
    'lamb_wd': GoldenBound(4, 8, 3, 8, 3),
    'lars_params': GoldenBound(4, 12, 4, 12, 4),
    'lars_nesterov': GoldenBound(4, 8, 4, 8, 4),
    'lars_wd': GoldenBound(4, 6, 4, 6, 4),
    'adafactor_default': GoldenBound(5, 6, 4, 6, 4),
    'adafactor_momentum': GoldenBound(12, 6, 12, 6, 12),
    'adafactor_plain': GoldenBound(6, 6, 6, 6, 6),
    'multi_momentum_adam': GoldenBound(8, 4, 8, 4, None),
    'multi_lars_lamb': GoldenBound(4, 10, 3, 5, None),
    'focus_adam_head': GoldenBound(3, 8, 4, 8, None),
    'weightnorm_adam': GoldenBound(10, 16, 8, 18, 8),
    'weightnorm_momentum': GoldenBound(10, 10, 7, 12, 7),
    'weightnorm_default': GoldenBound(14, 9, 9, 8, 8),  # (shim: 4.5 on the AMD below)
    'adam_lr_schedule': GoldenBound(3, 8, 4, 8, 4),
    'momentum_beta_override': GoldenBound(5, 4, 5, 4, None),
    'multi_keyword_lr': GoldenBound(4, 4, 4, 4, None),
    'multi_group_hyper_params': GoldenBound(4, 8, 4, 8, None),
    'user_sign_momentum': GoldenBound(4, 2, 4, 2, 4),
    'user_global_clip_sgd': GoldenBound(10, 2, 6, 2, 6),
    'adam_nonfinite': GoldenBound(4, 8, 4, 8, 4),
    'lamb_nonfinite': GoldenBound(4, 8, 4, 8, 4),
}


def golden_bound(case_id: str) -> GoldenBound:
  """The :data:`GOLDEN_BOUNDS` row of a case.

  Raises:
    KeyError: ``case_id`` has no row (every case of :data:`CASES` has one).
  """
  try:
    return GOLDEN_BOUNDS[case_id]
  except KeyError:
    raise KeyError(f'no cross-machine golden bound for case {case_id!r} '
                   '(equivalence_tests/cases.py GOLDEN_BOUNDS)') from None


#: The "other CPU" CI runs (``tests/test_golden.py``, ``tests/test_legacy_stack.py``):
#: ``stack -> XLA_FLAGS``, flags each jaxlib accepts (an unknown one aborts jax at start).
OTHER_CODEGEN = {
    'legacy': '--xla_backend_extra_options=-force-vector-width=4',  # jaxlib 0.4.13
    'modern': '--xla_cpu_max_isa=AVX',
}
