"""Train one example for N steps from given params on fixed batches: the same-numbers runs.

    python trainer.py EXAMPLE STEPS PARAMS.npz OUT.npz WORKDIR

Run with the example's directory as the working directory, legacy sources on the old stack or
migrated ones on the modern stack (the harness patches on the PYTHONPATH). The optimizer, the
train step and its hyper-parameters are the example's own: where the example builds them inside
its ``train_and_evaluate``, that function runs on mock data until the train step is first called
(its optimizer caught at ``jax_utils.replicate``, the step's bound arguments at the call), then
this loop runs the real step. If PARAMS.npz does not exist, the initial params made by the
example's own init are written there (the old stack does this first), else they replace the
optimizer's params (the optimizers' fresh states are zeros, whatever the values). Batches are
numpy draws from a seed per step (seq2seq: the example's own ``get_batch`` with Python's
``random`` seeded per step); dropout is off. OUT.npz holds ``loss`` (one per step) and the final
params as ``params/<path>`` (and pixelcnn's ``ema/<path>``).
"""
import functools
import os
import pathlib
import random
import sys

import numpy as np

sys.path.insert(0, os.getcwd())


class StopHere(Exception):
  pass


def flat(tree, prefix):
  from flax import traverse_util
  from flax.core import unfreeze
  try:
    tree = unfreeze(tree)
  except Exception:  # pylint: disable=broad-except
    pass
  return {prefix + '/'.join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


def unflat(arrays, prefix, like):
  """Rebuild ``like``'s structure from ``arrays`` (``prefix<path>`` keys).

  Raises:
    KeyError: the tree's paths differ from the file's (both lists in the message).
  """
  from flax import traverse_util
  from flax.core import freeze, unfreeze
  import jax.numpy as jnp
  frozen = type(like).__name__ == 'FrozenDict'
  want = traverse_util.flatten_dict(unfreeze(like))
  have = {tuple(k[len(prefix):].split('/')): v for k, v in arrays.items() if k.startswith(prefix)}
  if set(want) != set(have):
    raise KeyError(f'params paths differ: only in the model {sorted(set(want) - set(have))[:5]}, '
                   f'only in the file {sorted(set(have) - set(want))[:5]}')
  tree = traverse_util.unflatten_dict({k: jnp.asarray(have[k], dtype=want[k].dtype) for k in want})
  return freeze(tree) if frozen else tree


def params_of(opt):
  return opt.target if hasattr(opt, 'target') else opt.params


def with_params(opt, params):
  return opt.replace(target=params) if hasattr(opt, 'target') else opt.replace(params=params)


def init_or_load(opt, params_file):
  if not params_file.exists():
    np.savez(params_file, **flat(params_of(opt), 'params/'))
    return opt
  arrays = dict(np.load(params_file))
  return with_params(opt, unflat(arrays, 'params/', params_of(opt)))


def mock(n):
  import tensorflow_datasets as tfds
  return tfds.testing.mock_data(num_examples=n, data_dir=str(pathlib.Path.cwd().parents[1] / '.tfds' / 'metadata'))


def catch_setup(train, call):
  """Run ``call()`` (the example's train_and_evaluate) until its train step is first called.

  Returns (the optimizer it built, the step's bound positional args, bound keyword args).
  """
  seen = {}
  real_replicate = train.jax_utils.replicate
  real_step = train.train_step

  class JaxUtils:
    def __getattr__(self, name):
      return getattr(sys.modules['flax.jax_utils'], name)

    @staticmethod
    def replicate(tree, *a, **k):
      seen.setdefault('replicated', tree)
      return real_replicate(tree, *a, **k)

  def step(*args, **kwargs):
    seen['args'], seen['kwargs'] = args, kwargs
    raise StopHere
  train.jax_utils, train.train_step = JaxUtils(), step
  try:
    call()
  except StopHere:
    pass
  finally:
    train.jax_utils, train.train_step = sys.modules['flax.jax_utils'], real_step
  if 'args' not in seen:
    raise RuntimeError('the example never called its train step')
  return seen['replicated'], seen['args'], seen['kwargs']


def mnist(steps, params_file):
  import jax
  import train
  params = train.get_initial_params(jax.random.PRNGKey(0))
  opt = init_or_load(train.create_optimizer(params, 0.1, 0.9), params_file)
  teacher = np.random.RandomState(1234).normal(size=(28 * 28, 10)).astype(np.float32)
  losses = []
  for s in range(steps):
    rng = np.random.RandomState(s)
    image = rng.uniform(size=(32, 28, 28, 1)).astype(np.float32)
    label = np.argmax(image.reshape(32, -1) @ teacher, axis=1).astype(np.int32)
    opt, metrics = train.train_step(opt, {'image': image, 'label': label})
    losses.append(float(metrics['loss']))
  return losses, flat(params_of(opt), 'params/')


def seq2seq(steps, params_file):
  import jax
  import train
  import train_test
  opt = init_or_load(train_test.create_test_optimizer(), params_file)
  losses = []
  for s in range(steps):
    random.seed(s)
    batch, masks = train.get_batch(128)
    opt, metrics = train.train_step(opt, batch, masks, jax.random.PRNGKey(s))
    losses.append(float(metrics['loss']))
  return losses, flat(params_of(opt), 'params/')


def _pmapped(fn, args, kwargs, **pmap_kw):
  import jax
  return jax.pmap(functools.partial(fn, *args, **kwargs), axis_name='batch', **pmap_kw)


def wmt(steps, params_file, workdir):
  import jax
  from flax import jax_utils
  import train
  from configs import default
  config = default.get_config()
  config.max_corpus_chars, config.vocab_size, config.batch_size = 1000, 64, 8
  config.num_layers, config.qkv_dim, config.emb_dim, config.mlp_dim, config.num_heads = 2, 32, 32, 64, 2
  config.max_target_length = config.max_eval_target_length = config.max_predict_length = 16
  config.dropout_rate = config.attention_dropout_rate = 0.0
  config.save_checkpoints = config.restore_checkpoints = False
  real_step = train.train_step
  with mock(32):
    opt, args, kwargs = catch_setup(train, lambda: train.train_and_evaluate(config, workdir))
  opt = init_or_load(opt, params_file)
  # p_train_step(optimizer, batch, dropout_rng=...) of partial(train_step, config=, learning_rate_fn=, ...)
  p_step = _pmapped(real_step, (), {k: v for k, v in kwargs.items() if k != 'dropout_rng'})
  ropt = jax_utils.replicate(opt)
  losses = []
  for s in range(steps):
    rng = np.random.RandomState(s)
    lengths = rng.randint(4, 16, size=(2, 8))
    pos = np.arange(16)
    inputs = np.where(pos < lengths[0][:, None], rng.randint(1, 64, size=(8, 16)), 0).astype(np.int32)
    targets = np.where(pos < lengths[1][:, None], rng.randint(1, 64, size=(8, 16)), 0).astype(np.int32)
    batch = {'inputs': inputs[None], 'targets': targets[None]}
    # returns (optimizer, metrics, new dropout rng)
    ropt, metrics = p_step(ropt, batch, dropout_rng=jax.random.split(jax.random.PRNGKey(s), 1))[:2]
    m = jax.device_get(metrics)
    losses.append(float(m['loss'][0] / m['denominator'][0]))
  return losses, flat(params_of(jax_utils.unreplicate(ropt)), 'params/')


def pixelcnn(steps, params_file, workdir):
  import jax
  from flax import jax_utils
  import train
  from configs import default
  config = default.get_config()
  config.init_batch_size = config.batch_size = 4
  config.num_epochs, config.n_resnet, config.n_feature, config.n_logistic_mix = 1, 1, 8, 2
  config.dropout_rate = 0.0
  real_step = train.train_step
  with mock(8):
    (opt, ema), args, kwargs = catch_setup(train, lambda: train.train_and_evaluate(config, workdir))
  opt = init_or_load(opt, params_file)
  ema = params_of(opt)
  # p_train_step(optimizer, ema, batch, rng) of partial(train_step, config, learning_rate_fn)
  p_step = _pmapped(real_step, args[:2], {})
  ropt, rema = jax_utils.replicate((opt, ema))
  losses = []
  for s in range(steps):
    rng = np.random.RandomState(s)
    image = rng.randint(0, 256, size=(1, 4, 32, 32, 3)).astype(np.float32) / 127.5 - 1.0
    ropt, rema, metrics = p_step(ropt, rema, {'image': image}, jax.random.split(jax.random.PRNGKey(s), 1))
    losses.append(float(jax.device_get(metrics['loss'])[0]))
  opt, ema = jax_utils.unreplicate((ropt, rema))
  return losses, {**flat(params_of(opt), 'params/'), **flat(ema, 'ema/')}


def main():
  example, steps, params_file, out, workdir = sys.argv[1:6]
  steps, params_file = int(steps), pathlib.Path(params_file)
  fn = globals()[example]
  losses, leaves = fn(steps, params_file, workdir) if example in ('wmt', 'pixelcnn') else fn(steps, params_file)
  np.savez(out, loss=np.asarray(losses, np.float64), **leaves)


if __name__ == '__main__':
  main()
