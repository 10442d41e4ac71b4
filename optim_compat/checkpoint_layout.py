"""Checkpoint layouts: state dicts checked against a target, legacy optimizer -> TrainState.

The layout half of :mod:`optim_compat.checkpoint`: finding legacy ``Optimizer``
state dicts (``{'target', 'state': {'step', 'param_states'}}``) in a checkpoint,
checking a found state dict against the target's (:func:`_conform`: keys,
shapes, dtypes; orbax's None for empty nodes), device axes of replicated saves,
and the two directions between a legacy ``OptimizerState`` and an Optax
``opt_state`` (rows of ``optim_compat.state_map``): :func:`opt_state_from_legacy`
(legacy -> Optax, :class:`_Filler`) and :func:`legacy_from_opt_state` (Optax ->
legacy). The checkpoint converter (``restore_legacy``, ``to_legacy``,
``convert-checkpoint``) and the legacy view (:mod:`optim_compat.legacy_view`)
both call these two, so the mapping exists once. Both are pure pytree
re-arrangements (a negation for LARS): they run under ``jit`` on traced values.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

import jax
import numpy as np
from flax import serialization, traverse_util
from flax.training import train_state as train_state_lib

from optim_compat import base, spec, state_map, transforms, weight_norm
from optim_compat.checkpoint_files import CheckpointError, ReplicatedCheckpointWarning

_EMPTY = traverse_util.empty_node
_INJECT_KEPT = ('hyperparams', 'hyperparams_states')


#: optax.multi_transform's state: MultiTransformState (optax < 0.2.5), PartitionState
_PARTITION = {'MultiTransformState', 'PartitionState'}
#: legacy WeightNorm's per-parameter fields holding the wrapped def's states -> the key of
#: ``transforms.weight_norm``'s inner parameters they belong to
_WN_INNER = {'direction_state': 'direction', 'scale_state': 'scale'}


# --------------------------------------------------------------------------
# finding and checking state dicts


def is_legacy_optimizer(sd) -> bool:
  """Whether ``sd`` has the legacy ``Optimizer`` state-dict layout."""
  return (isinstance(sd, Mapping) and set(sd) == {'target', 'state'}
          and isinstance(sd['state'], Mapping) and set(sd['state']) == {'step', 'param_states'})


def find_legacy_optimizers(sd, path: tuple = ()) -> list[tuple[str, ...]]:
  """Key paths (tuples of str) of every legacy optimizer sub-tree of a state dict."""
  if is_legacy_optimizer(sd):
    return [path]
  if not isinstance(sd, Mapping):
    return []
  out = []
  for k, v in sd.items():
    out += find_legacy_optimizers(v, path + (k,))
  return out


def _normalize_namedtuples(sd):
  """Old Flax namedtuple layout ``{'name', 'fields', 'values'}`` -> field-name keys.

  Flax wrote namedtuples as ``{'name': cls, 'fields': {'0': f0, ...}, 'values':
  {'0': v0, ...}}`` before it switched to ``{f0: v0, ...}`` (flax
  ``serialization._restore_namedtuple`` still reads both). Arrays are not copied.
  """
  if not isinstance(sd, Mapping):
    return sd
  if (set(sd) == {'name', 'fields', 'values'} and isinstance(sd['fields'], Mapping)
      and isinstance(sd['values'], Mapping)):
    sd = {sd['fields'][str(i)]: sd['values'][str(i)] for i in range(len(sd['fields']))}
  return {k: _normalize_namedtuples(v) for k, v in sd.items()}


def _describe(x) -> str:
  if x is None:
    return 'None'
  if x is _EMPTY:
    return '{}'
  if isinstance(x, Mapping):
    return 'a sub-tree'
  dtype = getattr(x, 'dtype', None)
  shape = tuple(np.shape(x)) if hasattr(x, 'shape') or np.isscalar(x) else '?'
  return f'{np.dtype(dtype).name if dtype is not None else type(x).__name__}{list(shape)}'


def _flat(tree) -> dict:
  if isinstance(tree, Mapping):
    return traverse_util.flatten_dict(dict(tree), keep_empty_nodes=True)
  return {(): tree}


def _join(where: str, key: tuple) -> str:
  return '/'.join([where.strip('/')] * bool(where.strip('/')) + [str(k) for k in key]) or '/'


def _get(sd, keys, where=''):
  for i, k in enumerate(keys):
    if not isinstance(sd, Mapping) or k not in sd:
      raise CheckpointError(f'structure mismatch at {_join(where, keys[:i + 1])}: the target has '
                            f'an optimizer there, the checkpoint has nothing')
    sd = sd[k]
  return sd


def _set(sd, keys, value):
  if not keys:
    return value
  out = dict(sd)
  out[keys[0]] = _set(sd[keys[0]], keys[1:], value)
  return out


def _no_arrays(tree) -> bool:
  """Whether a state-dict sub-tree holds no data: only empty nodes (``{}``) and ``None``."""
  if tree is None:
    return True
  return isinstance(tree, Mapping) and all(_no_arrays(v) for v in tree.values())


def _fill_empty(expected, found):
  """``found`` with the empty nodes of ``expected`` where it has ``None`` or nothing.

  An empty tuple or namedtuple (optax ``EmptyState()``, ``MaskedNode()``, the
  state of ``add_decayed_weights`` or ``set_to_zero``) is ``{}`` in a state dict
  but ``None`` in an orbax checkpoint, and a sub-tree holding only such nodes
  (``chain(EmptyState(), EmptyState())``) may come back as one ``None``; either
  way there is no data to lose. Anything holding an array is left to
  :func:`_conform` to check.
  """
  if not isinstance(expected, Mapping):
    return found
  if (found is None or (isinstance(found, Mapping) and not found)) and _no_arrays(expected):
    return _empty_like(expected)
  if not isinstance(found, Mapping):
    return found
  out = dict(found)
  for k, e in expected.items():
    if k in found:
      out[k] = _fill_empty(e, found[k])
    elif _no_arrays(e):
      out[k] = _empty_like(e)
  return out


def _empty_like(tree):
  return {k: _empty_like(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _conform(expected, found, where: str, replicas: int | None = None):
  """``found`` checked against ``expected`` (state dicts): same keys, shapes, dtypes.

  With ``replicas``, a found leaf of shape ``(replicas,) + expected`` is
  replaced by its first copy (device 0, a numpy view). ``None`` where
  ``expected`` has only empty nodes is taken as those (:func:`_fill_empty`).

  Raises:
    CheckpointError: naming the first differing path (sorted order) with the
      expected and found shape/dtype.
  """
  found = _fill_empty(expected, found)
  fe, ff = _flat(expected), _flat(found)
  out = {}
  for key in sorted(set(fe) | set(ff), key=lambda k: tuple(map(str, k))):
    path = _join(where, key)
    if key not in ff:
      deeper = [k for k in ff if k[:len(key)] == key]
      what = 'a sub-tree' if deeper else 'nothing'
      raise CheckpointError(f'structure mismatch at {path}: expected {_describe(fe[key])}, '
                            f'found {what}')
    if key not in fe:
      deeper = [k for k in fe if k[:len(key)] == key]
      raise CheckpointError(f'structure mismatch at {path}: expected '
                            f'{"a sub-tree" if deeper else "nothing"}, found {_describe(ff[key])}')
    e, f = fe[key], ff[key]
    if (e is None) != (f is None) or (e is _EMPTY) != (f is _EMPTY):
      raise CheckpointError(f'structure mismatch at {path}: expected {_describe(e)}, '
                            f'found {_describe(f)}')
    if e is not None and e is not _EMPTY:
      e_shape, f_shape = tuple(np.shape(e)), tuple(np.shape(f))
      if replicas and f_shape == (replicas,) + e_shape and hasattr(f, 'shape'):
        f, f_shape = f[0], e_shape
      e_dtype, f_dtype = getattr(e, 'dtype', None), getattr(f, 'dtype', None)
      if e_shape != f_shape or (e_dtype is not None and f_dtype is not None
                                and np.dtype(e_dtype) != np.dtype(f_dtype)):
        raise CheckpointError(f'structure mismatch at {path}: expected {_describe(e)}, '
                              f'found {_describe(f)}')
    out[key] = f
  if set(out) == {()}:
    return out[()]
  return traverse_util.unflatten_dict(out)


def _replicas(step) -> int | None:
  """``n`` for a step of shape ``(n,)`` (one per device: a replicated optimizer), else None."""
  shape = np.shape(step)
  return shape[0] if len(shape) == 1 else None


def _strip_replicas(opt_sd, where: str, step_key=('state', 'step')):
  """``(opt_sd, n)``: a replicated save (step of shape ``(n,)``) reduced to device 0.

  ``step_key``: where the step is (``('step',)`` in a ``TrainState`` state dict).
  """
  step = np.asarray(_get(opt_sd, step_key))
  if step.ndim == 0:
    return opt_sd, None
  if step.ndim != 1:
    raise CheckpointError(f'{_join(where, step_key)}: expected an int scalar (or one '
                          f'per device), found {_describe(step)}')
  n = step.shape[0]
  warnings.warn(f'{_join(where, ())}: saved from a replicated optimizer (leading device axis '
                f'of {n}; steps {step.tolist()}): using device 0\'s copy',
                ReplicatedCheckpointWarning, stacklevel=3)
  flat = _flat(opt_sd)
  for key, x in flat.items():
    if x is None or x is _EMPTY:
      continue
    if np.ndim(x) < 1 or np.shape(x)[0] != n:
      raise CheckpointError(f'{_join(where, key)}: step has a device axis of {n} but this leaf '
                            f'is {_describe(x)}')
    flat[key] = x[0]
  return traverse_util.unflatten_dict(flat), n


def _index(tree, i):
  """Device ``i``'s copy of every array leaf of a replicated state dict."""
  if isinstance(tree, Mapping):
    return {k: _index(v, i) for k, v in tree.items()}
  return tree if tree is None else tree[i]


