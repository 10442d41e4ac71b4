"""optim_compat: the legacy ``flax.optim`` API, running on Optax.

Use ``import optim_compat as optim`` in place of ``from flax import optim``, or
call :func:`install` so that ``import flax.optim`` itself resolves here.
"""
from flax.traverse_util import ModelParamTraversal

from optim_compat.base import (MultiOptimizer, Optimizer, OptimizerDef, OptimizerState,
                               ReplicatedOptimizer, to_optax)
from optim_compat.defs import (LAMB, LARS, AdaBelief, Adadelta, Adafactor, Adagrad, Adam,
                               GradientDescent, Momentum, RMSProp)
from optim_compat import dynamic_scale  # noqa: F401 - legacy submodule path
from optim_compat.defs import LEGACY_MODULES as _LEGACY_MODULES
from optim_compat.dynamic_scale import DynamicScale
from optim_compat.install import install
from optim_compat import weight_norm  # noqa: F401 - legacy submodule path
from optim_compat.weight_norm import WeightNorm
from optim_compat.spec import SPECS

__all__ = ['AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
           'LAMB', 'LARS', 'Momentum', 'Optimizer', 'OptimizerDef', 'OptimizerState',
           'RMSProp', 'ReplicatedOptimizer', 'SPECS', 'install', 'to_optax', 'DynamicScale',
           'ModelParamTraversal', 'MultiOptimizer', 'WeightNorm']

globals().update(_LEGACY_MODULES)  # optim_compat.adam, .momentum, .sgd, ... (legacy submodules)
