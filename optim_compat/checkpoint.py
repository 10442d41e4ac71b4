"""Legacy ``flax.optim`` checkpoints: restore them as ``TrainState``, convert them, roll back.

A legacy checkpoint of an ``Optimizer`` is the state dict (legacy flax.optim
0.5.3, ``Optimizer.state_dict`` / ``flax.serialization.to_state_dict``)::

    {'target': <params>, 'state': {'step': int32 (or (n_devices,) when saved
                                   replicated), 'param_states': <mirror of params;
                                   each leaf a dict of the def's state fields,
                                   {} for GradientDescent, None for a leaf no
                                   MultiOptimizer group selects>}}

written by ``flax.training.checkpoints.save_checkpoint`` as msgpack
(``flax.serialization.to_bytes``) to ``<dir>/checkpoint_<step>``, possibly inside
a container (a tuple, dict, namedtuple or dataclass holding the optimizer beside
``model_state``, ``ema``, ``step`` ...). After the migration the same call
writes the ``TrainState`` (``{'step', 'params', 'opt_state'}``) as an orbax
directory (flax >= 0.7), or msgpack where orbax is turned off; both are read
back here too (the program's next run restores its own save).

* :func:`restore_legacy` turns such a checkpoint into the caller's target (a
  ``TrainState`` built with the tx the codemod emits for that def, a shim
  ``Optimizer``, or a container of them), every Optax ``count`` set to the
  legacy ``step``, containers of exactly the target's types.
* :func:`to_legacy` turns a ``TrainState`` back into a shim ``Optimizer``
  whose ``to_state_dict`` is the legacy layout (rollback).
* :func:`convert_state_dict` / :func:`write_checkpoint` back the
  ``optim-migrate convert-checkpoint`` command.

Which Optax state field holds which legacy field is migration knowledge: it is in
``optim_compat.state_map`` beside the migration table.
"""
from __future__ import annotations

import ast
import math
import os
import pathlib
import re
import shutil
import tempfile
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util
from flax.training import train_state as train_state_lib

from optim_compat import base, spec, state_map, transforms

_EMPTY = traverse_util.empty_node
_INJECT_KEPT = ('hyperparams', 'hyperparams_states')
#: optax.multi_transform's state: MultiTransformState (optax < 0.2.5), PartitionState
_PARTITION = {'MultiTransformState', 'PartitionState'}


class CheckpointError(ValueError):
  """A checkpoint that cannot be read or does not fit the target (the message says where)."""


class ReplicatedCheckpointWarning(UserWarning):
  """The checkpoint was saved from a replicated optimizer; device 0's copy is used."""


# --------------------------------------------------------------------------
# reading


def _is_orbax(path: pathlib.Path) -> bool:
  return path.is_dir() and any((path / n).exists() for n in (
      '_CHECKPOINT_METADATA', '_METADATA', 'manifest.ocdbt', 'checkpoint'))


def _checkpoint_file(path: pathlib.Path, step: int | None) -> pathlib.Path:
  """The checkpoint: ``path`` itself (a msgpack file or an orbax directory), or
  ``checkpoint_<step>`` (default: the latest) in the directory ``path``.

  Raises:
    CheckpointError: nothing there, no such step, or a ``step`` given with a single
      checkpoint whose name does not carry that step.
  """
  if path.is_file() or _is_orbax(path):
    m = re.fullmatch(r'checkpoint_(\d+)', path.name)
    if step is not None and (m is None or int(m.group(1)) != step):
      raise CheckpointError(f'{path}: a single checkpoint, not checkpoint_{step}: a step picks '
                            'one file of a directory of checkpoint_<step> files (give the '
                            'directory, or the file without a step)')
    return path
  if not path.exists():
    raise CheckpointError(f'{path}: no such file or directory')
  found = {}
  for child in path.iterdir():
    m = re.fullmatch(r'checkpoint_(\d+)', child.name)
    if m and (child.is_file() or _is_orbax(child)):
      found[int(m.group(1))] = child
  if not found:
    raise CheckpointError(f'{path}: directory holds no checkpoint_<step> file')
  if step is None:
    return found[max(found)]
  if step not in found:
    raise CheckpointError(f'{path}: no checkpoint_{step} (steps found: {sorted(found)})')
  return found[step]