# --------------------------------------------------------------------------
# legacy -> TrainState


def _is_namedtuple(x) -> bool:
  return isinstance(x, tuple) and hasattr(x, '_fields')


def _classes(node, out=None) -> set:
  """Names of the namedtuple classes in an ``opt_state``."""
  out = set() if out is None else out
  if _is_namedtuple(node):
    out.add(type(node).__name__)
    for v in node:
      _classes(v, out)
  elif isinstance(node, (tuple, list)):
    for v in node:
      _classes(v, out)
  elif isinstance(node, Mapping):
    for v in node.values():
      _classes(v, out)
  return out


def _legacy_fields(ps_flat: dict) -> set:
  return {k[-1] for k, v in ps_flat.items() if v is not None and v is not _EMPTY and k}


def _mixed_states(ps_flat: dict) -> str:
  """A sentence when parameters hold different legacy state fields (helper-35's D2: a
  ``MultiOptimizer`` checkpoint, one def per group), else ``''``."""
  per_param: dict = {}
  for k, v in ps_flat.items():
    if k:
      per_param.setdefault(k[:-1], set()).update([k[-1]] if v is not None and v is not _EMPTY else [])
  if any(weight_norm.holds_weight_norm_states(f) for f in per_param.values()):
    return ('. Its parameters hold WeightNorm states (direction, scale and the wrapped def\'s): '
            "convert with --optimizer 'WeightNorm(<the def it wraps>(...), wn_decay=...)'")
  kinds: dict = {}
  for key, fields in per_param.items():
    kinds.setdefault(tuple(sorted(fields)), '/'.join(map(str, key)))
  if len(kinds) < 2:
    return ''
  shown = '; '.join(f'{where}: {list(fields) or "no state"}' for fields, where in kinds.items())
  return (f'. Its parameters hold different legacy states ({shown}): a MultiOptimizer '
          'checkpoint, one optimizer per group, which one --optimizer cannot describe; build '
          'the MultiOptimizer with optim_compat and restore it with '
          'optim_compat.checkpoint.restore_legacy(path, state)')


