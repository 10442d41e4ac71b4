"""Trajectory runner and ulp comparison (runs on the old and the modern stack).

Only numpy, jax and flax are used here so the same code records golden
trajectories inside the legacy virtualenv (jax 0.4.13, flax 0.5.3).
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util


def reference_params(seed: int = 0, dtype: str = 'float32') -> dict:
  """The params tree of the golden trajectories (``dtype``, default float32).

  Nested dicts with a zero-initialised bias, a 128x128 kernel, a 3-D kernel, a
  0-d scale and a (1,)-shaped leaf; values from ``np.random.RandomState`` (a
  stream numpy guarantees across versions).
  """
  rs = np.random.RandomState(seed)
  f32 = lambda x: np.asarray(x, np.float32)
  tree = {
      'encoder': {
          'dense': {'kernel': f32(rs.standard_normal((128, 128)) * 0.1),
                    'bias': np.zeros((128,), np.float32)},
          'conv': {'kernel': f32(rs.standard_normal((3, 3, 4)) * 0.3)},
      },
      'head': {'kernel': f32(rs.standard_normal((128, 10)) * 0.1),
               'bias': np.zeros((10,), np.float32)},
      'temperature': f32(1.5),
      'offset': f32([0.25]),
  }
  if dtype == 'float32':
    return tree
  return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), tree)


#: ``np.random.RandomState`` seeds are 32-bit; :func:`reference_grads` seeds it with
#: ``seed * GRAD_SEED_STRIDE + step * 7 + 2`` at most.
GRAD_SEED_STRIDE = 100003


def max_seed(steps: int) -> int:
  """The largest ``seed`` :func:`reference_grads` can draw ``steps`` steps from (-1: none)."""
  return (2 ** 32 - 1 - 7 * max(steps, 0) - 2) // GRAD_SEED_STRIDE


def reference_grads(params, step: int, seed: int = 0, device: int | None = None,
                    n_devices: int = 1):
  """Deterministic gradient tree for ``step``, in each param leaf's dtype.

  Values are multiples of 2**-12 in (-8, 8) (rounded to the leaf's dtype), so
  sums over up to 8 devices are exact in float32. With ``device`` given, returns
  that device's share, whose mean over the ``n_devices`` (a power of two) is
  exactly the single-device ``g`` in its dtype, so a ``pmean``'d run must
  reproduce the single-device run:

  - float32 leaves: ``g + (d - (n-1)/2) * s`` (every device a different share);
  - bfloat16 / float16 leaves: ``n * g`` on device 0 and zeros elsewhere, in
    that dtype. Float32 shares would give a float32 mean (not ``g`` rounded) and
    promote the params to float32 at the first step; these stay in their dtype,
    and every partial sum in any reduction order is ``0`` or ``n * g``: exact.
  """
  g = reference_draw(params, step, seed, 1)
  if device is None:
    return g
  return reference_share(g, reference_draw(params, step, seed, 2), device, n_devices)


def reference_draw(params, step: int, seed: int, offset: int):
  """One of :func:`reference_grads`' draws (``offset`` 1: ``g``, 2: ``s``), in each leaf's
  dtype; reads only the leaves' shapes and dtypes. Drawn once, it can make every
  device's share (:func:`reference_share`) for every device count."""
  rs = np.random.RandomState(seed * GRAD_SEED_STRIDE + step * 7 + offset)

  def leaf(p):
    x = np.clip(rs.standard_normal(np.shape(p)), -7.9, 7.9)
    x = np.asarray(np.round(x * 4096) / 4096, np.float32)
    return x if np.asarray(p).dtype == np.float32 else jnp.asarray(x, np.asarray(p).dtype)
  return jax.tree_util.tree_map(leaf, params)


def reference_share(g, s, device: int, n_devices: int):
  """Device ``device``'s share of ``g`` out of ``n_devices`` (``g``, ``s``: the two
  :func:`reference_draw` trees): ``reference_grads(params, step, seed, device, n_devices)``."""
  k = np.float32(device - (n_devices - 1) / 2)

  def share(a, b):
    if np.asarray(a).dtype == np.float32:
      return (a + k * b).astype(np.float32)
    return a * n_devices if device == 0 else jnp.zeros_like(a)
  return jax.tree_util.tree_map(share, g, s)


def flat(tree) -> dict[str, np.ndarray]:
  """``{'a/b/c': array}`` for a nested-dict pytree."""
  return {'/'.join(map(str, k)): storable(v)
          for k, v in traverse_util.flatten_dict(_to_dict(tree)).items()}


def storable(x) -> np.ndarray:
  """numpy array; bfloat16/float16 widened to float32 (exact) so .npz can hold it."""
  x = np.asarray(x)
  if x.dtype.kind == 'V' or x.dtype.name in ('bfloat16', 'float16'):
    return x.astype(np.float32)
  return x


def _to_dict(tree):
  if hasattr(tree, 'unfreeze'):
    return tree.unfreeze()
  return tree


def optimization_barrier(x):
  """``jax.lax.optimization_barrier`` (jax >= 0.4.14), or its primitive on older jax."""
  barrier = getattr(jax.lax, 'optimization_barrier', None)
  if barrier is None:  # jax 0.4.13, the old stack
    from jax._src.ad_checkpoint import _optimization_barrier as barrier
  return barrier(x)


def run_legacy(opt_def, params, steps: int, seed: int = 0, n_devices: int = 1,
               record: Sequence[int] | None = None, apply_kwargs: Callable | None = None,
               use_pmap: bool | None = None, focus=None, overrides: Callable | None = None,
               corrupt_grads: Callable | None = None, scan: bool = True):
  """Run a legacy def (real ``flax.optim`` or the shim) for ``steps`` jitted steps.

  Args:
    opt_def: an ``OptimizerDef`` (legacy API: ``create`` / ``apply_gradient``).
    params: pytree of float arrays.
    n_devices: number of local devices. With ``use_pmap`` (default: when
      ``n_devices > 1``) the optimizer is replicated with
      copies on the host (what ``jax_utils.replicate`` produces, without its
      per-leaf device transfers) and each step is a ``jax.pmap`` over the first
      ``n_devices`` devices with ``pmean``'d gradients; otherwise ``jax.jit``.
    record: steps whose params to return (default: every step 1..steps).
    apply_kwargs: ``step -> dict`` of per-call hyper-parameter overrides
      (numbers; under ``pmap`` they become per-device arrays).
    focus: optional traversal passed to ``create(params, focus=...)``.
    overrides: ``(opt_def, values) -> apply_gradient kwargs``, run inside the
      jitted step with ``values = apply_kwargs(step)`` traced (e.g. to build
      a MultiOptimizer's per-group ``hyper_params=[...]`` list); default:
      the values themselves.
    corrupt_grads: ``(step, grads) -> grads`` applied to each device's
      gradients (e.g. to insert NaN/inf).
    scan: under ``pmap``, run the steps as one compiled ``lax.scan``
      (:func:`pmap_steps`); ``False``: one ``pmap`` call per step (for the
      cases whose numbers the scan does not reproduce, ``cases.PER_STEP``).

  Returns:
    ``(trajectory, final_optimizer)``; ``trajectory[step]`` is ``flat(params)``;
    under ``pmap`` each array has a leading device axis.
  """
  record = set(record or range(1, steps + 1))
  target = jax.tree_util.tree_map(jnp.asarray, params)
  opt = opt_def.create(target, focus=focus) if focus is not None else opt_def.create(target)
  kw = apply_kwargs or (lambda step: {})
  to_kwargs = overrides or (lambda opt_def, values: values)
  grads_at = _grads_fn(params, seed, corrupt_grads)
  if use_pmap is None:
    use_pmap = n_devices > 1
  apply = lambda o, g, k: o.apply_gradient(g, **to_kwargs(o.optimizer_def, k))
  if use_pmap and not scan:
    devices = jax.local_devices()[:n_devices]
    if len(devices) < n_devices:
      raise RuntimeError(f'need {n_devices} devices, have {len(jax.local_devices())}; '
                         'set XLA_FLAGS=--xla_force_host_platform_device_count=N')
    opt = replicate_on_host(opt, n_devices)
    step_fn = jax.pmap(data_parallel(apply), axis_name='batch', devices=devices)
    traj = {}
    for step in range(steps):
      g = stack([grads_at(step, d, n_devices) for d in range(n_devices)])
      k = {name: np.full((n_devices,), v, np.float32) for name, v in kw(step).items()}
      opt = step_fn(opt, g, k)
      if step + 1 in record:
        traj[step + 1] = flat(opt.target)
    return traj, opt
  if use_pmap:
    # every step's gradient shares and overrides up front: one program for all steps
    def draw(step, like):
      return (stack([grads_at(step, d, n_devices) for d in range(n_devices)]),
              {name: np.full((n_devices,), v, np.float32) for name, v in kw(step).items()})
    first = lambda args: jax.tree_util.tree_map(lambda x: x[0], args)
    head, tail = plan_steps(apply, opt, draw, steps, lambda o: o.target, first)
    opt, history = pmap_steps(apply, opt, head, tail, n_devices, lambda o: o.target)
    return {step: flat(history[step - 1]) for step in sorted(record)}, opt
  step_fn = jax.jit(apply)
  traj = {}
  for step in range(steps):
    opt = step_fn(opt, grads_at(step), kw(step))
    if step + 1 in record:
      traj[step + 1] = flat(opt.target)
  return traj, opt


def stack(trees):
  """One pytree of numpy arrays: ``trees``' leaves stacked on a new leading axis.

  Raises:
    ValueError: the trees differ in structure (from ``jax.tree_util.tree_map``).
  """
  return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def replicate_on_host(tree, n_devices: int):
  """Each leaf ``x`` as a read-only numpy view of shape ``(n_devices,) + x.shape``:
  what ``flax.jax_utils.replicate`` produces, without its per-leaf device transfers
  (``pmap`` shards the copies itself)."""
  return jax.tree_util.tree_map(
      lambda x: np.broadcast_to(np.asarray(x), (n_devices,) + np.shape(x)), tree)


def host(x) -> np.ndarray:
  """A device array as numpy (zero-size ``pmap`` outputs, which jax cannot fetch, rebuilt)."""
  if int(np.prod(np.shape(x))) == 0:
    return np.zeros(np.shape(x), x.dtype)
  return np.asarray(x)


def replicas_bitwise(tree) -> bool:
  """Every leaf's slices along its leading (device) axis bitwise equal to slice 0
  (NaN equal to NaN): the replicas of a ``pmap`` output, or of a trajectory of them."""
  return all(_same_bytes(x) or all(np.array_equal(storable(x[d]), storable(x[0]), equal_nan=True)
                                   for d in range(x.shape[0]))
             for x in map(host, jax.tree_util.tree_leaves(tree)))


def _same_bytes(x: np.ndarray) -> bool:
  """Every slice of ``x`` along axis 0 has slice 0's bytes (then ``array_equal`` holds too;
  otherwise that, which takes -0.0 == 0.0 and NaN == NaN, decides)."""
  if x.ndim == 0:
    return False  # no device axis: the slow path says so
  if x.shape[0] < 2 or x.size == 0:
    return True
  size = x.dtype.itemsize
  flat = np.ascontiguousarray(x).reshape(x.shape[0], -1)
  words = flat.view(f'u{size}') if size in (1, 2, 4, 8) else flat.view(np.uint8)
  return bool((words[1:] == words[:1]).all())


def data_parallel(step: Callable) -> Callable:
  """``step(state, grads, *rest)`` for inside ``pmap(axis_name='batch')``: ``grads``
  ``pmean``'d, behind an optimization barrier (it keeps XLA from fusing pmean's
  ``psum * (1/n)`` into the optimizer's arithmetic, where it changes which
  multiply-add LLVM contracts into an FMA: a program difference, not an
  optimizer one)."""
  def pstep(state, grads, *rest):
    return step(state, optimization_barrier(jax.lax.pmean(grads, 'batch')), *rest)
  return pstep


def _signature(tree):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, [(tuple(x.shape), np.dtype(x.dtype), bool(getattr(x, 'weak_type', False)))
                   for x in leaves]


def plan_steps(step: Callable, state, draw: Callable, steps: int, params_of: Callable,
               view: Callable = lambda args: args):
  """Every step's arguments, drawn up front, split where ``lax.scan`` can take over.

  A scan needs a state whose type (tree, shapes, dtypes, weak types) the step
  keeps; the first steps that change it (a weak-typed counter becomes strong;
  a user's float32 gradients promote bfloat16 params) must run alone, as
  separate programs, like every step once did. Traces only (``jax.eval_shape``).

  Args:
    step: ``(state, *args) -> state`` (for ``pmap``: one device's step).
    state: the initial state (arrays or ``jax.ShapeDtypeStruct``).
    draw: ``(t, like) -> args`` of step ``t``, a tuple; ``like`` is
      ``params_of(state)`` as zeros of the dtypes the state has before step
      ``t`` (what a gradient function that reads shapes and dtypes needs).
    steps: how many steps.
    view: ``args -> `` what ``step`` sees of them (e.g. one device's slice).

  Returns:
    ``(head, tail)``: the argument tuples of the type-changing first steps,
    and the tuple of the remaining steps' arguments stacked on a new leading
    axis (``None`` when no step is left).
  """
  avals = jax.eval_shape(lambda s: s, state)
  head = []
  for t in range(steps):
    like = jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype), params_of(avals))
    args = tuple(draw(t, like))
    out = jax.eval_shape(step, avals, *view(args))
    if _signature(out) == _signature(avals):
      rest = [args] + [tuple(draw(u, like)) for u in range(t + 1, steps)]
      return head, tuple(stack(column) for column in zip(*rest))
    head.append(args)
    avals = out
  return head, None


