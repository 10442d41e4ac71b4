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

This module is the runtime API the codemod emits into user code
(``optim_compat.checkpoint.restore_legacy``); the file formats are in
:mod:`optim_compat.checkpoint_files`, the layouts in
:mod:`optim_compat.checkpoint_layout`, the command's half in
:mod:`optim_compat.checkpoint_convert`; their public names are exported here.

Which Optax state field holds which legacy field is migration knowledge: it is in
``optim_compat.state_map`` beside the migration table.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import warnings
from typing import Mapping

import jax
import numpy as np
from flax import serialization
from flax.training import train_state as train_state_lib

from optim_compat import base
from optim_compat.checkpoint_convert import (  # noqa: F401 - the command's half, exported
    abstract_train_state, check_target, convert_state_dict, infer_def, parse_optimizer,
    write_checkpoint)
from optim_compat.checkpoint_files import (  # noqa: F401 - exported
    CheckpointError, ReplicatedCheckpointWarning, _is_orbax, read_state_dict)
from optim_compat.checkpoint_layout import (  # noqa: F401 - exported
    _EMPTY, _INJECT_KEPT, _PARTITION, _conform, _def_name, _flat, _get, _is_namedtuple,
    _is_opt, _is_train_state_sd, _key_str, _normalize_namedtuples, _restore_one, _set,
    choose_row, find_legacy_optimizers, is_legacy_optimizer, legacy_from_opt_state)