def _def_name(optimizer) -> str | None:
  if optimizer is None:
    return None
  if isinstance(optimizer, str):
    return optimizer.split('(')[0].strip()
  return type(optimizer).__name__


def choose_row(opt_state, fields: set, optimizer=None, candidates=None) -> dict:
  """The ``state_map`` row for a target ``opt_state`` and the checkpoint's legacy fields.

  ``optimizer`` (a def, its name, or ``"Name(...)"``) picks the row directly.
  Otherwise the row is the one whose Optax state classes the target holds
  (e.g. ``ScaleByAdamState``: Adam) and whose legacy fields the checkpoint has;
  Momentum and LARS (both a ``TraceState``) are told apart by LARS's
  ``MaskedState``. ``candidates`` (def names) limits the rows considered.

  Raises:
    CheckpointError: no row, or more than one, fits (the message lists them).
  """
  if (_PARTITION | {'WeightNormState'}) & _classes(opt_state):
    # each group picks its own row (_Filler.rebuild_groups), a weight_norm's inner
    # transformation its own (_Filler.rebuild_weight_norm)
    return {}
  name = _def_name(optimizer)
  if name is not None and name in state_map.OPTAX_STATE_SOURCES:
    return state_map.OPTAX_STATE_SOURCES[name]
  rows = {n: r for n, r in state_map.OPTAX_STATE_SOURCES.items()
          if candidates is None or n in candidates}
  known = {c for row in rows.values() for c, f in row.items() if f}
  present = _classes(opt_state)
  need = present & known
  if not need:
    return {}
  scored = []
  for name, row in rows.items():
    mapped = {c for c, f in row.items() if f}
    if not need <= mapped:
      continue
    wanted = {src.lstrip('-') for c in need for src in row[c].values()}
    if not wanted <= fields:
      continue
    scored.append((len(set(row) & present) - len(set(row) - present - mapped), name, row))
  if not scored:
    raise CheckpointError(f'the target opt_state ({sorted(need)}) cannot hold this checkpoint\'s '
                          f'legacy state fields {sorted(fields)}: is the target built with the '
                          f'right optimizer?')
  scored.sort(key=lambda s: -s[0])
  if len(scored) > 1 and scored[0][0] == scored[1][0]:
    raise CheckpointError(f'ambiguous: {[s[1] for s in scored]} all fit; pass optimizer=')
  return scored[0][2]