# flax.serialization's msgpack format (flax 0.5.3 and current, same bytes): a nested
# map of str keys; arrays as msgpack ExtType 1 (ndarray), 2 (Python complex),
# 3 (numpy scalar), whose data is msgpack (shape, dtype name, raw bytes) (for 2:
# (real, imag)); leaves over 2**30 bytes are split into a
# {'__msgpack_chunked_array__': ...} dict. Read and written here leaf by leaf, so
# memory holds the tree once plus about one leaf (a whole-buffer
# msgpack_restore / msgpack_serialize holds the tree twice).
_EXT_NDARRAY, _EXT_COMPLEX, _EXT_NPSCALAR = 1, 2, 3
_CHUNK_MARK = '__msgpack_chunked_array__'
_MAX_LEAF_BYTES = 2 ** 30


def _dtype(name):
  name = name.decode() if isinstance(name, bytes) else name
  return jnp.dtype(name)  # knows bfloat16 (ml_dtypes); numpy alone does not


def _ext_unpack(code, data):
  import msgpack
  if code in (_EXT_NDARRAY, _EXT_NPSCALAR):
    shape, name, buffer = msgpack.unpackb(data, raw=False)
    x = np.frombuffer(buffer, dtype=_dtype(name)).reshape(shape)
    return x[()] if code == _EXT_NPSCALAR else x
  if code == _EXT_COMPLEX:
    return complex(*msgpack.unpackb(data, raw=False))
  return msgpack.ExtType(code, data)


def _has_chunks(tree) -> bool:
  return isinstance(tree, dict) and (_CHUNK_MARK in tree or any(map(_has_chunks, tree.values())))


def read_state_dict(path, step: int | None = None) -> dict:
  """The state dict of a flax msgpack checkpoint, read leaf by leaf.

  Args:
    path: a checkpoint file, or a directory of ``checkpoint_<step>`` files
      (``flax.training.checkpoints`` naming).
    step: with a directory, the step to read (default: the highest).

  Returns:
    Nested dicts with numpy arrays as leaves, as
    ``flax.serialization.msgpack_restore`` returns them.

  Raises:
    CheckpointError: missing file, or a file that is not one complete msgpack
      object (truncated, corrupt, trailing bytes; a file that does not start as a
      msgpack map and does not parse as one object, e.g. text, is "not a flax
      checkpoint (msgpack) file"); the message names the file.
  """
  import msgpack
  file = _checkpoint_file(pathlib.Path(path), step)
  if file.is_dir():  # orbax (e.g. written by a migrated program, or --format orbax)
    return _read_orbax(file)
  size = file.stat().st_size
  if size == 0:
    raise CheckpointError(f'{file}: empty file, not a flax checkpoint')
  with open(file, 'rb') as f:
    head = f.read(1)[0]
  # a state dict is a msgpack map (fixmap, map 16, map 32); bytes that are not one and do
  # not parse as one object (text, say) are another kind of file, not a damaged checkpoint
  starts_as_map = 0x80 <= head <= 0x8f or head in (0xde, 0xdf)
  not_msgpack = CheckpointError(f'{file}: not a flax checkpoint (msgpack) file (a checkpoint '
                                f'starts with a msgpack map; this starts with byte {head:#04x}'
                                + (f' {chr(head)!r})' if 0x20 <= head < 0x7f else ')'))
  try:
    with open(file, 'rb') as f:
      unpacker = msgpack.Unpacker(f, raw=False, ext_hook=_ext_unpack, max_buffer_size=size,
                                  read_size=min(size, 1 << 22))
      objects = []
      for obj in unpacker:
        objects.append(obj)
        if len(objects) > 1:
          break
  except Exception as e:  # msgpack raises several unrelated types on bad bytes
    if not starts_as_map:
      raise not_msgpack from None
    raise CheckpointError(f'{file}: not a readable flax msgpack checkpoint '
                          f'(corrupt: {type(e).__name__}: {e})') from None
  if len(objects) != 1 and not starts_as_map:
    raise not_msgpack
  if len(objects) != 1:
    what = 'truncated (no complete object)' if not objects else 'trailing bytes after the state'
    raise CheckpointError(f'{file}: not a readable flax msgpack checkpoint ({what})')
  state = objects[0]
  if not isinstance(state, dict):
    raise CheckpointError(f'{file}: holds a {type(state).__name__}, not a state dict')
  if _has_chunks(state):  # leaves over 1 GiB: let flax reassemble them
    state = serialization.msgpack_restore(file.read_bytes())
  return state


