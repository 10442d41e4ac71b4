"""Harness patches for the flax v0.3.0 examples, installed at interpreter start.

Only active when $EXAMPLES_PATCHES is set (a comma-separated list of patch names
from bench/examples_harness/patches.py; empty: none). $EXAMPLES_ZERO_EDIT=1 also
calls optim_compat.install() first. Each patch checks that the stack lacks the
API before installing anything, and logs to $EXAMPLES_PATCH_LOG (JSON lines).
The example sources are never touched.
"""
import json
import os
import sys

_SELECTED = os.environ.get('EXAMPLES_PATCHES')
_LOG = os.environ.get('EXAMPLES_PATCH_LOG')
_SEEN = set()


def _log(name, event):
  if (name, event) in _SEEN or not _LOG:
    return
  _SEEN.add((name, event))
  with open(_LOG, 'a') as f:
    f.write(json.dumps({'patch': name, 'event': event, 'pid': os.getpid()}) + '\n')


def _used(name, fn):
  def wrapper(*args, **kwargs):
    _log(name, 'used')
    return fn(*args, **kwargs)
  wrapper.__name__ = getattr(fn, '__name__', name)
  wrapper.__wrapped__ = fn
  return wrapper


def _add_module_attrs(module, name, attrs):
  """Serve ``attrs`` from ``module`` where it lacks them; log the first access."""
  missing = {k: v for k, v in attrs.items() if k not in module.__dict__}
  if not missing:
    return False
  old = module.__dict__.get('__getattr__')

  def __getattr__(attr):
    if attr in missing:
      _log(name, 'used')
      return missing[attr]
    if old is not None:
      return old(attr)
    raise AttributeError(f'module {module.__name__!r} has no attribute {attr!r}')

  # Probe: the attribute may exist only through the module's own __getattr__ (a
  # deprecation shim); then the stack still has it.
  really_missing = {}
  for k, v in missing.items():
    try:
      if old is None:
        raise AttributeError
      old(k)
    except AttributeError:
      really_missing[k] = v
  if not really_missing:
    return False
  missing = really_missing
  module.__getattr__ = __getattr__
  return True


