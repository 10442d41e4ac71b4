"""optim_compat: the legacy ``flax.optim`` API, running on Optax.

Use ``import optim_compat as optim`` in place of ``from flax import optim``, or
call :func:`install` so that ``import flax.optim`` itself resolves here.

Each public name is imported from its module (:data:`HOMES`) at its first use,
by the module ``__getattr__`` below; so ``import optim_compat.spec`` (the
migration table, which the codemod reads) costs no jax import. The legacy
submodule paths are real modules (``optim_compat.adam`` has
``flax.optim.adam``'s names); :data:`optim_compat.legacy_paths.MODULES` maps
each ``flax.optim`` path to its module here.
"""
import importlib
import sys

__all__ = ['AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
           'LAMB', 'LARS', 'Momentum', 'Optimizer', 'OptimizerDef', 'OptimizerState',
           'RMSProp', 'ReplicatedOptimizer', 'SPECS', 'install', 'to_optax', 'DynamicScale',
           'ModelParamTraversal', 'MultiOptimizer', 'WeightNorm',
           # the legacy view of a TrainState (optim_compat.legacy_view)
           'legacy_state', 'legacy_state_dict', 'with_legacy_state', 'hyper_params',
           'set_hyper_params', 'apply_gradients',
           # a TrainState whose params may be a bare array (optim_compat.array_state)
           'ArrayTrainState']

#: Where each public name lives (imported there at its first use).
HOMES = {
    **dict.fromkeys(('MultiOptimizer', 'Optimizer', 'OptimizerDef', 'OptimizerState',
                     'ReplicatedOptimizer'), 'optim_compat.base'),
    # to_optax(def, inject=...) wraps base.to_optax
    **dict.fromkeys(('legacy_state', 'legacy_state_dict', 'with_legacy_state', 'hyper_params',
                     'set_hyper_params', 'apply_gradients', 'to_optax'), 'optim_compat.legacy_view'),
    **dict.fromkeys(('AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
                     'LAMB', 'LARS', 'Momentum', 'RMSProp'), 'optim_compat.defs'),
    'DynamicScale': 'optim_compat.dynamic_scale',
    'ArrayTrainState': 'optim_compat.array_state',
    'WeightNorm': 'optim_compat.weight_norm',
    'SPECS': 'optim_compat.spec',
    'ModelParamTraversal': 'flax.traverse_util',
}
#: The submodules, among them the legacy paths (``optim_compat.adam``, ``.sgd``, ...).
SUBMODULES = frozenset({
    'base', 'defs', 'dynamic_scale', 'emitted', 'legacy_paths', 'legacy_rule', 'spec',
    'state_map', 'transforms', 'update_rules', 'weight_norm', 'checkpoint',
    'checkpoint_files', 'checkpoint_layout', 'checkpoint_convert', 'def_text', 'legacy_view',
    'adabelief', 'adadelta', 'adafactor', 'adagrad', 'adam', 'lamb', 'lars', 'momentum',
    'rmsprop', 'sgd', 'restore_guard', 'array_state'})
#: Every name the package has (a test checks it against ``__all__`` and the modules); read
#: by the codemod to tell whether the shim offers a legacy name, without importing jax.
LOADED_NAMES = frozenset(__all__) | SUBMODULES


def __getattr__(name: str):
  if name in HOMES:
    value = getattr(importlib.import_module(HOMES[name]), name)
    globals()[name] = value  # later uses find it here
    return value
  if name in SUBMODULES:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted({*globals(), *HOMES, *SUBMODULES})


def install() -> bool:
  """Alias ``flax.optim`` to ``optim_compat`` when Flax has no ``flax.optim``.

  After this, ``import flax.optim``, ``from flax import optim``,
  ``flax.optim.Adam`` (after ``import flax``) and the legacy submodules
  (``flax.optim.base``, ``flax.optim.adam``, ``flax.optim.dynamic_scale``, ...: the
  table :data:`optim_compat.legacy_paths.MODULES`) give the shim;
  ``flax.optim.dynamic_scale.DynamicScale`` is Flax's own
  ``flax.training.dynamic_scale.DynamicScale``.

  Returns:
    ``True`` if the alias was installed; ``False`` when a real ``flax.optim``
    exists (Flax <= 0.5.3): then nothing is changed and legacy code keeps
    running on the real module.
  """
  import importlib.util

  import flax

  from optim_compat import legacy_paths
  package = sys.modules[__name__]
  if sys.modules.get('flax.optim') is package:
    return True
  if importlib.util.find_spec('flax.optim') is not None:
    return False
  for legacy, module in legacy_paths.MODULES.items():
    sys.modules[legacy] = importlib.import_module(module)
  flax.optim = package
  return True