def _read_orbax(file: pathlib.Path) -> dict:
  """An orbax checkpoint directory as a flax state dict with numpy leaves.

  Every array is read to host memory as numpy, whatever devices wrote it (a
  ``pmap``-replicated save of 8 devices reads in a 1-device process). Orbax
  gives a tuple (``TrainState.opt_state``, a ``chain``) back as a list and an
  empty tuple or namedtuple (optax ``EmptyState()``, ``MaskedNode()``) as
  ``None``; lists become ``{'0': ..., '1': ...}`` here, as
  ``flax.serialization.to_state_dict`` writes them, and ``None`` is matched
  against the target's empty nodes by :func:`_conform`.

  Raises:
    CheckpointError: not a readable orbax checkpoint (names the directory).
  """
  import orbax.checkpoint as ocp
  path = file.absolute()
  try:
    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(path)
    meta = getattr(meta, 'item_metadata', meta)  # orbax >= 0.11: StepMetadata
    meta = getattr(meta, 'tree', meta)
    array_meta = getattr(getattr(ocp, 'metadata', None), 'ArrayMetadata', ())
    args = jax.tree_util.tree_map(
        lambda m: ocp.RestoreArgs(restore_type=np.ndarray) if isinstance(m, array_meta)
        else ocp.RestoreArgs(), meta)
    state = checkpointer.restore(path, restore_args=args)
  except Exception:  # noqa: BLE001 - another orbax version: its own reader, device arrays
    from flax.training import checkpoints
    try:
      state = checkpoints.restore_checkpoint(str(path), target=None)
    except Exception as e:  # noqa: BLE001
      raise CheckpointError(f'{file}: not a readable orbax checkpoint ({type(e).__name__}: '
                            f'{e})') from None
  state = _as_state_dict(state)
  if not isinstance(state, dict):
    raise CheckpointError(f'{file}: holds a {type(state).__name__}, not a state dict')
  return state