def _install(name):
  import jax
  import jax.numpy as jnp
  if name == 'old_stack_checkpoints':
    import importlib.util
    import types
    # flax 0.5.3's msgpack serialization tests isinstance(x, jax.xla.DeviceArray), gone from jax
    # 0.4.13: jax.Array is that type there. Only on the old stack (jax < 0.5): on the modern one
    # the name is OM204's to rewrite.
    xla_patched = False
    if tuple(int(v) for v in jax.__version__.split('.')[:2]) < (0, 5):
      import jax.interpreters.xla as xla
      xla_patched = _add_module_attrs(xla, name, {'DeviceArray': jax.Array})
    try:
      if importlib.util.find_spec('jax.experimental.gda_serialization') is not None:
        return xla_patched
    except (ImportError, ValueError):
      pass
    import importlib.abc
    import importlib.machinery

    class GlobalDeviceArray:  # nothing is one: flax only tests isinstance
      pass

    def build(fullname):
      if fullname == 'jax.experimental.gda_serialization':
        mod = types.ModuleType(fullname)
        mod.__path__ = []
        return mod
      if fullname == 'jax.experimental.gda_serialization.serialization':
        from jax.experimental.array_serialization import serialization
        return serialization
      mod = types.ModuleType(fullname)
      mod.GlobalDeviceArray = GlobalDeviceArray
      return mod

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
      names = ('jax.experimental.gda_serialization', 'jax.experimental.gda_serialization.serialization',
               'jax.experimental.global_device_array')

      def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
          return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname.endswith('gda_serialization'))
        return None

      def create_module(self, spec):
        _log(name, 'used')
        return build(spec.name)

      def exec_module(self, module):
        pass
    sys.meta_path.insert(0, Finder())
    return True
  if name == 'optim_dynamic_scale':
    try:
      import flax.optim as optim
    except ImportError:
      return False  # the modern stack: the codemod or the shim provide it
    if 'DynamicScale' in optim.__dict__:
      return False
    from flax.optim import dynamic_scale  # flax 0.5.3 keeps the class in this submodule
    return _add_module_attrs(optim, name, {'DynamicScale': dynamic_scale.DynamicScale})
  if name == 'omnistaging':
    if hasattr(jax.config, 'enable_omnistaging'):
      return False
    jax.config.enable_omnistaging = _used(name, lambda: None)
    return True
  if name == 'jax_config_module':
    import importlib.util
    import types
    try:
      if importlib.util.find_spec('jax.config') is not None:
        return False
    except (ImportError, ValueError):
      pass

    class _ConfigModule(types.ModuleType):
      def __getattr__(self, attr):
        if attr == 'config':
          _log(name, 'used')
          return jax.config
        return getattr(jax.config, attr)
    sys.modules['jax.config'] = _ConfigModule('jax.config')
    return True
  if name in ('tree_map', 'tree_multimap', 'tree_leaves'):
    target = {'tree_map': jax.tree_util.tree_map, 'tree_multimap': jax.tree_util.tree_map,
              'tree_leaves': jax.tree_util.tree_leaves}[name]
    return _add_module_attrs(jax, name, {name: target})
  if name == 'device_array':
    return _add_module_attrs(jnp, name, {'DeviceArray': jax.Array})
  if name == 'ops_index_update':
    import numpy as np
    return _add_module_attrs(jax.ops, name, {
        'index_update': lambda x, idx, y, **kw: x.at[idx].set(y),
        'index_add': lambda x, idx, y, **kw: x.at[idx].add(y),
        'index': np.index_exp})
  if name == 'pil_fromarray':
    try:
      import PIL.Image
    except ImportError:
      return False
    import numpy as np
    orig = PIL.Image.fromarray

    def fromarray(obj, *args, **kwargs):
      if isinstance(obj, jax.Array):
        _log(name, 'used')
        obj = np.asarray(obj)
      return orig(obj, *args, **kwargs)
    PIL.Image.fromarray = fromarray
    return True
  if name == 'dropout_default':
    import flax.linen as nn
    orig = nn.Dropout.__call__

    def __call__(self, inputs, deterministic=None, *args, **kwargs):
      if deterministic is None and self.deterministic is None:
        _log(name, 'used')
        deterministic = False
      return orig(self, inputs, deterministic, *args, **kwargs)
    nn.Dropout.__call__ = __call__
    return True
  if name == 'init_frozendict':
    import flax
    if not hasattr(flax.config, 'flax_return_frozendict'):
      return False
    if flax.config.flax_return_frozendict:
      return False
    flax.config.update('flax_return_frozendict', True)
    from flax.core import frozen_dict
    orig = frozen_dict.FrozenDict.pop

    def pop(self, *args, **kwargs):  # the call that needs a FrozenDict (dict.pop returns no pair)
      _log(name, 'used')
      return orig(self, *args, **kwargs)
    frozen_dict.FrozenDict.pop = pop
    return True
  if name == 'mha_positional_mask':
    import inspect
    import flax.linen as nn
    params = list(inspect.signature(nn.MultiHeadDotProductAttention.__call__).parameters)
    if params[2] != 'inputs_k':
      return False      # flax <= 0.7: (inputs_q, inputs_kv, mask=None, ...), the legacy order
    orig = nn.MultiHeadDotProductAttention.__call__

    def __call__(self, inputs_q, *args, **kwargs):
      if len(args) == 2 and 'mask' not in kwargs:
        _log(name, 'used')
        kv, mask = args
        return orig(self, inputs_q, kv, mask=mask, **kwargs)
      return orig(self, inputs_q, *args, **kwargs)
    nn.MultiHeadDotProductAttention.__call__ = __call__
    return True
  if name == 'const_array_sizes':
    import numpy as np
    orig = jnp.array

    def array(obj, *args, **kwargs):
      if (not args and not kwargs and isinstance(obj, (tuple, list)) and obj
          and all(type(e) is int for e in obj)):
        _log(name, 'used')
        return np.asarray(obj, dtype=np.int32)
      return orig(obj, *args, **kwargs)
    jnp.array = array
    return True
  if name == 'lstmcell':
    return _install_lstmcell(name)
  if name == 'mask':
    if 'mask' in jax.__dict__:
      return False

    def mask(fun, in_shapes, out_shape=None):
      def masked(args, logical_env):
        _log(name, 'used')
        return fun(*args)
      return masked
    return _add_module_attrs(jax, name, {'mask': mask})
  if name == 'hashable_arrays':
    cls = type(jnp.zeros(()))
    if cls.__hash__ is not None:
      return False

    def __hash__(self):
      _log(name, 'used')
      if self.ndim:
        raise TypeError(f'unhashable: a jax array of shape {self.shape}')
      return hash(self.item())
    try:
      cls.__hash__ = __hash__
    except TypeError:
      _log(name, 'unavailable')
      return False
    return True
  if name == 'tf_options_threading':
    try:
      import tensorflow as tf
    except ImportError:
      return False
    ds_cls = tf.data.Dataset
    try:
      opts = ds_cls.range(1).options()
      threading = opts.experimental_threading if hasattr(opts, 'experimental_threading') else None
      if threading is not None:
        threading.private_threadpool_size = 2
        return False
    except ValueError:
      pass
    orig = ds_cls.options

    def options(self):
      # TF <= 2.15 recomputed the options at each call, so the example's mutation had no effect;
      # today the returned object is immutable and raises. A mutable copy keeps the no-effect.
      _log(name, 'used')
      return tf.data.Options().merge(orig(self))
    ds_cls.options = options
    if not hasattr(tf.data.Options(), 'experimental_threading'):
      tf.data.Options.experimental_threading = property(lambda self: self.threading)
    return True
  raise ValueError(f'EXAMPLES_PATCHES: unknown patch {name!r}')


