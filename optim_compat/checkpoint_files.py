"""Checkpoint files: flax msgpack (streamed leaf by leaf) and orbax directories.

The file half of :mod:`optim_compat.checkpoint`: where a checkpoint is
(``<dir>/checkpoint_<step>``), reading one as a state dict (nested dicts, numpy
leaves) and writing a state dict as flax's msgpack bytes. The errors of the
whole checkpoint API live here (the lowest layer) and are exported by
:mod:`optim_compat.checkpoint`.
"""
from __future__ import annotations

import contextlib
import logging
import pathlib
import re
import sys
import threading
import warnings
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization


class CheckpointError(ValueError):
  """A checkpoint that cannot be read or does not fit the target (the message says where)."""

  __module__ = 'optim_compat.checkpoint'  # where callers import it from


class ReplicatedCheckpointWarning(UserWarning):
  """The checkpoint was saved from a replicated optimizer; device 0's copy is used."""

  __module__ = 'optim_compat.checkpoint'  # where callers import it from


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
  path = file.absolute()
  try:
    with _orbax_quiet():
      import orbax.checkpoint as ocp
      checkpointer = ocp.PyTreeCheckpointer()
      meta = orbax_metadata_tree(checkpointer, path)
      array_meta = getattr(getattr(ocp, 'metadata', None), 'ArrayMetadata', ())
      args = jax.tree_util.tree_map(
          lambda m: ocp.RestoreArgs(restore_type=np.ndarray) if isinstance(m, array_meta)
          else ocp.RestoreArgs(), meta)
      state = checkpointer.restore(path, restore_args=args)
  except Exception as first:  # noqa: BLE001 - another orbax version: its reader, device arrays
    try:
      with _orbax_quiet():
        from flax.training import checkpoints  # (its import warns through absl)
        state = checkpoints.restore_checkpoint(str(path), target=None)
    except Exception:  # noqa: BLE001 - the first reader's reason names the damage best
      raise CheckpointError(f'{file}: not a readable orbax checkpoint '
                            f'({type(first).__name__}: {_first_line(first)})') from None
  state = _as_state_dict(state)
  if not isinstance(state, dict):
    raise CheckpointError(f'{file}: holds a {type(state).__name__}, not a state dict')
  return state


def orbax_metadata_tree(checkpointer, path: pathlib.Path):
  """The metadata tree of the orbax checkpoint ``path`` (nested dicts and lists of array
  metadata; no array is read), whichever orbax version wrote it."""
  meta = checkpointer.metadata(path)
  meta = getattr(meta, 'item_metadata', meta)  # orbax >= 0.11: StepMetadata
  return getattr(meta, 'tree', meta)


def _first_line(error: BaseException) -> str:
  """An orbax / tensorstore error's first line, without the tensorstore spec it appends
  (a kilobyte of JSON that names nothing the user can act on)."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
  return text.split(' [tensorstore_spec=', 1)[0]


@contextlib.contextmanager
def _orbax_quiet():
  """Within: orbax's reader without its noise on a damaged checkpoint. Its Python
  warnings (sharding info populated from file) are silenced, and ``sys.stderr`` is
  wrapped in :class:`_WithoutClosedLoopReports`, which drops absl ``WARNING`` lines
  meanwhile and, from then on, the ``RuntimeError: Event loop is closed`` tracebacks of
  orbax's I/O threads; after a failure, Python's ``coroutine ... was never awaited`` warnings
  and asyncio's ``Task exception was never retrieved`` reports are dropped too. After a failed read those threads go on reporting for a while
  (their pending reads finish after the event loop has closed), writing to whatever
  ``sys.stderr`` is when they do: so after a failure the wrapper stays; after a success
  ``sys.stderr`` is restored. The error itself propagates."""
  stderr = sys.stderr
  wrapper = stderr if isinstance(stderr, _WithoutClosedLoopReports) else (
      _WithoutClosedLoopReports(stderr))
  was_quiet, wrapper.absl_quiet = wrapper.absl_quiet, True
  sys.stderr = wrapper
  failed = False
  # (a task of a failing read can be collected, and logged as never retrieved, before the
  # read itself fails: seen once under load, through a logging handler holding the real
  # stderr; so asyncio's reports are off meanwhile too)
  asyncio_log = logging.getLogger('asyncio')
  level = asyncio_log.level
  asyncio_log.setLevel(logging.CRITICAL)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      yield
  except BaseException:
    failed = True
    raise
  finally:
    wrapper.absl_quiet = was_quiet
    if not failed:
      asyncio_log.setLevel(level)
    if failed:  # its reads left pending: at exit Python warns of each coroutine never
      # awaited, and asyncio logs each task whose exception was never retrieved
      warnings.filterwarnings('ignore', r"coroutine '.*' was never awaited", RuntimeWarning)
      logging.getLogger('asyncio').setLevel(logging.CRITICAL)
    if not failed and wrapper is not stderr:
      wrapper.close()
      sys.stderr = stderr


class _WithoutClosedLoopReports:
  """A text stream that passes what is written on to ``stream`` line by line, less each
  whole traceback report (``Traceback (most recent call last):`` or ``Exception ignored
  in ...``, its indented frames, its exception line) whose exception line says ``Event
  loop is closed``: what orbax's I/O threads print after a failed read. Lines are put
  together per writing thread (a thread's report is not cut by another's message). A
  report cut off by the end of the process is dropped. With ``absl_quiet``, absl
  ``WARNING`` lines are dropped too."""
  _STARTS = ('Traceback (most recent call last):', 'Exception ignored')

  def __init__(self, stream):
    self._stream = stream
    self._pending: dict[int, str] = {}   # thread -> its partial line
    self._report: dict[int, list] = {}   # thread -> the lines of its report being read
    self.absl_quiet = False  # drop absl's WARNING lines too (while orbax reads)

  def write(self, text: str) -> int:
    thread = threading.get_ident()
    *lines, rest = (self._pending.pop(thread, '') + text).split('\n')
    for line in lines:
      self._line(thread, line + '\n')
    if rest and (thread in self._report
                 or any(s.startswith(rest[:len(s)]) for s in self._STARTS)):
      self._pending[thread] = rest  # may start or go on with a report: wait for its end
    elif rest:
      self._stream.write(rest)
    return len(text)

  def _line(self, thread: int, line: str) -> None:
    report = self._report.get(thread)
    if report is None:
      if line.startswith(self._STARTS):
        self._report[thread] = [line]
      elif not (self.absl_quiet and line.startswith('WARNING:absl:')):
        self._stream.write(line)
      return
    report.append(line)
    if line[:1] in (' ', '\t') or line.startswith(self._STARTS):
      return  # a frame, or the traceback under 'Exception ignored in'
    del self._report[thread]
    if 'Event loop is closed' not in line:
      self._stream.write(''.join(report))

  def close(self) -> None:
    """Write out what is held that is not a closed-loop report; the stream stays open."""
    for thread in list(self._report):
      self._stream.write(''.join(self._report.pop(thread)))
    for thread in list(self._pending):
      self._stream.write(self._pending.pop(thread))

  def flush(self) -> None:
    self._stream.flush()

  def __getattr__(self, name):
    return getattr(self._stream, name)


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
