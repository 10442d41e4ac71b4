"""``check``: prove a migrated Optax optimizer makes the same updates as a legacy def.

    report = equivalence_tests.check(optim_compat.Adam(1e-3, weight_decay=1e-4),
                                     optax.adamw(1e-3, weight_decay=1e-4), params,
                                     devices=(1, 2, 4, 8), mode='pmap')
    assert report.ok, report

Both optimizers start from the same params and get the same gradients for
``steps`` jitted steps; their parameter trajectories are compared leaf by leaf
in ulps of each leaf's largest magnitude (``core.ulp_distance``). The runner
works on the old stack too (jax 0.4.13 with real ``flax.optim``): only jax,
numpy and flax are imported at module level.

Modes:

* ``'single'``: one device, ``jax.jit``.
* ``'pmap'``: the state replicated with ``flax.jax_utils.replicate`` over the
  first ``n`` devices; each device gets its own gradient share and the step
  ``pmean``'s them (``axis_name='batch'``), as data-parallel legacy code did.
* ``'sharded'``: ``jax.jit`` over a ``Mesh`` of ``n`` devices with axes
  ``('data', 'model')`` (model axis 2 when ``n`` is even); gradient shares are
  sharded over ``'data'`` and averaged inside the step; every parameter and
  state array with at least 1024 elements and a dimension divisible by the
  model axis is sharded over ``'model'`` on its largest such dimension.

Each step is one call of a compiled step function, as in a training loop
(``check`` and ``collect``). The project's grid (``run_pair(..., scan=True)``)
instead draws every step's gradients up front and runs a run's steps as one
compiled ``lax.scan`` (after any first steps that change the state's dtypes):
with XLA's backend optimisation off, as the grid runs, that gives the per-step
numbers bitwise (measured on all 39 grid cases); with default XLA flags the
loop body's multiply-adds can contract differently, measured up to 2 ulp of a
leaf's largest magnitude (Adam, Momentum, RMSProp centered, LARS, Adafactor), so
the user-facing check never scans.

Gradient shares are multiples of 2**-12 (``core.reference_grads``), so their
mean over up to 8 devices is exact: any difference between device counts is
the optimizer's arithmetic, not the averaging. The default draws, ``'mixed'``,
scale a leaf's elements by 1, 2**-24 and 2**-50 in turn (exact powers of two, so
the means stay exact, and squares stay normal numbers in float32 / bfloat16: no
flush-to-zero question), which puts every leaf partly in the regimes where an
epsilon's placement or size decides the update. Device counts the process lacks
(jax already started with fewer CPU devices) run in one worker process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` for the largest of them, each
count ``n`` on its first ``n`` devices (bitwise the numbers of a process with
exactly ``n``, checked in tests/test_check.py), while this process runs its own
counts; the objects travel with ``cloudpickle`` and the worker gets this process's
``sys.path``. All runs of a process advance in lockstep, drawing each step's
gradients once (``run_counts``); ``last_timings()`` says where the time went.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from equivalence_tests import core

MODES = ('single', 'pmap', 'sharded')
#: Arrays with fewer elements stay replicated in ``'sharded'`` mode.
SHARD_MIN_SIZE = 1024


@dataclasses.dataclass
class Worst:
  """Where the largest difference is: leaf path, step (1-based), device count, values."""
  path: str
  step: int
  n_devices: int
  mode: str
  index: tuple
  legacy_value: float
  tx_value: float
  ulp: float


@dataclasses.dataclass
class Report:
  """The result of :func:`check`.

  Attributes:
    ok: every leaf within ``max_ulp_bound`` and every replica set bitwise equal.
    max_ulp: the largest distance found (ulps of each leaf's largest |value|).
    max_ulp_bound: the bound checked.
    worst: where ``max_ulp`` is (``None`` when everything is bitwise equal).
    per_leaf: ``{path: max ulp over all steps and runs}``.
    replicas_bitwise: ``{(mode, n_devices, 'legacy'|'tx'): bool}``: all pmap
      replicas / all copies of each shard bitwise equal to each other.
    runs: the ``(mode, n_devices)`` pairs run; steps: steps per run.
    grads: the gradient draws (``'mixed'``, ``'random'``, ``'tiny'``, ``'callable'``).
    notes: lines printed under the headline (e.g. float16 leaves that got unscaled
      random draws under ``'mixed'``).
  """
  ok: bool
  max_ulp: float
  max_ulp_bound: float
  worst: Worst | None
  per_leaf: dict
  replicas_bitwise: dict
  runs: list
  steps: int
  grads: str = 'random'
  notes: tuple = ()

  def __str__(self) -> str:
    status = 'OK' if self.ok else 'DIFFERS'
    runs = ', '.join(f'{m}x{n}' for m, n in self.runs)
    lines = [f'optimizer equivalence: {status}: max {self.max_ulp:g} ulp '
             f'(bound {self.max_ulp_bound:g}) over {self.steps} steps, {self.grads} gradients; '
             f'runs: {runs}']
    lines += [f'  note: {n}' for n in self.notes]
    if self.worst is not None:
      w = self.worst
      lines.append(f'  worst: {w.path}{list(w.index)} at step {w.step}, {w.mode} on '
                   f'{w.n_devices} device(s): legacy {w.legacy_value!r} vs tx {w.tx_value!r} '
                   f'({w.ulp:g} ulp)')
    bad = [k for k, v in self.replicas_bitwise.items() if not v]
    if bad:
      lines.append('  replicas NOT bitwise equal: ' + ', '.join(f'{m}x{n} {who}' for m, n, who in bad))
    width = max([len(p) for p in self.per_leaf] + [4])
    lines.append(f'  {"leaf":<{width}}  max ulp')
    for path, ulp in sorted(self.per_leaf.items(), key=lambda kv: -kv[1]):
      flag = '' if ulp <= self.max_ulp_bound else '   <-- over the bound'
      lines.append(f'  {path:<{width}}  {ulp:g}{flag}')
    return '\n'.join(lines)


# ---------------------------------------------------------------------------
# inputs


def materialize(params, seed: int = 0):
  """``params`` with every ``jax.ShapeDtypeStruct`` leaf drawn from ``seed``.

  Values: ``0.1 * standard normal`` from ``np.random.RandomState(seed)`` in
  leaf order, cast to the leaf's dtype.

  Raises:
    ValueError: a leaf that is not a floating-point array, or one too large to allocate
      here (names its path).
  """
  rs = np.random.RandomState(seed)

  def leaf(path, x):
    if isinstance(x, jax.ShapeDtypeStruct):
      try:
        x = jnp.asarray(rs.standard_normal(x.shape) * 0.1, x.dtype)
      except MemoryError:
        gib = math.prod(x.shape) * 8 / 2**30  # (drawn as float64 first)
        raise ValueError(f'params leaf {jax.tree_util.keystr(path) or "<root>"}: shape '
                         f'{tuple(x.shape)} needs {gib:.1f} GiB to draw, more than this machine '
                         'can allocate') from None
    dtype = np.asarray(x).dtype if not hasattr(x, 'dtype') else x.dtype
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f'params leaf {jax.tree_util.keystr(path) or "<root>"} has dtype {dtype}: '
                       'only floating-point leaves can be checked')
    return jnp.asarray(x)
  return jax.tree_util.tree_map_with_path(leaf, params)


def flat(tree) -> dict[str, np.ndarray]:
  """``{keystr path: numpy array}`` of any pytree (bfloat16/float16 widened exactly)."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(p): core.storable(v) for p, v in leaves}


def dtype_names(params) -> dict[str, str]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  return {jax.tree_util.keystr(p): np.dtype(v.dtype).name for p, v in leaves}


class PerDeviceGrads:
  """``grads=PerDeviceGrads(fn)``: ``fn(step, params, device, n_devices)`` gives each
  device its own share (``device=None``: the single-device gradient); the mean
  of the shares should equal the single-device gradient exactly, as
  ``core.reference_grads``' shares do. ``params_free=True`` promises that
  ``fn`` reads only the params' shapes and dtypes (not their values): all
  steps then run as one compiled scan, with ``fn`` given the initial params."""

  def __init__(self, fn, params_free: bool = False):
    self.fn = fn
    self.params_free = params_free

  def __call__(self, step, params, device=None, n_devices=1):
    return self.fn(step, params, device, n_devices)


def _signature(tree):
  """``(treedef, ((shape, dtype), ...))``: all that the named draws read of a params tree."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(np.shape(x)),
                         np.dtype(x.dtype if hasattr(x, 'dtype') else np.asarray(x).dtype))
                        for x in leaves)


class _NamedDraws:
  """``grads='random'`` / ``'tiny'`` / ``'mixed'`` of ``seed``: ``scale`` applied to each
  of ``core.reference_grads``' trees (``None``: unscaled).

  Called as ``(step, params, device=None, n_devices=1)``, like any gradient
  function. :meth:`shares` gives the same values for all devices of a count at
  once, from one pair of draws per step and params signature, kept for the
  latest step only: the checker's runs of every device count and both
  optimizers take their gradients from it step by step.
  """
  params_free = True  # shapes and dtypes only

  def __init__(self, seed: int, scale: Callable | None = None):
    self.seed, self.scale = seed, scale
    self._memo_key, self._memo = None, {}

  def _scaled(self, tree):
    return tree if self.scale is None else jax.tree_util.tree_map(self.scale, tree)

  def __call__(self, step, params, device=None, n_devices=1):
    return self._scaled(core.reference_grads(params, step, self.seed, device, n_devices))

  def shares(self, step: int, params, n_devices: int | None):
    """``self(step, params)`` (``n_devices`` None), else every device's share
    ``self(step, params, d, n_devices)`` stacked on a new leading axis (numpy leaves
    ``(n_devices, ...)``, ``core.stack``); bitwise what those calls give."""
    key = (step, _signature(params))
    if key != self._memo_key:
      self._memo_key, self._memo = key, {}
    memo = self._memo
    if 'g' not in memo:
      memo['g'] = core.reference_draw(params, step, self.seed, 1)
    if n_devices is None:
      return self._scaled(memo['g'])
    if 's' not in memo:
      memo['s'] = core.reference_draw(params, step, self.seed, 2)
    return jax.tree_util.tree_map(functools.partial(self._stacked_share, n_devices),
                                  memo['g'], memo['s'])

  def _stacked_share(self, n: int, g, s) -> np.ndarray:
    """One leaf's ``(n, ...)`` stack of every device's scaled share: float32 leaves as one
    broadcast ``g + k * s`` (the same float32 operations as ``core.reference_share``'s
    per device), scaled slice by slice in place; others device by device as before."""
    if np.asarray(g).dtype != np.float32:  # jax arrays: scaled as before, then stacked
      return np.stack([np.asarray(self._scaled(core.reference_share(g, s, d, n)))
                       for d in range(n)])
    ks = np.asarray([np.float32(d - (n - 1) / 2) for d in range(n)], np.float32)
    out = (g + ks.reshape((n,) + (1,) * np.ndim(g)) * s).astype(np.float32, copy=False)
    if self.scale is not None:
      for d in range(n):
        out[d] = self.scale(out[d])
    return out


def _random_grads(seed):
  return _NamedDraws(seed)


#: ``grads='tiny'``: the random draws times this power of two (exact, so shares still
#: average exactly), where epsilons of 1e-8 to 1e-6 dominate the update. Not for float16
#: leaves: such epsilons and the squared gradients underflow there.
TINY_SCALE = 2.0 ** -24
#: ``grads='mixed'`` (the default): element ``i`` of each leaf (row-major) gets the random
#: draw times ``MIXED_SCALES[i % 3]``, powers of two (exact: shares still average exactly).
#: Each leaf of 3 or more elements has elements in all three regimes: ~1 (where the random
#: draws look: learning rates, betas, weight decay; a scalar leaf stays there), ~6e-8
#: (where an epsilon of 1e-8 to 1e-6 in or beside a square root decides the update: Adam,
#: RMSProp, Adagrad, LAMB, AdaBelief's eps_root) and ~9e-16 (g^2 ~ 1e-30: Adafactor's
#: epsilon1).
MIXED_SCALES = (1.0, TINY_SCALE, 2.0 ** -50)
#: Dtypes whose normal range ends above this get the random draws unscaled in ``'mixed'``
#: (float16: 6e-5; the squared tiny draws need about 2**-124).
MIXED_MIN_TINY = 2.0 ** -124
# GRADS, the draws' names, and DEFAULT_GRADS ('mixed'), the draws check(), `optim-migrate
# check` / `record`, pyproject entries and the pytest plugin use when none is named, live
# in the jax-free cli module (its parser needs them)
from equivalence_tests.cli import DEFAULT_GRADS, GRADS  # noqa: E402


def _tiny_scale(g):
  dtype = np.asarray(g).dtype
  return (g * np.asarray(TINY_SCALE, dtype)).astype(dtype)


def _tiny_grads(seed):
  return _NamedDraws(seed, _tiny_scale)


def mixed_scales(shape, dtype) -> np.ndarray:
  """The factors ``'mixed'`` multiplies a leaf's random draw by (``shape``, in ``dtype``):
  ``MIXED_SCALES[i % 3]`` for flat (row-major) element ``i``, or all ones for a dtype too
  narrow for the tiny bands (float16, see ``MIXED_MIN_TINY``). Read-only (cached: every
  step and device share it)."""
  return _mixed_scales(tuple(int(d) for d in shape), np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _mixed_scales(shape: tuple, dtype: np.dtype) -> np.ndarray:
  size = int(np.prod(shape, dtype=np.int64))
  if float(jnp.finfo(dtype).tiny) > MIXED_MIN_TINY:
    out = np.ones(shape, dtype)
  else:
    bands = np.asarray(MIXED_SCALES, np.float64)[np.arange(size) % len(MIXED_SCALES)]
    out = bands.reshape(shape).astype(dtype)
  out.setflags(write=False)
  return out


def narrow_leaves(params) -> list[str]:
  """Paths of the leaves ``'mixed'`` gives unscaled random draws (float16)."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  return [jax.tree_util.keystr(p) for p, v in leaves
          if float(jnp.finfo(np.asarray(v).dtype if not hasattr(v, 'dtype') else v.dtype).tiny)
          > MIXED_MIN_TINY]


