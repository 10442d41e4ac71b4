"""Record golden trajectories of real ``flax.optim`` (run in the old stack).

    .legacy-venv/bin/python -m equivalence_tests.record_golden [--out DIR] [--check] [--cases ID...]

Writes ``DIR/<case_id>.npz`` per case of ``cases.py``: ``p/<step>/<leaf path>``
for the recorded steps and ``state/<flattened legacy state dict key>`` of the
final optimizer (the legacy checkpoint layout). ``--check`` re-records into
memory and compares with the committed files instead of writing: the layout
(keys, dtypes, shapes) exactly, the values within the case's cross-machine
bound (``cases.golden_bound``: the files were recorded on one CPU, a re-record
on another rounds reductions and multiply-adds differently); it prints one
line per case, ``<case_id>: ok ...`` or ``<case_id>: DIFFERS ...``, and exits 1
if any differs.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import numpy as np
from flax import serialization, traverse_util

from equivalence_tests import cases, core

GOLDEN_DIR = pathlib.Path(__file__).parent / 'golden'


def record_case(optim_module, case_id: str, def_name: str, kwargs: dict) -> dict[str, np.ndarray]:
  """Arrays of one golden file for ``optim_module.<def_name>(**kwargs)``."""
  traj, opt = cases.run_case(optim_module, case_id, record=cases.RECORDED_STEPS)
  out = {f'p/{step}/{path}': v for step, leaves in traj.items() for path, v in leaves.items()}
  sd = serialization.to_state_dict(opt)
  for k, v in traverse_util.flatten_dict(sd['state'], keep_empty_nodes=True).items():
    key = 'state/' + '/'.join(k)
    # an empty legacy state (GradientDescent's ``()``, saved as ``{}``) is kept
    # as a zero-size uint8 marker so the layout itself is recorded
    empty = v is traverse_util.empty_node or isinstance(v, dict)
    # and a legacy ``None`` (RMSProp's ``mg`` when not centered) as zero-size int8
    if v is None:
      out[key] = np.zeros((0,), np.int8)
    else:
      out[key] = np.zeros((0,), np.uint8) if empty else core.storable(v)
  return out


def load(case_id: str, directory=GOLDEN_DIR) -> tuple[dict, dict]:
  """``(trajectory, final_state)`` of a golden file; trajectory as in ``core``."""
  data = np.load(pathlib.Path(directory) / f'{case_id}.npz')
  return load_arrays({key: data[key] for key in data.files})


def compare_files(case_id: str, old, new: dict) -> tuple[bool, str]:
  """``(ok, message)``: a re-recorded file's arrays ``new`` against the committed ``old``.

  ``ok``: same keys, and per key the same dtype and shape; params within
  ``cases.golden_bound(case_id).legacy`` and each state leaf within
  ``.legacy_state`` ulps (of that leaf's largest magnitude, as ``core.compare``).
  """
  keys = sorted(old.files)
  if keys != sorted(new):
    return False, f'keys differ: {sorted(set(keys) ^ set(new))}'
  bad = [k for k in keys if old[k].dtype != new[k].dtype or old[k].shape != new[k].shape]
  if bad:
    return False, f'dtype or shape differs: {bad}'
  if all(old[k].tobytes() == new[k].tobytes() for k in keys):
    return True, 'bitwise equal'
  bound = cases.golden_bound(case_id)
  dtype = cases.DTYPES.get(case_id)
  split = lambda arrays: load_arrays({k: arrays[k] for k in keys})
  (old_traj, old_state), (new_traj, new_state) = split(old), split(new)
  params, where = core.compare(new_traj, old_traj, dtype)
  state, state_key = 0.0, None
  for key, value in old_state.items():
    if value.size and key != 'step':
      d = core.ulp_distance(new_state[key], value, dtype=dtype)
      if d > state:
        state, state_key = d, key
  ok = (params <= bound.legacy and state <= bound.legacy_state
        and np.array_equal(new_state.get('step'), old_state.get('step')))
  return ok, (f'params {params:g} ulp (bound {bound.legacy:g}, worst at {where}), '
              f'state {state:g} ulp (bound {bound.legacy_state:g}, worst at {state_key})')


def load_arrays(data) -> tuple[dict, dict]:
  """``(trajectory, final_state)`` of a golden file's arrays (``name -> array``)."""
  traj: dict = {}
  state = {}
  for key in data:
    kind, rest = key.split('/', 1)
    if kind == 'p':
      step, path = rest.split('/', 1)
      traj.setdefault(int(step), {})[path] = data[key]
    else:
      state[rest] = data[key]
  return traj, state


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--out', type=pathlib.Path, default=GOLDEN_DIR)
  parser.add_argument('--check', action='store_true')
  parser.add_argument('--cases', nargs='+', metavar='CASE_ID',
                      help='only these cases (default: all of cases.py)')
  args = parser.parse_args(argv)
  unknown = set(args.cases or ()) - set(cases.CASE_BY_ID)
  if unknown:
    parser.error(f'unknown case id(s) {sorted(unknown)}')
  from flax import optim  # the real one: this only runs in the old stack
  failures = 0
  for case_id, def_name, kwargs in cases.CASES:
    if args.cases and case_id not in args.cases:
      continue
    arrays = record_case(optim, case_id, def_name, kwargs)
    path = args.out / f'{case_id}.npz'
    if args.check:
      ok, message = compare_files(case_id, np.load(path), arrays)
      print(f'{case_id}: {"ok" if ok else "DIFFERS"}: {message} ({path})')
      failures += not ok
    else:
      args.out.mkdir(parents=True, exist_ok=True)
      np.savez_compressed(path, **arrays)
      print(f'wrote {path} ({path.stat().st_size} bytes)')
  print(f'jax {jax.__version__}')
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