def _is_jax(x) -> bool:
  return isinstance(x, (jax.Array, jax.core.Tracer))


def _cast(x, dtype):
  """``x`` as ``dtype``: a jax (or traced) value stays one, anything else becomes numpy."""
  if _is_jax(x):
    return x if x.dtype == dtype else x.astype(dtype)
  return np.asarray(x, dtype)


def _negate(x):
  return np.negative(x) if isinstance(x, (np.ndarray, np.generic)) else -x


class _Filler:
  """Rebuilds a target ``opt_state`` from one legacy optimizer state (a state dict)."""

  def __init__(self, step, param_states, row, where, source='the checkpoint'):
    self.step = step
    self.ps = param_states
    self.ps_flat = _flat(param_states)
    self.row = row
    self.where = where
    self.source = source
    self.used: set = set()
    self.candidates = None

  def count_like(self, template, path):
    if np.shape(template) != np.shape(self.step):
      raise CheckpointError(f'{path}: target count has shape {np.shape(template)}; restore into '
                            f'an unreplicated target and replicate afterwards')
    dtype = getattr(template, 'dtype', None)
    return _cast(self.step, dtype) if dtype is not None else int(self.step)

  def field_tree(self, template, source: str, path: str):
    negate = source.startswith('-')
    field = source.lstrip('-')
    out = {}
    for key, tpl in _flat(serialization.to_state_dict(template)).items():
      if tpl is _EMPTY:  # optax.MaskedNode: a leaf of another multi_transform group
        out[key] = {}
        continue
      legacy_key = key + (field,)
      where = _join(self.where, ('state', 'param_states') + legacy_key)
      if legacy_key not in self.ps_flat:
        raise CheckpointError(f'{where}: missing from {self.source} ({path} needs it; '
                              f'{self.source} has fields {sorted(_legacy_fields(self.ps_flat))})'
                              + _mixed_states(self.ps_flat))
      value = _conform(tpl, self.ps_flat[legacy_key], where)
      self.used.add(legacy_key)
      out[key] = _negate(value) if negate else value
    return serialization.from_state_dict(template, traverse_util.unflatten_dict(out)
                                         if set(out) != {()} else out[()])

  def legacy_states(self, template):
    where = _join(self.where, ('state', 'param_states'))
    tpl_sd = serialization.to_state_dict(template)
    # a template leaf {} where the checkpoint has state fields (or None) is an
    # optax.MaskedNode: that leaf belongs to another multi_transform group
    masked = [k for k, t in _flat(tpl_sd).items() if t is _EMPTY
              and not (k in self.ps_flat and self.ps_flat[k] is _EMPTY)]
    inside = lambda key: any(key[:len(m)] == m for m in masked)
    mine = {k: v for k, v in self.ps_flat.items() if not inside(k)}
    mine.update({m: _EMPTY for m in masked})
    found = _conform(tpl_sd, traverse_util.unflatten_dict(mine) if set(mine) != {()} else
                     mine[()], where)
    self.used.update(k for k in mine if k not in masked)
    return serialization.from_state_dict(template, found)

  def rebuild(self, node, path: str):
    if isinstance(node, transforms.WeightNormState):
      return self.rebuild_weight_norm(node, path)
    if isinstance(node, transforms.LegacyRuleState):
      return type(node)(self.count_like(node.count, f'{path}.count'),
                        self.legacy_states(node.param_states))
    if isinstance(node, base.OptimizerState):
      return node.replace(step=self.count_like(node.step, f'{path}.step'),
                          param_states=self.legacy_states(node.param_states))
    if _is_namedtuple(node) and type(node).__name__ in _PARTITION:
      return node._replace(inner_states=self.rebuild_groups(node.inner_states, path))
    if _is_namedtuple(node):
      cls = type(node).__name__
      sources = self.row.get(cls, {})
      values = {}
      for f in node._fields:
        v, p = getattr(node, f), f'{path}.{f}'
        if f == 'count':
          values[f] = self.count_like(v, p)
        elif cls.startswith('Inject') and f in _INJECT_KEPT:
          values[f] = v  # legacy checkpoints hold no hyper-parameters
        elif f in sources:
          values[f] = self.field_tree(v, sources[f], p)
        else:
          values[f] = self.rebuild(v, p)
      return type(node)(**values)
    if isinstance(node, (tuple, list)):
      return type(node)(self.rebuild(v, f'{path}[{i}]') for i, v in enumerate(node))
    if isinstance(node, Mapping):
      return type(node)({k: self.rebuild(v, f'{path}[{k!r}]') for k, v in node.items()})
    if node is None or not hasattr(node, 'shape'):
      return node
    raise CheckpointError(f'{path}: no legacy source for this {_describe(node)} leaf of the target '
                          f'opt_state (fields without a mapping in optim_compat.state_map)')

  def rebuild_weight_norm(self, node, path):
    """``transforms.weight_norm``'s state from legacy ``WeightNorm`` per-parameter states
    (``<param>/{direction, scale, direction_state/<field>, scale_state/<field>}``): the
    direction and scale trees as they are, the wrapped def's states as the inner
    transformation's, over ``{'direction': ..., 'scale': ...}`` (its row chosen by its
    own state classes)."""
    fields = _legacy_fields(self.ps_flat)
    if not weight_norm.holds_weight_norm_states(fields):
      raise CheckpointError(f'{path}: a weight_norm state, and {self.source} holds no WeightNorm '
                            f'state (no per-parameter direction and scale; it has fields '
                            f'{sorted(fields)}): is the target built with the right optimizer?')
    inner_flat = _wn_inner_flat(self.ps_flat)
    self.used.update(k for k in self.ps_flat if len(k) >= 2 and k[-2] in _WN_INNER)
    inner = _Filler(self.step, traverse_util.unflatten_dict(inner_flat) if inner_flat else {},
                    None, self.where, self.source)
    # (the wrapped def's row, by its state classes: candidates name the WeightNorm)
    try:
      inner.row = choose_row(node.inner_state, _legacy_fields(inner.ps_flat))
    except CheckpointError as e:  # (helper-39: the message named neither the path nor WeightNorm)
      raise CheckpointError(f'{path}.inner_state (the def WeightNorm wraps): {e}') from None
    inner_state = inner.rebuild(node.inner_state, f'{path}.inner_state')
    inner.check_all_used()
    return type(node)(self.field_tree(node.direction, 'direction', f'{path}.direction'),
                      self.field_tree(node.scale, 'scale', f'{path}.scale'), inner_state)

  def rebuild_groups(self, inner_states, path):
    """``optax.multi_transform`` groups (the codemod's MultiOptimizer / focus form):
    each group's state is filled with the row of its own transformation."""
    out, outer = {}, self.row
    for label, inner in inner_states.items():
      sub = inner.inner_state if type(inner).__name__ == 'MaskedState' else inner
      self.row = choose_row(sub, _legacy_fields(self.ps_flat), candidates=self.candidates)
      out[label] = self.rebuild(inner, f'{path}.inner_states[{label!r}]')
    self.row = outer
    return type(inner_states)(out)

  def check_all_used(self):
    for key, v in self.ps_flat.items():
      if v is None or v is _EMPTY or key in self.used:
        continue
      raise CheckpointError(f'{_join(self.where, ("state", "param_states") + key)}: legacy state '
                            f'{_describe(v)} has no place in the target opt_state (it would be '
                            f'silently dropped): is the target built with the right optimizer?')


