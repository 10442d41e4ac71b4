"""``optim-migrate convert-checkpoint``'s half of the checkpoint API: no Python target.

A legacy checkpoint converted from its file alone: the def parsed from
``--optimizer`` (or inferred from the state fields), the emitted tx built,
a ``TrainState`` template made without allocating the optimizer state, every
legacy optimizer in the state dict replaced by its ``TrainState`` state dict,
and the result written atomically (msgpack or orbax), never over a file that is
not a checkpoint. Exported by :mod:`optim_compat.checkpoint`.
"""
from __future__ import annotations

import ast
import math
import os
import pathlib
import shutil
import tempfile
import warnings
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from flax.training import train_state as train_state_lib

from optim_compat import def_text, emitted, spec, weight_norm
from optim_compat.checkpoint_files import (
    CheckpointError, ReplicatedCheckpointWarning, _is_orbax, _msgpack_checkpoint_problem,
    _pack_stream, _TooLarge)
from optim_compat.checkpoint_layout import (
    _flat, _get, _is_namedtuple, _INJECT_KEPT, _legacy_fields, _mixed_states, _normalize_namedtuples,
    _restore_one, _set, _strip_replicas, find_legacy_optimizers)


def parse_optimizer(text: str, learning_rate_injected: bool = False) -> tuple[str, dict[str, str]]:
  """``"Adam(learning_rate=1e-3, beta1=0.9)"`` -> ``('Adam', {'learning_rate': '1e-3', ...})``.

  ``"WeightNorm(Adam(...), wn_decay=1e-3)"`` -> ``('WeightNorm', {'inner': ('Adam', {...}),
  'wn_decay': '1e-3'})``.

  Positional arguments take the legacy order (``spec.SPECS[name].hyper_params``).
  Values must be literal numbers, booleans or None; a non-literal
  ``learning_rate`` (e.g. ``config.lr``) is dropped, as it is not in the state,
  unless ``learning_rate_injected``: ``inject_hyperparams`` stores the rate in
  ``opt_state``, and a value this cannot evaluate would be written as 0.0.

  Raises:
    CheckpointError: not a call of a table entry or of ``WeightNorm`` around one (a bare
      ``Adam``: call it; ``MultiOptimizer``: restored at run time instead, the message says
      how), an
      unknown argument, one given twice (``Adam(1e-3, learning_rate=2)``), ``*``/``**``
      unpacking, a non-literal value (the learning rate only with
      ``learning_rate_injected``), a literal that is not a number, True/False or
      None (``learning_rate='x'``), or a learning rate that is inf (``1e999``);
      the message names the argument and value.
  """
  try:
    call = def_text.parse_call(text)
  except def_text.DefTextError as e:
    if e.kind == 'syntax':
      raise CheckpointError(f'--optimizer {text!r}: not a Python call ({e.detail})') from None
    if e.detail in spec.SPECS:
      raise CheckpointError(f'--optimizer {text!r} is the class {e.detail}, not called: call it, '
                            f'e.g. {e.detail}(learning_rate=1e-3)') from None
    call = None
  if call is not None and call.name == 'WeightNorm':
    return _parse_weight_norm(text, call, learning_rate_injected)
  if call is not None and call.name == 'MultiOptimizer':
    raise CheckpointError(
        f'--optimizer {text!r}: a MultiOptimizer needs its traversals, which a command line '
        'cannot give; optim_compat.checkpoint.restore_legacy(dir, state) restores this '
        'checkpoint into the state the migrated code builds, at run time (convert-checkpoint '
        f'takes one of {sorted(spec.SPECS)}, or WeightNorm(<one of them>))')
  if call is None or call.name not in spec.SPECS:
    raise CheckpointError(f'--optimizer {text!r}: expected one of {sorted(spec.SPECS)} '
                          f'called with its legacy arguments')
  name, entry = call.name, spec.SPECS[call.name]
  pairs = []
  for i, a in enumerate(call.args):
    if isinstance(a, ast.Starred):
      raise CheckpointError(f'--optimizer {text!r}: cannot unpack {ast.unparse(a)}: give each '
                            'argument as a literal')
    if i >= len(entry.hyper_params):
      raise CheckpointError(f'--optimizer {text!r}: too many positional arguments')
    pairs.append((entry.hyper_params[i].name, a))
  for keyword, value in call.keywords:
    if keyword is None:
      raise CheckpointError(f'--optimizer {text!r}: cannot unpack **{ast.unparse(value)}: '
                            'give each argument as a literal')
    if keyword not in entry.hyper_param_names:
      raise CheckpointError(f'--optimizer {text!r}: {name} has no argument {keyword!r}; '
                            f'valid: {list(entry.hyper_param_names)}')
    pairs.append((keyword, value))
  _once(text, pairs)
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
      written = call.spelled(value)
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