def _as_state_dict(tree):
  """Lists and tuples as ``{'0': ..}`` dicts (flax's state-dict form), arrays as numpy."""
  if isinstance(tree, Mapping):
    return {str(k): _as_state_dict(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return {str(i): _as_state_dict(v) for i, v in enumerate(tree)}
  if isinstance(tree, jax.Array):
    return np.asarray(tree)
  return tree


def _pack_stream(obj, write, packer, where=''):
  """Write ``obj`` (a state dict) as flax's msgpack bytes, one leaf at a time."""
  import msgpack
  if isinstance(obj, Mapping):
    write(packer.pack_map_header(len(obj)))
    for k, v in obj.items():  # in order, as flax.serialization.to_bytes writes them
      write(packer.pack(k))
      _pack_stream(v, write, packer, f'{where}/{k}')
    return
  if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
    x = np.asarray(obj)
    if x.nbytes > _MAX_LEAF_BYTES:
      raise _TooLarge(where)
    code = _EXT_NPSCALAR if isinstance(obj, np.generic) else _EXT_NDARRAY
    payload = msgpack.packb((x.shape, x.dtype.name, x.tobytes()), use_bin_type=True)
    write(packer.pack(msgpack.ExtType(code, payload)))
    return
  if isinstance(obj, complex):
    write(packer.pack(msgpack.ExtType(_EXT_COMPLEX, msgpack.packb((obj.real, obj.imag)))))
    return
  write(packer.pack(obj))


class _TooLarge(Exception):
  pass


# --------------------------------------------------------------------------
# layout helpers


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
  if _PARTITION & _classes(opt_state):
    return {}  # each group picks its own row (_Filler.rebuild_groups)
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


class _Filler:
  """Rebuilds a target ``opt_state`` from one legacy optimizer state dict."""

  def __init__(self, step, param_states, row, where):
    self.step = step
    self.ps = param_states
    self.ps_flat = _flat(param_states)
    self.row = row
    self.where = where
    self.used: set = set()
    self.candidates = None

  def count_like(self, template, path):
    if np.shape(template) != ():
      raise CheckpointError(f'{path}: target count has shape {np.shape(template)}; restore into '
                            f'an unreplicated target and replicate afterwards')
    dtype = getattr(template, 'dtype', None)
    return np.asarray(self.step, dtype) if dtype is not None else int(self.step)

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
        raise CheckpointError(f'{where}: missing from the checkpoint ({path} needs it; the '
                              f'checkpoint has fields {sorted(_legacy_fields(self.ps_flat))})')
      value = _conform(tpl, self.ps_flat[legacy_key], where)
      self.used.add(legacy_key)
      out[key] = np.negative(value) if negate else value
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


def _step_like(template, step):
  if isinstance(template, (int, np.integer)) and not hasattr(template, 'shape'):
    return int(step)
  return np.asarray(step, getattr(template, 'dtype', np.int32))


def _is_train_state_sd(sd) -> bool:
  return isinstance(sd, Mapping) and set(sd) >= {'step', 'params', 'opt_state'}


def _replicas(step) -> int | None:
  """``n`` for a step of shape ``(n,)`` (one per device: a replicated optimizer), else None."""
  shape = np.shape(step)
  return shape[0] if len(shape) == 1 else None


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


def _index(tree, i):
  """Device ``i``'s copy of every array leaf of a replicated state dict."""
  if isinstance(tree, Mapping):
    return {k: _index(v, i) for k, v in tree.items()}
  return tree if tree is None else tree[i]


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
  filler = _Filler(step, opt_sd['state']['param_states'], None, where)
  filler.row = choose_row(target.opt_state, _legacy_fields(filler.ps_flat), optimizer)
  opt_state = filler.rebuild(target.opt_state, 'opt_state')
  filler.check_all_used()
  return target.replace(step=_step_like(target.step, step), params=params,
                        opt_state=opt_state), replicas


def _is_opt(x) -> bool:
  return isinstance(x, (train_state_lib.TrainState, base.Optimizer))


def _key_str(k) -> str:
  for attr in ('key', 'idx', 'name'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


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


def restore_legacy(path_or_state_dict, target, *, optimizer=None, step: int | None = None):
  """Restore a legacy ``flax.optim`` checkpoint into ``target``.

  Args:
    path_or_state_dict: a msgpack checkpoint file or orbax directory, a
      directory of ``checkpoint_<step>`` checkpoints, or an already loaded
      state dict. As ``restore_checkpoint``, a missing path or a directory
      with no checkpoint yet returns ``target`` unchanged (a fresh run), and a
      checkpoint already in the ``TrainState`` layout (saved after the
      migration: msgpack, or orbax as modern ``save_checkpoint`` writes it,
      whose empty optax states read back as None) is restored as is. Legacy
      layout (module docstring), at the root or inside a container. A
      replicated save (step of shape ``(n,)``, every leaf with a leading device
      axis) is reduced to device 0 with a :class:`ReplicatedCheckpointWarning`,
      or, into a target replicated over the same ``n`` devices
      (``jax_utils.replicate`` before the restore), restored device by device.
    target: a ``flax.training.train_state.TrainState`` built with the tx the
      codemod emits for the def (``spec.tx_from_source(SPECS[name].emit(...))``;
      ``optax.multi_transform`` of those for MultiOptimizer / ``focus=``), or
      with ``optim_compat.to_optax(def)`` (any def, WeightNorm included), a
      shim ``Optimizer``, or a container (dict, tuple, namedtuple, dataclass)
      holding them; replicated or not. Only its structure, shapes and dtypes
      are used.
    optimizer: the legacy def (instance, name or ``"Name(...)"``) when the
      target's opt_state cannot tell it (rarely needed).
    step: with a directory, which ``checkpoint_<step>`` (default: latest).

  Returns:
    ``target``'s type, with the checkpoint's values (numpy leaves): ``params``
    = legacy ``target``; every Optax ``count`` and ``TrainState.step`` = the
    legacy ``step`` (in the target's dtype); moments at the Optax fields of
    ``optim_compat.state_map``; inject_hyperparams values kept from ``target``;
    the rest of a container passed through.

  Raises:
    CheckpointError: unreadable file; no legacy optimizer where the target has
      one; structure mismatch (names the first differing path with expected and
      found shape/dtype); legacy state the target's opt_state has no place for;
      a replicated target and a checkpoint not saved from as many devices.
    TypeError: a target that is none of the above.
  """
  if isinstance(path_or_state_dict, Mapping):
    sd, source = path_or_state_dict, '<state dict>'
  else:
    path = pathlib.Path(path_or_state_dict)
    if step is None and (not path.exists() or (path.is_dir() and not _is_orbax(path) and not any(
        re.fullmatch(r'checkpoint_\d+', c.name) for c in path.iterdir()))):
      return target  # as restore_checkpoint: nothing saved yet (a fresh run)
    sd, source = read_state_dict(path, step), str(path)
  sd = _normalize_namedtuples(sd)
  if _is_opt(target):
    if _is_train_state_sd(sd) and isinstance(target, train_state_lib.TrainState):
      return _restore_one(sd, target, '')[0]  # saved after the migration: as is
    found = find_legacy_optimizers(sd)
    if not found:
      raise CheckpointError(f'{source}: no legacy flax.optim optimizer state in it '
                            f"(keys {sorted(sd)})")
    if len(found) > 1:
      raise CheckpointError(f'{source}: {len(found)} legacy optimizers at '
                            f'{["/".join(p) for p in found]}; pass a container target')
    if found[0]:
      warnings.warn(f'{source}: using the optimizer at {"/".join(found[0])}; the rest of the '
                    f'checkpoint is ignored (pass a container target to keep it)', stacklevel=2)
    return _restore_one(_get(sd, found[0]), target, '/'.join(found[0]), optimizer)[0]
  leaves, _ = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_opt)
  new_sd, replicas = sd, None
  for key_path, node in leaves:
    if not _is_opt(node):
      continue
    keys = tuple(_key_str(k) for k in key_path)
    restored, n = _restore_one(_get(sd, keys), node, '/'.join(keys), optimizer)
    replicas = replicas or n
    new_sd = _set(new_sd, keys, serialization.to_state_dict(restored))
  new_sd = _conform(serialization.to_state_dict(target), new_sd, '', replicas)
  return serialization.from_state_dict(target, new_sd)


# --------------------------------------------------------------------------
# TrainState -> legacy (rollback)


def to_legacy(train_state, optimizer_def) -> base.Optimizer:
  """A shim ``Optimizer`` holding ``train_state``'s params and optimizer state.

  ``flax.serialization.to_state_dict`` of the result is the legacy checkpoint
  layout that real flax.optim 0.5.3 restores (``Optimizer.restore_state``).

  Args:
    train_state: a ``TrainState`` whose tx is the one the codemod emits for
      ``optimizer_def`` (or ``optim_compat.to_optax(optimizer_def)``).
    optimizer_def: the legacy def (``optim_compat.Adam(...)`` etc.; its
      hyper-parameters are not stored, only its state layout is used).

  Returns:
    ``Optimizer(optimizer_def, OptimizerState(int32 step, param_states), params)``.

  Raises:
    CheckpointError: an Optax ``count`` differs from ``train_state.step``
      (the legacy layout has one step; the message names the path), or the
      opt_state lacks a legacy field the def needs.
  """
  template = optimizer_def.create(train_state.params)
  names = {_def_name(d) for d in getattr(optimizer_def, 'sub_optimizers', (optimizer_def,))}
  fields = {f for n in names if n in spec.SPECS for f in spec.SPECS[n].state_fields}
  step = int(np.asarray(train_state.step))
  found: dict[tuple, Any] = {}  # legacy param_states key (path + (field,)) -> value

  def check_count(v, path):
    if int(np.asarray(v)) != step:
      raise CheckpointError(f'{path} = {int(np.asarray(v))} differs from TrainState.step = {step}: '
                            f'the legacy layout has one step')

  def take(tree, field=None, negate=False):
    for key, v in _flat(serialization.to_state_dict(tree)).items():
      if v is None or v is _EMPTY:  # frozen leaf, or another group's (MaskedNode)
        continue
      found[key + ((field,) if field else ())] = np.negative(v) if negate else v

  def walk(node, path, row):
    if isinstance(node, (transforms.LegacyRuleState, base.OptimizerState)):
      check_count(node[0] if isinstance(node, tuple) else node.step, f'{path}.count')
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
          check_count(v, p)
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
  walk(train_state.opt_state, 'opt_state',
       choose_row(train_state.opt_state, fields, optimizer=single, candidates=names))
  out = {}
  for key, tpl in _flat(serialization.to_state_dict(template.state.param_states)).items():
    if tpl is None or tpl is _EMPTY:
      out[key] = tpl
    elif key in found:
      out[key] = found[key]
    else:
      raise CheckpointError(f'opt_state has no Optax field holding legacy {key[-1]!r} for '
                            f'{"/".join(map(str, key[:-1]))}: does {type(optimizer_def).__name__} '
                            f'match the TrainState tx?')
  ps = (traverse_util.unflatten_dict(out) if set(out) != {()} else out[()]) if out else {}
  sd = {'target': serialization.to_state_dict(train_state.params),
        'state': {'step': np.asarray(step, np.int32), 'param_states': ps}}
  sd = _conform(serialization.to_state_dict(template), sd, 'legacy')
  return serialization.from_state_dict(template, sd)


# --------------------------------------------------------------------------
# the command: convert a file without a Python target


def parse_optimizer(text: str, learning_rate_injected: bool = False) -> tuple[str, dict[str, str]]:
  """``"Adam(learning_rate=1e-3, beta1=0.9)"`` -> ``('Adam', {'learning_rate': '1e-3', ...})``.

  Positional arguments take the legacy order (``spec.SPECS[name].hyper_params``).
  Values must be literal numbers, booleans or None; a non-literal
  ``learning_rate`` (e.g. ``config.lr``) is dropped, as it is not in the state,
  unless ``learning_rate_injected``: ``inject_hyperparams`` stores the rate in
  ``opt_state``, and a value this cannot evaluate would be written as 0.0.

  Raises:
    CheckpointError: not a call of a table entry (a bare ``Adam``: call it), an
      unknown argument, one given twice (``Adam(1e-3, learning_rate=2)``), ``*``/``**``
      unpacking, a non-literal value (the learning rate only with
      ``learning_rate_injected``), a literal that is not a number, True/False or
      None (``learning_rate='x'``), or a learning rate that is inf (``1e999``);
      the message names the argument and value.
  """
  try:
    node = ast.parse(text.strip(), mode='eval').body
  except SyntaxError as e:
    raise CheckpointError(f'--optimizer {text!r}: not a Python call ({e.msg})') from None
  bare = node.attr if isinstance(node, ast.Attribute) else getattr(node, 'id', None)
  if bare in spec.SPECS:
    raise CheckpointError(f'--optimizer {text!r} is the class {bare}, not called: call it, e.g. '
                          f'{bare}(learning_rate=1e-3)')
  name = getattr(node, 'func', None)
  name = name.attr if isinstance(name, ast.Attribute) else getattr(name, 'id', None)
  if not isinstance(node, ast.Call) or name not in spec.SPECS:
    raise CheckpointError(f'--optimizer {text!r}: expected one of {sorted(spec.SPECS)} '
                          f'called with its legacy arguments')
  entry = spec.SPECS[name]
  pairs = []
  for i, a in enumerate(node.args):
    if isinstance(a, ast.Starred):
      raise CheckpointError(f'--optimizer {text!r}: cannot unpack {ast.unparse(a)}: give each '
                            'argument as a literal')
    if i >= len(entry.hyper_params):
      raise CheckpointError(f'--optimizer {text!r}: too many positional arguments')
    pairs.append((entry.hyper_params[i].name, a))
  for kw in node.keywords:
    if kw.arg is None:
      raise CheckpointError(f'--optimizer {text!r}: cannot unpack **{ast.unparse(kw.value)}: '
                            'give each argument as a literal')
    if kw.arg not in entry.hyper_param_names:
      raise CheckpointError(f'--optimizer {text!r}: {name} has no argument {kw.arg!r}; '
                            f'valid: {list(entry.hyper_param_names)}')
    pairs.append((kw.arg, kw.value))
  seen = set()
  for key, _ in pairs:  # Python: TypeError, multiple values for argument
    if key in seen:
      raise CheckpointError(f'--optimizer {text!r}: {key} is given twice (an error in Python: '
                            'multiple values for one argument); give it once')
    seen.add(key)
  args = {}
  for key, value in pairs:
    try:
      literal = ast.literal_eval(value)
    except ValueError:  # a name or expression from the user's code
      ok, is_literal = False, False
    else:
      ok, is_literal = literal is None or isinstance(literal, (bool, int, float)), True
    if ok and key == 'learning_rate' and isinstance(literal, float) and not math.isfinite(literal):
      # legacy takes it and turns every parameter into NaN at the first step
      written = ast.get_source_segment(text.strip(), value) or ast.unparse(value)
      raise CheckpointError(f'--optimizer {text!r}: learning_rate={written} is {literal}, not a '
                            'finite number')
    if ok:
      args[key] = ast.unparse(value)
    elif is_literal:  # 'x', [1e-3], 1j: never a hyper-parameter, the learning rate included
      raise CheckpointError(f'--optimizer {text!r}: {key}={ast.unparse(value)} is a '
                            f'{type(literal).__name__}, not a number, True/False or None')
    elif key != 'learning_rate':  # the learning rate is not in the state layout
      raise CheckpointError(f'--optimizer {text!r}: {key}={ast.unparse(value)} must be a number, '
                            f'True/False or None')
    elif learning_rate_injected:  # ... except in inject_hyperparams' opt_state
      raise CheckpointError(
          f'--optimizer {text!r}: learning_rate={ast.unparse(value)} is not a literal number: '
          'with --learning-rate-injected the converted state stores the learning rate '
          '(opt_state.hyperparams.learning_rate) and it cannot be evaluated here; give its '
          'value, e.g. learning_rate=1e-3')
  return name, args


def infer_def(param_states) -> str:
  """The table entry whose legacy state fields the checkpoint has, when only one has them.

  Raises:
    CheckpointError: no entry or several (e.g. Adam / AdaBelief / LAMB share
      ``grad_ema, grad_sq_ema``); the message lists them.
  """
  fields = _legacy_fields(_flat(param_states))
  names = [n for n, e in spec.SPECS.items()
           if fields <= set(e.state_fields) and (fields or not e.state_fields)
           and set(e.state_fields) - fields <= {'mg'}]
  if len(names) != 1:
    raise CheckpointError(f'cannot infer the optimizer from the state fields {sorted(fields)} '
                          f'(candidates: {names or "none"}); pass --optimizer')
  return names[0]


def _graft_hyperparams(abstract, concrete):
  """``abstract`` (from ``jax.eval_shape``) with inject_hyperparams values from ``concrete``."""
  if _is_namedtuple(abstract):
    cls = type(abstract).__name__
    return type(abstract)(**{
        f: (getattr(concrete, f) if cls.startswith('Inject') and f in _INJECT_KEPT
            else _graft_hyperparams(getattr(abstract, f), getattr(concrete, f)))
        for f in abstract._fields})
  if isinstance(abstract, (tuple, list)):
    return type(abstract)(_graft_hyperparams(a, c) for a, c in zip(abstract, concrete))
  if isinstance(abstract, Mapping):
    return type(abstract)({k: _graft_hyperparams(v, concrete[k]) for k, v in abstract.items()})
  return abstract


def abstract_train_state(tx, params) -> train_state_lib.TrainState:
  """A ``TrainState`` template for ``params`` without allocating optimizer state.

  The opt_state comes from ``jax.eval_shape(tx.init, ...)`` (``ShapeDtypeStruct``
  leaves); inject_hyperparams values from ``tx.init`` on a tiny tree of the
  same structure (they do not depend on shapes).
  """
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype if not hasattr(x, 'dtype')
                                     else x.dtype), params)
  opt_state = jax.eval_shape(tx.init, abstract)
  tiny = jax.tree_util.tree_map(lambda s: jnp.zeros((1,) * len(s.shape), s.dtype), abstract)
  opt_state = _graft_hyperparams(opt_state, tx.init(tiny))
  return train_state_lib.TrainState(step=0, apply_fn=None, params=abstract, tx=tx,
                                    opt_state=opt_state)


