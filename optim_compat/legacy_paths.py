"""Where each legacy ``flax.optim`` module lives in the shim, as data.

``optim_compat.install()`` (the zero-edit mode) points these ``sys.modules`` entries at
the shim, and the codemod's shim fallback rewrites a file's imports with the same table
(``codemod.rules.fallback``), so both give ``flax.optim.adam`` the same module.
"""
from __future__ import annotations

from optim_compat import spec

#: ``flax.optim[.<submodule>]`` -> the shim module that has its names.
MODULES = {
    'flax.optim': 'optim_compat',
    'flax.optim.base': 'optim_compat.base',
    'flax.optim.dynamic_scale': 'optim_compat.dynamic_scale',
    'flax.optim.weight_norm': 'optim_compat.weight_norm',
    **{f'flax.optim.{entry.module_name}': f'optim_compat.{entry.module_name}'
       for entry in spec.SPECS.values()},
}