def _install_lstmcell(name):
  import flax.linen as nn
  import inspect
  import jax
  import jax.numpy as jnp
  sig = inspect.signature(nn.LSTMCell.initialize_carry)
  if 'batch_dims' in sig.parameters:
    return False
  modern = nn.LSTMCell

  class LSTMCell(modern):
    """flax 0.3 LSTMCell: features from the carry, static initialize_carry."""
    features: int = None

    def __call__(self, carry, inputs):
      if self.features is None:
        _log(name, 'used')
        # A frozen dataclass field, filled once from the carry as flax 0.3 did.
        object.__setattr__(self, 'features', carry[0].shape[-1])
      return super().__call__(carry, inputs)

    @staticmethod
    def initialize_carry(rng, batch_dims, size, init_fn=nn.initializers.zeros):
      _log(name, 'used')
      key1, key2 = jax.random.split(rng)
      mem_shape = tuple(batch_dims) + (size,)
      return init_fn(key1, mem_shape), init_fn(key2, mem_shape)

  LSTMCell.__name__ = LSTMCell.__qualname__ = 'LSTMCell'
  nn.LSTMCell = LSTMCell
  import flax.linen.recurrent as rec
  rec.LSTMCell = LSTMCell
  return True


def _main():
  if _SELECTED is None:
    return
  if os.environ.get('EXAMPLES_ZERO_EDIT') == '1':
    import optim_compat
    optim_compat.install()
  for name in filter(None, (n.strip() for n in _SELECTED.split(','))):
    try:
      if _install(name):
        _log(name, 'installed')
    except Exception as e:  # a broken patch must show, not hide the example's own error
      _log(name, 'failed')
      sys.stderr.write(f'[examples harness] patch {name} failed to install: {type(e).__name__}: {e}\n')


_main()