def _wn_inner_flat(ps_flat: dict) -> dict:
  """Legacy WeightNorm per-parameter states (flat: ``(*param, 'direction_state', field)``)
  -> the wrapped def's states over ``{'direction': ..., 'scale': ...}`` (flat: ``('direction',
  *param, field)``), a ``{}`` state (a def with none) kept as one."""
  inner = {}
  for key, v in ps_flat.items():
    if len(key) >= 2 and key[-2] in _WN_INNER:
      inner[(_WN_INNER[key[-2]],) + key[:-2] + key[-1:]] = v
    elif key and key[-1] in _WN_INNER and v is _EMPTY:
      inner[(_WN_INNER[key[-1]],) + key[:-1]] = v
  return inner


def opt_state_from_legacy(template, step, param_states, optimizer=None, *, where: str = '',
                          candidates=None, source: str = 'the checkpoint'):
  """Legacy -> Optax: ``template`` (an ``opt_state``) holding a legacy optimizer state.

  The one implementation of this direction (``restore_legacy``, ``convert-checkpoint``
  and ``optim_compat.with_legacy_state`` call it).

  Args:
    template: the target ``opt_state`` (of the tx the codemod emits for the def,
      ``inject_hyperparams`` wrapped or not, ``multi_transform`` groups, or
      ``to_optax(def)``); only its structure, shapes and dtypes are used, except
      ``inject_hyperparams`` values, which are kept.
    step: the legacy int ``step`` (numpy, jax or traced; the shape of the
      template's counts).
    param_states: the legacy ``param_states`` as a state dict (mirror of params;
      each leaf a dict of legacy fields, ``{}`` for no state, ``None`` for a leaf
      no MultiOptimizer group selects).
    optimizer: the def (instance, name or ``"Name(...)"``) picking the
      ``state_map`` row; None: inferred from the template's state classes.
    where: path prefix for error messages.
    candidates: def names the per-group rows are chosen among (None: all).
    source: what ``param_states`` is, for error messages.

  Returns:
    ``template``'s structure: every Optax ``count`` = ``step`` (in the count's
    dtype), moments at the fields of ``optim_compat.state_map`` (negated where
    the row says ``-``), legacy-layout states (``LegacyRuleState``,
    ``OptimizerState``) filled as they are. Leaves are the given values (numpy
    stays numpy, jax arrays and tracers stay so).

  Raises:
    CheckpointError: a legacy field missing, of another shape / dtype, or
      without a place in the template (the message names the path).
  """
  filler = _Filler(step, param_states, None, where, source)
  filler.candidates = candidates
  filler.row = choose_row(template, _legacy_fields(filler.ps_flat), optimizer, candidates)
  opt_state = filler.rebuild(template, 'opt_state')
  filler.check_all_used()
  return opt_state


