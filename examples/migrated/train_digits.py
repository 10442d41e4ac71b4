"""Legacy Flax example: train an MLP on sklearn digits with flax.optim + pmap."""
import argparse
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import jax_utils
from sklearn.datasets import load_digits
import optax
from flax.training import train_state

BASE_LR = 0.1
TOTAL_STEPS = 200  # overwritten by --steps in main()
GLOBAL_BATCH = 64
NUM_TRAIN = 1440


class MLP(nn.Module):
  """Dense -> BatchNorm -> relu -> Dense classifier."""

  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Dense(64)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x)
    return nn.Dense(10)(x)


model = MLP()


def learning_rate_fn(step):
  """Cosine decay from BASE_LR to 0 over TOTAL_STEPS."""
  progress = jnp.minimum(step, TOTAL_STEPS) / TOTAL_STEPS
  return BASE_LR * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))


def load_data():
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  return (x[:NUM_TRAIN], y[:NUM_TRAIN]), (x[NUM_TRAIN:], y[NUM_TRAIN:])


def cross_entropy(logits, labels):
  one_hot = jax.nn.one_hot(labels, 10)
  return -jnp.mean(jnp.sum(one_hot * jax.nn.log_softmax(logits), axis=-1))


@functools.partial(jax.pmap, axis_name='batch')
def train_step(optimizer, batch_stats, batch):
  """One data-parallel SGD step."""

  def loss_fn(params):
    logits, new_model_state = model.apply(
        {'params': params, 'batch_stats': batch_stats}, batch['image'],
        train=True, mutable=['batch_stats'])
    return cross_entropy(logits, batch['label']), new_model_state

  (loss, new_model_state), grads = jax.value_and_grad(
      loss_fn, has_aux=True)(optimizer.params)
  grads = jax.lax.pmean(grads, 'batch')
  loss = jax.lax.pmean(loss, 'batch')
  new_batch_stats = jax.lax.pmean(new_model_state['batch_stats'], 'batch')
  lr = learning_rate_fn(optimizer.step)
  new_optimizer = optimizer.replace(opt_state=optax.tree_utils.tree_set(optimizer.opt_state, learning_rate=lr)).apply_gradients(grads=grads)
  return new_optimizer, new_batch_stats, loss


@jax.jit
def eval_step(params, batch_stats, images):
  logits = model.apply({'params': params, 'batch_stats': batch_stats},
                       images, train=False)
  return jnp.argmax(logits, axis=-1)


def train_batches(x, y, n_dev):
  """Yields device-sharded batches forever, reshuffling each epoch."""
  rng = np.random.RandomState(0)
  per_dev = GLOBAL_BATCH // n_dev
  while True:
    perm = rng.permutation(len(x))
    for i in range(len(x) // GLOBAL_BATCH):
      idx = perm[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH]
      yield {'image': x[idx].reshape(n_dev, per_dev, -1),
             'label': y[idx].reshape(n_dev, per_dev)}


def main():
  global TOTAL_STEPS
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--out', type=str, default=None)
  args = parser.parse_args()
  TOTAL_STEPS = args.steps

  n_dev = jax.local_device_count()
  (x_train, y_train), (x_test, y_test) = load_data()

  variables = model.init(jax.random.PRNGKey(0), x_train[:1], train=False)
  params, batch_stats = variables['params'], variables['batch_stats']

  optimizer_def = optax.chain(optax.add_decayed_weights(5e-4), optax.inject_hyperparams(optax.sgd, static_args=('momentum', 'nesterov'))(learning_rate=0.0, momentum=0.9, nesterov=True))
  optimizer = train_state.TrainState.create(apply_fn=None, params=params, tx=optimizer_def)
  optimizer = jax_utils.replicate(optimizer)
  batch_stats = jax_utils.replicate(batch_stats)

  losses = []
  batches = train_batches(x_train, y_train, n_dev)
  for step in range(args.steps):
    optimizer, batch_stats, loss = train_step(
        optimizer, batch_stats, next(batches))
    losses.append(float(loss[0]))
    if (step + 1) % 50 == 0:
      print(f'step {step + 1}: loss {losses[-1]:.4f}', file=sys.stderr)

  params = jax_utils.unreplicate(optimizer).params
  preds = eval_step(params, jax_utils.unreplicate(batch_stats), x_test)
  accuracy = float(np.mean(np.asarray(preds) == y_test))
  final_step = int(jax_utils.unreplicate(optimizer).step)
  print(f'devices={n_dev} final_step={final_step} final_loss={losses[-1]:.4f} '
        f'test_accuracy={accuracy:.4f}', file=sys.stderr)

  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'losses': losses, 'test_accuracy': accuracy,
                 'final_step': final_step, 'devices': n_dev}, f)


if __name__ == '__main__':
  main()
