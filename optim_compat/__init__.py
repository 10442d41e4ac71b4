"""optim_compat: the legacy ``flax.optim`` API, running on Optax.

Use ``import optim_compat as optim`` in place of ``from flax import optim``, or
call :func:`install` so that ``import flax.optim`` itself resolves here.
"""
from optim_compat.base import Optimizer, OptimizerDef, OptimizerState
from optim_compat.defs import Adam, GradientDescent, Momentum
from optim_compat.install import install
from optim_compat.spec import SPECS

__all__ = ['Adam', 'GradientDescent', 'Momentum', 'Optimizer', 'OptimizerDef',
           'OptimizerState', 'SPECS', 'install']