def pmap_steps(step: Callable, state, head: list, tail, n_devices: int, params_of: Callable):
  """All steps of a data-parallel run under ``jax.pmap``: one compiled ``lax.scan``.

  Args:
    step: ``(state, grads, *rest) -> state`` for one device (e.g.
      ``opt.apply_gradient``); it gets ``pmean``'d gradients (:func:`data_parallel`).
    state: one copy of the state pytree (replicated here, on the host).
    head, tail: from :func:`plan_steps` with ``view`` taking device 0's slice:
      ``head`` a list of ``(grads, *rest)`` tuples whose leaves have shape
      ``(n_devices, ...)`` (each device's share), run one compiled step each;
      ``tail`` the same, stacked: leaves ``(steps, n_devices, ...)``, one scan.
    n_devices: the first ``n_devices`` local devices are used.
    params_of: ``state -> params`` (what is kept after every step).

  Returns:
    ``(final_state, history)``: the final state (leaves ``(n_devices, ...)``,
    on the devices) and a list with one pytree per step: ``params_of(state)``
    after it, numpy arrays of shape ``(n_devices, ...)``.

  Raises:
    RuntimeError: fewer than ``n_devices`` local devices.
  """
  devices = jax.local_devices()[:n_devices]
  if len(devices) < n_devices:
    raise RuntimeError(f'need {n_devices} devices, have {len(jax.local_devices())}; '
                       'set XLA_FLAGS=--xla_force_host_platform_device_count=N')
  pstep = data_parallel(step)
  state = replicate_on_host(state, n_devices)
  history = []
  if head:
    one = jax.pmap(pstep, axis_name='batch', devices=devices)
    for args in head:
      state = one(state, *args)
      history.append(jax.tree_util.tree_map(host, params_of(state)))
  if tail is not None:
    def body(s, x):
      s = pstep(s, *x)
      return s, params_of(s)
    run = jax.pmap(lambda s, x: jax.lax.scan(body, s, x), axis_name='batch', devices=devices)
    state, stacked = run(state, jax.tree_util.tree_map(lambda x: np.swapaxes(x, 0, 1), tail))
    stacked = jax.tree_util.tree_map(host, stacked)
    steps = np.shape(jax.tree_util.tree_leaves(tail)[0])[0]
    history += [jax.tree_util.tree_map(lambda x: x[:, t], stacked) for t in range(steps)]
  return state, history


