"""The hyper-parameter sets recorded from real flax.optim 0.5.3.

Plain Python data: imported by the recorder in the old-stack virtualenv and by
the tests on the modern stack. Each case is ``(case_id, def_name, kwargs)``;
the ids name the golden files ``golden/<case_id>.npz``.
"""

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

FILTERS = {
    'kernels_except_conv': lambda path, _: path.endswith('/kernel') and '/conv/' not in path,
    'biases': lambda path, _: path.endswith('/bias'),
    'scalars': lambda path, _: path in ('/temperature', '/offset'),
    'head': lambda path, _: path.startswith('/head/'),
}


def build(optim_module, def_name: str, kwargs: dict):
  """``(opt_def, focus)`` for a case, with ``optim_module`` the real flax.optim or the shim."""
  kwargs = dict(kwargs)
  traversal = optim_module.ModelParamTraversal
  focus = kwargs.pop('focus', None)
  focus = traversal(FILTERS[focus]) if focus else None
  if def_name == 'WeightNorm':
    name, kw = kwargs.pop('inner')
    return optim_module.WeightNorm(getattr(optim_module, name)(**kw), **kwargs), focus
  if def_name == 'MultiOptimizer':
    groups = [(traversal(FILTERS[f]), getattr(optim_module, name)(**kw))
              for f, name, kw in kwargs['groups']]
    return optim_module.MultiOptimizer(*groups), focus
  return getattr(optim_module, def_name)(**kwargs), focus


def params_for(case_id: str):
  """The reference params of a case (its dtype; no 0-d leaf for WeightNorm)."""
  from equivalence_tests import core
  params = core.reference_params(SEED, DTYPES.get(case_id, 'float32'))
  if case_id.startswith('weightnorm'):
    params = {k: v for k, v in params.items() if k != 'temperature'}
  return params


#: Cases run in another parameter dtype (default float32).
DTYPES = {'adam_bf16': 'bfloat16'}

STEPS = 20
#: Steps (after that many updates) whose parameters the golden files keep.
RECORDED_STEPS = (1, 3, 20)
SEED = 0
