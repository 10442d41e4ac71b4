"""Per-parameter update rules of the legacy optimizers, as legacy flax.optim 0.5.3 computes them.

Each rule is ``param_update(opt_def, step, hp, param, state, grad) -> (update, new_state)``:
``step`` is the legacy pre-increment int32 step, ``hp`` the per-call
hyper-parameters, ``state`` the legacy per-parameter state (legacy field
names), and ``update`` is what ``optax.apply_updates`` adds to ``param``.

Where the legacy rule is ``p_new = p - X`` the update is ``-X``, so
``p + update`` reproduces ``p_new`` bit for bit. Where it subtracts twice
(decoupled weight decay), the update is ``p_new - p``, which can differ from
``p_new`` by one rounding where an element crosses zero.

Sources: the equations in ``shared/legacy-flax-optim.md`` §2, checked by the golden
trajectories of real flax.optim 0.5.3 (``equivalence_tests/golden``).
"""
from __future__ import annotations

import importlib

import numpy as np


class _Deferred:
  """A module imported at its first attribute use, which then takes this placeholder's
  global name: the migration table (``spec``) names these rules, and the codemod reads
  the table without paying for a jax import it never uses."""

  def __init__(self, module: str, name: str):
    self._module, self._name = module, name

  def __getattr__(self, attr):
    module = importlib.import_module(self._module)
    globals()[self._name] = module
    return getattr(module, attr)


jnp = _Deferred('jax.numpy', 'jnp')
lax = _Deferred('jax.lax', 'lax')


def require_learning_rate(hp):
  """``hp.learning_rate``.

  Raises:
    ValueError: it is ``None`` (legacy asserts 'no learning rate provided').
  """
  if hp.learning_rate is None:
    raise ValueError('no learning rate provided: pass learning_rate= to the '
                     'optimizer def or to apply_gradient().')
  return hp.learning_rate