__all__ = ['CheckpointError', 'ReplicatedCheckpointWarning', 'restore_legacy', 'to_legacy',
           'read_state_dict', 'convert_state_dict', 'write_checkpoint', 'check_target',
           'parse_optimizer', 'infer_def', 'abstract_train_state', 'is_legacy_optimizer',
           'find_legacy_optimizers', 'choose_row']


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
      codemod emits for the def (``emitted.tx_from_source(SPECS[name].emit(...))``;
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
  try:
    return _restore_sd(sd, target, source, optimizer)
  except CheckpointError as e:
    if str(e).startswith(f'{source}:'):
      raise
    raise CheckpointError(f'{source}: {e}{_injection_hint(sd, target)}') from None


def _has_key(tree, key: str) -> bool:
  return isinstance(tree, Mapping) and (key in tree or any(_has_key(v, key)
                                                           for v in tree.values()))


def _injection_hint(sd, target) -> str:
  """Why a TrainState checkpoint may not fit ``target``: one side's opt_state is
  ``optax.inject_hyperparams`` state and the other's is not (convert-checkpoint's
  ``--learning-rate-injected`` given or not, helper-28's D2); else ''."""
  if not _has_key(sd, 'opt_state'):
    return ''
  injected = lambda x: isinstance(x, tuple) and hasattr(x, 'hyperparams') and hasattr(  # noqa: E731
      x, 'inner_state')
  wants = any(injected(x) for x in jax.tree_util.tree_leaves(target, is_leaf=injected))
  saved = _has_key(sd, 'hyperparams')
  if wants and not saved:
    return ('; the target\'s tx is wrapped in optax.inject_hyperparams (a learning rate set '
            'at apply time) and the checkpoint\'s opt_state is a plain chain\'s: if '
            'optim-migrate convert-checkpoint wrote it, convert the legacy checkpoint again '
            'with --learning-rate-injected')
  if saved and not wants:
    return ('; the checkpoint\'s opt_state is optax.inject_hyperparams state (convert-checkpoint '
            '--learning-rate-injected) and the target\'s tx is a plain chain: convert the legacy '
            'checkpoint again without --learning-rate-injected, or wrap the tx in '
            'optax.inject_hyperparams')
  return ''


def _restore_sd(sd, target, source: str, optimizer):
  """:func:`restore_legacy` of a state dict read from ``source``."""
  if _is_opt(target):
    if _is_train_state_sd(sd) and isinstance(target, train_state_lib.TrainState):
      return _restore_one(sd, target, '')[0]  # saved after the migration: as is
    if _is_train_state_sd(sd):
      return _optimizer_from_train_state_sd(sd, target, '', source)
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
    if isinstance(node, base.Optimizer) and _is_train_state_sd(_get(sd, keys)):
      restored, n = _optimizer_from_train_state_sd(_get(sd, keys), node, '/'.join(keys),
                                                   source), None
    else:
      restored, n = _restore_one(_get(sd, keys), node, '/'.join(keys), optimizer)
    replicas = replicas or n
    new_sd = _set(new_sd, keys, serialization.to_state_dict(restored))
  new_sd = _conform(serialization.to_state_dict(target), new_sd, '', replicas)
  return serialization.from_state_dict(target, new_sd)


def _candidate_txs(optimizer_def):
  """The Optax transformations a migrated program may have built for ``optimizer_def``:
  the codemod's emitted tx (hyper-parameters as in the def, learning rate fixed, then
  injected: ``optax.inject_hyperparams``; for a WeightNorm, ``transforms.weight_norm`` of
  each of its wrapped def's), then ``optim_compat.to_optax(def)``."""
  from optim_compat import emitted, legacy_view, spec, transforms
  from optim_compat.weight_norm import WeightNorm
  if isinstance(optimizer_def, WeightNorm):  # (the codemod's transforms.weight_norm(<inner>))
    hp = optimizer_def.hyper_params
    for inner in _candidate_txs(optimizer_def.wrapped_optimizer):
      yield transforms.weight_norm(inner, hp.wn_decay, hp.wn_eps)
  name = _def_name(optimizer_def)
  entry = spec.SPECS.get(name)
  if entry is not None:
    hp = optimizer_def.hyper_params
    args = {}
    for field in dataclasses.fields(hp):
      value = getattr(hp, field.name)
      value = value.item() if hasattr(value, 'item') else value
      args[field.name] = repr(0.0 if value is None and field.name == 'learning_rate' else value)
    for injected in (False, True):
      try:
        yield emitted.tx_from_source(entry.emit(args, injected))
      except Exception:  # noqa: BLE001 - a def whose fields are not its call's keywords
        pass
  yield legacy_view.to_optax(optimizer_def)


def _optimizer_from_train_state_sd(sd, target: base.Optimizer, where: str,
                                   source: str) -> base.Optimizer:
  """A ``TrainState`` state dict (a checkpoint the migrated program wrote) as the shim
  ``Optimizer`` ``target``: its opt_state read through the first tx of
  :func:`_candidate_txs` whose state it fits, then :func:`to_legacy`.

  Raises:
    CheckpointError: ``target`` is replicated (restore into the unreplicated optimizer,
      then replicate it), or the opt_state fits none of the candidate txs (names them).
  """
  at = f'{source}: ' + (f'{where}: ' if where else '')
  optimizer_def = target.optimizer_def
  if isinstance(optimizer_def, base.ReplicatedOptimizer) or np.ndim(target.state.step):
    raise CheckpointError(f'{at}a TrainState checkpoint into a replicated shim Optimizer: '
                          'restore into the unreplicated optimizer, then replicate it')
  tried = []
  for tx in _candidate_txs(optimizer_def):
    template = abstract_train_state(tx, target.target)
    try:
      restored = _restore_one(sd, template, where)[0]
    except CheckpointError as e:
      tried.append(str(e))
      continue
    return to_legacy(restored, optimizer_def)
  raise CheckpointError(f'{at}a TrainState checkpoint whose opt_state fits no Optax '
                        f'transformation of {type(optimizer_def).__name__} (the emitted tx, '
                        f'its inject_hyperparams form, to_optax): {tried[0]}')


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
  step = int(np.asarray(train_state.step))

  def check_count(v, path):
    if int(np.asarray(v)) != step:
      raise CheckpointError(f'{path} = {int(np.asarray(v))} differs from TrainState.step = {step}: '
                            f'the legacy layout has one step')

  ps = legacy_from_opt_state(train_state.opt_state, optimizer_def, template.state.param_states,
                             check_count)
  sd = {'target': serialization.to_state_dict(train_state.params),
        'state': {'step': np.asarray(step, np.int32), 'param_states': ps}}
  sd = _conform(serialization.to_state_dict(template), sd, 'legacy')
  return serialization.from_state_dict(template, sd)