def legacy_from_opt_state(opt_state, optimizer_def, template_param_states, check_count=None,
                          *, where: str = 'opt_state'):
  """Optax -> legacy: the legacy ``param_states`` (a state dict) an ``opt_state`` holds.

  The one implementation of this direction (``to_legacy`` and
  ``optim_compat.legacy_state`` call it).

  Args:
    opt_state: a ``TrainState.opt_state`` of the tx the codemod emits for
      ``optimizer_def`` (or ``to_optax(optimizer_def)``).
    optimizer_def: the legacy def (its state layout and the ``state_map`` rows
      of its defs are used; MultiOptimizer groups each pick theirs).
    template_param_states: ``optimizer_def.init_state(params).param_states``
      (or its ``jax.eval_shape``): the legacy structure to fill.
    check_count: called as ``check_count(value, path)`` for every Optax
      ``count`` (and legacy-layout step) met; None: not checked.
    where: path prefix for error messages.

  Returns:
    The legacy ``param_states`` state dict: ``template_param_states``' structure
    with the Optax values (numpy stays numpy, traced stays traced).

  Raises:
    CheckpointError: the opt_state has no field holding a legacy field the def needs.
  """
  names = {_def_name(d) for d in getattr(optimizer_def, 'sub_optimizers', (optimizer_def,))}
  fields = {f for n in names if n in spec.SPECS for f in spec.SPECS[n].state_fields}
  found: dict[tuple, Any] = {}  # legacy param_states key (path + (field,)) -> value
  check = check_count or (lambda v, path: None)

  def take(tree, field=None, negate=False):
    for key, v in _flat(serialization.to_state_dict(tree)).items():
      if v is None or v is _EMPTY:  # frozen leaf, or another group's (MaskedNode)
        continue
      found[key + ((field,) if field else ())] = _negate(v) if negate else v

  def walk(node, path, row):
    if isinstance(node, transforms.WeightNormState):
      wrapped = getattr(optimizer_def, 'wrapped_optimizer', None)
      if wrapped is None:
        raise CheckpointError(f'{path}: a weight_norm state, and the def is '
                              f'{type(optimizer_def).__name__}, not a WeightNorm')
      take(node.direction, 'direction')
      take(node.scale, 'scale')
      inner_tpl = _wn_inner_flat(_flat(serialization.to_state_dict(template_param_states)))
      inner = legacy_from_opt_state(
          node.inner_state, wrapped, traverse_util.unflatten_dict(inner_tpl) if inner_tpl else {},
          check_count, where=f'{path}.inner_state')
      back = {v: k for k, v in _WN_INNER.items()}
      for key, v in _flat(inner).items():
        if v is not None and v is not _EMPTY:
          found[key[1:-1] + (back[key[0]], key[-1])] = v
    elif isinstance(node, (transforms.LegacyRuleState, base.OptimizerState)):
      check(node[0] if isinstance(node, tuple) else node.step, f'{path}.count')
      take(node.param_states)
    elif _is_namedtuple(node) and type(node).__name__ in _PARTITION:
      for label, inner in node.inner_states.items():
        sub = inner.inner_state if type(inner).__name__ == 'MaskedState' else inner
        walk(inner, f'{path}.inner_states[{label!r}]',
             choose_row(sub, fields, candidates=names))
    elif _is_namedtuple(node):
      cls = type(node).__name__
      for f in node._fields:
        v, p = getattr(node, f), f'{path}.{f}'
        if f == 'count':
          check(v, p)
        elif cls.startswith('Inject') and f in _INJECT_KEPT:
          continue
        elif f in row.get(cls, {}):
          src = row[cls][f]
          take(v, src.lstrip('-'), src.startswith('-'))
        else:
          walk(v, p, row)
    elif isinstance(node, (tuple, list)):
      for i, v in enumerate(node):
        walk(v, f'{path}[{i}]', row)
    elif isinstance(node, Mapping):
      for k, v in node.items():
        walk(v, f'{path}[{k!r}]', row)

  single = next(iter(names)) if len(names) == 1 else None
  walk(opt_state, where, choose_row(opt_state, fields, optimizer=single, candidates=names))
  out = {}
  for key, tpl in _flat(serialization.to_state_dict(template_param_states)).items():
    if tpl is None or tpl is _EMPTY:
      out[key] = tpl
    elif key in found:
      out[key] = found[key]
    else:
      raise CheckpointError(f'opt_state has no Optax field holding legacy {key[-1]!r} for '
                            f'{"/".join(map(str, key[:-1]))}: does {type(optimizer_def).__name__} '
                            f'match the TrainState tx?')
  return (traverse_util.unflatten_dict(out) if set(out) != {()} else out[()]) if out else {}