def _grads_fn(params, seed, corrupt_grads):
  def grads_at(step, device=None, n_devices=1):
    g = reference_grads(params, step, seed, device, n_devices)
    return corrupt_grads(step, g) if corrupt_grads else g
  return grads_at


def run_optax(tx, params, steps: int, seed: int = 0, record=None, hyperparams=None,
              corrupt_grads: Callable | None = None):
  """Run an Optax ``GradientTransformation`` the way ``TrainState`` does.

  ``hyperparams``: ``step -> dict`` written into an ``inject_hyperparams``
  state before each update (the migrated form of a per-call lr override).
  ``corrupt_grads``: as in :func:`run_legacy`.
  """
  grads_at = _grads_fn(params, seed, corrupt_grads)
  import optax
  record = set(record or range(1, steps + 1))
  p = jax.tree_util.tree_map(jnp.asarray, params)
  state = tx.init(p)

  @jax.jit
  def step_fn(p, s, g, hp):
    if hp:
      s = optax.tree_utils.tree_set(s, **hp)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s
  traj = {}
  for step in range(steps):
    hp = {k: jnp.float32(v) for k, v in (hyperparams(step) if hyperparams else {}).items()}
    p, state = step_fn(p, state, grads_at(step), hp)
    if step + 1 in record:
      traj[step + 1] = flat(p)
  return traj


