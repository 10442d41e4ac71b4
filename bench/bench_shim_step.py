"""``shim_vs_optax_step``: the shim's jitted train step vs the hand-written Optax one.

For each model (an MLP of about 1.07M float32 parameters, a small CNN with
BatchNorm) and optimizer (Adam, Momentum, a MultiOptimizer of Adam on kernels
and Momentum on biases), three jitted train steps (forward, backward, update)
are compiled and timed, interleaved round by round in this one process:

- ``shim``: legacy code through the shim, ``optimizer.apply_gradient(grads)``;
- ``stock``: ``TrainState.apply_gradients`` with the Optax chain the codemod
  emits for that def (``spec.SPECS[name].emit``; for the MultiOptimizer,
  ``optax.multi_transform`` over the two emitted chains with path labels);
- ``same``: ``TrainState.apply_gradients`` with ``optim_compat.to_optax(def)``,
  the very transformation the shim runs (isolates the wrapper's cost).

Reported value: median over rounds of ``shim seconds / stock seconds`` (1.0 =
same speed, below 1 = shim faster). Details: min–max, the ratio vs ``same``,
compile-time ratio (``jit(f).lower(...).compile()`` seconds, shim / stock, with
fresh functions every repetition), and the instruction counts of the compiled
HLO (``Compiled.as_text()``) of all three.
"""
from __future__ import annotations

import statistics
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import flax
import optax
from flax import linen as nn
from flax import traverse_util
from flax.training import train_state

import optim_compat
from optim_compat import emitted
from optim_compat import spec as spec_lib

from common import fmt_range, hlo_entry_op_count, hlo_op_count, interleave, ratios, summary


class MLP(nn.Module):
  hidden: tuple = (1024, 256)
  classes: int = 10

  @nn.compact
  def __call__(self, x, train=True):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.classes)(x)