def _mixed_scale(g):
  dtype = np.asarray(g).dtype
  return (g * mixed_scales(np.shape(g), dtype)).astype(dtype)


def _mixed_grads(seed):
  return _NamedDraws(seed, _mixed_scale)


#: ``grads=<name>``: the draw functions of ``seed``.
_NAMED_GRADS = {'random': _random_grads, 'tiny': _tiny_grads, 'mixed': _mixed_grads}


def _user_grads(fn):
  def grads(step, params, device=None, n_devices=1):
    g = fn(step, params)
    return jax.tree_util.tree_map(np.asarray, g)  # the same share on every device
  return grads


# ---------------------------------------------------------------------------
# the two kinds of optimizer, as (init, step, params_of)


def _is_optax(tx) -> bool:
  return hasattr(tx, 'init') and hasattr(tx, 'update') and not hasattr(tx, 'create')


def _tx_name(tx) -> str:
  """``tx`` for a message: ``optax.adam``, a function's name, else its repr."""
  name = getattr(tx, '__name__', None)
  if not isinstance(name, str):
    text = repr(tx)
    return text if len(text) <= 60 else text[:57] + '...'
  if (getattr(tx, '__module__', None) or '').split('.')[0] == 'optax':
    import optax
    return f'optax.{name}' if getattr(optax, name, None) is tx else f'{tx.__module__}.{name}'
  return name


