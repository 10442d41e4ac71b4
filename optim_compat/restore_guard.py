"""Flax's ``restore_checkpoint`` with a shim ``Optimizer`` target and a ``TrainState`` checkpoint.

Legacy code on the shim restores with ``flax.training.checkpoints.restore_checkpoint(dir,
optimizer)``. When ``dir`` holds a checkpoint the *migrated* program wrote (the
``TrainState`` layout ``{'step', 'params', 'opt_state'}``), current Flax reads an orbax
checkpoint against the target's structure and, finding none of its keys, gives the
target back unchanged: the program silently starts again from step 0 (found running a
migrated program and its legacy twin on the same directory). A msgpack one fails with
``Missing field target``.

:func:`install` wraps ``flax.training.checkpoints.restore_checkpoint`` so that, when the target holds a shim ``Optimizer`` and the checkpoint holds a
``TrainState`` where it sits, the restore goes through
:func:`optim_compat.checkpoint.restore_legacy` (the moments at the legacy fields, the
step, the params). Every other call is Flax's own, unchanged. It runs at every shim
``OptimizerDef.create`` where ``flax.training.checkpoints`` is already imported (legacy
code imports it at the top; importing it here would cost every shim user orbax's import,
about 0.35 s). Code that bound the function itself
(``from flax.training.checkpoints import restore_checkpoint``) before that keeps Flax's.

Both wrappers (and ``save_checkpoint``'s) also make a relative local directory absolute:
Flax >= 0.7 reads and writes with orbax, which rejects one ('Checkpoint path should be
absolute'), where legacy code on Flax <= 0.5.3 passed ``'ckpt'`` (the same directory).
"""
from __future__ import annotations

import functools
import os
import pathlib
import sys

_MARK = '_optim_compat_guard'


def _shim_optimizer_paths(target) -> list[tuple[str, ...]]:
  """Key paths (state-dict keys) of the shim ``Optimizer`` nodes in ``target``."""
  import jax
  from optim_compat import base
  from optim_compat.checkpoint_layout import _key_str
  found = []
  for key_path, node in jax.tree_util.tree_flatten_with_path(
      target, is_leaf=lambda x: isinstance(x, base.Optimizer))[0]:
    if isinstance(node, base.Optimizer):
      found.append(tuple(_key_str(k) for k in key_path))
  return found


def _orbax_keys(path: pathlib.Path, keys: tuple[str, ...]):
  """The top keys of the orbax checkpoint ``path`` below ``keys`` (its metadata only), or
  None when it cannot be read (Flax's own call then reports it)."""
  from optim_compat.checkpoint_files import _orbax_quiet, orbax_metadata_tree
  try:
    with _orbax_quiet():
      import orbax.checkpoint as ocp
      tree = orbax_metadata_tree(ocp.PyTreeCheckpointer(), path.absolute())
      for k in keys:
        tree = tree[k] if isinstance(tree, dict) else tree[int(k)]
      return set(tree) if isinstance(tree, dict) else None
  except Exception:  # noqa: BLE001 - unreadable here: Flax's own restore says why
    return None


def _wants_legacy_restore(ckpt_dir, target, step) -> str | None:
  """'orbax': an orbax ``TrainState`` checkpoint where ``target`` holds a shim
  ``Optimizer``; 'msgpack': a msgpack checkpoint and such a target; else None."""
  from optim_compat.checkpoint_files import CheckpointError, _checkpoint_file
  paths = _shim_optimizer_paths(target) if target is not None else []
  if not paths:
    return None
  try:
    file = _checkpoint_file(pathlib.Path(ckpt_dir), step)
  except (CheckpointError, OSError, TypeError):
    return None
  if file.is_dir():
    fits = any((_orbax_keys(file, p) or set()) >= {'step', 'params', 'opt_state'} for p in paths)
    return 'orbax' if fits else None
  return 'msgpack'


def _local_absolute(ckpt_dir):
  """``ckpt_dir`` made absolute when it is a relative local path (str or path; a URL such as
  ``gs://...`` and anything else unchanged)."""
  if isinstance(ckpt_dir, (str, pathlib.PurePath)) and '://' not in str(ckpt_dir) \
      and not os.path.isabs(ckpt_dir):
    return os.path.abspath(ckpt_dir)
  return ckpt_dir


def install() -> None:
  """Wrap ``flax.training.checkpoints.restore_checkpoint`` (once; see the module docstring).

  The wrapper has Flax's signature; with a shim ``Optimizer`` in ``target``, no ``prefix``
  other than ``checkpoint_`` and no Flax-only options, and an orbax ``TrainState``
  checkpoint at ``ckpt_dir``, it returns ``restore_legacy(ckpt_dir, target,
  step=step)``: ``target``'s structure, numpy leaves. A msgpack checkpoint goes to Flax
  first and to ``restore_legacy`` only when Flax's fails (a ``TrainState`` layout: Flax
  raises ``Missing field``); if that fails too, Flax's error is raised. For an orbax one it
  raises what ``restore_legacy`` raises (``CheckpointError`` naming the path: a layout
  that fits no Optax transformation of the def, a replicated target).
  """
  from flax.training import checkpoints
  flax_restore = checkpoints.restore_checkpoint
  if getattr(flax_restore, _MARK, False):
    return

  @functools.wraps(flax_restore)
  def restore_checkpoint(ckpt_dir, target=None, step=None, prefix='checkpoint_', *args,
                         **kwargs):
    ckpt_dir = _local_absolute(ckpt_dir)
    kind = (_wants_legacy_restore(ckpt_dir, target, step)
            if not args and not kwargs and prefix == 'checkpoint_' else None)
    from optim_compat.checkpoint import restore_legacy
    if kind == 'orbax':
      return restore_legacy(ckpt_dir, target, step=step)
    try:
      return flax_restore(ckpt_dir, target, step, prefix, *args, **kwargs)
    except ValueError as flax_error:
      if kind != 'msgpack':
        raise
      try:
        return restore_legacy(ckpt_dir, target, step=step)
      except Exception:  # noqa: BLE001 - not a TrainState either: Flax's reason stands
        raise flax_error from None

  setattr(restore_checkpoint, _MARK, True)
  checkpoints.restore_checkpoint = restore_checkpoint
  flax_save = checkpoints.save_checkpoint

  @functools.wraps(flax_save)
  def save_checkpoint(ckpt_dir, *args, **kwargs):
    return flax_save(_local_absolute(ckpt_dir), *args, **kwargs)

  if not getattr(flax_save, _MARK, False):
    setattr(save_checkpoint, _MARK, True)
    checkpoints.save_checkpoint = save_checkpoint


def install_if_imported() -> None:
  """:func:`install` when ``flax.training.checkpoints`` is imported already; else nothing
  (cheap: a dictionary look-up once installed)."""
  module = sys.modules.get('flax.training.checkpoints')
  if module is not None and not getattr(module.restore_checkpoint, _MARK, False):
    install()
