"""Property-based equivalence: every table entry, random pytrees, 2 pmap devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m equivalence_tests.properties

For every entry of the migration table, hypothesis draws pytree structures
(nested dict / list / tuple / ``FrozenDict``, scalar and zero-size leaves) in
float32, and for the entries whose emitted form is the shim's own rule or a
bitwise-equal stock chain also in bfloat16 and float16. The shim's def and the
emitted Optax chain run side by side under ``pmap`` on 2 devices
(``checker.check``): they must agree within the table's bound and every
replica must be bitwise equal. Derandomized (same examples every run); exits
1 with hypothesis' falsifying example on the first failure.
"""
from __future__ import annotations

import sys
import warnings

#: One hyper-parameter set per entry, with weight decay where the emitted form changes with it.
HYPER_PARAMS = {
    'GradientDescent': {'learning_rate': 0.1},
    'Momentum': {'learning_rate': 0.1, 'weight_decay': 1e-2, 'nesterov': True},
    'Adam': {'learning_rate': 0.01, 'weight_decay': 1e-2},
    'AdaBelief': {'learning_rate': 0.01, 'beta2': 0.99},
    'Adadelta': {'learning_rate': 1.0, 'weight_decay': 1e-2},
    'Adagrad': {'learning_rate': 0.05},
    'RMSProp': {'learning_rate': 0.01, 'centered': True},
    'LAMB': {'learning_rate': 0.01, 'weight_decay': 1e-2},
    'LARS': {'learning_rate': 0.3, 'trust_coefficient': 0.01, 'eps': 1e-6, 'weight_decay': 1e-3},
    'Adafactor': {'learning_rate': 0.05, 'beta1': 0.9, 'min_dim_size_to_factor': 2},
}
#: Entries checked in bfloat16 / float16 too. Their emitted form (with HYPER_PARAMS) is the
#: shim's own rule (bound 2: the same arithmetic, rounded at other fusion boundaries) or
#: stock Optax with a measured low-precision bound in the table
#: (``stock_max_ulp_low_precision``).
#: Not LAMB / LARS / Adafactor: their whole-leaf norms and means amplify those rounding
#: differences (measured 5.2 bfloat16 ulp for LAMB between two programs of the same rule).
LOW_PRECISION = {'GradientDescent': 'table', 'Momentum': 'table', 'Adagrad': 'same rule'}


def trees(dtype: str):
  """Hypothesis strategy: pytrees of ``jax.ShapeDtypeStruct`` leaves of ``dtype``."""
  import jax
  import jax.numpy as jnp
  from flax.core import FrozenDict
  from hypothesis import strategies as st
  shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
  leaves = shapes.map(lambda s: jax.ShapeDtypeStruct(s, jnp.dtype(dtype)))
  keys = st.text('abcdefgh', min_size=1, max_size=3)
  return st.recursive(
      leaves,
      lambda inner: st.one_of(
          st.dictionaries(keys, inner, min_size=1, max_size=3),
          st.lists(inner, min_size=1, max_size=3),
          st.lists(inner, min_size=1, max_size=3).map(tuple),
          st.dictionaries(keys, inner, min_size=1, max_size=3).map(FrozenDict)),
      max_leaves=5)


def check_entry(name: str, dtype: str, max_examples: int) -> None:
  """Run the property for one table entry and dtype; raises on a counterexample."""
  from hypothesis import HealthCheck, given, settings
  import optim_compat
  from optim_compat import emitted, spec
  from equivalence_tests import checker
  entry = spec.SPECS[name]
  kwargs = HYPER_PARAMS[name]
  if dtype == 'float32':
    bound = entry.stock_max_ulp
  elif LOW_PRECISION[name] == 'same rule':
    # the same rule, but a different XLA program: XLA:CPU computes bfloat16/float16
    # elementwise ops in float32 and rounds at fusion boundaries, which differ between
    # the shim's step and optax's update + apply_updates (measured up to 1.03 ulp)
    bound = 2
  else:
    bound = entry.stock_max_ulp_low_precision

  @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
            suppress_health_check=list(HealthCheck))
  @given(trees(dtype))
  def prop(tree):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      legacy = getattr(optim_compat, name)(**kwargs)
    tx = emitted.tx_from_source(entry.emit({k: repr(v) for k, v in kwargs.items()}))
    report = checker.check(legacy, tx, tree, steps=3, devices=(2,), mode='pmap', max_ulp=bound)
    assert report.ok, f'{name} {dtype} {tree}:\n{report}'
  prop()


def main(argv=None) -> int:
  import jax
  argv = sys.argv[1:] if argv is None else argv
  examples = int(argv[0]) if argv else 3
  if jax.local_device_count() < 2:
    print('needs XLA_FLAGS=--xla_force_host_platform_device_count=2', file=sys.stderr)
    return 2
  checked = 0
  for name in HYPER_PARAMS:
    for dtype in ('float32',) + (('bfloat16', 'float16') if name in LOW_PRECISION else ()):
      check_entry(name, dtype, examples if dtype == 'float32' else max(1, examples - 1))
      checked += 1
  print(f'properties hold: {checked} entry/dtype pairs')
  return 0


if __name__ == '__main__':
  sys.exit(main())