def a_type(value) -> str:
  """``value``'s type name with its article, for messages: ``an int``, ``a list``."""
  name = type(value).__name__
  return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def validate_tx(tx, params, what: str | None = None) -> None:
  """Check ``tx`` is an Optax ``GradientTransformation`` or a callable ``params -> TrainState``.

  A callable is called once on ``params`` (concrete arrays, e.g. from
  :func:`materialize`) to see what it builds. ``what`` names ``tx`` in the
  messages (default ``tx <name>``; the CLI passes ``--tx '<expression>'``).

  Raises:
    TypeError: ``tx`` is neither (e.g. ``None``); an Optax function not called
      (``optax.adam`` instead of ``optax.adam(1e-3)``); a callable that returns
      something other than a ``TrainState`` (names the type it returned).
    ValueError: a callable that raises (names the exception).
  """
  what = what or f'tx {_tx_name(tx)}'
  if _is_optax(tx) and not isinstance(tx, type):
    return
  if not callable(tx):
    raise TypeError(f'{what} is {a_type(tx)}, not an optax GradientTransformation '
                    '(or a callable returning a TrainState)')
  name = _tx_name(tx)
  if name.startswith('optax.') and not isinstance(tx, type):
    raise TypeError(f'{what} is a function, not a GradientTransformation: call it, e.g. '
                    f'{name}(1e-3)')
  try:
    state = tx(params)
  except Exception as e:  # noqa: BLE001 - any failure is the callable's
    raise ValueError(f'{what}: calling it on the params to build a TrainState raised '
                     f'{type(e).__name__}: {e}') from None
  if _is_optax(state):
    raise TypeError(f'{what} returned a GradientTransformation, not a TrainState: pass the '
                    'transformation itself as tx')
  if not (hasattr(state, 'params') and hasattr(state, 'apply_gradients')):
    raise TypeError(f'{what} returned a {type(state).__name__}, not a TrainState (a callable tx '
                    'must build one from the params)')


def _legacy_runner(opt_def):
  def init(params):
    return opt_def.create(params)

  def step(opt, grads):
    return opt.apply_gradient(grads)
  return init, step, lambda opt: opt.target


def _tx_runner(tx, expected_tree):
  if _is_optax(tx):
    import optax

    def init(params):
      return (params, tx.init(params))

    def step(state, grads):
      params, opt_state = state
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    return init, step, lambda state: state[0]
  if not callable(tx):
    raise TypeError(f'tx must be an optax GradientTransformation or a callable params -> '
                    f'TrainState, got {type(tx).__name__}')

  def init_state(params):
    state = tx(params)
    got = jax.tree_util.tree_structure(state.params)
    if got != expected_tree:
      raise ValueError(f'the TrainState built by tx has params {got}, but params are '
                       f'{expected_tree}')
    return state

  def step_state(state, grads):
    return state.apply_gradients(grads=grads)
  return init_state, step_state, lambda state: state.params


# ---------------------------------------------------------------------------
# one trajectory


def _replica0(x) -> np.ndarray:
  return core.host(x)[0]


def _replicas_equal_sharded(tree) -> bool:
  for x in jax.tree_util.tree_leaves(tree):
    copies: dict = {}
    for shard in x.addressable_shards:
      key = str(shard.index)
      data = np.asarray(shard.data)
      if key in copies and not np.array_equal(copies[key], data, equal_nan=True):
        return False
      copies.setdefault(key, data)
  return True


def _mesh(n: int):
  from jax.sharding import Mesh
  model = 2 if n % 2 == 0 else 1
  devices = np.asarray(jax.devices()[:n]).reshape(n // model, model)
  return Mesh(devices, ('data', 'model'))


def _leaf_spec(x, model_size: int):
  from jax.sharding import PartitionSpec
  shape = np.shape(x)
  if model_size > 1 and int(np.prod(shape)) >= SHARD_MIN_SIZE:
    dims = [d for d in np.argsort(shape)[::-1] if shape[d] % model_size == 0]
    if dims:
      spec = [None] * len(shape)
      spec[dims[0]] = 'model'
      return PartitionSpec(*spec)
  return PartitionSpec()


def _trajectory(runner, params, grads_fn, steps: int, n: int, mode: str, scan: bool = False):
  """``({step: flat params}, replicas_bitwise)`` for one optimizer, mode and count.

  One jitted call per step. With ``scan``, gradients that do not depend on the
  params' values (``'random'``, or a ``PerDeviceGrads(..., params_free=True)``)
  are drawn for every step up front and all steps run as one compiled
  ``lax.scan``; a user's ``grads`` callable always sees the params of each step.
  """
  if scan and getattr(grads_fn, 'params_free', False):
    return _scanned_trajectory(runner, params, grads_fn, steps, n, mode)
  run = _Run(runner, params, n, mode)
  for t in range(steps):
    run.advance(run.grads(t, grads_fn))
  return run.result()


def _pmap_put(tree, devices):
  """``tree`` (host copies with a leading device axis) on ``devices`` as ``jax.pmap``'s
  outputs lie, where pmap is built on ``shard_map`` and they carry a ``NamedSharding``
  (jax 0.10): a first call with host arrays traces and compiles the step once more than
  the later steps, given device arrays, need (the same program, less its call site in
  the metadata: tests/test_check.py checks the numbers bitwise). Where pmap's outputs
  carry another sharding (jax 0.4.13, which compiles once either way): ``tree`` as it is."""
  sharding = _pmap_out_sharding(tuple(devices))
  return tree if sharding is None else jax.device_put(tree, sharding)


@functools.lru_cache(maxsize=16)
def _pmap_out_sharding(devices: tuple):
  from jax.sharding import NamedSharding
  probe = jax.pmap(lambda x: x, axis_name='batch', devices=list(devices))(
      np.zeros((len(devices),), np.int32))
  return probe.sharding if isinstance(probe.sharding, NamedSharding) else None


def _replica_views(x) -> list:
  """The replicas of a ``pmap`` output ``x`` (leading device axis of ``n``): ``n`` read-only
  numpy views of the devices' own buffers, in device-axis order, each of shape
  ``x.shape[1:]``; nothing copied (``np.asarray(x)`` gathers all ``n`` copies into one host
  array: 32 MB a step for a 1M-parameter leaf on 8 devices). Zero-size leaves, whose
  shards jax cannot fetch, give zeros."""
  shape, n = tuple(np.shape(x))[1:], np.shape(x)[0]
  if int(np.prod(np.shape(x))) == 0:
    return [np.zeros(shape, x.dtype)] * n
  out = [None] * n
  for shard in x.addressable_shards:
    i = shard.index[0]  # a slice(d, d + 1) (jax >= 0.5) or the int d (jax 0.4.13)
    out[(i.start or 0) if isinstance(i, slice) else int(i)] = np.asarray(shard.data).reshape(shape)
  if any(v is None for v in out):  # not one buffer per replica: gather them
    return list(core.host(x))
  return out


def _views_bitwise(views: list) -> bool:
  """Every view's bytes equal the first's, or its values (``-0.0 == 0.0``, NaN equal to
  NaN): what :func:`core.replicas_bitwise` says of the stacked replicas."""
  first = views[0]
  words = _words(first)
  return all(np.array_equal(_words(v), words)
             or np.array_equal(core.storable(v), core.storable(first), equal_nan=True)
             for v in views[1:])


def _words(x: np.ndarray) -> np.ndarray:
  size = x.dtype.itemsize
  flat_x = np.ascontiguousarray(x).reshape(-1)
  return flat_x.view(f'u{size}') if size in (1, 2, 4, 8) else flat_x.view(np.uint8)


class _Run:
  """One optimizer's trajectory for one mode and device count, one compiled call per step.

  ``grads(t, grads_fn)`` draws step ``t``'s gradients as the step takes them
  (``'single'``: one tree; ``'pmap'`` / ``'sharded'``: every device's share
  stacked, ``(k, ...)`` leaves with ``k`` the count or the data axis);
  ``advance(grads)`` runs the step; ``last`` is then its flat params (``'pmap'``:
  replica 0's, views of its device buffers); ``result()`` is ``({step: flat params},
  replicas_bitwise)`` (``keep=False``: ``{}``, only ``last`` kept). Several runs can
  advance in lockstep, sharing draws.
  """

  def __init__(self, runner, params, n: int, mode: str, keep: bool = True, who=None):
    init, step, self.params_of = runner
    self.mode, self.n, self.keep, self.who = mode, n, keep, who
    self.traj, self.ok, self.last = {}, True, None
    self.seconds: list = []  # wall seconds of each advance (the first: with its compile)
    state = init(params)
    if mode == 'single':
      self.k = None
      self.step_fn = jax.jit(step)
    elif mode == 'pmap':
      self.k = n
      devices = jax.local_devices()[:n]
      state = _pmap_put(core.replicate_on_host(state, n), devices)
      self.step_fn = jax.pmap(core.data_parallel(step), axis_name='batch', devices=devices)
    else:
      mesh, state_shardings, self.share_shardings, sstep = _sharded_program(step, state, n)
      self.step_fn = jax.jit(sstep, out_shardings=state_shardings)
      state = jax.device_put(state, state_shardings)
      self.k = mesh.shape['data']
    self.state = state

  def current(self):
    """The params a gradient function sees (``'pmap'``: replica 0's, on the host)."""
    params = self.params_of(self.state)
    if self.mode == 'pmap':
      return jax.tree_util.tree_map(_replica0, params)
    return params

  def like(self):
    """:meth:`current`'s shapes and dtypes, no values fetched (read-only zero-strided
    numpy placeholders): all that the named draws read."""
    lead = 1 if self.mode == 'pmap' else 0
    return jax.tree_util.tree_map(
        lambda x: np.broadcast_to(np.zeros((), x.dtype), tuple(np.shape(x))[lead:]),
        self.params_of(self.state))

  def grads(self, t: int, grads_fn):
    current = self.current()
    if self.k is None:
      return grads_fn(t, current)
    return core.stack([grads_fn(t, current, d, self.k) for d in range(self.k)])

  def advance(self, grads) -> None:
    clock = time.perf_counter()
    _TAG.who = self.who  # jax's trace / lower / compile events on this thread are this run's
    try:
      self._advance(grads)
    finally:
      _TAG.who = None
      self.seconds.append(time.perf_counter() - clock)

  def _advance(self, grads) -> None:
    if self.mode == 'sharded':
      grads = jax.device_put(grads, self.share_shardings(grads, 1))
    self.state = self.step_fn(self.state, grads)
    params = self.params_of(self.state)
    if self.mode == 'pmap':
      leaves, treedef = jax.tree_util.tree_flatten(params)
      views = [_replica_views(x) for x in leaves]
      self.ok = self.ok and all(_views_bitwise(v) for v in views)
      self.last = flat(jax.tree_util.tree_unflatten(treedef, [v[0] for v in views]))
      if self.keep:  # copies: the views would hold every step's device buffers
        self.traj[len(self.traj) + 1] = {k: np.array(v) for k, v in self.last.items()}
      return
    if self.mode == 'sharded':
      self.ok = self.ok and _replicas_equal_sharded(params)
    self.last = flat(params)
    if self.keep:
      self.traj[len(self.traj) + 1] = self.last

  def result(self):
    if self.mode == 'pmap':
      return self.traj, self.ok and all(
          _views_bitwise(_replica_views(x)) for x in jax.tree_util.tree_leaves(self.state))
    if self.mode == 'sharded':
      return self.traj, self.ok and _replicas_equal_sharded(self.state)
    return self.traj, True


def _sharded_program(step, state, n: int):
  """``(mesh, state_shardings, share_shardings, sstep)`` of sharded mode.

  ``sstep(state, shares)`` is one step (``shares``: ``(data, ...)`` leaves,
  averaged inside). ``share_shardings(tree, lead)``: the shardings of such
  shares with ``lead`` leading axes up to and including the data axis.
  """
  from jax.sharding import NamedSharding, PartitionSpec
  mesh = _mesh(n)
  model = mesh.shape['model']
  state_shardings = jax.tree_util.tree_map(
      lambda x: NamedSharding(mesh, _leaf_spec(x, model)), state)

  def share_shardings(tree, lead):
    return jax.tree_util.tree_map(lambda x: NamedSharding(
        mesh, PartitionSpec(*([None] * (lead - 1)), 'data',
                            *_leaf_spec(x[(0,) * lead], model))), tree)

  def sstep(s, gs):
    g = jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), gs)
    return step(s, core.optimization_barrier(g))
  return mesh, state_shardings, share_shardings, sstep


