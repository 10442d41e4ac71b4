"""Rule family *methods*: legacy ``Optimizer`` methods with a modern counterpart.

OM009 (``opt.replicate()`` -> ``jax_utils.replicate(opt)``, unsafe: legacy also
averaged the gradients), OM010 (``opt.unreplicate()``), OM011
(``compute_gradient`` -> ``jax.value_and_grad``; ``optimize`` -> that, then
``apply_gradients``), OM116 (``.replicate(...)`` arguments that do not convert).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from codemod.names import code, kwargs, template
from codemod.rules.defs import Problem


def method_problem(q, call: cst.Call) -> Optional[Problem]:
  if not q.is_optimizer(call.func.value):
    return None
  method = call.func.attr.value
  if method == 'replicate':
    if not q.opts.fixable('OM009'):
      return Problem('OM009', '`.replicate()` -> flax.jax_utils.replicate(...) is an unsafe fix '
                              '(legacy also pmean-ed the gradients in apply_gradient): rerun with '
                              '--unsafe-fixes, or convert by hand')
    if any(a.keyword is None or a.keyword.value not in ('devices', 'axis_name') for a in call.args):
      return Problem('OM116', '`.replicate(...)` with these arguments is not converted', note=False)
  elif call.args or not q.opts.fixable('OM010'):
    return Problem('OM010', '`.unreplicate()` is not converted here', note=False)
  return None


def blocks(q) -> bool:
  return any(method_problem(q, c) for c in q.f.method_calls.values())


def _replicate_message(call) -> str:
  axis = kwargs(call).get('axis_name')
  axis = code(axis.value) if axis else "'batch'"
  return (f'.replicate() -> jax_utils.replicate(...): legacy also averaged the gradients '
          f'over pmap axis {axis} in apply_gradient; add grads = jax.lax.pmean(grads, '
          f'{axis}) before apply_gradients unless the step already does')


# -- sites ------------------------------------------------------------------------------------
def leave_method(p, original) -> bool:
  """``opt.replicate()`` / ``opt.unreplicate()`` on an optimizer. Ends the call's chain."""
  q = p.q
  if id(original) not in q.f.method_calls or not q.is_optimizer(original.func.value):
    return False
  problem = method_problem(q, original)
  if problem:
    p.flag(original, problem.rule, problem.text, blocks=True, note=problem.note)
  elif not q.blocked:
    if original.func.attr.value == 'replicate':
      message = _replicate_message(original)
      p.fix(original, apply_method, [('OM009', message)])
      p.note('OM009', message)
    else:
      p.fix(original, apply_method, [('OM010', '.unreplicate() -> jax_utils.unreplicate(...)')])
  return True


def leave_compute_gradient(p, original: cst.Assign) -> None:
  """``loss, g = opt.compute_gradient(f)`` -> ``jax.value_and_grad`` (OM011)."""
  q = p.q
  if id(original) not in q.f.grad_assigns or not q.converts:
    return
  if q.is_optimizer(original.value.func.value):
    p.fix(original, apply_compute_gradient, [('OM011', 'compute_gradient(f) -> '
                                                       'jax.value_and_grad(f)(opt.params)')])


def leave_optimize(p, original: cst.SimpleStatementLine) -> None:
  """``new, loss[, aux] = opt.optimize(f[, learning_rate=lr])`` -> value_and_grad, then
  apply_gradients: two statements (OM011)."""
  q = p.q
  at = next((i for i, small in enumerate(original.body)
             if id(small) in q.f.optimize_assigns), None)
  if at is None or not q.converts or not q.is_optimizer(original.body[at].value.func.value):
    return
  p.fix(original, apply_optimize, [('OM011', 'optimize(f) -> jax.value_and_grad(f)(opt.params), '
                                             'then apply_gradients (two statements)')],
        data={'at': at})


# -- fixes ----------------------------------------------------------------------------------
def apply_method(ctx, original, updated, fix):
  recv = updated.func.value
  method = original.func.attr.value
  ctx.add_import('flax', 'jax_utils')
  devices = [a for a in updated.args if a.keyword is not None and a.keyword.value == 'devices']
  args = [cst.Arg(recv)] + [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in devices]
  args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
  args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' ')))
          for a in args[:-1]] + args[-1:]
  return cst.Call(func=cst.parse_expression(f'jax_utils.{method}'), args=args)


def apply_compute_gradient(ctx, original, updated, fix):
  recv = updated.value.func.value
  fn = updated.value.args[0].value
  elements = list(updated.targets[0].target.elements)
  ctx.add_import('jax')
  if len(elements) == 2:
    return updated.with_changes(value=template('jax.value_and_grad(F)(R.params)', F=fn, R=recv))
  a, b, c = (e.value for e in elements)
  targets = [updated.targets[0].with_changes(target=template('(A, B), C', A=a, B=b, C=c))]
  return updated.with_changes(
      targets=targets, value=template('jax.value_and_grad(F, has_aux=True)(R.params)', F=fn, R=recv))


def apply_optimize(ctx, original, updated, fix):
  at = fix.data['at']
  assign = updated.body[at]
  call = assign.value
  recv, fn = call.func.value, call.args[0].value
  names = [e.value for e in assign.targets[0].target.elements]
  ctx.add_import('jax')
  subs = {'F': fn, 'R': recv, 'A': names[0], 'L': names[1]}
  if len(names) == 2:
    first = 'L, grads_from_optimize = jax.value_and_grad(F)(R.params)'
  else:
    first = '(L, X), grads_from_optimize = jax.value_and_grad(F, has_aux=True)(R.params)'
    subs['X'] = names[2]
  lr = kwargs(call).get('learning_rate')
  if lr is not None:
    second = ('A = R.replace(opt_state=optax.tree_utils.tree_set(R.opt_state, '
              'learning_rate=LR)).apply_gradients(grads=grads_from_optimize)')
    subs['LR'] = lr.value
    ctx.add_import('optax')
  else:
    second = 'A = R.apply_gradients(grads=grads_from_optimize)'
  from codemod.names import Substitute
  first_small = cst.parse_statement(first).body[0].visit(Substitute(subs))
  second_small = cst.parse_statement(second).body[0].visit(Substitute(subs))
  if len(updated.body) > 1:  # `x = 1; new, loss = opt.optimize(f)`: both on this line
    body = list(updated.body)
    body[at:at + 1] = [first_small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT),
                       second_small.with_changes(semicolon=assign.semicolon)]
    return updated.with_changes(body=body)
  line1 = updated.with_changes(body=[first_small])
  line2 = cst.SimpleStatementLine(body=[second_small])
  return cst.FlattenSentinel([line1, line2])
