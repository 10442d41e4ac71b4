"""Zero-edit mode: make ``flax.optim`` resolve to this shim on Flax >= 0.6."""
from __future__ import annotations

import importlib.util
import sys


def install() -> bool:
  """Alias ``flax.optim`` to ``optim_compat`` when Flax has no ``flax.optim``.

  After this, ``import flax.optim``, ``from flax import optim`` and
  ``flax.optim.Adam`` (after ``import flax``) give the shim.

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
  return True