def _scanned_trajectory(runner, params, grads_fn, steps: int, n: int, mode: str, keys=None):
  """:func:`_trajectory` with every step's gradients drawn up front (``core.plan_steps``).

  The steps that change the state's types run one compiled step each (e.g. a
  weak-typed step counter that the first step makes strong); one
  compiled ``lax.scan`` runs the rest.

  ``keys``: the runner's state and params are dicts of independent members
  (:func:`run_batch`); then ``{key: (traj, replicas_bitwise, final_state)}``,
  each member's replicas checked on its own.
  """
  init, step, params_of = runner
  state = init(params)
  parts = list(keys) if keys is not None else [None]
  pick = (lambda tree, k: tree) if keys is None else (lambda tree, k: tree[k])
  ok = dict.fromkeys(parts, True)

  def check(tree, test):
    for k in parts:
      ok[k] = ok[k] and test(pick(tree, k))
  if mode == 'pmap':
    draw = lambda t, like: (core.stack([grads_fn(t, like, d, n) for d in range(n)]),)
    first = lambda args: jax.tree_util.tree_map(lambda x: x[0], args)
    head, tail = core.plan_steps(step, state, draw, steps, params_of, first)
    state, history = core.pmap_steps(step, state, head, tail, n, params_of)
    for k in parts:
      ok[k] = (core.replicas_bitwise([pick(h, k) for h in history])
               and core.replicas_bitwise(pick(state, k)))
    return _per_key(history, parts, pick, ok, lambda h: jax.tree_util.tree_map(_replica0, h), keys,
                    state)
  if mode == 'single':
    one_step, put, jit_kw, scan_kw = step, (lambda tree, lead: tree), {}, {}
    draw = lambda t, like: (grads_fn(t, like),)
  else:
    from jax.sharding import NamedSharding, PartitionSpec
    mesh, state_shardings, share_shardings, one_step = _sharded_program(step, state, n)
    model, data = mesh.shape['model'], mesh.shape['data']
    draw = lambda t, like: (core.stack([grads_fn(t, like, d, data) for d in range(data)]),)
    state = jax.device_put(state, state_shardings)
    put = lambda tree, lead: jax.device_put(tree, share_shardings(tree, lead))
    # shardings follow shapes only, so they hold for a state whose dtypes a step changes
    history_shardings = jax.tree_util.tree_map(
        lambda x: NamedSharding(mesh, PartitionSpec(None, *_leaf_spec(x, model))), params_of(state))
    jit_kw = {'out_shardings': state_shardings}
    scan_kw = {'out_shardings': (state_shardings, history_shardings)}
  sharded = mode == 'sharded'
  head, tail = core.plan_steps(one_step, state, draw, steps, params_of)
  history = []
  if head:
    fn = jax.jit(one_step, **jit_kw)
    for (grads,) in head:
      state = fn(state, put(grads, 1))
      history.append(params_of(state))
  if sharded:
    for h in history:
      check(h, _replicas_equal_sharded)
  history = [jax.tree_util.tree_map(core.host, h) for h in history]
  if tail is not None:
    def body(s, g):
      s = one_step(s, g)
      return s, params_of(s)
    fn = jax.jit(lambda s, gs: jax.lax.scan(body, s, gs), **scan_kw)
    state, stacked = fn(state, put(tail[0], 2))
    if sharded:
      check(stacked, _replicas_equal_sharded)
    stacked = jax.tree_util.tree_map(core.host, stacked)
    history += [jax.tree_util.tree_map(lambda x: x[t], stacked)
                for t in range(steps - len(history))]
  if sharded:
    check(state, _replicas_equal_sharded)
  return _per_key(history, parts, pick, ok, lambda h: h, keys, state)