#: float32 spacing times this factor is the spacing of the named narrower float.
_ULP_FACTOR = {'float32': 1, 'bfloat16': 2 ** 16, 'float16': 2 ** 13}


def ulp_distance(actual: np.ndarray, expected: np.ndarray, scale: float | None = None,
                 dtype: str | None = None) -> float:
  """max |actual - expected| in ulps of the leaf's largest magnitude.

  The ulp is ``np.spacing`` of ``scale`` (default ``max|expected|``) in
  ``dtype`` (default ``expected``'s; ``'bfloat16'`` for values widened from
  bfloat16): the spacing at the leaf's scale. 0.0 means equal values; NaN at
  the same positions, and equal infinities, count as equal; any other
  difference involving NaN or inf is ``inf``.
  """
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  if a.shape != e.shape:
    raise ValueError(f'shape mismatch {a.shape} vs {e.shape}')
  same = (a == e) | (np.isnan(a) & np.isnan(e))  # equal infinities count as equal too
  with np.errstate(invalid='ignore'):
    diff = np.where(same, 0.0, np.abs(a - e))
  if not np.all(np.isfinite(diff)):  # NaN vs a number, inf vs a number, +inf vs -inf
    return float('inf')
  if diff.size == 0 or not np.any(diff):
    return 0.0
  if scale is None:
    finite = np.abs(e[np.isfinite(e)])
    scale = float(finite.max()) if finite.size else 0.0
  base = np.asarray(expected).dtype
  if base.kind != 'f':
    base = np.dtype(np.float32)
  factor = _ULP_FACTOR.get(dtype or base.name, 1)
  ulp = float(np.spacing(base.type(scale))) if scale > 0 else float(np.finfo(base).tiny)
  return float(np.max(diff) / (ulp * factor))


