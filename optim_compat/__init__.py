"""optim_compat: the legacy ``flax.optim`` API, running on Optax.

Use ``import optim_compat as optim`` in place of ``from flax import optim``, or
call :func:`install` so that ``import flax.optim`` itself resolves here.

The shim (jax, flax, optax) loads at the first use of any of its names, all at
once; until then ``import optim_compat.spec`` (the migration table, which the
codemod reads) costs no jax import.
"""
__all__ = ['AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
           'LAMB', 'LARS', 'Momentum', 'Optimizer', 'OptimizerDef', 'OptimizerState',
           'RMSProp', 'ReplicatedOptimizer', 'SPECS', 'install', 'to_optax', 'DynamicScale',
           'ModelParamTraversal', 'MultiOptimizer', 'WeightNorm',
           # the legacy view of a TrainState (optim_compat.legacy_view)
           'legacy_state', 'with_legacy_state', 'hyper_params', 'set_hyper_params',
           'apply_gradients']

#: Names the package has once the shim is loaded, beyond ``__all__``: its submodules and
#: the legacy submodule paths (``optim_compat.adam``, ...). A test checks this list.
LOADED_NAMES = frozenset({
    '_LEGACY_MODULES', 'adabelief', 'adadelta', 'adafactor', 'adagrad', 'adam', 'base', 'defs',
    'dynamic_scale', 'lamb', 'lars', 'momentum', 'rmsprop', 'rules', 'sgd', 'spec',
    'transforms', 'weight_norm', 'legacy_view', 'checkpoint_files', 'checkpoint_layout',
    'state_map'}) | frozenset(__all__)
_state = 'new'  # -> 'loading' -> 'loaded'

from optim_compat.install import install  # noqa: E402 - light; the function, not the submodule


def _load() -> None:
  """Import the shim and bind its names here (what this module used to do on import)."""
  global _state
  if _state != 'new':
    return
  _state = 'loading'
  try:
    _bind()
  except BaseException:
    _state = 'new'
    raise
  _state = 'loaded'


def _bind() -> None:
  from flax.traverse_util import ModelParamTraversal

  from optim_compat import base, defs, dynamic_scale, spec, weight_norm
  names = {name: getattr(base, name) for name in (
      'MultiOptimizer', 'Optimizer', 'OptimizerDef', 'OptimizerState', 'ReplicatedOptimizer',
      'to_optax')}
  names.update({name: getattr(defs, name) for name in (
      'LAMB', 'LARS', 'AdaBelief', 'Adadelta', 'Adafactor', 'Adagrad', 'Adam', 'GradientDescent',
      'Momentum', 'RMSProp')})
  names.update(ModelParamTraversal=ModelParamTraversal, DynamicScale=dynamic_scale.DynamicScale,
               install=install, WeightNorm=weight_norm.WeightNorm,
               SPECS=spec.SPECS, _LEGACY_MODULES=defs.LEGACY_MODULES)
  names.update(defs.LEGACY_MODULES)  # optim_compat.adam, .momentum, .sgd, ... (legacy submodules)
  from optim_compat import legacy_view  # to_optax(def, inject=...) wraps base.to_optax
  names.update({name: getattr(legacy_view, name) for name in legacy_view.__all__})
  globals().update(names)


#: Real submodules among them: importing one loads only what it imports
#: (``from optim_compat import spec`` asks for the attribute first).
_SUBMODULES = frozenset({'base', 'defs', 'dynamic_scale', 'rules', 'spec', 'transforms',
                         'weight_norm', 'legacy_view', 'checkpoint_files', 'checkpoint_layout',
                         'state_map'})


def __getattr__(name: str):
  if name in _SUBMODULES:
    import importlib
    return importlib.import_module(f'{__name__}.{name}')
  if name in LOADED_NAMES:
    _load()
    if name in globals():
      return globals()[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  _load()
  return sorted(globals())


#: The legacy submodule paths (``optim_compat.adam``, ...) exist only once the shim has
#: loaded (``defs`` makes them); an import statement naming one loads it first.
_LEGACY_SUBMODULES = LOADED_NAMES - _SUBMODULES - frozenset(__all__) - {'_LEGACY_MODULES'}


class _LegacySubmoduleFinder:
  """``import optim_compat.adam`` / ``from optim_compat.sgd import GradientDescent`` before
  the first use of the shim: the finder loads the shim, then hands over the module it made."""

  @staticmethod
  def find_spec(fullname, path=None, target=None):
    import importlib.util
    import sys
    package, _, name = fullname.rpartition('.')
    if package != __name__ or name not in _LEGACY_SUBMODULES:
      return None
    _load()
    module = sys.modules[fullname]
    return importlib.util.spec_from_loader(fullname, _Existing(module))


class _Existing:
  """A loader that returns an already built module."""

  def __init__(self, module):
    self.module = module

  def create_module(self, spec):
    return self.module

  def exec_module(self, module):
    pass


def _add_finder() -> None:
  import sys
  if not any(isinstance(f, type) and f.__name__ == '_LegacySubmoduleFinder'
             and f.__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.append(_LegacySubmoduleFinder)


_add_finder()