def _per_key(history, parts, pick, ok, view, keys, state):
  """``{t: flat params}, ok`` (``keys`` None), else ``(traj, ok, final state)`` per key."""
  if keys is None:
    return {t + 1: flat(view(h)) for t, h in enumerate(history)}, ok[None]
  return {k: ({t + 1: flat(view(pick(h, k))) for t, h in enumerate(history)}, ok[k],
              pick(state, k)) for k in parts}


def run_batch(members: dict, steps: int, n: int, mode: str, seed: int = 0) -> dict:
  """Several independent trajectories as one compiled program per ``(mode, n)``.

  ``members``: ``{key: (opt, params, grads)}``, ``opt`` a legacy def or an Optax
  ``GradientTransformation``, ``grads`` a :class:`PerDeviceGrads` with
  ``params_free=True`` (or ``'random'``). Every member runs as in
  ``run_pair(..., scan=True)``: its gradients drawn up front, its steps in the
  shared ``lax.scan`` (the first steps that change any member's types run as
  separate programs). XLA compiles one program for the batch instead of one
  per member, whose per-program cost dominates the project's grid; the
  members share no array, so each gets its own numbers (checked bitwise
  against :func:`run_pair` in ``tests/test_scan.py``).

  Returns ``{key: (traj, replicas_bitwise, final_state)}`` with ``traj`` as
  :func:`run_pair`'s (the state on the devices; under ``pmap`` each leaf has a
  leading device axis).

  Raises:
    ValueError: a member's gradients depend on the params' values.
  """
  runners, params, draws = {}, {}, {}
  for key, (opt, p, grads) in members.items():
    p = materialize(p, seed)
    if grads in (None, 'random'):
      grads = _random_grads(seed)
    if not getattr(grads, 'params_free', False):
      raise ValueError(f'{key}: run_batch needs gradients drawn from shapes only '
                       '(PerDeviceGrads(..., params_free=True) or "random")')
    runners[key] = (_tx_runner(opt, jax.tree_util.tree_structure(p)) if _is_optax(opt)
                    else _legacy_runner(opt))
    params[key], draws[key] = p, grads

  def init(ps):
    return {k: r[0](ps[k]) for k, r in runners.items()}

  def step(s, g):
    return {k: r[1](s[k], g[k]) for k, r in runners.items()}

  def params_of(s):
    return {k: r[2](s[k]) for k, r in runners.items()}

  def grads_fn(t, like, device=None, n_devices=1):
    return {k: draws[k](t, like[k], device, n_devices) for k in runners}
  grads_fn.params_free = True
  return _scanned_trajectory((init, step, params_of), params, grads_fn, steps, n, mode,
                             keys=list(runners))


def run_pair(legacy, tx, params, grads, steps: int, n: int, mode: str, seed: int = 0,
             scan: bool = False) -> dict:
  """Both trajectories for one ``(mode, n)``, in this process (needs ``n`` devices).

  ``legacy`` may be ``None`` (then only ``tx`` runs). ``scan=True``: where the
  gradients are known up front (``'random'``, ``PerDeviceGrads(params_free=True)``)
  all steps run as one compiled ``lax.scan`` (bitwise the per-step numbers only
  with XLA's backend optimisation off; see the module docstring). Returns
  ``{'legacy': traj, 'tx': traj, 'replicas': {'legacy': bool, 'tx': bool}}``.
  """
  params = materialize(params, seed)
  grads_fn = _grads_fn(grads, seed)
  out: dict = {'replicas': {}}
  for who, runner in _runners(legacy, tx, params):
    out[who], out['replicas'][who] = _trajectory(runner, params, grads_fn, steps, n, mode,
                                                 scan)
  return out


def _grads_fn(grads, seed: int):
  if isinstance(grads, PerDeviceGrads):
    return grads
  if grads is None:
    return _random_grads(seed)
  if isinstance(grads, str):
    return _NAMED_GRADS[grads](seed)
  return _user_grads(grads)


def _runners(legacy, tx, params) -> list:
  """``[(who, (init, step, params_of))]`` for the optimizers given (``None``: skipped)."""
  tree = jax.tree_util.tree_structure(params)
  return [(who, _legacy_runner(opt) if who == 'legacy' else _tx_runner(opt, tree))
          for who, opt in (('legacy', legacy), ('tx', tx)) if opt is not None]


def run_counts(legacy, tx, params, grads, steps: int, counts: Sequence[int], mode: str,
               seed: int = 0, threads: int = 1, summarize: dict | None = None) -> dict:
  """``{(mode, n): run_pair(legacy, tx, params, grads, steps, n, mode, seed)}`` for every
  ``n`` in ``counts``, in this process (needs ``max(counts)`` devices; a count ``n``
  runs on the first ``n``), bitwise the same numbers.

  All runs (each count, each optimizer) advance in lockstep, one compiled call
  per run and step: the named draws (``'random'``, ``'tiny'``, ``'mixed'``) are
  drawn once per step and params signature for all of them (``_NamedDraws.shares``)
  instead of once per device, count and optimizer, where they cost more than the
  steps (a 1M-parameter tree: about 0.1 s a draw). Every run's state is held at
  once. ``'pmap'`` reads each replica in its device's buffer (no gather of the ``n``
  copies).

  ``summarize`` (leaf path -> dtype name, both optimizers given): each count's
  :func:`summary` instead of its trajectories, built step by step (``_Summary``:
  the same numbers) and no trajectory kept.

  ``threads`` > 1: each step's compiled calls (the first step's: with their
  compiles) run on up to that many threads, the draws staying in this thread.
  Only for a process of its own (the worker): jax's context managers
  (``jax.default_matmul_precision``, ``enable_x64``, ...) are per thread, so a
  caller's would not reach the others.
  """
  import concurrent.futures
  clock, compiled, cpu = time.perf_counter(), _compile_seconds(), time.process_time()
  params = materialize(params, seed)
  grads_fn = _grads_fn(grads, seed)
  runners = _runners(legacy, tx, params)
  if summarize is not None and len(runners) < 2:
    raise ValueError('summarize needs both optimizers')
  keep = summarize is None
  stages = _stages()
  runs = [(n, who, _Run(runner, params, n, mode, keep, who)) for n in counts
          for who, runner in runners]
  by_key = {(n, who): run for n, who, run in runs}
  sums = {n: _Summary(mode, n, summarize) for n in counts} if not keep else {}
  shared = getattr(grads_fn, 'shares', None)
  threads = max(1, min(len(runs), threads))
  split = _TIMINGS['run_counts'] = {'setup': time.perf_counter() - clock}
  pending, drawing = [], 0.0
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for t in range(steps):
      if t == 1:
        split['first_step'] = time.perf_counter() - clock - split['setup']
      drawn, args = {}, []  # drawn: (k, params signature) -> the shares, for this step
      at = time.perf_counter()
      for _, _, run in runs:  # in this thread, in order: a user's function sees no threads
        if shared is None:
          args.append(run.grads(t, grads_fn))
          continue
        like = run.like()
        key = (run.k, _signature(like))
        if key not in drawn:
          drawn[key] = shared(t, like, run.k)
        args.append(drawn[key])
      drawing += time.perf_counter() - at
      if threads == 1:
        for (_, _, run), a in zip(runs, args):
          run.advance(a)
      else:
        # each run's compiled step on a thread of its own: the first step's compiles overlap
        for f in [pool.submit(run.advance, a) for (_, _, run), a in zip(runs, args)]:
          f.result()
      for n, acc in sums.items():  # on the pool, while the next step's draws are made
        pair = (t + 1, by_key[(n, 'legacy')].last, by_key[(n, 'tx')].last)
        if threads == 1:
          acc.add(*pair)
        else:
          pending.append(pool.submit(acc.add, *pair))
    for f in pending:
      f.result()
  out = {}
  for n in counts:
    replicas = {who: by_key[(n, who)].result()[1] for who, _ in runners}
    if sums:
      out[(mode, n)] = sums[n].result(replicas)
      continue
    out[(mode, n)] = r = {'replicas': replicas}
    for who, _ in runners:
      r[who] = by_key[(n, who)].traj
  split['total'] = time.perf_counter() - clock
  split['steps'] = split['total'] - split['setup'] - split.get('first_step', split['total'])
  split['first_step'] = split.get('first_step', split['total'] - split['setup'])
  split['xla_compile'] = _compile_seconds() - compiled
  split['summary'] = sum(acc.seconds for acc in sums.values())
  split['draws'] = drawing
  split['cpu'] = time.process_time() - cpu
  now = _stages()
  for who, _ in runners:
    mine = [by_key[(n, who)].seconds for n in counts]
    split[who] = {'first_step': sum(x[0] for x in mine if x),
                  'steps': sum(sum(x[1:]) for x in mine),
                  **{stage: now.get((stage, who), 0.0) - stages.get((stage, who), 0.0)
                     for stage in ('trace', 'lower', 'compile')}}
  return out


