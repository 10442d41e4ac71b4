"""Zero-edit mode: make ``flax.optim`` resolve to this shim on Flax >= 0.6."""
from __future__ import annotations

import importlib.util
import sys


def install() -> bool:
  """Alias ``flax.optim`` to ``optim_compat`` when Flax has no ``flax.optim``.

  After this, ``import flax.optim``, ``from flax import optim``,
  ``flax.optim.Adam`` (after ``import flax``) and the legacy submodules
  (``flax.optim.base``, ``flax.optim.adam``, ``flax.optim.dynamic_scale``, ...)
  give the shim; ``flax.optim.dynamic_scale.DynamicScale`` is Flax's own
  ``flax.training.dynamic_scale.DynamicScale``.

  Returns:
    ``True`` if the alias was installed; ``False`` when a real ``flax.optim``
    exists (Flax <= 0.5.3): then nothing is changed and legacy code keeps
    running on the real module.
  """
  import flax
  import optim_compat
  if sys.modules.get('flax.optim') is optim_compat:
    return True
  if importlib.util.find_spec('flax.optim') is not None:
    return False
  sys.modules['flax.optim'] = optim_compat
  flax.optim = optim_compat
  submodules = {'base': optim_compat.base, 'dynamic_scale': optim_compat.dynamic_scale,
                'weight_norm': optim_compat.weight_norm,
                **optim_compat.defs.LEGACY_MODULES}
  for name, module in submodules.items():
    sys.modules[f'flax.optim.{name}'] = module
  return True
