"""``DynamicScale`` at its legacy path (``flax.optim.dynamic_scale``).

The class is Flax's own: ``flax.training.dynamic_scale.DynamicScale`` on
Flax >= 0.6 (so the legacy and modern paths give the *same* class), or the
real ``flax.optim.dynamic_scale.DynamicScale`` on Flax <= 0.5.3.
"""
try:
  from flax.training.dynamic_scale import DynamicScale, DynamicScaleResult
except ImportError:  # Flax <= 0.5.3 has it only under flax.optim
  from flax.optim.dynamic_scale import DynamicScale, DynamicScaleResult  # type: ignore

__all__ = ['DynamicScale', 'DynamicScaleResult']
