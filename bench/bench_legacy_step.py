"""``shim_vs_legacy_step``: the shim vs the real ``flax.optim`` 0.5.3, in the old stack.

One subprocess in the old-stack interpreter (``equivalence_tests.legacy_env``:
jax 0.4.13, flax 0.5.3, optax 0.1.5) compiles and times, interleaved round by
round, the same jitted train steps as ``bench_shim_step`` (same models, sizes
and optimizers) with three contenders:

- ``shim``: ``optim_compat`` defs, ``optimizer.apply_gradient(grads)``;
- ``real``: the real ``flax.optim`` defs, same code;
- ``stock``: ``TrainState.apply_gradients`` with the Optax chain the codemod
  emits (optax 0.1.5).

Reported value: median over rounds of ``shim seconds / real seconds``. Details:
min–max, ``real / stock`` and ``shim / stock`` medians, compile-time ratio
shim / real, and the HLO instruction counts.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


def worker(quick: bool) -> dict:
  """Runs in the old stack: ``{'model/opt': {...ratios, ops...}, '_versions': ...}``."""
  import jax
  import numpy as np
  from flax import optim as real
  from flax.training import train_state

  import bench_shim_step as b
  from common import ratios

  models, configs, rounds, steps, compile_reps = b.sizes(quick)
  rng = np.random.default_rng(0)
  out = {}
  for model_name, opt_name in configs:
    model, has_bn, shape = models[model_name]
    x, y = b.data(shape, rng)
    params, batch_stats, n_params = b.init_model(model, x)
    shim_def, stock_tx = b.optimizers(params)[opt_name]
    real_def = b.legacy_defs(real)[opt_name]
    contenders = {
        'shim': (shim_def.create(params), lambda: b.make_shim_step(model, has_bn)),
        'real': (real_def.create(params), lambda: b.make_shim_step(model, has_bn)),
        'stock': (train_state.TrainState.create(apply_fn=None, params=params, tx=stock_tx),
                  lambda: b.make_train_state_step(model, has_bn)),
    }
    r = b.bench_contenders(contenders, batch_stats, x, y, rounds, steps, compile_reps)
    t = r['times']
    out[f'{model_name}/{opt_name}'] = {
        'shim_vs_real': ratios(t['shim'], t['real']),
        'real_vs_stock': ratios(t['real'], t['stock']),
        'shim_vs_stock': ratios(t['shim'], t['stock']),
        'compile': ratios(r['compile']['shim'], r['compile']['real']),
        'ops': r['ops'], 'n_params': n_params, 'batch': shape[0], 'steps': steps,
        'real_ms': statistics.median(t['real']) / steps * 1e3}
  import flax
  import optax
  out['_versions'] = f'jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__}'
  return out


def run(quick: bool) -> list[tuple[str, float, str]]:
  from equivalence_tests import legacy_env
  from common import fmt_range, summary
  python = legacy_env.ensure()
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([str(ROOT), str(BENCH_DIR)]))
  cmd = [str(python), '-W', 'ignore', str(pathlib.Path(__file__).resolve()), '--worker']
  if quick:
    cmd.append('--quick')
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT),
                        timeout=1800)
  if proc.returncode != 0:
    raise RuntimeError(f'old-stack worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
  res = json.loads(proc.stdout.strip().splitlines()[-1])
  versions = res.pop('_versions')
  out = []
  for config, r in res.items():
    ops = r['ops']
    out.append((
        f'shim_vs_legacy_step[{config}]', summary(r['shim_vs_real'])[0],
        f'shim / real flax.optim step time in the old stack ({versions}); '
        f'{fmt_range(r["shim_vs_real"])} rounds of {r["steps"]} steps; real / TrainState+emitted '
        f'Optax {summary(r["real_vs_stock"])[0]:.3f} ({fmt_range(r["real_vs_stock"])}); shim / '
        f'TrainState+emitted Optax {summary(r["shim_vs_stock"])[0]:.3f}; HLO ops shim '
        f'{ops["shim"]} / real {ops["real"]} / stock {ops["stock"]}; compile ratio shim/real '
        f'{summary(r["compile"])[0]:.3f}; {r["n_params"]} params, batch {r["batch"]}; real '
        f'{r["real_ms"]:.2f} ms per step' + ('; --quick: tiny MLP + MultiOptimizer only' if quick else '')))
  return out


if __name__ == '__main__':
  if '--worker' in sys.argv:
    print(json.dumps(worker('--quick' in sys.argv)))
  else:
    for name, value, details in run('--quick' in sys.argv):
      print(f'{name}: {value:.4g} ({details})')