def _step_like(template, step):
  if isinstance(template, (int, np.integer)) and not hasattr(template, 'shape'):
    return int(step)
  return np.asarray(step, getattr(template, 'dtype', np.int32))


def _is_train_state_sd(sd) -> bool:
  return isinstance(sd, Mapping) and set(sd) >= {'step', 'params', 'opt_state'}


def _target_replicas(target, where: str, saved: int | None) -> int | None:
  """The device count of a replicated target (``jax_utils.replicate``: step of shape
  ``(n,)``), checked against the checkpoint's (``saved``).

  Raises:
    CheckpointError: a replicated target and a checkpoint that is not, or is from
      another device count.
  """
  step = target.step if isinstance(target, train_state_lib.TrainState) else target.state.step
  n = _replicas(step)
  if n is not None and saved != n:
    found = f'saved from {saved} devices' if saved else 'not replicated'
    raise CheckpointError(f'{_join(where, ())}: the target is replicated over {n} devices (step '
                          f'of shape ({n},)) but the checkpoint is {found}: restore into the '
                          'unreplicated state, then replicate it (jax_utils.replicate)')
  return n


def _restore_one(opt_sd, target, where: str, optimizer=None):
  """One legacy optimizer state dict into a ``TrainState`` or shim ``Optimizer`` target
  (a ``TrainState`` state dict into a ``TrainState`` target: checked, then as is).

  A replicated checkpoint (step of shape ``(n,)``) into an unreplicated target is
  reduced to device 0 (:class:`ReplicatedCheckpointWarning`); into a target
  replicated over the same ``n`` devices, every device's copy is restored.
  Returns ``(restored, n or None)``.
  """
  if isinstance(target, train_state_lib.TrainState) and _is_train_state_sd(opt_sd):
    saved = _replicas(opt_sd['step'])
    if _target_replicas(target, where, saved) is None and saved is not None:
      opt_sd, _ = _strip_replicas(opt_sd, where, ('step',))
    found = _conform(serialization.to_state_dict(target), opt_sd, where)
    return serialization.from_state_dict(target, found), saved
  if not is_legacy_optimizer(opt_sd):
    raise CheckpointError(f'{_join(where, ())}: not a legacy flax.optim Optimizer state dict '
                          f"(expected keys {{'target', 'state': {{'step', 'param_states'}}}}, "
                          f'found {sorted(opt_sd) if isinstance(opt_sd, Mapping) else type(opt_sd).__name__})')
  if not isinstance(target, (train_state_lib.TrainState, base.Optimizer)):
    raise TypeError(f'target must be a flax TrainState, an optim_compat Optimizer or a container '
                    f'of them, not {type(target).__name__}')
  saved = _replicas(opt_sd['state']['step'])
  n = _target_replicas(target, where, saved)
  if n is not None and isinstance(target, train_state_lib.TrainState):
    # every device's copy restored on its own, then stacked again: exact, even if they differ
    parts = [_restore_one(_index(opt_sd, i), jax.tree_util.tree_map(lambda x: x[i], target),
                          where, optimizer)[0] for i in range(n)]
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *parts), n
  if n is None:
    opt_sd, replicas = _strip_replicas(opt_sd, where)
  else:
    replicas = n
  step = np.asarray(opt_sd['state']['step'])
  if step.dtype.kind not in 'iu':
    raise CheckpointError(f'{_join(where, ("state", "step"))}: expected an integer step, '
                          f'found {_describe(step)}')
  if isinstance(target, base.Optimizer):
    found = _conform(serialization.to_state_dict(target), opt_sd, where)
    return serialization.from_state_dict(target, found), replicas
  params = serialization.from_state_dict(
      target.params, _conform(serialization.to_state_dict(target.params), opt_sd['target'],
                              _join(where, ('target',))))
  opt_state = opt_state_from_legacy(target.opt_state, step, opt_sd['state']['param_states'],
                                    optimizer, where=where)
  return target.replace(step=_step_like(target.step, step), params=params,
                        opt_state=opt_state), replicas


def _is_opt(x) -> bool:
  return isinstance(x, (train_state_lib.TrainState, base.Optimizer))


def _key_str(k) -> str:
  for attr in ('key', 'idx', 'name'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)
