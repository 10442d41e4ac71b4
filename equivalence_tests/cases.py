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
)

STEPS = 20
#: Steps (after that many updates) whose parameters the golden files keep.
RECORDED_STEPS = (1, 2, 5, 10, 20)
SEED = 0