class CNN(nn.Module):
  features: tuple = (16, 32)
  classes: int = 10

  @nn.compact
  def __call__(self, x, train=True):
    for i, f in enumerate(self.features):
      x = nn.Conv(f, (3, 3), strides=(1, 1) if i == 0 else (2, 2))(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
      x = nn.relu(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.classes)(x)


ADAM_KW = {'learning_rate': 1e-3, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-8}
MOMENTUM_KW = {'learning_rate': 0.05, 'beta': 0.9, 'nesterov': True}


def _stock_tx(name: str, kwargs: dict) -> optax.GradientTransformation:
  """The Optax chain the codemod writes for ``name(**kwargs)``."""
  src = spec_lib.SPECS[name].emit({k: repr(v) for k, v in kwargs.items()})
  return emitted.tx_from_source(src)


def _is_bias(path) -> bool:
  return 'bias' in path


def legacy_defs(lib) -> dict:
  """``{opt_name: def}`` built from ``lib`` (``optim_compat`` or the real ``flax.optim``)."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    return {
        'adam': lib.Adam(**ADAM_KW),
        'momentum': lib.Momentum(**MOMENTUM_KW),
        'multi': lib.MultiOptimizer(
            (traverse_util.ModelParamTraversal(lambda path, _: not _is_bias(path)),
             lib.Adam(**ADAM_KW)),
            (traverse_util.ModelParamTraversal(lambda path, _: _is_bias(path)),
             lib.Momentum(**MOMENTUM_KW)))}


def optimizers(params, lib=optim_compat):
  """``{opt_name: (legacy def from lib, stock Optax tx the codemod emits)}``."""
  defs = legacy_defs(lib)
  labels = traverse_util.unflatten_dict({
      k: ('momentum' if _is_bias('/'.join(k)) else 'adam')
      for k in traverse_util.flatten_dict(flax.core.unfreeze(params))})
  if isinstance(params, flax.core.FrozenDict):  # flax 0.5.3 params; labels must match
    labels = flax.core.freeze(labels)
  multi_tx = optax.multi_transform(
      {'adam': _stock_tx('Adam', ADAM_KW), 'momentum': _stock_tx('Momentum', MOMENTUM_KW)},
      labels)
  return {'adam': (defs['adam'], _stock_tx('Adam', ADAM_KW)),
          'momentum': (defs['momentum'], _stock_tx('Momentum', MOMENTUM_KW)),
          'multi': (defs['multi'], multi_tx)}


def _loss_fn(model, has_bn):
  def loss(params, batch_stats, x, y):
    if has_bn:
      logits, new_vars = model.apply({'params': params, 'batch_stats': batch_stats}, x,
                                     train=True, mutable=['batch_stats'])
      new_bs = new_vars['batch_stats']
    else:
      logits, new_bs = model.apply({'params': params}, x), batch_stats
    onehot = jax.nn.one_hot(y, logits.shape[-1])
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), -1)), new_bs
  return loss


def make_shim_step(model, has_bn):
  """A fresh ``(optimizer, batch_stats, x, y) -> (optimizer, batch_stats, loss)``."""
  loss = _loss_fn(model, has_bn)

  def step(optimizer, batch_stats, x, y):
    (l, new_bs), grads = jax.value_and_grad(loss, has_aux=True)(
        optimizer.target, batch_stats, x, y)
    return optimizer.apply_gradient(grads), new_bs, l
  return step


def make_train_state_step(model, has_bn):
  """A fresh ``(state, batch_stats, x, y) -> (state, batch_stats, loss)``."""
  loss = _loss_fn(model, has_bn)

  def step(state, batch_stats, x, y):
    (l, new_bs), grads = jax.value_and_grad(loss, has_aux=True)(
        state.params, batch_stats, x, y)
    return state.apply_gradients(grads=grads), new_bs, l
  return step


def _compile(make, args):
  t0 = time.perf_counter()
  compiled = jax.jit(make()).lower(*args).compile()
  return compiled, time.perf_counter() - t0


def _block(tree):
  for leaf in jax.tree_util.tree_leaves(tree):
    leaf.block_until_ready()


def bench_contenders(contenders, batch_stats, x, y, rounds, steps, compile_reps):
  """Compile and time train steps, interleaved.

  Args:
    contenders: ``{name: (initial optimizer or TrainState, make_step)}`` where
      ``make_step()`` returns a fresh step function.

  Returns:
    ``{'times': {name: [s per round]}, 'compile': {name: [s]}, 'ops': {name: int}}``;
    round times cover ``steps`` consecutive steps.
  """
  compile_s = {k: [] for k in contenders}
  compiled = {}
  for rep in range(compile_reps):
    for k in (list(contenders) if rep % 2 == 0 else list(contenders)[::-1]):
      state, make = contenders[k]
      compiled[k], s = _compile(make, (state, batch_stats, x, y))
      compile_s[k].append(s)
  texts = {k: c.as_text() for k, c in compiled.items()}
  ops = {k: f'{hlo_op_count(t)} ({hlo_entry_op_count(t)} in ENTRY)' for k, t in texts.items()}
  carry = {k: (contenders[k][0], batch_stats) for k in contenders}

  def runner(k):
    def go():
      st, bs = carry[k]
      for _ in range(steps):
        st, bs, l = compiled[k](st, bs, x, y)
      _block((st, bs, l))
      carry[k] = (st, bs)
    return go

  for k in contenders:  # warm-up
    runner(k)()
  times = interleave({k: runner(k) for k in contenders}, rounds)
  return {'times': times, 'compile': compile_s, 'ops': ops}


def init_model(model, x):
  """``(params, batch_stats, n_params)``."""
  variables = model.init(jax.random.PRNGKey(0), x)
  params = variables['params']
  n_params = sum(int(np.size(p)) for p in jax.tree_util.tree_leaves(params))
  return params, variables.get('batch_stats', {}), n_params


def bench_config(model, has_bn, x, y, opt_name, rounds, steps, compile_reps):
  params, batch_stats, n_params = init_model(model, x)
  opt_def, stock_tx = optimizers(params)[opt_name]
  contenders = {
      'shim': (opt_def.create(params), lambda: make_shim_step(model, has_bn)),
      'stock': (train_state.TrainState.create(apply_fn=None, params=params, tx=stock_tx),
                lambda: make_train_state_step(model, has_bn)),
      'same': (train_state.TrainState.create(apply_fn=None, params=params,
                                             tx=optim_compat.to_optax(opt_def)),
               lambda: make_train_state_step(model, has_bn)),
  }
  r = bench_contenders(contenders, batch_stats, x, y, rounds, steps, compile_reps)
  times = r['times']
  return {'vs_stock': ratios(times['shim'], times['stock']),
          'vs_same': ratios(times['shim'], times['same']),
          'compile': ratios(r['compile']['shim'], r['compile']['stock']),
          'ops': r['ops'], 'n_params': n_params,
          'shim_ms': statistics.median(times['shim']) / steps * 1e3,
          'stock_ms': statistics.median(times['stock']) / steps * 1e3}


def sizes(quick: bool):
  """``(models, configs, rounds, steps, compile_reps)`` for full or quick runs."""
  if quick:
    models = {'mlp': (MLP(hidden=(64, 32)), False, (16, 8, 8, 1)),
              'cnn': (CNN(features=(4, 8)), True, (8, 8, 8, 1))}
    configs = [('mlp', 'multi')]  # Adam + Momentum groups
    return models, configs, 3, 2, 1
  models = {'mlp': (MLP(), False, (128, 28, 28, 1)),
            'cnn': (CNN(), True, (64, 28, 28, 1))}
  configs = [(m, o) for m in ('mlp', 'cnn') for o in ('adam', 'momentum', 'multi')]
  return models, configs, 60, 5, 3


def data(shape, rng):
  x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
  y = jnp.asarray(rng.integers(0, 10, size=shape[0]).astype(np.int32))
  return x, y


def run(quick: bool) -> list[tuple[str, float, str]]:
  rng = np.random.default_rng(0)
  models, configs, rounds, steps, compile_reps = sizes(quick)
  out = []
  all_compile = []
  for model_name, opt_name in configs:
    model, has_bn, shape = models[model_name]
    x, y = data(shape, rng)
    r = bench_config(model, has_bn, x, y, opt_name, rounds, steps, compile_reps)
    med = summary(r['vs_stock'])[0]
    all_compile.extend(r['compile'])
    ops = r['ops']
    out.append((
        f'shim_vs_optax_step[{model_name}/{opt_name}]', med,
        f'shim / TrainState+emitted Optax chain, step time; {fmt_range(r["vs_stock"])} rounds of '
        f'{steps} steps; vs TrainState+to_optax(def) {summary(r["vs_same"])[0]:.3f} '
        f'({fmt_range(r["vs_same"])}); HLO ops shim {ops["shim"]} / stock {ops["stock"]} / '
        f'to_optax {ops["same"]}; compile ratio {summary(r["compile"])[0]:.3f}; '
        f'{r["n_params"]} params, batch {shape[0]}; '
        f'{r["shim_ms"]:.2f} ms vs {r["stock_ms"]:.2f} ms per step'))
  out.append(('shim_vs_optax_compile', summary(all_compile)[0],
              f'lower+compile seconds, shim / TrainState+emitted Optax chain, all configs; '
              f'{fmt_range(all_compile)}'))
  if quick:
    out = [(n, v, d + '; --quick: tiny MLP + MultiOptimizer only') for n, v, d in out]
  return out


if __name__ == '__main__':
  import sys
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
