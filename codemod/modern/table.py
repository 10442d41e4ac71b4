"""The OM2xx knowledge table: removed JAX / Flax APIs and what replaces them.

Pure data (no LibCST, no project imports; the prefilter's regexes are derived here): ``codemod.rules`` registers
:data:`RULES`, ``codemod.modern.rewrite`` applies :data:`APIS`, and the text
prefilter is derived from the entries' words (:func:`prefilter_words`).

Versions, from the JAX changelog, the Flax sources and the two stacks measured
here (old: jax 0.4.13 + flax 0.5.3; modern: jax 0.10.2 + flax 0.12.8):

* ``jax.tree_map``, ``tree_leaves``, ``tree_flatten``, ``tree_unflatten``,
  ``tree_structure``, ``tree_transpose``, ``treedef_is_leaf`` at the top of
  ``jax``: deprecated in 0.4.26, removed in 0.6.0; the same functions live in
  ``jax.tree_util`` on every version. ``jax.tree.*`` only exists from 0.4.25
  on (not on the old stack), so ``jax.tree_util.*`` is the form that runs on
  both stacks, and the one emitted. ``tree_multimap``: deprecated in 0.3.5,
  removed in 0.3.16 ("``jax.tree_util.tree_map`` is a direct replacement").
* ``jax.config.enable_omnistaging()``: omnistaging is on by default since
  0.2.0 and cannot be disabled since 0.2.12; the method is gone (absent on
  both stacks).
* the ``jax.config`` submodule: importing it deprecated in 0.4.25, removed
  in 0.4.29; ``from jax import config`` is the same object on both stacks.
* ``jax.numpy.DeviceArray``: deprecated in 0.4.7, removed in 0.4.14
  (``jax.interpreters.xla.DeviceArray`` likewise); ``jax.Array`` exists since
  0.4.1. On jax 0.4.13 ``jnp.DeviceArray is jax.Array``; before 0.4.1 it was
  the concrete array class, and a tracer was not an instance of it.
* ``jax.ops.index_update`` / ``index_add`` / ``index_mul`` / ``index_min`` /
  ``index_max`` and ``jax.ops.index``: deprecated in 0.2.22, removed in
  0.3.2, replaced by ``x.at[idx].set(y)`` (``add``, ``multiply``, ``min``,
  ``max``), which takes ``indices_are_sorted`` / ``unique_indices`` too.
  ``jax.ops.index`` was NumPy's ``index_exp``.
* ``Module.init`` returns a plain ``dict`` since flax 0.7.1 (a ``FrozenDict``
  before): ``.pop`` / ``.unfreeze()`` are FrozenDict methods;
  ``flax.core.pop`` (flax >= 0.6.6, not in 0.5.3) and ``flax.core.unfreeze``
  (both stacks) take either.
* ``MultiHeadDotProductAttention.__call__``: ``(inputs_q, inputs_kv,
  mask=None[, deterministic=None])`` in flax 0.3.0 - 0.5.3; now
  ``(inputs_q, inputs_k=None, inputs_v=None, *, mask=None, deterministic=None,
  ...)`` (flax 0.7.5): a positional third argument is now the values.
* ``Dropout.__call__``: flax 0.3.0 has ``(inputs, deterministic=False,
  rng=None, broadcast_dims=())``; from 0.3.1 on ``deterministic`` defaults to
  None and must be given (module attribute or call argument), else an error.
* ``jax.host_id`` / ``host_count``: renamed ``jax.process_index`` / ``process_count`` in
  jax 0.2.13; the old names are still there today (jax 0.10.2) as aliases, so the rename
  is for the day they go. ``jax.host_ids`` is left alone (its new name,
  ``process_indices``, is missing from jax 0.4.13), and so is ``Device.host_id`` (an
  attribute of a device).
* pre-Linen ``flax.nn``: gone from flax 0.5.3 and today (both measured). Its activations were
  ``jax.nn``'s functions re-exported (flax 0.3.0 ``flax/nn/activation.py``; ``tanh`` was
  ``jax.numpy.tanh``), and ``jax.nn`` has each of them on both stacks.
* ``jax.mask`` / ``jax.shapecheck``: removed in 0.3.16, no replacement.
* ``nn.LSTMCell``: flax 0.3 took no ``features`` and had a static
  ``initialize_carry(rng, batch_dims, size)``; now ``features`` is required and
  ``initialize_carry(rng, input_shape)`` is a method (flax 0.7.0).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

#: Rule ids, safety and one-line summaries (registered in ``codemod.rules.RULES``).
RULES = (
    ('OM201', 'safe', '`jax.tree_map` / `tree_multimap` / `tree_leaves` / ... -> `jax.tree_util.*` '
                      '(runs on jax 0.4.13 and today; `jax.tree.*` needs jax >= 0.4.25)'),
    ('OM202', 'safe', '`jax.config.enable_omnistaging()` removed (omnistaging is always on)'),
    ('OM203', 'safe', '`from jax.config import config` -> `from jax import config`; '
                      '`import jax.config` -> `import jax`'),
    ('OM204', 'safe', '`jnp.DeviceArray` / `jax.random.KeyArray` in an annotation -> `jax.Array`'),
    ('OM205', 'unsafe', '`jnp.DeviceArray` / `jax.random.KeyArray` as a value (`isinstance`, ...) '
                        '-> `jax.Array`: a tracer is a `jax.Array`, it was no `DeviceArray` before '
                        'jax 0.4.1; a raw uint32 key is a `jax.Array` and was no `KeyArray`'),
    ('OM206', 'safe', '`jax.ops.index_update(x, jax.ops.index[i], y)` (and `index_add` / `_mul` / '
                      '`_min` / `_max`) -> `x.at[i].set(y)` (`add`, `multiply`, `min`, `max`)'),
    ('OM207', 'safe', '`v.pop(k)` / `v.unfreeze()` on what a Flax `init` returns (a dict since '
                      'flax 0.7.1), or on a parameter its docstring documents as a `FrozenDict` '
                      '-> `flax.core.pop(v, k)` / `flax.core.unfreeze(v)`; '
                      '`v.copy({...})` (a FrozenDict-only call: `dict.copy` takes no argument) -> '
                      '`flax.core.copy(v, {...})`'),
    ('OM208', 'unsafe', '`a, b = v.pop(k)` / `v.unfreeze()` on a value not proven to come from '
                        '`init` -> `flax.core.pop` / `flax.core.unfreeze`'),
    ('OM209', 'safe', '`MultiHeadDotProductAttention(...)(q, kv, mask)` -> `(q, kv, mask=mask)` '
                      '(a third positional argument is now the values)'),
    ('OM210', 'safe', '`nn.Dropout(rate)(x)` with no `deterministic` anywhere -> '
                      '`deterministic=False`, flax 0.3.0\'s default (an error since 0.3.1)'),
    ('OM211', 'safe', '`lax.dynamic_slice(x, start, jnp.array((a, b)))` -> sizes as a tuple '
                      '(`slice_sizes` must be static under jit)'),
    ('OM212', 'safe', '`PIL.Image.fromarray(x)` -> `fromarray(np.asarray(x))` (a jax array has '
                      'no `__array_interface__`)'),
    ('OM213', 'safe', '`jax.host_id()` / `jax.host_count()` -> `jax.process_index()` / '
                      '`jax.process_count()` (renamed in jax 0.2.13)'),
    ('OM214', 'safe', '`flax.nn.relu` (and the other pre-Linen activations) -> `jax.nn.relu`, the '
                      'function flax.nn re-exported'),
    ('OM215', 'safe', '`jnp.product` / `alltrue` / `sometrue` / `cumproduct` / `round_` -> '
                      '`jnp.prod` / `all` / `any` / `cumprod` / `round` (NumPy\'s old aliases, '
                      'the same functions; gone from jax.numpy after jax 0.4.13)'),
    ('OM216', 'safe', '`jax.experimental.optimizers` / `stax` -> `jax.example_libraries.*` (moved '
                      'in jax 0.2.25; the same modules, on both stacks)'),
    ('OM217', 'safe', '`jax.lax.tie_in(x, y)` -> `y` where `x` is a name, an attribute or a '
                      'constant (a no-op since omnistaging, jax 0.2.0; gone from today\'s jax)'),
    ('OM221', 'manual', '`jax.mask` / `jax.shapecheck`: removed in jax 0.3.16, no replacement'),
    ('OM222', 'manual', '`nn.LSTMCell()` without `features`, static `initialize_carry`: carry '
                        'shapes need the hidden size'),
    ('OM223', 'manual', 'elements of a jax array used as dict keys (0-d arrays are unhashable)'),
    ('OM224', 'manual', 'a removed JAX / Flax API in a form OM2xx does not rewrite, or a call that '
                        'may be an attention layer with the mask third positional (unproven)'),
)


@dataclasses.dataclass(frozen=True)
class Api:
  """One removed API: how it is found, what replaces it, and why.

  ``old``: qualified names (as LibCST's ``QualifiedNameProvider`` gives them)
  that denote it; ``new``: the replacement's qualified name for renames, else
  the new form in words; ``kind`` selects the rewrite in
  ``codemod.modern.rewrite``; ``words``: strings that must all occur in a
  file's text for the entry to apply (the prefilter); empty = derived from
  ``old`` (the first component and the last one of each name).
  """
  rule: str
  kind: str  # 'rename' | 'relocate' | 'drop_call' | 'scatter' | 'frozendict' | 'mha' | 'dropout'
  #            | 'static_sizes' | 'pil' | 'second_arg' | 'flag'
  old: tuple[str, ...]
  new: Optional[str]
  why: str
  before: str
  after: str
  since: str
  words: tuple[tuple[str, ...], ...] = ()
  #: for 'scatter': the ``.at[...]`` method; for 'flag': the TODO text; for an OM204 'rename':
  #: why the same name as a value (OM205) may differ; for a module 'rename': ``'module'`` (its
  #: ``import old.module [as m]`` statements move too)
  extra: Optional[str] = None


#: Flax's variable collections: ``rest, params = v.pop('params')``, the popped value named
#: after its key, unpacks FrozenDict's ``(rest, value)`` (on a plain dict it would name the
#: second item of the value as the whole value): OM207 rather than OM208. Other target names
#: (``w, b = d.pop('params')``: a pair) stay OM208.
FLAX_COLLECTIONS = frozenset({'params', 'batch_stats', 'cache', 'intermediates', 'params_axes'})

_TREE = ('tree_map', 'tree_leaves', 'tree_flatten', 'tree_unflatten', 'tree_structure',
         'tree_transpose', 'treedef_is_leaf')

#: What pre-Linen ``flax.nn`` exported from ``jax.nn`` (flax 0.3.0 ``flax/nn/__init__.py``).
_NN_ACTIVATIONS = ('celu', 'elu', 'gelu', 'glu', 'leaky_relu', 'log_sigmoid', 'log_softmax',
                   'relu', 'sigmoid', 'soft_sign', 'softmax', 'softplus', 'swish', 'silu')

APIS: tuple[Api, ...] = (
    *(Api('OM201', 'rename', (f'jax.{n}',), f'jax.tree_util.{n}',
          f'`jax.{n}` was an alias of `jax.tree_util.{n}` (the same function)',
          f'jax.{n}(...)', f'jax.tree_util.{n}(...)',
          'deprecated in jax 0.4.26, removed in 0.6.0; jax.tree_util has it on every version')
      for n in _TREE),
    Api('OM201', 'rename', ('jax.tree_multimap', 'jax.tree_util.tree_multimap'),
        'jax.tree_util.tree_map',
        '`tree_map(f, tree, *rest, is_leaf=None)` took over `tree_multimap`: the same mapping',
        'jax.tree_multimap(f, a, b)', 'jax.tree_util.tree_map(f, a, b)',
        'deprecated in jax 0.3.5, removed in 0.3.16'),
    Api('OM202', 'drop_call', ('jax.config.enable_omnistaging', 'jax.config.config.enable_omnistaging'),
        None, 'omnistaging is the only mode (default since jax 0.2.0, cannot be disabled since 0.2.12)',
        'jax.config.enable_omnistaging()', '(statement removed)',
        'gone from jax 0.4.13 and today'),
    Api('OM224', 'flag', ('jax.config.disable_omnistaging', 'jax.config.config.disable_omnistaging'),
        None, 'omnistaging cannot be disabled since jax 0.2.12', 'jax.config.disable_omnistaging()',
        '(by hand)', 'removed in jax 0.2.12',
        extra='omnistaging cannot be disabled since jax 0.2.12: code that relied on eager '
              'constants inside jit (e.g. shapes from jnp values) must use static Python values'),
    Api('OM203', 'relocate', ('jax.config.config',), 'jax.config',
        'the `jax.config` submodule is gone; the config object is `jax.config`',
        'from jax.config import config', 'from jax import config',
        'importing jax.config deprecated in jax 0.4.25, removed in 0.4.29'),
    Api('OM203', 'relocate', ('jax.config',), 'jax',
        '`import jax.config` imports a submodule that no longer exists; `jax.config` is an '
        'attribute of `jax`', 'import jax.config', 'import jax',
        'removed in jax 0.4.29', words=(('import jax.config',),)),
    Api('OM204', 'rename', ('jax.numpy.DeviceArray', 'jax.interpreters.xla.DeviceArray'), 'jax.Array',
        'the array type is `jax.Array` (on jax 0.4.13 `jnp.DeviceArray is jax.Array`)',
        'x: jnp.DeviceArray', 'x: jax.Array',
        'deprecated in jax 0.4.7, removed in 0.4.14; jax.Array since 0.4.1'),
    Api('OM204', 'rename', ('jax.random.KeyArray', 'jax.random.PRNGKeyArray'), 'jax.Array',
        'the key type in an annotation is `jax.Array` (a raw uint32 key is one; a typed key '
        'array is one since jax 0.4.16)',
        'key: jax.random.KeyArray', 'key: jax.Array',
        'deprecated in jax 0.4.16, gone in jax 0.10.2 (in 0.4.13 both are the typed-key class)',
        extra='a raw uint32 key is a `jax.Array` but was no `KeyArray` (`isinstance` checks '
              'change)'),
    *(Api('OM216', 'rename', (f'jax.experimental.{mod}',), f'jax.example_libraries.{mod}',
          f'`jax.experimental.{mod}` moved to `jax.example_libraries.{mod}` (the same module)',
          f'from jax.experimental import {mod}', f'from jax.example_libraries import {mod}',
          'moved in jax 0.2.25, gone from jax.experimental in jax 0.4.13 and today; '
          'jax.example_libraries on both stacks', extra='module')
      for mod in ('optimizers', 'stax')),
    *(Api('OM206', 'scatter', (f'jax.ops.{old}',), f'x.at[idx].{new}(y)',
          f'`jax.ops.{old}(x, idx, y)` was `x[idx] {op} y` out of place, as `x.at[idx].{new}(y)` is',
          f'jax.ops.{old}(x, jax.ops.index[1:], y)', f'x.at[1:].{new}(y)',
          'deprecated in jax 0.2.22, removed in 0.3.2', extra=new)
      for old, new, op in (('index_update', 'set', '='), ('index_add', 'add', '+='),
                           ('index_mul', 'multiply', '*='), ('index_min', 'min', 'min='),
                           ('index_max', 'max', 'max='))),
    Api('OM207', 'frozendict', (), 'flax.core.pop',
        '`init` returns a dict since flax 0.7.1: `dict.pop(k)` returns the value alone',
        "variables, params = variables.pop('params')",
        "variables, params = flax.core.pop(variables, 'params')",
        'flax.core.pop: flax >= 0.6.6 (not in 0.5.3)',
        words=(('flax', '.pop(', 'init'), ('FrozenDict', '.pop('),
               ('flax', re.compile(r'\.pop\(\s*[\'"](?:' + '|'.join(sorted(FLAX_COLLECTIONS))
                                   + r')[\'"]'))),
        extra='pop'),
    Api('OM207', 'frozendict', (), 'flax.core.unfreeze',
        '`init` returns a dict since flax 0.7.1, which has no `.unfreeze()`',
        'variables.unfreeze()', 'flax.core.unfreeze(variables)',
        'flax.core.unfreeze: every flax version', words=(('.unfreeze(',),), extra='unfreeze'),
    Api('OM207', 'frozendict', (), 'flax.core.copy',
        '`init` returns a dict since flax 0.7.1: `dict.copy()` takes no argument, only '
        "FrozenDict's `.copy(add_or_replace)` did",
        "state.copy({'batch_stats': stats})", "flax.core.copy(state, {'batch_stats': stats})",
        'flax.core.copy: flax >= 0.6.6 (not in 0.5.3)', words=(('flax', '.copy({'),), extra='copy'),
    Api('OM209', 'mha', ('flax.linen.MultiHeadDotProductAttention',
                         'flax.linen.attention.MultiHeadDotProductAttention'), None,
        'flax 0.3-0.5: `(inputs_q, inputs_kv, mask=None, deterministic=None)`; now '
        '`(inputs_q, inputs_k=None, inputs_v=None, *, mask=None, deterministic=None)`',
        'attn(q, kv, mask)', 'attn(q, kv, mask=mask)', 'signature changed in flax 0.7.5'),
    Api('OM210', 'dropout', ('flax.linen.Dropout', 'flax.linen.stochastic.Dropout'), None,
        'flax 0.3.0: `__call__(inputs, deterministic=False, rng=None, broadcast_dims=())`; since '
        '0.3.1 `deterministic` defaults to None and must be given',
        'nn.Dropout(rate=0.1)(x)', 'nn.Dropout(rate=0.1)(x, deterministic=False)',
        'default removed in flax 0.3.1'),
    Api('OM211', 'static_sizes', ('jax.lax.dynamic_slice',), None,
        '`slice_sizes` must be concrete: `jnp.array(...)` inside jit is a tracer (an error on '
        'jax 0.4.13 and today)',
        'lax.dynamic_slice(x, s, jnp.array((1, 1, d)))', 'lax.dynamic_slice(x, s, (1, 1, d))',
        'omnistaging (jax 0.2.0) staged jnp.array inside jit'),
    Api('OM212', 'pil', ('PIL.Image.fromarray',), None,
        'Pillow reads `__array_interface__`, which jax arrays lack; `np.asarray` of a NumPy array '
        'is the array itself', 'Image.fromarray(x)', 'Image.fromarray(np.asarray(x))',
        'jax.Array (0.4.1) has no __array_interface__', words=(('fromarray', 'jax'),)),
    *(Api('OM213', 'rename', (f'jax.{old}',), f'jax.{new}',
          f'`jax.{old}` is an alias of `jax.{new}` (same arguments: an optional backend)',
          f'jax.{old}()', f'jax.{new}()',
          'renamed in jax 0.2.13; '
          f'jax.{new} on both stacks (jax 0.4.13 and 0.10.2)')
      for old, new in (('host_id', 'process_index'), ('host_count', 'process_count'))),
    *(Api('OM214', 'rename', (f'flax.nn.{n}', f'flax.nn.activation.{n}'), new,
          f'pre-Linen `flax.nn.{n}` was `{new}` re-exported (the same function)',
          f'flax.nn.{n}(x)', f'{new}(x)',
          f'flax.nn is gone from flax 0.5.3 and today; {new} is on both stacks')
      for n, new in (*((a, f'jax.nn.{a}') for a in _NN_ACTIVATIONS), ('tanh', 'jax.numpy.tanh'))),
    *(Api('OM215', 'rename', (f'jax.numpy.{old}',), f'jax.numpy.{new}',
          f'`jnp.{old}` was an alias of `jnp.{new}` (NumPy\'s deprecated spelling)',
          f'jnp.{old}(x)', f'jnp.{new}(x)',
          f'jnp.{old} is in jax 0.4.13, gone in jax 0.10.2; jnp.{new} is on both')
      for old, new in (('product', 'prod'), ('alltrue', 'all'), ('sometrue', 'any'),
                       ('cumproduct', 'cumprod'), ('round_', 'round'))),
    Api('OM217', 'second_arg', ('jax.lax.tie_in',), None,
        'a no-op since omnistaging (jax 0.2.0): `tie_in(x, y)` returns `y`', 'lax.tie_in(x, y)',
        'y', 'in jax 0.4.13, gone in jax 0.10.2'),
    Api('OM224', 'flag', ('jax.lax.tie_in',), None,
        'a no-op since omnistaging (jax 0.2.0): `tie_in(x, y)` returns `y`', 'lax.tie_in(x, y)',
        'y', 'in jax 0.4.13, gone in jax 0.10.2',
        extra='`{name}(x, y)` returns `y` since omnistaging (jax 0.2.0) and is gone from '
              'today\'s jax: replace the call with its second argument'),
    Api('OM224', 'flag', ('jax.xla_computation',), None,
        'replaced by the ahead-of-time lowering API', 'jax.xla_computation(f)(x)',
        'jax.jit(f).lower(x).compiler_ir()', 'in jax 0.4.13, gone in jax 0.10.2',
        extra='`{name}` is gone from today\'s jax: lower with `jax.jit(f).lower(*args)` and read '
              '`.as_text()` or `.compiler_ir()`'),
    Api('OM221', 'flag', ('jax.mask', 'jax.shapecheck'), None,
        'shape polymorphism by masking was removed with no replacement', '@jax.mask(...)',
        '(by hand)', 'removed in jax 0.3.16',
        extra='`{name}` was removed in jax 0.3.16 with no replacement: pad inputs to a fixed shape '
              'and pass an explicit mask (or jit per shape), then delete this use'),
    Api('OM222', 'flag', ('flax.linen.LSTMCell', 'flax.linen.recurrent.LSTMCell',
                          'flax.linen.OptimizedLSTMCell', 'flax.linen.GRUCell',
                          'flax.linen.recurrent.OptimizedLSTMCell', 'flax.linen.recurrent.GRUCell'),
        None, 'cells take `features` now and `initialize_carry(rng, input_shape)` is a method',
        'nn.LSTMCell.initialize_carry(rng, (), 128)',
        'nn.LSTMCell(features=128).initialize_carry(rng, (1,))', 'changed in flax 0.7.0',
        extra='{name}: give the cell `features=<hidden size>` and make the carry with '
              '`{cell}(features=H).initialize_carry(rng, batch_dims + (input_features,))` '
              '(carry shapes batch_dims + (H,), zeros as before)'),
    Api('OM223', 'dict_keys', (), None,
        'iterating a jax array yields 0-d jax arrays, which are unhashable',
        'for k in jnp.unique(y): counts[k] = ...', 'for k in jnp.unique(y).tolist(): ...',
        'jax arrays were never hashable'),  # no words of its own: checked in the files the
    #                                         other entries' words select (`jax` + `for ` alone
    #                                         would send nearly every JAX file to a parse)
)

#: ``jax.ops.index`` and its NumPy twins: ``jax.ops.index[i]`` is ``i``.
#: Flax functions that return a ``dict`` or a ``FrozenDict`` (of the kind they are given, or
#: always a FrozenDict): ``.unfreeze()`` / ``.pop(k)`` on what they return is OM207 (proven),
#: as on an ``init`` result. (``checkpoints.convert_pre_linen`` returns a dict for a dict:
#: dopamine's ``convert_pre_linen(bundle['online_params']).unfreeze()`` fails on today's
#: checkpoints.)
FLAX_TREE_CALLS = frozenset({
    'flax.training.checkpoints.convert_pre_linen', 'flax.core.freeze', 'flax.core.unfreeze',
    'flax.core.frozen_dict.freeze', 'flax.core.frozen_dict.unfreeze', 'flax.core.FrozenDict',
    'flax.core.frozen_dict.FrozenDict', 'flax.core.copy', 'flax.core.frozen_dict.copy'})

#: The last name of a type a parameter's docstring gives (``p (frozen_dict.FrozenDict): ...``)
#: that proves ``p.unfreeze()`` / ``p.pop(k)`` act on a FrozenDict (or, since flax 0.7.1, the
#: dict ``init`` returns in its place): OM207 rather than OM208.
FROZEN_DICT_TYPES = frozenset({'FrozenDict'})

INDEX_HELPERS = frozenset({'jax.ops.index', 'jax.numpy.index_exp', 'numpy.index_exp'})
#: Calls whose value is a jax array (for OM206 / OM223: ``x.at`` needs one).
JAX_VALUE_PREFIXES = ('jax.numpy.', 'jax.lax.', 'jax.random.', 'jax.nn.', 'jax.ops.', 'jax.device_put')


def _dotted(parts) -> str:
  """A regex of the dotted name ``parts`` as source may spell it (spaces around dots)."""
  return r'\s*\.\s*'.join(map(re.escape, parts))


def spellings(qname: str) -> tuple[tuple, ...]:
  """The text tests a file must pass for an expression in it to resolve to ``qname``
  (as ``QualifiedNameProvider`` resolves: an ``import``, a ``from`` import, either with
  ``as``). One group per way to bind a prefix of ``qname``: ``import jax`` then
  ``jax.tree_map`` (the dotted name itself), ``import jax as J`` then ``J.tree_map``,
  ``from jax import tree_map [as t]``, ``from jax import numpy`` then ``numpy.DeviceArray``,
  ``import jax.numpy as jnp`` then ``jnp.DeviceArray``. Each group starts with the last
  component as a plain word (a cheap test), then the regexes. Star imports and names
  reached through assignments do not resolve, so they need no group."""
  parts = qname.split('.')
  last = parts[-1]
  groups = [(last, re.compile(_dotted(parts) + r'\b'))]
  for k in range(1, len(parts)):
    module, rest = parts[:k], parts[k:]
    # import M as A; A.rest
    groups.append((last, re.compile(r'import\s+' + _dotted(module) + r'\s+as\b'),
                   re.compile(r'\.\s*' + _dotted(rest) + r'\b')))
    # from M[:-1] import M[-1] [as A]; A.rest  /  from M import rest[0] (k = len - 1)
    if k >= 2:
      groups.append((last, re.compile(_from_import(module[:-1], module[-1])),
                     re.compile(r'\.\s*' + _dotted(rest) + r'\b')))
  groups.append((last, re.compile(_from_import(parts[:-1], last))))
  return tuple(groups)


def _from_import(module, name: str) -> str:
  """A regex of ``from module import ... name`` (over parentheses or backslashes), where
  ``name`` is an imported name, not an ``as`` name (``from flax import linen as nn`` does not
  import ``flax.nn``: on the ecosystem tree that form passed 36 files the pass left as they were)."""
  return (r'from\s+' + _dotted(module) + r'\s+import\s+(?:\([^)]*?|(?:[^\n\\;]|\\\r?\n)*?)'
          r'(?<!\bas\s)\b' + re.escape(name) + r'\b')


def prefilter_words() -> tuple[tuple, ...]:
  """The text tests of the prefilter: a file may need OM2xx when all the tests of one
  tuple pass (a string: it occurs in the text; a regex: it is found). Derived from
  :data:`APIS`: an entry's ``words``, else :func:`spellings` of each old name, so that a
  file passes exactly when it spells one of the entries' names in a form that resolves to
  it (``jax.config.update`` or an attention ``mask`` does not pass; ``jax.tree_util.tree_map``
  does not pass for ``jax.tree_map``)."""
  found = []
  for api in APIS:
    groups = api.words or tuple(g for q in api.old for g in spellings(q))
    for g in groups:
      if g not in found:
        found.append(g)
  return tuple(found)


def by_first_word(groups) -> dict[str, tuple[tuple, ...]]:
  """``groups`` (:func:`prefilter_words`) keyed by their first test, a plain word: the rest
  of each group is tried only where that word occurs (one substring test per word)."""
  keyed: dict[str, list] = {}
  for group in groups:
    keyed.setdefault(group[0], []).append(tuple(group[1:]))
  return {w: tuple(rests) for w, rests in keyed.items()}


def passes(text: str, keyed) -> bool:
  """Does ``text`` pass one of the groups (``keyed``: :func:`by_first_word`)?"""
  for word, rests in keyed.items():
    if word in text:
      for rest in rests:
        if all((w in text) if isinstance(w, str) else (w.search(text) is not None)
               for w in rest):
          return True
  return False


def removed(qname: str) -> Optional[Api]:
  """The entry for a name a program failed to find (``jax.tree_map``, the ``jax.config``
  module, ``flax.nn`` as a prefix of ``flax.nn.relu``), or None."""
  return next((a for a in APIS if qname in a.old), None) or next(
      (a for a in APIS for q in a.old if q.startswith(qname + '.')), None)


def dict_method_gone(name) -> Optional[Api]:
  """The FrozenDict method (``unfreeze``) a program called on a plain dict (what ``init``
  returns since flax 0.7.1): its OM207 entry; None for any other name (``pop`` and ``copy``
  exist on a dict, so they fail otherwise or not at all)."""
  return next((a for a in APIS if a.kind == 'frozendict' and a.extra == name
               and not hasattr(dict, name)), None)


def rule_summary(rule: str) -> str:
  return next(s for r, _, s in RULES if r == rule)


def nn_renames() -> frozenset:
  """The ``flax.nn`` names OM214 renames (not flagged as a pre-Linen model, OM105)."""
  return frozenset(q for a in APIS if a.rule == 'OM214' for q in a.old)


def renames() -> dict[str, Api]:
  """Old qualified name -> its 'rename' entry."""
  return {q: a for a in APIS if a.kind == 'rename' for q in a.old}


def by_kind(kind: str) -> dict[str, Api]:
  """Old qualified name -> entry, for the entries of ``kind``."""
  return {q: a for a in APIS if a.kind == kind for q in a.old}
