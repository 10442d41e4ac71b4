"""The harness patches: jax-0.2-era / flax-0.3-era APIs restored around an example run.

Pure data and logic (no jax import): ``bench/examples_harness/site/sitecustomize.py``
installs the selected patches in the example's process; this module names them,
says what each restores, whether an OM2xx codemod rule could make it unnecessary
(the rewrite of the caller's source; the brief's list of jax / flax API changes),
and picks the set each variant runs with.

A patch is only installed where the stack lacks the API (each installer checks),
and it logs one JSON line ``{"patch": name, "event": "installed" | "used"}`` to
``$EXAMPLES_PATCH_LOG`` when installed and the first time the example reaches it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class Patch:
  name: str
  restores: str       # the legacy API, as the example calls it
  how: str            # what the harness does in its place
  om2xx: bool         # True: a source rewrite (an OM2xx rule) could remove the need
  faithful: bool = True   # False: the stand-in does not compute what the legacy API did


PATCHES: dict[str, Patch] = {p.name: p for p in [
    Patch('old_stack_checkpoints', 'flax 0.5.3 `flax.training.checkpoints` on jax 0.4.13 (the old stack itself, not the examples)',
          'jax.experimental.gda_serialization.serialization -> array_serialization.serialization, a GlobalDeviceArray class nothing is an instance of, and jax.interpreters.xla.DeviceArray = jax.Array (flax 0.5.3 serialization; jax < 0.5 only)', False),
    Patch('optim_dynamic_scale', 'flax.optim.DynamicScale (flax 0.3; gone from flax.optim by 0.5.3: the old stack itself)',
          'flax.optim.dynamic_scale.DynamicScale, where flax 0.5.3 keeps it (OM006 rewrites the name for AFTER)', False),
    Patch('omnistaging', 'jax.config.enable_omnistaging()', 'a no-op (omnistaging is always on)', True),
    Patch('jax_config_module', 'from jax.config import config', "a 'jax.config' module whose `config` is jax.config", True),
    Patch('tree_map', 'jax.tree_map', 'jax.tree_util.tree_map', True),
    Patch('tree_multimap', 'jax.tree_multimap', 'jax.tree_util.tree_map', True),
    Patch('tree_leaves', 'jax.tree_leaves', 'jax.tree_util.tree_leaves', True),
    Patch('device_array', 'jnp.DeviceArray (annotations)', 'jax.Array', True),
    Patch('ops_index_update', 'jax.ops.index_update / jax.ops.index', 'x.at[idx].set(y) / numpy.index_exp', True),
    Patch('pil_fromarray', 'PIL.Image.fromarray(jax array)', 'numpy.asarray first', True),
    Patch('dropout_default', 'nn.Dropout()(x) with no `deterministic`', 'deterministic=False when neither the field nor the call sets it (flax 0.3.0 default)', True),
    Patch('init_frozendict', '`variables.pop(...)` on what `init` returns (a FrozenDict in flax 0.3)', "flax.config 'flax_return_frozendict' = True", True),
    Patch('mha_positional_mask', 'MultiHeadDotProductAttention()(q, kv, mask)', 'the third positional argument passed as mask= (it is inputs_v today)', True),
    Patch('const_array_sizes', 'jnp.array((1, 1, d)) as lax.dynamic_slice sizes under jit',
          'jnp.array of a tuple / list of Python ints returns a numpy int32 array (a constant, as jax 0.2 computed it)', True),
    Patch('lstmcell', 'nn.LSTMCell() without `features`, static nn.LSTMCell.initialize_carry(rng, batch_dims, size)',
          'a LSTMCell (same parameters and math) taking features from the carry, with the static initialize_carry', False),
    Patch('mask', 'jax.mask(fun, in_shapes, out_shape) (removed, no replacement)',
          'calls fun on the padded arguments: the logical shapes are not applied (the padding is computed on; the example masks its loss and metrics itself)',
          False, faithful=False),
    Patch('hashable_arrays', 'iterating a jax array and using the elements as dict keys', 'jax arrays hash by value (0-d) as jax 0.2 DeviceArrays did', False),
    Patch('tf_options_threading', 'ds.options().experimental_threading.<x> = ... (TF: raises today)',
          'Dataset.options() returns a mutable copy (the mutation has no effect on the dataset, as in the TF of 2020)', False),
]}

#: The variants of a run: the stack, whether the sources are rewritten, and the patches allowed.
VARIANTS = {
    'before-unpatched': dict(stack='old', rewrite=False, zero_edit=False, allow='none'),
    'before': dict(stack='old', rewrite=False, zero_edit=False, allow='all'),
    'after': dict(stack='modern', rewrite=True, zero_edit=False, allow='non-om2xx'),
    'after+om2xx-patches': dict(stack='modern', rewrite=True, zero_edit=False, allow='all'),
    'zero-edit': dict(stack='modern', rewrite=False, zero_edit=True, allow='all'),
}


def allowed(variant: str) -> list[str]:
  """The patch names a variant may install, in the table's order.

  Raises:
    KeyError: an unknown variant (the message lists the known ones).
  """
  if variant not in VARIANTS:
    raise KeyError(f'unknown variant {variant!r}; known: {", ".join(VARIANTS)}')
  rule = VARIANTS[variant]['allow']
  if rule == 'none':
    return []
  return [n for n, p in PATCHES.items() if rule == 'all' or not p.om2xx]


def read_log(path: pathlib.Path) -> dict[str, set[str]]:
  """Parse a patch log: {patch name: {'installed', 'used'}}; a missing file is {}.

  Raises:
    ValueError: a line is not a JSON object with a known patch name (names the
      file and the line number).
  """
  out: dict[str, set[str]] = {}
  if not path.exists():
    return out
  for i, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
      name, event = rec['patch'], rec['event']
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f'{path}:{i}: not a patch log record: {line!r}') from e
    if name not in PATCHES:
      raise ValueError(f'{path}:{i}: unknown patch {name!r}')
    out.setdefault(name, set()).add(event)
  return out
