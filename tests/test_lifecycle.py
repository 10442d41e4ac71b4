"""The checkpoint lifecycle of a migrated program: run, save, run again from the save, again.

The legacy programs of ``tests/fixtures/programs/lifecycle`` (every table optimizer, WeightNorm,
a MultiOptimizer with a frozen part, Adam and Momentum with a learning rate passed at apply
time, a pmap-replicated Momentum; each restores its checkpoint directory or starts fresh,
trains, saves with ``step=`` and ``overwrite=True``) are migrated here by the real codemod
(``optim-migrate rewrite --write``) and run as subprocesses, ``STEPS`` steps a run:

* modern cycle: the migrated program three times against one directory (fresh -> resume ->
  resume); each run's params must equal one uninterrupted run of ``3 * STEPS`` steps, bitwise
  (same machine, same session);
* legacy first: the legacy program on the old stack (real flax.optim 0.5.3, its own
  ``flax.training.checkpoints`` writing a legacy msgpack file) once, then the migrated program
  twice on the modern stack; vs one uninterrupted legacy run on the old stack, within the
  migration table's bound for the def (two XLA versions: not bitwise).

All runs of one stage share a process (one per stage and stack; the old-stack run beside the
first modern one), and the modern processes share a persistent compilation cache.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax.training import train_state

from codemod import cli
from equivalence_tests import core
from optim_compat import checkpoint as ck
from optim_compat import emitted, spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / 'tests' / 'fixtures' / 'programs' / 'lifecycle'
STEPS = 3
#: case -> the table entries whose emitted tx it trains (its bound: the largest of theirs)
CASES = {
    'sgd': ('GradientDescent',), 'momentum': ('Momentum',), 'adam': ('Adam',),
    'adabelief': ('AdaBelief',), 'adadelta': ('Adadelta',), 'adagrad': ('Adagrad',),
    'rmsprop': ('RMSProp',), 'lamb': ('LAMB',), 'lars': ('LARS',), 'adafactor': ('Adafactor',),
    'weight_norm': (), 'multi': ('Momentum', 'Adam'), 'adam_lr': ('Adam',),
    'momentum_lr': ('Momentum',), 'replicated': ('Momentum',),
}
#: WeightNorm is emitted as optim_compat.to_optax of the shim def: the shim's bound against
#: real flax.optim (README: <= 2 ulp, 4 with a margin), as in tests/test_checkpoints.py
SHIM_ULP = 4.0


def _env(cache):
  return dict(os.environ, JAX_PLATFORMS='cpu',
              XLA_FLAGS='--xla_force_host_platform_device_count=2',
              JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')


def _start(python, program_dir, jobs, env):
  args = [str(a) for job in jobs for a in job]
  return subprocess.Popen([python, str(PROGRAMS / 'run.py'), str(program_dir), *args],
                          cwd=program_dir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _wait(proc, what):
  out, err = proc.communicate()
  assert proc.returncode == 0, f'{what} failed ({proc.returncode}):\n{err[-4000:]}'


def _layout(root):
  """``{case: (checkpoint name, 'orbax' | 'msgpack')}`` of what each case left on disk."""
  out = {}
  for case in sorted(p.name for p in root.iterdir()):
    found = sorted(c for c in (root / case).iterdir() if c.name.startswith('checkpoint_'))
    out[case] = [(c.name, 'orbax' if c.is_dir() else 'msgpack') for c in found]
  return out


def _trajectory(npz, case):
  traj = {}
  with np.load(npz) as data:
    for key in data.files:
      name, step, leaf = key.split('/', 2)
      if name == case:
        traj.setdefault(int(step), {})[leaf] = data[key]
  return traj


@pytest.fixture(scope='module')
def migrated(tmp_path_factory):
  """The lifecycle programs, migrated by ``optim-migrate rewrite --write``."""
  out = tmp_path_factory.mktemp('lifecycle_migrated')
  for name in ('common.py', 'table.py', 'schedule.py'):
    shutil.copy(PROGRAMS / name, out / name)
  proc = subprocess.run([sys.executable, '-m', 'codemod.cli', 'rewrite', '--write', '--jobs', '1',
                         str(out)], capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == cli.EXIT_CHANGES, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert '2 rewritten, 0 flagged' in proc.stderr, proc.stderr
  for name in ('table.py', 'schedule.py'):
    text = (out / name).read_text()
    assert 'optim.' not in text.replace('optim_compat.', '') and 'TODO(optim-migrate)' not in text
    assert 'optim_compat.checkpoint.restore_legacy(ckpt_dir, optimizer)' in text
    assert 'checkpoints.save_checkpoint(os.path.abspath(ckpt_dir), optimizer, step=' in text
  return out


@pytest.fixture(scope='module')
def runs(migrated, legacy_python, tmp_path_factory):
  """Every run of both cycles; returns the npz of each and the checkpoint layouts seen."""
  tmp = tmp_path_factory.mktemp('lifecycle_runs')
  env = _env(tmp / 'jax_cache')
  legacy_env = {k: v for k, v in env.items()  # the old stack: not the modern runs' cache
                if not k.startswith(('JAX_COMPILATION_CACHE', 'JAX_PERSISTENT_CACHE'))}
  npz = {name: tmp / f'{name}.npz' for name in
         ('uninterrupted', 'cycle1', 'cycle2', 'cycle3',
          'legacy_uninterrupted', 'legacy1', 'legacy2', 'legacy3')}
  cycle, legacy_cycle = tmp / 'cycle', tmp / 'legacy_cycle'
  layouts = {}
  # stage 1: the modern uninterrupted run and first (fresh) run; beside it, on the old stack,
  # the legacy program's uninterrupted run and first run
  modern = _start(sys.executable, migrated, [(tmp / 'u', 3 * STEPS, npz['uninterrupted']),
                                             (cycle, STEPS, npz['cycle1'])], env)
  old = _start(legacy_python, PROGRAMS, [(tmp / 'lu', 3 * STEPS, npz['legacy_uninterrupted']),
                                         (legacy_cycle, STEPS, npz['legacy1'])], legacy_env)
  _wait(modern, 'migrated program, first run')
  _wait(old, 'legacy program on the old stack')
  layouts['cycle1'], layouts['legacy1'] = _layout(cycle), _layout(legacy_cycle)
  # stages 2 and 3: both cycles resume, in one modern process per stage
  for run in (2, 3):
    _wait(_start(sys.executable, migrated, [(cycle, STEPS, npz[f'cycle{run}']),
                                            (legacy_cycle, STEPS, npz[f'legacy{run}'])], env),
          f'migrated program, run {run}')
    layouts[f'cycle{run}'], layouts[f'legacy{run}'] = _layout(cycle), _layout(legacy_cycle)
  return {'npz': npz, 'layouts': layouts, 'cycle': cycle}


def test_every_table_entry_has_a_lifecycle_case():
  assert {n for names in CASES.values() for n in names} == set(spec.SPECS)
  source = (PROGRAMS / 'table.py').read_text() + (PROGRAMS / 'schedule.py').read_text()
  for name in spec.SPECS:
    assert f'optim.{name}(' in source, name


def test_checkpoints_on_disk_are_the_layouts_each_stack_writes(runs):
  """The old stack writes legacy msgpack files, the migrated program orbax directories (flax
  >= 0.7); ``keep=1``: one checkpoint per case, the newest."""
  layouts = runs['layouts']
  for run in (1, 2, 3):
    assert layouts[f'cycle{run}'] == {c: [(f'checkpoint_{run * STEPS}', 'orbax')] for c in CASES}
  assert layouts['legacy1'] == {c: [(f'checkpoint_{STEPS}', 'msgpack')] for c in CASES}
  for run in (2, 3):
    assert layouts[f'legacy{run}'] == {c: [(f'checkpoint_{run * STEPS}', 'orbax')] for c in CASES}


@pytest.mark.parametrize('case', sorted(CASES))
def test_migrated_program_resumes_its_own_checkpoints_bitwise(runs, case):
  """Found by the tracker (issue 15, OM013): the second run of a migrated program crashed in
  restore_legacy (``structure mismatch at opt_state/1: expected {}, found None``: orbax gives
  an empty optax state back as None)."""
  expected = _trajectory(runs['npz']['uninterrupted'], case)
  assert sorted(expected) == list(range(1, 3 * STEPS + 1))
  for run in (1, 2, 3):
    traj = _trajectory(runs['npz'][f'cycle{run}'], case)
    assert sorted(traj) == list(range((run - 1) * STEPS + 1, run * STEPS + 1)), run
    part = {s: expected[s] for s in traj}
    assert core.bitwise_equal(traj, part), (run, core.compare(traj, part))


def _bound(case):
  """The table's bound for the case's defs (``stock_max_ulp``, as tests/test_golden.py).

  Under pmap the table states that XLA may fuse roundings differently (Momentum: measured up
  to 1.03 ulp) and bounds that by ``stock_max_ulp_low_precision``: measured here, float32,
  0.5 ulp for the resumed runs and 1.0 for an uninterrupted migrated pmap run (no checkpoint
  involved) against legacy's, where the jitted runs of Momentum are bitwise.
  """
  names = CASES[case]
  if case == 'replicated':
    return float(spec.SPECS['Momentum'].stock_max_ulp_low_precision)
  return max(float(spec.SPECS[n].stock_max_ulp) for n in names) if names else SHIM_ULP


@pytest.mark.parametrize('case', sorted(CASES))
def test_legacy_checkpoint_resumed_by_the_migrated_program_matches_legacy(runs, case):
  """First run: the legacy program on the old stack; then the migrated one twice."""
  expected = _trajectory(runs['npz']['legacy_uninterrupted'], case)
  first = _trajectory(runs['npz']['legacy1'], case)
  assert core.bitwise_equal(first, {s: expected[s] for s in first})  # same stack and machine
  resumed = {}
  for run in (2, 3):
    resumed.update(_trajectory(runs['npz'][f'legacy{run}'], case))
  assert sorted(resumed) == list(range(STEPS + 1, 3 * STEPS + 1))
  worst, where = core.compare(resumed, {s: expected[s] for s in resumed})
  assert worst <= _bound(case), (worst, where)


def _common():
  """The programs' ``common.py`` (params and gradients), imported under its own name."""
  import importlib.util
  where = importlib.util.spec_from_file_location('lifecycle_common', PROGRAMS / 'common.py')
  module = importlib.util.module_from_spec(where)
  where.loader.exec_module(module)
  return module


def test_a_replicated_orbax_save_restores_in_a_one_device_process(runs):
  """The pmap case's last save (orbax, from 2 devices), read in this process (1 device: orbax
  refused it before, it has no sharding for 2 devices) into an unreplicated target: device 0's
  copy, the uninterrupted run's last params and step."""
  assert jax.local_device_count() == 1
  tx = emitted.tx_from_source(spec.SPECS['Momentum'].emit(
      {'learning_rate': '0.05', 'beta': '0.8', 'nesterov': 'True'}))
  target = train_state.TrainState.create(apply_fn=None, params=_common().make_params(), tx=tx)
  with pytest.warns(ck.ReplicatedCheckpointWarning, match='device axis of 2'):
    restored = ck.restore_legacy(runs['cycle'] / 'replicated', target)
  assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(target)
  assert int(restored.step) == 3 * STEPS
  last = _trajectory(runs['npz']['uninterrupted'], 'replicated')[3 * STEPS]
  assert core.bitwise_equal({0: core.flat(restored.params)}, {0: last})