def convert_state_dict(sd, optimizer: str | None = None, learning_rate_injected: bool = False):
  """Every legacy optimizer in a state dict replaced by a ``TrainState`` state dict.

  Args:
    sd: a checkpoint's state dict (legacy optimizer at the root or in a container).
    optimizer: ``"Name(args...)"`` in legacy syntax; ``None`` infers the def from
      the state fields when only one entry has them (defaults for the rest).
    learning_rate_injected: build the tx the codemod emits for code that passes
      ``learning_rate=`` at apply time (``optax.inject_hyperparams``).

  Returns:
    ``(new_sd, notes)``: ``new_sd`` restores with
    ``flax.training.checkpoints.restore_checkpoint(..., target=state)`` where
    ``state = TrainState.create(apply_fn=..., params=..., tx=<emitted tx>)``
    (inside the same container as before); ``notes`` are human-readable lines
    (def used, emitted tx, replicated saves).

  Raises:
    CheckpointError: no legacy optimizer in ``sd``, an unparseable or
      non-inferable ``optimizer``, or a state that does not fit the def.
  """
  sd = _normalize_namedtuples(sd)
  found = find_legacy_optimizers(sd)
  if not found:
    raise CheckpointError("no legacy flax.optim optimizer state found (expected {'target': ..., "
                          "'state': {'step': ..., 'param_states': ...}} at the root or inside a "
                          f'container; top-level keys: {sorted(sd)})')
  notes = []
  for keys in found:
    where = '/'.join(keys)
    opt_sd = _get(sd, keys)
    if optimizer is None:
      name, args = infer_def(opt_sd['state']['param_states']), {}
      notes.append(f'{where or "/"}: optimizer inferred from its state fields: {name}')
    else:
      name, args = parse_optimizer(optimizer, learning_rate_injected)
    if 'learning_rate' not in args or args['learning_rate'] == 'None':
      args = dict(args, learning_rate='0.0')  # not in the state layout; set it in the train step
    source = spec.SPECS[name].emit(args, learning_rate_injected)
    try:
      tx = spec.tx_from_source(source)
    except Exception as e:  # noqa: BLE001 - any failure building it is the argument's
      raise CheckpointError(f'--optimizer {optimizer!r}: cannot build {source}: '
                            f'{type(e).__name__}: {e}') from None
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always', ReplicatedCheckpointWarning)
      stripped, _ = _strip_replicas(opt_sd, where) if np.ndim(opt_sd['state']['step']) else (opt_sd, None)
    notes += [str(w.message) for w in caught]
    template = abstract_train_state(tx, stripped['target'])
    restored, _ = _restore_one(stripped, template, where, name)
    sd = _set(sd, keys, serialization.to_state_dict(restored))
    notes.append(f'{where or "/"}: {name} -> TrainState(tx={source})')
  return sd, notes