def leaf_scales(trajectory: dict) -> dict[str, float]:
  """``{leaf path: largest finite |value| over all steps}`` of a trajectory."""
  scales: dict[str, float] = {}
  for leaves in trajectory.values():
    for path, value in leaves.items():
      finite = np.abs(np.asarray(value, np.float64))
      finite = finite[np.isfinite(finite)]
      scales[path] = max(scales.get(path, 0.0), float(finite.max()) if finite.size else 0.0)
  return scales


def compare(actual: dict, expected: dict, dtype: str | None = None) -> tuple[float, tuple | None]:
  """Max ulp distance over steps and leaves, and ``(step, leaf)`` of the worst.

  A leaf's scale is its largest magnitude over all compared steps, so a
  small (e.g. one-element) leaf passing near zero is not judged against the
  spacing of a value close to zero.

  Raises:
    KeyError: ``actual`` lacks a step or leaf path that ``expected`` has.
  """
  worst, where = 0.0, None
  scales = leaf_scales(expected)
  for step, leaves in expected.items():
    for path, value in leaves.items():
      d = ulp_distance(actual[step][path], value, scales[path], dtype)
      if d > worst:
        worst, where = d, (step, path)
  return worst, where


def bitwise_equal(actual: dict, expected: dict) -> bool:
  return all(np.array_equal(actual[s][k], v, equal_nan=True)
             for s, leaves in expected.items() for k, v in leaves.items())
