"""optim_compat: the legacy ``flax.optim`` API, running on Optax.

Use ``import optim_compat as optim`` in place of ``from flax import optim``, or
call :func:`install` so that ``import flax.optim`` itself resolves here.
"""
from optim_compat.base import (Optimizer, OptimizerDef, OptimizerState, ReplicatedOptimizer,
                               to_optax)
from optim_compat.defs import (LAMB, LARS, AdaBelief, Adadelta, Adafactor, Adagrad, Adam,
                               GradientDescent, Momentum, RMSProp)
from optim_compat.install import install
from optim_compat.spec import SPECS

__all__ = ['AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
           'LAMB', 'LARS', 'Momentum', 'Optimizer', 'OptimizerDef', 'OptimizerState',
           'RMSProp', 'ReplicatedOptimizer', 'SPECS', 'install', 'to_optax']