def _msgpack_checkpoint_problem(path: pathlib.Path) -> str | None:
  """Why the file ``path`` is not a flax msgpack checkpoint, or None. Reads only its start:
  a msgpack map (a state dict) whose first key is a string."""
  import msgpack
  try:
    with open(path, 'rb') as f:
      head = f.read(1)
      if not head:
        return 'an empty file'
      if not (0x80 <= head[0] <= 0x8f or head[0] in (0xde, 0xdf)):
        shown = f' {chr(head[0])!r}' if 0x20 <= head[0] < 0x7f else ''
        return f'it starts with byte {head[0]:#04x}{shown}; a checkpoint starts with a msgpack map'
      f.seek(0)
      unpacker = msgpack.Unpacker(f, raw=False, read_size=1 << 16, max_buffer_size=1 << 24)
      if unpacker.read_map_header() and not isinstance(unpacker.unpack(), str):
        return 'a msgpack map whose first key is not a string, not a state dict'
  except OSError as e:
    return f'cannot read it ({e.strerror or e})'
  except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on bad bytes
    return 'not a readable msgpack map'
  return None


def check_target(dst, force: bool = False) -> None:
  """``dst`` may be written: it does not exist, or ``force`` and it is a checkpoint.

  ``force`` replaces a flax msgpack checkpoint file, an orbax checkpoint directory
  or a symlink (the link, never what it points to); never a folder of other
  files or a file that is not a checkpoint (``victim.py``). Creates nothing.

  Raises:
    FileExistsError: ``dst`` exists and not ``force``, or is no checkpoint (names it).
  """
  dst = pathlib.Path(dst)
  if not (dst.exists() or dst.is_symlink()):
    return
  if not force:
    raise FileExistsError(f'{dst}: already exists (pass --force to replace it)')
  if dst.is_symlink():
    return
  if dst.is_dir():
    if not (_is_orbax(dst) or _is_orbax(dst / 'ckpt')):
      # --force replaces a checkpoint, never a folder of other files
      raise FileExistsError(f'{dst}: a directory that is not a checkpoint; force replaces only a '
                            'checkpoint file or checkpoint directory')
    return
  problem = (_msgpack_checkpoint_problem(dst) if dst.is_file()
             else 'not a regular file or directory')
  if problem:
    raise FileExistsError(f'{dst}: not a flax checkpoint file ({problem}); force replaces only '
                          'a checkpoint file or checkpoint directory')