_WN_ARGS = ('wrapped_optimizer', 'wn_decay', 'wn_eps')


def _once(text: str, pairs) -> None:
  """Each ``(argument, value)`` of ``pairs`` names its argument once (Python: TypeError,
  multiple values for argument)."""
  seen = set()
  for key, _ in pairs:
    if key in seen:
      raise CheckpointError(f'--optimizer {text!r}: {key} is given twice (an error in Python: '
                            'multiple values for one argument); give it once')
    seen.add(key)


def _parse_weight_norm(text: str, call, learning_rate_injected: bool):
  """``WeightNorm(<a table def call>, wn_decay, wn_eps)`` -> ``('WeightNorm', {'inner':
  (name, args), 'wn_decay': ..., 'wn_eps': ...})``, the inner def parsed as
  :func:`parse_optimizer` parses one; ``wn_decay`` / ``wn_eps`` literal numbers (they shape
  no state, but the converted state is the one the migrated code builds with them)."""
  given = list(zip(_WN_ARGS, call.args))
  if len(call.args) > len(_WN_ARGS):
    raise CheckpointError(f'--optimizer {text!r}: too many positional arguments')
  for keyword, value in call.keywords:
    if keyword not in _WN_ARGS:
      raise CheckpointError(f'--optimizer {text!r}: WeightNorm has no argument {keyword!r}; '
                            f'valid: {list(_WN_ARGS)}')
    given.append((keyword, value))
  _once(text, given)
  args = dict(given)
  inner = args.pop('wrapped_optimizer', None)
  if inner is None or isinstance(inner, ast.Starred):
    raise CheckpointError(f'--optimizer {text!r}: WeightNorm needs the def it wraps, e.g. '
                          'WeightNorm(Adam(learning_rate=1e-3), wn_decay=1e-3)')
  out = {'inner': parse_optimizer(ast.unparse(inner), learning_rate_injected)}
  for key, value in args.items():
    try:
      literal = ast.literal_eval(value)
    except ValueError:
      literal = None
    if isinstance(literal, bool) or not isinstance(literal, (int, float)) or \
        not math.isfinite(literal):
      raise CheckpointError(f'--optimizer {text!r}: {key}={ast.unparse(value)} must be a finite '
                            'literal number')
    out[key] = ast.unparse(value)
  return 'WeightNorm', out


def emitted_source(name: str, args: dict, learning_rate_injected: bool = False) -> str:
  """The Optax source the codemod writes for ``name`` and its parsed ``args`` (a learning
  rate not given: 0.0, to be set in the train step), ``transforms.weight_norm`` around the
  inner def's for a WeightNorm."""
  if name == 'WeightNorm':
    return spec.weight_norm_emit(emitted_source(*args['inner'], learning_rate_injected),
                                 [f'{k}={v}' for k, v in args.items() if k != 'inner'])
  if 'learning_rate' not in args or args['learning_rate'] == 'None':
    args = dict(args, learning_rate='0.0')  # not in the state layout; set it in the train step
  return spec.SPECS[name].emit(args, learning_rate_injected)


def infer_def(param_states) -> str:
  """The table entry whose legacy state fields the checkpoint has, when only one has them.

  Raises:
    CheckpointError: no entry or several (e.g. Adam / AdaBelief / LAMB share
      ``grad_ema, grad_sq_ema``); the message lists them.
  """
  fields = _legacy_fields(_flat(param_states))
  if weight_norm.holds_weight_norm_states(fields):
    raise CheckpointError('a WeightNorm checkpoint (per-parameter direction and scale): pass '
                          "--optimizer 'WeightNorm(<the def it wraps>(...), wn_decay=...)'")
  names = [n for n, e in spec.SPECS.items()
           if fields <= set(e.state_fields) and (fields or not e.state_fields)
           and set(e.state_fields) - fields <= {'mg'}]
  if len(names) != 1:
    raise CheckpointError(f'cannot infer the optimizer from the state fields {sorted(fields)} '
                          f'(candidates: {names or "none"}); pass --optimizer'
                          + _mixed_states(_flat(param_states)))
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
    source = emitted_source(name, args, learning_rate_injected)
    try:
      tx = emitted.tx_from_source(source)
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