class _Summary:
  """:func:`summary` of one count, built step by step from the two runs' flat params
  (``add``, steps in any order, on any thread) without keeping them: per step and
  leaf only the largest difference, where it is and the legacy leaf's largest finite
  magnitude (``core.leaf_scales``); ``result`` then divides by the ulps of the whole
  run's scale as ``core.ulp_distance`` does. ``seconds``: time spent in ``add``."""

  def __init__(self, mode: str, n: int, dtypes: dict):
    self.mode, self.n, self.dtypes = mode, n, dtypes
    self.steps: dict = {}
    self.seconds = 0.0

  def add(self, step: int, legacy: dict, tx: dict) -> None:
    clock = time.perf_counter()
    leaves = {}
    for path, expected in legacy.items():
      leaves[path] = (_finite_max(expected),) + _largest_gap(tx[path], expected)
    self.steps[step] = leaves
    self.seconds += time.perf_counter() - clock

  def result(self, replicas: dict) -> dict:
    order = (sorted(self.steps) if all(isinstance(k, int) for k in self.steps)
             else list(self.steps))  # added on threads: in step order again
    scales: dict = {}
    for step in order:
      for path, (scale, *_) in self.steps[step].items():
        scales[path] = max(scales.get(path, 0.0), scale)
    per_leaf: dict = {}
    worst = None
    for step in order:
      for path, (_, gap, dtype, where) in self.steps[step].items():
        d = 0.0 if gap == 0 else _in_ulps(gap, scales[path], dtype, self.dtypes.get(path))
        per_leaf[path] = max(per_leaf.get(path, 0.0), d)
        if d > 0 and (worst is None or d > worst[-1]):
          worst = (path, step, self.n, self.mode) + where + (d,)
    return {'summary': True, 'replicas': dict(replicas), 'per_leaf': per_leaf, 'worst': worst}


def _finite_max(expected: np.ndarray) -> float:
  """The largest finite ``|value|`` of a leaf (0.0 if none): one step of ``core.leaf_scales``."""
  if expected.size == 0:
    return 0.0
  top = np.max(np.abs(expected))
  if np.isfinite(top):  # no NaN, no inf: the float64 path's number (abs and max are exact)
    return float(top)
  finite = np.abs(np.asarray(expected, np.float64))
  finite = finite[np.isfinite(finite)]
  return float(finite.max()) if finite.size else 0.0


def _largest_gap(actual: np.ndarray, expected: np.ndarray) -> tuple:
  """``(gap, expected's dtype, where)`` of one leaf and step, for ``core.ulp_distance`` and
  the report's worst: ``gap`` the largest ``|actual - expected|`` in float64 (0 where
  equal, inf where a NaN or inf differs), ``where`` ``(index, legacy value, tx value)`` of
  its first element (``()`` when ``gap`` is 0).

  Raises:
    ValueError: the shapes differ (as ``core.ulp_distance``).
  """
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  if a.shape != e.shape:
    raise ValueError(f'shape mismatch {a.shape} vs {e.shape}')
  if e.size == 0:
    return 0.0, expected.dtype, ()
  with np.errstate(invalid='ignore'):
    diff = np.abs(a - e)
  top = np.max(diff)
  if not np.isfinite(top):  # a NaN or an inf somewhere: ulp_distance's masks decide
    same = (a == e) | (np.isnan(a) & np.isnan(e))
    with np.errstate(invalid='ignore'):
      diff = np.where(same, 0.0, diff)
    top = np.max(diff) if np.all(np.isfinite(diff)) else np.inf
    diff = np.where(np.isnan(diff), np.inf, diff)
  if top == 0:
    return 0.0, expected.dtype, ()
  idx = np.unravel_index(int(np.argmax(diff)), e.shape) if e.ndim else ()
  return top, expected.dtype, (tuple(int(i) for i in idx), float(e[idx]), float(a[idx]))


def _in_ulps(gap, scale: float, base, dtype: str | None) -> float:
  """``gap`` (> 0, or inf) in ulps of ``scale`` as ``core.ulp_distance`` counts them."""
  if not np.isfinite(gap):
    return float('inf')
  base = np.dtype(base)
  if base.kind != 'f':
    base = np.dtype(np.float32)
  factor = core._ULP_FACTOR.get(dtype or base.name, 1)
  ulp = float(np.spacing(base.type(scale))) if scale > 0 else float(np.finfo(base).tiny)
  return float(gap / (ulp * factor))


#: Where the last :func:`collect` / :func:`run_counts` of this process spent its time
#: (:func:`last_timings`).
_TIMINGS: dict = {}
_COMPILED = [False]  # listener registered
#: ``{(stage, who): seconds}`` summed over threads since the listener's registration:
#: stage ``'trace'`` / ``'lower'`` / ``'compile'`` (jax's jaxpr trace, MLIR lowering and
#: XLA backend compile events), ``who`` the run's optimizer (``'legacy'`` / ``'tx'``) on
#: the thread that paid it, else None.
_STAGES: dict = {}
_STAGE_NAMES = {'jaxpr_trace_duration': 'trace', 'jaxpr_to_mlir_module_duration': 'lower',
                'backend_compile_duration': 'compile'}
_TAG = threading.local()
_LOCK = threading.Lock()


def _compile_seconds() -> float:
  """Seconds this process spent in XLA backend compiles since the first call (summed over
  threads; jax's ``/jax/core/compile/backend_compile_duration`` events); also starts
  recording :data:`_STAGES`."""
  if not _COMPILED[0]:
    _COMPILED[0] = True

    def listen(event, seconds, **_):
      stage = _STAGE_NAMES.get(event.rsplit('/', 1)[-1])
      if stage is not None:
        key = (stage, getattr(_TAG, 'who', None))
        with _LOCK:
          _STAGES[key] = _STAGES.get(key, 0.0) + seconds
    register = getattr(getattr(jax, 'monitoring', None), 'register_event_duration_secs_listener',
                       None)
    if register is not None:
      register(listen)
  return sum(v for (stage, _), v in _STAGES.items() if stage == 'compile')


def _stages() -> dict:
  with _LOCK:
    return dict(_STAGES)


def last_timings() -> dict:
  """Wall-clock seconds of the last :func:`collect` in this process (a copy).

  ``{'total': s, 'here': split or None, 'worker': split or None}``. A split
  (:func:`run_counts`' own) is ``{'setup': params, optimizer states and their first
  placement, 'first_step': the first step of every run with their compiles (in the
  worker: concurrent, on up to one thread per usable core), 'steps': the other steps,
  'total': s, 'xla_compile': XLA backend compile seconds summed over threads, 'draws':
  the gradient draws (in the calling thread), 'summary': building the counts'
  summaries (``summarize``; summed over threads, overlapping the draws), 'cpu': this
  process's CPU seconds in it, 'legacy' / 'tx': {'first_step', 'steps': wall seconds of
  that optimizer's calls summed over its runs (overlapping on threads), 'trace',
  'lower', 'compile': jax's trace, MLIR lowering and XLA compile seconds paid on its
  runs' threads}}``; the worker's also has ``'devices'`` (its host device count),
  ``'startup'`` (from its start until it has read its input: python, jax and the
  optimizers' imports), ``'startup_cpu'`` and ``'process_cpu'`` (its CPU seconds
  until then and in all) and ``'results'`` (from its end of work until this process
  has its results: pickling and reading them). Empty before any :func:`collect`.
  """
  import copy
  return copy.deepcopy({k: v for k, v in _TIMINGS.items() if k != 'run_counts'})