def _atomic_target(dst: pathlib.Path, force: bool):
  check_target(dst, force)
  dst.parent.mkdir(parents=True, exist_ok=True)


def write_checkpoint(sd, dst, fmt: str = 'flax', force: bool = False) -> pathlib.Path:
  """Write a state dict atomically: a msgpack file (``flax``) or an orbax directory.

  The data goes to a temporary sibling first and is renamed over ``dst`` only
  when complete, so an interrupted write leaves ``dst`` as it was.

  Raises:
    FileExistsError: ``dst`` exists and not ``force``.
    ValueError: unknown ``fmt``.
  """
  dst = pathlib.Path(dst).absolute()
  if fmt not in ('flax', 'orbax'):
    raise ValueError(f'unknown format {fmt!r}: flax or orbax')
  _atomic_target(dst, force)
  if fmt == 'flax':
    import msgpack
    fd, tmp = tempfile.mkstemp(prefix=f'.{dst.name}.', suffix='.tmp', dir=dst.parent)
    try:
      with os.fdopen(fd, 'wb') as f:
        try:
          _pack_stream(sd, f.write, msgpack.Packer(use_bin_type=True))
        except _TooLarge:  # a leaf over 1 GiB: flax's own writer chunks it
          f.seek(0)
          f.truncate()
          f.write(serialization.msgpack_serialize(sd))
        f.flush()
        os.fsync(f.fileno())
      # mkstemp creates 0600; a checkpoint gets the usual mode (0666 minus the umask)
      umask = os.umask(0)
      os.umask(umask)
      os.chmod(tmp, 0o666 & ~umask)
      if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
      os.replace(tmp, dst)
    except BaseException:
      if os.path.exists(tmp):
        os.unlink(tmp)
      raise
    return dst
  import orbax.checkpoint as ocp
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f'.{dst.name}.', suffix='.tmp', dir=dst.parent))
  try:
    ocp.PyTreeCheckpointer().save(tmp / 'ckpt', sd)
    old = None
    if dst.exists() or dst.is_symlink():
      old = dst.parent / f'.{dst.name}.old-{os.getpid()}'
      os.replace(dst, old)
    os.replace(tmp / 'ckpt', dst)
    if old is not None:
      shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return dst
