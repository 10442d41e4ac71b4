"""Legacy checkpoints written by real ``flax.optim`` 0.5.3, and what legacy did next.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        .legacy-venv/bin/python -m equivalence_tests.checkpoint_legacy OUT_DIR

Runs in the old stack only (jax 0.4.13, flax 0.5.3; numpy/jax/flax imports).
For every case below, real flax.optim trains ``BEFORE`` jitted steps on the
reference params and gradients (``core.reference_grads(params, step)``), saves
the checkpoint to ``OUT_DIR/<case>/checkpoint_<BEFORE>``, then trains ``AFTER``
more steps and writes ``OUT_DIR/<case>.npz``: ``'<step>/<leaf path>'`` = the
params after each continuation step, ``'final/<state-dict path>'`` = the final
optimizer's state dict (device 0 for the replicated run).

The checkpoint file is what ``flax.training.checkpoints.save_checkpoint`` 0.5.3
writes: ``flax.serialization.to_bytes(target)`` at ``<dir>/checkpoint_<step>``.
That module does not import on jax 0.4.13 (it needs removed jax modules), so the
bytes are written directly; ``to_bytes`` needs ``jax.interpreters.xla.DeviceArray``,
which jax 0.4.13 lacks, and is given ``jax.Array`` in this process only
(shared/legacy-flax-optim.md, "Environment notes").

Cases: every single-def case of ``cases.CASES`` (so every table entry), the
MultiOptimizer, focus and WeightNorm cases, containers holding an Adam
optimizer (a dict, a tuple and a ``flax.struct`` dataclass with ``optimizer``
beside ``model_state``, ``ema`` and ``step``), and a Momentum run
``pmap``-replicated over 2 devices whose checkpoint keeps the device axis.
Prints one JSON line: ``{"jax": ..., "flax": ..., "cases": [...]}``.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils, serialization, struct, traverse_util

from equivalence_tests import cases, core

BEFORE = 5
AFTER = 5
REPLICATED_DEVICES = 2

#: containers holding an optimizer (case id -> builder of the saved object)
CONTAINER_CASE = ('adam_betas', 'Adam',
                  {'learning_rate': 0.01, 'beta1': 0.85, 'beta2': 0.99, 'eps': 1e-6})


@struct.dataclass
class TrainingState:
  """A container in the shape legacy programs saved (optimizer beside model state)."""
  optimizer: Any
  model_state: Any
  ema: Any
  step: Any


def selected_cases():
  """``(case_id, def_name, kwargs)`` of ``cases.CASES`` trained plainly (no per-call
  overrides, no injected gradients, no user-written defs): every table entry
  with its hyper-parameter sets, MultiOptimizer, focus and WeightNorm."""
  return [c for c in cases.CASES
          if not c[1].startswith('user:') and not {'apply', 'grads'} & set(c[2])]


def _containers(opt, params):
  ema = jax.tree_util.tree_map(lambda x: (x * np.float32(0.5)).astype(np.float32), params)
  model_state = {'batch_stats': {'mean': np.arange(4, dtype=np.float32)}}
  return {
      'container_dict': lambda o: {'optimizer': o, 'model_state': model_state, 'step': BEFORE},
      'container_tuple': lambda o: (o, ema),
      'container_dataclass': lambda o: TrainingState(optimizer=o, model_state=model_state,
                                                     ema=ema, step=BEFORE),
  }


def _save(obj, directory: str, step: int):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f'checkpoint_{step}'), 'wb') as f:
    f.write(serialization.to_bytes(obj))


def _flat_sd(tree) -> dict:
  sd = serialization.to_state_dict(tree)
  out = {}
  for k, v in traverse_util.flatten_dict(sd).items():
    if v is None or (isinstance(v, dict) and not v):
      continue
    out['final/' + '/'.join(k)] = core.storable(v)
  return out


def _train(opt, params, start, steps, step_fn, grads_fn, record):
  for s in range(start, start + steps):
    opt = step_fn(opt, grads_fn(s))
    if record is not None:
      record[s + 1] = opt
  return opt


def run_case(out_dir, case_id, def_name, kwargs, real, replicated=False):
  params = cases.params_for(case_id)
  opt_def, focus = cases.build(real, def_name, kwargs)
  target = jax.tree_util.tree_map(jnp.asarray, params)
  opt = opt_def.create(target, focus=focus) if focus is not None else opt_def.create(target)
  if not replicated:
    step_fn = jax.jit(lambda o, g: o.apply_gradient(g))
    grads_fn = lambda s: core.reference_grads(params, s)
    take = lambda o: o
  else:
    n = REPLICATED_DEVICES
    devices = jax.local_devices()[:n]
    if len(devices) < n:
      raise RuntimeError(f'need {n} devices: set XLA_FLAGS=--xla_force_host_platform_device_count={n}')
    opt = jax_utils.replicate(opt, devices=devices)
    step_fn = jax.pmap(lambda o, g: o.apply_gradient(jax.lax.pmean(g, 'batch')),
                       axis_name='batch', devices=devices)
    grads_fn = lambda s: jax.tree_util.tree_map(
        lambda *xs: np.stack(xs),
        *[core.reference_grads(params, s, device=d, n_devices=n) for d in range(n)])
    take = jax_utils.unreplicate
  opt = _train(opt, params, 0, BEFORE, step_fn, grads_fn, None)
  saved = {case_id: opt}
  if case_id == CONTAINER_CASE[0]:
    saved.update({cid: build(opt) for cid, build in _containers(opt, params).items()})
  for cid, obj in saved.items():
    _save(obj, os.path.join(out_dir, cid), BEFORE)
  record = {}
  final = _train(opt, params, BEFORE, AFTER, step_fn, grads_fn, record)
  arrays = {f'{s}/{leaf}': v for s, o in record.items() for leaf, v in core.flat(take(o).target).items()}
  arrays.update(_flat_sd(take(final)))
  for cid in saved:
    np.savez(os.path.join(out_dir, f'{cid}.npz'), **arrays)
  return list(saved)


def main(argv) -> int:
  if len(argv) != 1:
    print(__doc__, file=sys.stderr)
    return 2
  out_dir = argv[0]
  jax.interpreters.xla.DeviceArray = jax.Array  # see the module docstring
  from flax import optim as real
  done = []
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    for case_id, def_name, kwargs in selected_cases():
      done += run_case(out_dir, case_id, def_name, kwargs, real)
    done += run_case(out_dir, 'replicated_momentum', 'Momentum',
                     {'learning_rate': 0.05, 'beta': 0.8, 'nesterov': True}, real, replicated=True)
  print(json.dumps({'jax': jax.__version__, 'flax': __import__('flax').__version__,
                    'before': BEFORE, 'after': AFTER, 'cases': done}))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