def _is_zero(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def _decoupled(param, step_term, lr, weight_decay):
  """Update for ``p - step_term - lr*wd*p`` (legacy Adam-family decay)."""
  if _is_zero(weight_decay):
    return -step_term
  new_param = param - step_term
  new_param = new_param - lr * weight_decay * param
  return new_param - param


def _bias_corrected(step, dtype, beta1, beta2, m, v):
  t = jnp.array(step + 1, lax.dtype(dtype))
  return m / (1 - beta1 ** t), v / (1 - beta2 ** t)


# -- GradientDescent: p - lr*g --------------------------------------------------
def sgd(opt_def, step, hp, param, state, grad):
  return -(require_learning_rate(hp) * grad), state


# -- Adam: decay decoupled but lr-scaled; t in the parameter's dtype ---------------
def adam(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  m = hp.beta1 * state.grad_ema + (1. - hp.beta1) * grad
  v = hp.beta2 * state.grad_sq_ema + (1. - hp.beta2) * lax.square(grad)
  m_hat, v_hat = _bias_corrected(step, param.dtype, hp.beta1, hp.beta2, m, v)
  step_term = lr * m_hat / (jnp.sqrt(v_hat) + hp.eps)
  return _decoupled(param, step_term, lr, hp.weight_decay), state.replace(grad_ema=m, grad_sq_ema=v)


# -- AdaBelief: s tracks (g - m_new)^2 + eps; eps again outside the sqrt ----------
def adabelief(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  m = hp.beta1 * state.grad_ema + (1. - hp.beta1) * grad
  s = hp.beta2 * state.grad_sq_ema + (1. - hp.beta2) * lax.square(grad - m) + hp.eps
  m_hat, s_hat = _bias_corrected(step, param.dtype, hp.beta1, hp.beta2, m, s)
  step_term = lr * m_hat / (jnp.sqrt(s_hat) + hp.eps)
  return _decoupled(param, step_term, lr, hp.weight_decay), state.replace(grad_ema=m, grad_sq_ema=s)


# -- Adadelta: delta from the *old* accumulator; decay lr-scaled, after the step --
def adadelta(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  rho, eps = hp.rho, hp.eps
  sq_avg = rho * state.sq_avg + jnp.square(grad) * (1 - rho)
  delta = (jnp.sqrt(state.acc_delta + eps) / jnp.sqrt(sq_avg + eps)) * grad
  acc_delta = rho * state.acc_delta + jnp.square(delta) * (1 - rho)
  return (_decoupled(param, lr * delta, lr, hp.weight_decay),
          state.replace(sq_avg=sq_avg, acc_delta=acc_delta))


# -- Adagrad: G starts at 0; eps outside the sqrt ------------------------------------
def adagrad(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  G = state.G + jnp.square(grad)
  return -(lr * grad / (jnp.sqrt(G) + hp.eps)), state.replace(G=G)


# -- RMSProp: eps outside the sqrt; `mg` only when centered (fixed at construction) -
def rmsprop_init(cls):
  def init(opt_def, param):
    mg = jnp.zeros_like(param) if opt_def.hyper_params.centered else None
    return cls(v=jnp.zeros_like(param), mg=mg)
  return init


def rmsprop(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  v = hp.beta2 * state.v + (1.0 - hp.beta2) * jnp.square(grad)
  if hp.centered:
    if state.mg is None:  # legacy failed here with a TypeError on None
      raise ValueError('RMSProp: centered=True needs a def created with centered=True '
                       '(the state has no mg); it cannot be switched on per call')
    mg = hp.beta2 * state.mg + (1.0 - hp.beta2) * grad
    var = v - jnp.square(mg)
  else:
    mg, var = state.mg, v
  return -(lr * grad / (jnp.sqrt(var) + hp.eps)), state.replace(v=v, mg=mg)


# -- LAMB: trust ratio ||p||/||u|| is 0 for a zero leaf (it never moves) ------------
def lamb(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  m = hp.beta1 * state.grad_ema + (1. - hp.beta1) * grad
  v = hp.beta2 * state.grad_sq_ema + (1. - hp.beta2) * lax.square(grad)
  t = jnp.array(step + 1, lax.dtype(param.dtype))
  m_hat = m / (1. - hp.beta1 ** t)
  v_hat = v / (1. - hp.beta2 ** t)
  u = m_hat / (jnp.sqrt(v_hat) + hp.eps)
  if hp.weight_decay != 0.0:  # Python branch, as legacy: a traced value raises
    u += hp.weight_decay * param
  p_norm = jnp.linalg.norm(param)
  u_norm = jnp.linalg.norm(u)
  ratio = jnp.where(p_norm + u_norm > 0., p_norm / u_norm, 1.)
  return -(ratio * lr * u), state.replace(grad_ema=m, grad_sq_ema=v)


# -- LARS: ratio tc*||p|| / (||g|| + wd*||p|| + eps) on the raw g; L2 after it ------
def lars(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  p_norm = jnp.linalg.norm(param)
  g_norm = jnp.linalg.norm(grad)
  ratio = hp.trust_coefficient * p_norm / (g_norm + hp.weight_decay * p_norm + hp.eps)
  ratio = jnp.where(jnp.logical_or(g_norm == 0., p_norm == 0.), 1., ratio)
  scaled_lr = lr * ratio
  if hp.weight_decay != 0:
    grad += hp.weight_decay * param
  scaled_grad = scaled_lr * grad
  momentum = hp.beta * state.momentum + scaled_grad
  d = scaled_grad + hp.beta * momentum if hp.nesterov else momentum
  return -d, state.replace(momentum=momentum)


# -- Adafactor: factored second moments for leaves with two dims >= min_dim ---------
def _factored_dims(hp, shape):
  if not hp.factored or len(shape) < 2:
    return None
  order = np.argsort(shape)
  if shape[order[-2]] < hp.min_dim_size_to_factor:
    return None
  return int(order[-2]), int(order[-1])


def adafactor_init(cls):
  def init(opt_def, param):
    fields = {k: jnp.zeros((1,)) for k in ('v_row', 'v_col', 'v', 'm')}
    dims = _factored_dims(opt_def.hyper_params, param.shape)
    if dims is not None:
      d1, d0 = dims
      fields['v_row'] = jnp.zeros(np.delete(param.shape, d0), jnp.float32)
      fields['v_col'] = jnp.zeros(np.delete(param.shape, d1), jnp.float32)
    else:
      fields['v'] = jnp.zeros(param.shape, jnp.float32)
    if opt_def.hyper_params.beta1 is not None:
      fields['m'] = jnp.zeros(param.shape, opt_def.dtype_momentum)
    return cls(**fields)
  return init


def adafactor(opt_def, step, hp, param, state, grad):
  """The update ``new_param - param``; for bfloat16 / float16 params (whose new value
  legacy casts back to their dtype) computed in float32, so that ``optax.apply_updates``
  (``(p + u).astype(p.dtype)``) lands on legacy's value (exactly unless a step shrinks an
  element by more than 2**16 times), where a bfloat16 difference would round."""
  new_param, update, new_state = _adafactor(opt_def, step, hp, param, state, grad)
  if new_param is None:
    return update, new_state
  if jnp.finfo(param.dtype).bits < 32:
    return new_param.astype(jnp.float32) - param.astype(jnp.float32), new_state
  return new_param - param, new_state


def adafactor_new_param(opt_def, step, hp, param, state, grad):
  """``(new_param, new_state)`` as legacy computes it (the shim's own step, exact)."""
  new_param, update, new_state = _adafactor(opt_def, step, hp, param, state, grad)
  if new_param is None or jnp.finfo(param.dtype).bits >= 32:  # as before: p + update
    return param + (new_param - param if new_param is not None else update), new_state
  return new_param, new_state


#: The shim's ``OptimizerDef.apply_gradient`` takes a rule's ``new_param`` form where it
#: has one: the new parameter itself, not ``param + update``.
adafactor.new_param = adafactor_new_param


def _adafactor(opt_def, step, hp, param, state, grad):
  """``(new_param or None, update or None, new_state)``: ``update`` (``-u``) where legacy
  returns ``p - u`` in the param's dtype; otherwise legacy's new param, cast to its dtype."""
  lr = require_learning_rate(hp)
  fixed = opt_def.hyper_params  # factoring and parameter scaling: fixed at construction
  grad = grad.astype(jnp.float32)
  new = {k: jnp.zeros((1,)) for k in ('v_row', 'v_col', 'v', 'm')}
  t = jnp.array(step - hp.step_offset, jnp.float32) + 1.0
  decay = 1.0 - t ** (-hp.decay_rate)
  scale = lr
  if fixed.multiply_by_parameter_scale:
    scale *= jnp.maximum(jnp.sqrt(jnp.mean(param * param)), hp.epsilon2)
  mixing = 1.0 - decay
  g2 = grad * grad + hp.epsilon1
  dims = _factored_dims(fixed, param.shape)
  if dims is not None:
    d1, d0 = dims
    v_row = decay * state.v_row + mixing * jnp.mean(g2, axis=d0)
    v_col = decay * state.v_col + mixing * jnp.mean(g2, axis=d1)
    new['v_row'], new['v_col'] = v_row, v_col
    reduced = d1 - 1 if d1 > d0 else d1
    row_factor = (v_row / jnp.mean(v_row, axis=reduced, keepdims=True)) ** -0.5
    col_factor = v_col ** -0.5
    y = grad * jnp.expand_dims(row_factor, axis=d0) * jnp.expand_dims(col_factor, axis=d1)
  else:
    v = decay * state.v + mixing * g2
    new['v'] = v
    y = grad * v ** -0.5
  if hp.clipping_threshold is not None:
    y /= jnp.maximum(1.0, jnp.sqrt(jnp.mean(y * y)) / hp.clipping_threshold)
  subtrahend = scale * y
  if hp.beta1 is not None:
    m = hp.beta1 * state.m + (1.0 - hp.beta1) * subtrahend
    subtrahend = m
    new['m'] = m.astype(opt_def.dtype_momentum)
  if hp.weight_decay_rate is None and param.dtype == subtrahend.dtype:
    return None, -subtrahend, type(state)(**new)
  if hp.weight_decay_rate is not None:
    new_param = (1.0 - hp.weight_decay_rate) * param - subtrahend
  else:
    new_param = param - subtrahend
  return new_param.astype(param.dtype), None, type(state)(**new)


# -- Momentum: weight decay is L2 added to the gradient before the momentum ---------
def momentum(opt_def, step, hp, param, state, grad):
  lr = require_learning_rate(hp)
  if hp.weight_decay != 0:  # Python branch, as legacy: a traced value raises
    grad += hp.weight_decay * param
  m = hp.beta * state.momentum + grad
  d = grad + hp.beta * m if hp.nesterov else m
  return -(lr * d), state.replace(momentum=m)
