"""``faithful_vs_optax_step``: the emitted faithful transformations vs stock Optax.

Where stock Optax differs intrinsically from legacy ``flax.optim``, the codemod
emits ``optim_compat.transforms.<name>(...)`` (LAMB, Adagrad, LARS with weight
decay, Adafactor). This module times that transformation against the stock
Optax one with the closest arguments (``spec.STOCK_ALTERNATIVES``, what
``--prefer-stock-optax`` emits: ``optax.lamb``, ``optax.adagrad(
initial_accumulator_value=0, eps=eps**2)``, ``optax.lars``, ``optax.adafactor``).

The step is ``u, s = tx.update(g, s, p); p = optax.apply_updates(p, u)``,
jitted, on a tree of about 0.98M float32 parameters shaped like a real model:
an MLP's kernels and biases (512-1024-256-10), a conv net's 3x3 kernels and
biases, a BatchNorm scale and bias, and a 3-D (1-D conv) kernel. With the
default ``min_dim_size_to_factor=128`` Adafactor factors the MLP's two large
kernels and the 3-D kernel and keeps a full second moment for the rest.
The gradients are fixed random arrays (the state and params evolve from step
to step, as in training).

Contenders run interleaved, round by round, in this one process (each round
is ``steps`` consecutive steps, the order alternating). Reported value: median
over rounds of ``faithful seconds / stock seconds`` (wall clock; below 1 = the
faithful one is faster). Details: min–max, the same ratio of process CPU time
(less sensitive to other processes on a shared machine), ms per step, the HLO
of both compiled steps (``Compiled.as_text()`` instructions, ENTRY
instructions, XLA's ``cost_analysis`` bytes accessed and flops: passes over
the leaves show there; and whether any f64 appears), the compile-time ratio
(``jit(step).lower(...).compile()``, fresh functions each repetition), and the
load average before and after the case.
"""
from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optim_compat import emitted
from optim_compat import spec as spec_lib

from common import fmt_range, hlo_entry_op_count, hlo_op_count, ratios, summary

#: ``path -> shape``: an MLP, a conv net with BatchNorm, a 1-D conv (a 3-D kernel).
FULL_SHAPES = {
    'mlp/Dense_0/kernel': (512, 1024), 'mlp/Dense_0/bias': (1024,),
    'mlp/Dense_1/kernel': (1024, 256), 'mlp/Dense_1/bias': (256,),
    'mlp/Dense_2/kernel': (256, 10), 'mlp/Dense_2/bias': (10,),
    'cnn/Conv_0/kernel': (3, 3, 3, 32), 'cnn/Conv_0/bias': (32,),
    'cnn/Conv_1/kernel': (3, 3, 32, 64), 'cnn/Conv_1/bias': (64,),
    'cnn/Conv_2/kernel': (3, 3, 64, 128), 'cnn/Conv_2/bias': (128,),
    'cnn/BatchNorm_0/scale': (128,), 'cnn/BatchNorm_0/bias': (128,),
    'cnn/Conv1d_0/kernel': (3, 128, 256), 'cnn/Conv1d_0/bias': (256,),
}
QUICK_SHAPES = {
    'mlp/Dense_0/kernel': (32, 64), 'mlp/Dense_0/bias': (64,),
    'cnn/Conv_0/kernel': (3, 3, 4, 8), 'cnn/BatchNorm_0/scale': (8,),
    'cnn/Conv1d_0/kernel': (3, 16, 32),
}

#: ``case -> (legacy def name, legacy arguments as source text)``; LARS with weight decay
#: (without it the codemod emits ``optax.lars``); Adafactor with and without momentum.
CASES = {
    'lamb': ('LAMB', {'learning_rate': '1e-3', 'weight_decay': '1e-2'}),
    'adagrad': ('Adagrad', {'learning_rate': '0.1'}),
    'lars': ('LARS', {'learning_rate': '0.1', 'weight_decay': '1e-3'}),
    'adafactor': ('Adafactor', {'learning_rate': '1e-2'}),
    'adafactor_momentum': ('Adafactor', {'learning_rate': '1e-2', 'beta1': '0.9'}),
}


def make_tree(shapes: dict, rng: np.random.Generator, grads: bool = False) -> dict:
  """Nested dict of float32 arrays (made with numpy: the same bits on any jax).

  Params: kernels ``normal / sqrt(fan_in)``, biases 0, scales 1; gradients:
  ``normal * 1e-2`` everywhere.
  """
  out = {}
  for path, shape in shapes.items():
    *prefix, leaf = path.split('/')
    if grads:
      value = rng.normal(size=shape) * 1e-2
    elif leaf == 'kernel':
      value = rng.normal(size=shape) / np.sqrt(np.prod(shape[:-1]))
    else:
      value = np.full(shape, 1.0 if leaf == 'scale' else 0.0)
    node = out
    for key in prefix:
      node = node.setdefault(key, {})
    node[leaf] = jnp.asarray(value.astype(np.float32))
  return out


def sources(case: str, extra: dict | None = None) -> tuple[str, str]:
  """``(faithful source, stock source)`` as the codemod emits them for ``case``."""
  name, args = CASES[case]
  args = {**args, **(extra or {})} if name == 'Adafactor' else args
  entry = spec_lib.SPECS[name]
  faithful = entry.emit(args)
  if not faithful.startswith('optim_compat.transforms.'):
    raise AssertionError(f'{case}: the codemod no longer emits the faithful one: {faithful}')
  return faithful, spec_lib.STOCK_ALTERNATIVES[name].emit(entry, args)


def make_step(tx: optax.GradientTransformation):
  """A fresh ``(params, state, grads) -> (params, state)``."""
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return step


