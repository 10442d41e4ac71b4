"""Legacy ``flax.optim.momentum`` (flax.optim 0.5.3): its names, on the shim.

The path the codemod's fallback and the zero-edit mode give ``flax.optim.momentum``
(``optim_compat.legacy_paths``); the classes are ``optim_compat.defs``'.
"""
from optim_compat.base import OptimizerDef  # noqa: F401
from optim_compat.defs import Momentum, _MomentumHyperParams, _MomentumParamState  # noqa: F401
