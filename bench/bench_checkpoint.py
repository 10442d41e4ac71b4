"""``checkpoint_convert_vs_restore``: converting a legacy checkpoint vs plainly restoring it.

A legacy ``Adam`` checkpoint (the shim's ``to_state_dict``, the layout real
flax.optim 0.5.3 writes: ``tests/test_shim_api.py`` / ``test_legacy_stack.py``)
of float32 kernels is written with ``flax.serialization.to_bytes``: >= 500 MB
(8 leaves of 2048x2560, params + 2 moments = 503 MB) for the full run, about
1.5 MB with ``quick``.

Contenders, alternated round by round in one process:

- convert: what ``optim-migrate convert-checkpoint`` does: ``read_state_dict`` +
  ``convert_state_dict`` + ``write_checkpoint`` (msgpack, fsync'd, atomic rename);
- restore_legacy: ``restore_legacy(file, TrainState target)``, in memory;
- reference: ``flax.training.checkpoints.restore_checkpoint(file, target=None)``
  (a plain restore of the same file).

Reported: medians of per-round ratios convert / reference and restore_legacy /
reference; and the peak resident memory (``VmHWM``, MiB)
of a fresh process converting the file, with, in the details, its excess over a
fresh process that only imports the same modules as a multiple of the file
size, beside the same for a plain restore.
"""
from __future__ import annotations

import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
ADAM = 'Adam(learning_rate=1e-3, beta1=0.9, beta2=0.999)'


def _write_checkpoint(path: pathlib.Path, leaves: int, shape: tuple) -> int:
  import numpy as np
  from flax import serialization
  rng = np.random.default_rng(0)
  params = {f'layer_{i}': {'kernel': rng.standard_normal(shape, dtype=np.float32)}
            for i in range(leaves)}
  states = {k: {'kernel': {'grad_ema': rng.standard_normal(shape, dtype=np.float32) * 1e-3,
                           'grad_sq_ema': np.abs(rng.standard_normal(shape, dtype=np.float32)) * 1e-6}}
            for k in params}
  sd = {'target': params, 'state': {'step': np.asarray(1000, np.int32), 'param_states': states}}
  data = serialization.msgpack_serialize(sd)
  path.write_bytes(data)
  return len(data)


_CHILD = '''
import os, sys
sys.path.insert(0, {root!r})
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
from optim_compat import checkpoint as ck
from flax.training import checkpoints
if {mode!r} == 'convert':
  sd, notes = ck.convert_state_dict(ck.read_state_dict({src!r}), {adam!r})
  ck.write_checkpoint(sd, {dst!r}, 'flax', force=True)
elif {mode!r} == 'restore':
  checkpoints.restore_checkpoint({src!r}, target=None)
with open('/proc/self/status') as f:
  print([l.split()[1] for l in f if l.startswith('VmHWM:')][0])
'''


def _peak_rss_mib(mode: str, src: str, dst: str) -> float:
  """Peak resident memory of a fresh process (``VmHWM``, which exec resets; the
  ``ru_maxrss`` of a child keeps the forking parent's peak on Linux)."""
  code = _CHILD.format(root=str(ROOT), mode=mode, src=src, dst=dst, adam=ADAM)
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  if proc.returncode != 0:
    raise RuntimeError(f'{mode} subprocess failed: {proc.stderr[-2000:]}')
  return int(proc.stdout.split()[-1]) / 1024  # kB


def run(quick: bool) -> list[tuple[str, float, str]]:
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  import jax
  import jax.numpy as jnp
  import optax
  from flax.training import checkpoints

  from optim_compat import checkpoint as ck

  leaves, shape = (8, (2048, 2560)) if not quick else (4, (128, 256))
  rounds = 3 if not quick else 5
  with tempfile.TemporaryDirectory() as tmp:
    src = pathlib.Path(tmp) / 'checkpoint_1000'
    dst = pathlib.Path(tmp) / 'converted'
    size = _write_checkpoint(src, leaves, shape)
    params = {f'layer_{i}': {'kernel': jax.ShapeDtypeStruct(shape, jnp.float32)}
              for i in range(leaves)}
    target = ck.abstract_train_state(optax.adam(1e-3), params)

    def convert():
      sd, _ = ck.convert_state_dict(ck.read_state_dict(src), ADAM)
      ck.write_checkpoint(sd, dst, 'flax', force=True)

    def restore_legacy():
      ck.restore_legacy(src, target)

    def reference():
      checkpoints.restore_checkpoint(str(src), target=None)

    contenders = {'convert': convert, 'restore_legacy': restore_legacy, 'reference': reference}
    for fn in contenders.values():  # warm-up: imports, page cache
      fn()
    times = {n: [] for n in contenders}
    names = list(contenders)
    for r in range(rounds):
      for n in names[r % 3:] + names[:r % 3]:
        t0 = time.perf_counter()
        contenders[n]()
        times[n].append(time.perf_counter() - t0)
    conv = [a / b for a, b in zip(times['convert'], times['reference'])]
    rest = [a / b for a, b in zip(times['restore_legacy'], times['reference'])]
    peak_convert = _peak_rss_mib('convert', str(src), str(dst))
    peak_restore = _peak_rss_mib('restore', str(src), str(dst))
    peak_base = _peak_rss_mib('imports', str(src), str(dst))
  mib = size / 2 ** 20
  ref = statistics.median(times['reference'])
  return [
      ('checkpoint_convert_vs_restore', statistics.median(conv),
       f'{size / 1e6:.0f} MB Adam checkpoint; convert (read+convert+fsync write) '
       f'{statistics.median(times["convert"]):.2f}s vs restore_checkpoint {ref:.2f}s; '
       f'ratio min-max {min(conv):.2f}-{max(conv):.2f} over {rounds}'),
      ('checkpoint_restore_legacy_vs_restore', statistics.median(rest),
       f'restore_legacy into a TrainState {statistics.median(times["restore_legacy"]):.2f}s; '
       f'ratio min-max {min(rest):.2f}-{max(rest):.2f} over {rounds}'),
      ('checkpoint_convert_peak_rss_mib', peak_convert,
       f'fresh process converting the {mib:.0f} MiB file; above its imports alone '
       f'({peak_base:.0f} MiB): convert {peak_convert - peak_base:.0f} MiB = '
       f'{(peak_convert - peak_base) / mib:.2f}x the file, plain restore_checkpoint '
       f'{peak_restore - peak_base:.0f} MiB = {(peak_restore - peak_base) / mib:.2f}x'),
  ]


if __name__ == '__main__':
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