def hlo_facts(compiled) -> dict:
  """Instruction counts, XLA cost analysis and f64 use of a compiled step."""
  text = compiled.as_text()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
    cost = cost[0] if cost else {}
  cost = cost or {}
  return {'ops': hlo_op_count(text), 'entry': hlo_entry_op_count(text),
          'bytes': float(cost.get('bytes accessed', float('nan'))),
          'flops': float(cost.get('flops', float('nan'))),
          'f64': 'f64[' in text}


def _loadavg() -> str:
  try:
    return '/'.join(f'{x:.1f}' for x in os.getloadavg())
  except OSError:
    return 'n/a'


def bench_case(case: str, params, grads, rounds: int, steps: int, compile_reps: int,
               extra: dict | None = None) -> dict:
  """Compile and time the faithful and the stock step of ``case``, interleaved."""
  load_before = _loadavg()
  srcs = dict(zip(('faithful', 'stock'), sources(case, extra)))
  txs = {k: emitted.tx_from_source(s) for k, s in srcs.items()}
  states = {k: tx.init(params) for k, tx in txs.items()}
  compile_s = {k: [] for k in txs}
  compiled = {}
  for rep in range(compile_reps):
    for k in (('faithful', 'stock') if rep % 2 == 0 else ('stock', 'faithful')):
      t0 = time.perf_counter()
      compiled[k] = jax.jit(make_step(txs[k])).lower(params, states[k], grads).compile()
      compile_s[k].append(time.perf_counter() - t0)
  facts = {k: hlo_facts(c) for k, c in compiled.items()}
  carry = {k: (params, states[k]) for k in txs}

  def go(k):
    p, s = carry[k]
    for _ in range(steps):
      p, s = compiled[k](p, s, grads)
    jax.block_until_ready((p, s))
    carry[k] = (p, s)

  for k in txs:  # warm-up
    go(k)
  wall = {k: [] for k in txs}
  cpu = {k: [] for k in txs}
  for r in range(rounds):
    for k in (('faithful', 'stock') if r % 2 == 0 else ('stock', 'faithful')):
      c0, t0 = time.process_time(), time.perf_counter()
      go(k)
      wall[k].append(time.perf_counter() - t0)
      cpu[k].append(time.process_time() - c0)
  for k, (p, _) in carry.items():
    if not all(bool(jnp.isfinite(x).all()) for x in jax.tree_util.tree_leaves(p)):
      raise AssertionError(f'{case}/{k}: non-finite params after the timed steps')
  return {'wall': ratios(wall['faithful'], wall['stock']),
          'cpu': ratios(cpu['faithful'], cpu['stock']),
          'compile': ratios(compile_s['faithful'], compile_s['stock']),
          'ms': {k: statistics.median(v) / steps * 1e3 for k, v in wall.items()},
          'facts': facts, 'sources': srcs, 'load': (load_before, _loadavg())}


def sizes(quick: bool):
  """``(shapes, cases, rounds, steps, compile_reps, adafactor extra args)``."""
  if quick:  # factor the small leaves too, so the factored branch runs
    return QUICK_SHAPES, ('lamb', 'adafactor_momentum'), 3, 2, 1, {'min_dim_size_to_factor': '16'}
  return FULL_SHAPES, tuple(CASES), 200, 5, 3, {}


def _fmt_facts(facts: dict) -> str:
  f, s = facts['faithful'], facts['stock']
  f64 = [k for k in ('faithful', 'stock') if facts[k]['f64']]
  return (f'HLO ops faithful {f["ops"]} ({f["entry"]} in ENTRY) / stock {s["ops"]} '
          f'({s["entry"]} in ENTRY); bytes accessed {f["bytes"] / 1e6:.1f} MB / '
          f'{s["bytes"] / 1e6:.1f} MB (ratio {f["bytes"] / s["bytes"]:.3f}); flops '
          f'{f["flops"] / 1e6:.2f} M / {s["flops"] / 1e6:.2f} M; f64: '
          f'{", ".join(f64) if f64 else "none"}')


def run(quick: bool) -> list[tuple[str, float, str]]:
  shapes, cases, rounds, steps, compile_reps, extra = sizes(quick)
  rng = np.random.default_rng(0)
  params = make_tree(shapes, rng)
  grads = make_tree(shapes, rng, grads=True)
  n_params = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))
  out, all_compile = [], []
  for case in cases:
    r = bench_case(case, params, grads, rounds, steps, compile_reps, extra)
    all_compile.extend(r['compile'])
    out.append((
        f'faithful_vs_optax_step[{case}]', summary(r['wall'])[0],
        f'{r["sources"]["faithful"].split("(")[0]} / {r["sources"]["stock"].split("(")[0]}, '
        f'jitted tx.update + apply_updates, wall time; {fmt_range(r["wall"])} rounds of '
        f'{steps} steps; CPU-time ratio {summary(r["cpu"])[0]:.3f} ({fmt_range(r["cpu"])}); '
        f'{r["ms"]["faithful"]:.2f} ms vs {r["ms"]["stock"]:.2f} ms per step; '
        f'{_fmt_facts(r["facts"])}; compile ratio {summary(r["compile"])[0]:.3f}; '
        f'{n_params} float32 params in {len(shapes)} leaves; load {r["load"][0]} before, '
        f'{r["load"][1]} after; stock: {r["sources"]["stock"]}'))
  out.append(('faithful_vs_optax_compile', summary(all_compile)[0],
              f'lower+compile seconds, faithful / stock, all cases; {fmt_range(all_compile)}'))
  if quick:
    out = [(n, v, d + '; --quick: tiny tree, LAMB and Adafactor with momentum only')
           for n, v, d in out]
  return out


if __name__ == '__main__':
  import sys
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