# ---------------------------------------------------------------------------
# device counts this process lacks: a subprocess


def _start_elsewhere(payload: dict, n: int):
  """Start a worker process with ``n`` host devices on ``payload`` (``run_counts``'
  keyword arguments); :func:`_finish_elsewhere` collects its results. The
  objects travel with ``cloudpickle``; the worker gets this process's ``sys.path``.

  Raises:
    ValueError: the optimizers cannot be pickled (the message says how to start
      jax with the devices instead).
  """
  import cloudpickle
  import tempfile
  env = dict(os.environ)
  flags = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                   if not f.startswith('--xla_force_host_platform_device_count'))
  env['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={n}'.strip()
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
  try:
    blob = cloudpickle.dumps(payload)
  except Exception as e:  # noqa: BLE001
    raise ValueError(f'cannot send the optimizers to a {n}-device subprocess ({e}); start '
                     f'jax with XLA_FLAGS=--xla_force_host_platform_device_count={n}') from e
  # stdin and stdout through files: nothing blocks while this process runs its own counts
  files = [tempfile.TemporaryFile() for _ in range(3)]
  files[0].write(blob)
  files[0].seek(0)
  started = time.time()
  try:
    proc = subprocess.Popen([sys.executable, '-m', 'equivalence_tests.checker', '--worker'],
                            stdin=files[0], stdout=files[1], stderr=files[2], env=env)
  except BaseException:
    for f in files:
      f.close()
    raise
  return proc, files, n, started


def _finish_elsewhere(started) -> dict:
  """The results of :func:`_start_elsewhere`'s worker (waits for it).

  Raises:
    RuntimeError: the worker failed (its exit status and stderr's end in the message).
    ValueError, TypeError: what ``run_counts`` raised there (bad input).
  """
  proc, files, n, start = started
  try:
    proc.wait()
    files[1].seek(0)
    files[2].seek(0)
    if proc.returncode != 0:
      raise RuntimeError(f'the {n}-device run failed (exit status {proc.returncode}):\n'
                         f'{files[2].read().decode(errors="replace")[-4000:]}')
    result, split = pickle.load(files[1])
  finally:
    _stop_elsewhere(started)
  if isinstance(result, BaseException):
    raise result
  ready, done = split.pop('ready'), split.pop('done')
  _TIMINGS['worker'] = {'devices': n, 'startup': ready - start, **split,
                        'results': time.time() - done}
  return result


def _stop_elsewhere(started) -> None:
  proc, files = started[:2]
  if proc.poll() is None:
    proc.kill()
  proc.wait()
  for f in files:
    f.close()


def _worker() -> int:
  payload = pickle.loads(sys.stdin.buffer.read())
  ready, ready_cpu = time.time(), time.process_time()
  from equivalence_tests import workers
  try:
    out = run_counts(**payload, threads=workers.default_workers())  # a process of its own
  except (ValueError, TypeError) as e:
    out = e
  split = {**_TIMINGS.get('run_counts', {}), 'startup_cpu': ready_cpu,
           'process_cpu': time.process_time(), 'ready': ready, 'done': time.time()}
  pickle.dump((out, split), sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
  return 0


# ---------------------------------------------------------------------------
# the API


def check(legacy, tx, params, *, steps: int = 20, devices: Sequence[int] = (1,),
          mode: str = 'pmap', grads: str | Callable = DEFAULT_GRADS, seed: int = 0,
          max_ulp: float | None = None) -> Report:
  """Run ``legacy`` and ``tx`` side by side and compare their parameter trajectories.

  Args:
    legacy: a legacy ``OptimizerDef`` (``optim_compat``'s, a user subclass, or
      real ``flax.optim``'s in the old stack).
    tx: an Optax ``GradientTransformation``, or a callable ``params ->
      TrainState`` (``apply_gradients(grads=...)`` is then the step).
    params: a pytree of float arrays, or of ``jax.ShapeDtypeStruct`` (values
      drawn from ``seed``).
    steps: jitted steps per run.
    devices: device counts to run (``'single'`` mode: only 1).
    mode: ``'single'``, ``'pmap'`` or ``'sharded'`` (see the module docstring).
    grads: ``'mixed'`` (the default): the random draws with each leaf's elements
      cycling through the scales 1, 2**-24 and 2**-50 (``MIXED_SCALES``), so one run
      covers the regime where learning rates and betas show and the regimes where an
      epsilon's placement or size decides the update (float16 leaves keep the scale 1:
      the tiny bands underflow there; the report notes them). ``'random'``
      (deterministic, from ``seed``: multiples of 2**-12 in (-8, 8)); a migration that
      gets an epsilon wrong may pass with it (``optax.adam(eps=1e-6)`` for ``Adam``:
      2 ulp). ``'tiny'`` (the random draws times 2**-24, not for float16 leaves). Or
      ``(step, params) -> grads`` evaluated at each optimizer's own current params
      (e.g. the gradient of your loss); every device gets the same share.
    seed: seeds the params (for ``ShapeDtypeStruct`` leaves) and the gradients.
    max_ulp: bound on every leaf's distance, in ulps of that leaf's largest
      magnitude over the run (0: bitwise). None (the default): the legacy def's
      :func:`default_max_ulp` (Adam and Adam with weight decay: 24; a def whose
      Optax form is bitwise, or one the spec does not know: 4).

  Returns:
    A :class:`Report`; ``report.ok`` is the verdict and ``str(report)`` the table.

  Raises:
    ValueError: unknown mode or ``grads`` name (``'tiny'`` with float16 leaves), a device
      count < 1, ``'single'`` with more than
      one device, ``'sharded'`` with an odd count > 1, a negative ``max_ulp``,
      ``params`` without leaves, a non-float leaf, a ``TrainState`` whose
      params tree differs from ``params``, a ``tx`` callable that raises (names
      the exception).
    TypeError: ``tx`` is neither a GradientTransformation nor a callable
      returning a ``TrainState`` (e.g. ``None``, or ``optax.adam`` not called);
      the message names it (:func:`validate_tx`).
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
  devices = [int(n) for n in devices]
  if not devices or min(devices) < 1:
    raise ValueError(f'device counts must be >= 1, got {devices}')
  if mode == 'single' and devices != [1]:
    raise ValueError(f"mode 'single' runs on one device; got devices={devices} (use 'pmap')")
  if mode == 'sharded' and any(n > 1 and n % 2 for n in devices):
    raise ValueError(f"mode 'sharded' needs device counts of 1 or an even number (a data x "
                     f"model mesh with a model axis of 2), got {devices}")
  if steps < 1:
    raise ValueError(f'steps must be >= 1, got {steps}')
  if max_ulp is None:
    max_ulp = default_max_ulp(legacy)
  if not max_ulp >= 0:
    raise ValueError(f'max_ulp must be >= 0, got {max_ulp}')
  if isinstance(grads, str) and grads not in GRADS:
    raise ValueError(f'grads must be one of {GRADS} or a callable, got {grads!r}')
  refuse_draws(grads, params, seed)
  leaves = jax.tree_util.tree_leaves(params)
  if not leaves:
    raise ValueError('params has no leaves: nothing to check')
  if all(math.prod(np.shape(x)) == 0 for x in leaves):
    raise ValueError('params has no elements (every leaf has a zero-size shape): nothing to check')
  concrete = materialize(params, seed)
  validate_tx(tx, concrete)  # the leaves and tx, before any subprocess starts
  dtypes = dtype_names(concrete)
  results = collect(legacy, tx, params, grads=grads, steps=steps, seed=seed, mode=mode,
                    devices=devices, summarize=dtypes)
  return report(results, dtypes, steps, max_ulp, grads=grads,
                notes=grads_notes(grads, concrete))


#: :func:`check`'s bound (ulps) for a legacy def the spec does not know, and the least
#: :func:`default_max_ulp` gives.
DEFAULT_MAX_ULP = 4.0
#: :func:`default_max_ulp`: this many times the def's ``stock_max_ulp``. That bound was
#: measured on the recorded tree; on other trees Adam with weight decay against
#: ``optax.adamw`` (rounding only: adamw subtracts the decay in the same update, legacy
#: a second time) measures more: 9-15 ulp in the spec's notes, up to 16 over 54 trees,
#: learning rates (1e-3, 1e-2, 0.1), weight decays (1e-4, 1e-3, 1e-2) and seeds, 20
#: steps, ``'mixed'`` draws (2.7 times its stock 6). 4 times leaves a margin of 1.5 over
#: that. Wrong migrations measure far more: b1 and b2 swapped 1.5e5-5.3e5 ulp, eps 1e-6
#: for 1e-8 1.7e5-4.5e5, lr 1% off 5e3, nesterov flipped 1.4e6; a weight decay off by 2x
#: measures 20-9e4 (the least where lr * weight_decay = 1e-7, whose effect over 20
#: steps is itself near rounding: there pass more ``steps``).
STOCK_MARGIN = 4


def default_max_ulp(legacy) -> float:
  """The bound :func:`check` uses when none is given: ``STOCK_MARGIN`` times the measured
  ``stock_max_ulp`` of ``legacy``'s def in ``optim_compat.spec`` (found by class name
  along its MRO, for classes of ``optim_compat`` or ``flax.optim``: user subclasses of
  them included), at least ``DEFAULT_MAX_ULP``; ``DEFAULT_MAX_ULP`` for any other def.
  E.g. Adam 24, AdaBelief and Adadelta 28, RMSProp 12, LAMB, LARS and Adafactor 8,
  GradientDescent, Momentum and Adagrad 4."""
  try:
    from optim_compat import spec
  except ImportError:  # an old stack without the project on its path
    return DEFAULT_MAX_ULP
  for cls in type(legacy).__mro__:
    entry = spec.SPECS.get(cls.__name__)
    if entry is not None and (cls.__module__ or '').split('.')[0] in ('optim_compat', 'flax'):
      return float(max(DEFAULT_MAX_ULP, STOCK_MARGIN * entry.stock_max_ulp))
  return DEFAULT_MAX_ULP


def refuse_draws(grads, params, seed: int = 0) -> None:
  """Raise ValueError for ``grads='tiny'`` with float16 leaves (``params``: any tree
  :func:`materialize` takes)."""
  if grads == 'tiny' and 'float16' in dtype_names(materialize(params, seed)).values():
    raise ValueError("grads='tiny' with float16 leaves: an epsilon of 1e-8 and the squared "
                     "gradients underflow in float16, so both sides divide by zero; use "
                     "'mixed' (float16 leaves keep the random draws there) or 'random'")


def grads_notes(grads, params) -> tuple:
  """What the report says about the draws ``grads`` gives ``params`` (concrete leaves)."""
  if grads != 'mixed':
    return ()
  narrow = narrow_leaves(params)
  if not narrow:
    return ()
  return (f'{len(narrow)} float16 leaf/leaves ({", ".join(narrow[:5])}'
          f'{", ..." if len(narrow) > 5 else ""}) got the random draws only: the tiny bands of '
          "'mixed' underflow in float16, so epsilons are not exercised there",)


def collect(legacy, tx, params, *, grads, steps: int, seed: int, mode: str,
            devices: Sequence[int], summarize: dict | None = None) -> dict:
  """``{(mode, n): run_pair(...)}`` for each device count (bitwise its numbers): the
  counts this process has in it (:func:`run_counts`), the others in one worker
  process with the largest of them as host devices, started first and running
  meanwhile (``run_counts`` on threads there).

  Either optimizer may be ``None`` (recording only the legacy side, or
  checking a ``tx`` against a recorded file). ``summarize`` (leaf path -> dtype
  name; both optimizers given): each count's :func:`summary` instead of its
  trajectories, computed where it ran (the worker's trajectories of a 1M-parameter
  tree, 3 counts x 2 x 20 steps, are 0.5 GB to pickle and read back).

  Raises:
    ValueError: ``grads='tiny'`` with float16 leaves (:func:`refuse_draws`).
  """
  refuse_draws(grads, params, seed)
  payload = dict(legacy=legacy, tx=tx, params=params, grads=grads, steps=steps, seed=seed,
                 mode=mode)
  have = jax.local_device_count()
  here = list(dict.fromkeys(n for n in devices if n <= have))
  elsewhere = list(dict.fromkeys(n for n in devices if n > have))
  if elsewhere and jax.default_backend() != 'cpu':
    raise ValueError(f'{max(elsewhere)} devices requested, this {jax.default_backend()} '
                     f'process has {have}')
  # one worker for every missing count, on the first n of its max(elsewhere) devices,
  # running while this process runs its own counts
  clock = time.perf_counter()
  _TIMINGS.clear()
  started = (_start_elsewhere({**payload, 'counts': elsewhere, 'summarize': summarize},
                              max(elsewhere)) if elsewhere else None)
  try:
    results = run_counts(**payload, counts=here, summarize=summarize) if here else {}
  except BaseException:
    if started is not None:
      _stop_elsewhere(started)
    raise
  _TIMINGS['here'] = _TIMINGS.pop('run_counts', None)
  if started is not None:
    results.update(_finish_elsewhere(started))
  _TIMINGS.setdefault('worker', None)
  _TIMINGS['total'] = time.perf_counter() - clock
  return {(mode, n): results[(mode, n)] for n in devices}


def report(results: dict, dtypes: dict, steps: int, max_ulp: float, grads='random',
           notes: tuple = ()) -> Report:
  """The :class:`Report` of :func:`collect`'s results (``dtypes``: leaf path -> dtype name;
  ``grads``: the draws' name, or a callable; ``notes``: extra report lines). A result
  may be a count's trajectories or their :func:`summary` (``collect(...,
  summarize=dtypes)``): the same report."""
  per_leaf: dict = {}
  worst = None
  replicas = {}
  for (mode, n), r in results.items():
    part = r if r.get('summary') else summary(mode, n, r, dtypes)
    for who, ok in part['replicas'].items():
      replicas[(mode, n, who)] = ok
    for path, d in part['per_leaf'].items():
      per_leaf[path] = max(per_leaf.get(path, 0.0), d)
    if part['worst'] is not None and (worst is None or part['worst'][-1] > worst.ulp):
      worst = Worst(*part['worst'])
  max_found = max(per_leaf.values(), default=0.0)
  ok = max_found <= max_ulp and all(replicas.values())
  name = grads if isinstance(grads, str) else 'callable'
  return Report(ok, max_found, max_ulp, worst, per_leaf, replicas, list(results), steps, name,
                tuple(notes))


def summary(mode: str, n: int, result: dict, dtypes: dict) -> dict:
  """One count's part of :func:`report`, computed where its trajectories are (plain
  data, small to pickle): ``{'summary': True, 'replicas': {who: bool}, 'per_leaf':
  {path: max ulp over its steps}, 'worst': the fields of its :class:`Worst` as a tuple
  (its first largest difference in step and leaf order), or None when bitwise}``.
  ``result``: a :func:`run_pair` result with both trajectories (``run_counts(...,
  summarize=dtypes)`` builds the same step by step, keeping none)."""
  acc = _Summary(mode, n, dtypes)
  for step, leaves in result['legacy'].items():
    acc.add(step, leaves, result['tx'][step])
  return acc.result(result['replicas'])


if __name__ == '__main__':
  if sys.argv[1:] == ['--worker']:
    sys.exit(_worker())
  print('usage: python -m equivalence_tests.checker --worker  (internal)', file=sys.stderr)
  sys.exit(2)
