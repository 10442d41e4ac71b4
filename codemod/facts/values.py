"""Which expressions give an optimizer, from what the analysis has found so far."""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.names import Names, attr_chain, call_argument

#: Checkpoint readers: what they return has their target's structure (an optimizer for one).
_RESTORE_NAMES = frozenset(api.RESTORES)
_METHOD_ON_NAME = m.Attribute(value=m.Name(), attr=m.Name('replicate') | m.Name('unreplicate')
                              | m.Name('replace'))
_METHOD_ON_CALL = m.Attribute(value=m.Call(), attr=m.Name('replicate') | m.Name('unreplicate')
                              | m.Name('replace'))
#: ``o.optimizer_def.create(p)``: a fresh optimizer from ``o``'s own def (the reset idiom)
RESET_CALL = m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name(), attr=m.Name('optimizer_def')),
                     attr=m.Name('create')),
    args=[m.Arg(keyword=None, star='')])


#: ``opt.optimizer_def.hyper_params`` (the whole hyper-parameters of an optimizer's def).
DEF_HYPER_PARAMS = m.Attribute(value=m.Attribute(attr=m.Name('optimizer_def')),
                               attr=m.Name('hyper_params'))


def create_receiver(n: Names, call: cst.Call) -> Optional[cst.BaseExpression]:
  """The def a create call creates from, or None: ``d`` in ``d.create(p)``, and in
  ``jax.jit(d.create, backend='cpu')(p)`` (a :data:`~codemod.legacy_api.CREATE_WRAPPERS`
  call given the bound ``create`` alone and keywords, then called: :func:`jitted_create`)."""
  if m.matches(call.func, m.Attribute(attr=m.Name('create'))):
    return call.func.value
  inner = jitted_create(n, call)
  return inner.value if inner is not None else None


def jitted_create(n: Names, call: cst.Call) -> Optional[cst.Attribute]:
  """``d.create`` when ``call`` is ``jax.jit(d.create, <keywords>)(<arguments>)``, else None."""
  wrap = call.func
  if not (isinstance(wrap, cst.Call) and wrap.args and wrap.args[0].keyword is None
          and not wrap.args[0].star and all(a.keyword is not None for a in wrap.args[1:])
          and m.matches(wrap.args[0].value, m.Attribute(attr=m.Name('create')))):
    return None
  return wrap.args[0].value if n.qnames(wrap.func) & api.CREATE_WRAPPERS else None


def pickled_value(n: Names, call: cst.Call) -> cst.BaseExpression:
  """What ``pickle.dump(x, f)`` (a :data:`~codemod.legacy_api.PICKLERS` call with a first
  positional argument) pickles: ``x``, or ``x`` of ``unreplicate(x)`` / ``jax.device_get(x)``."""
  value = call.args[0].value
  if isinstance(value, cst.Call) and value.args and n.qnames(value.func) & api.PICKLE_PASSTHROUGH:
    return value.args[0].value
  return value


def wrapper_of(n: Names, call) -> str | None:
  """The qualified name of the wrapper (:data:`codemod.legacy_api.WRAPPERS`) when
  ``call`` wraps the function it is given first: ``jax.pmap(step, ...)``, or a configured
  wrapper ``parallelize(donate_argnums=())(step)``; else None."""
  if not isinstance(call, cst.Call) or not call.args or call.args[0].keyword is not None \
      or call.args[0].star:
    return None
  func = call.func
  if isinstance(func, cst.Call) and all(a.keyword is not None for a in func.args):
    func = func.func  # `W(**options)(step)`
  found = sorted(n.qnames(func) & api.CALL_WRAPPERS)
  return found[0] if found else None


def wraps_factory(n: Names, call) -> bool:
  """``call`` wraps a function of this file that returns an optimizer (``jax.jit(step)``,
  or a lambda whose body is a call making one): what it returns, called, is one too."""
  wrapper = wrapper_of(n, call)
  if wrapper is None or not api.WRAPPERS[wrapper].returns_result:
    return False
  fn = call.args[0].value
  if isinstance(fn, cst.Lambda):
    return produces_optimizer(n, fn.body)
  return isinstance(fn, cst.Name) and fn.value in n.facts.opt_factories


def own_function(value) -> str | None:
  """The name of this file's function or method ``value`` calls (``f(...)``,
  ``self.f(...)``), else None."""
  if isinstance(value, cst.Call):
    if isinstance(value.func, cst.Name):
      return value.func.value
    if m.matches(value.func, m.Attribute(value=m.Name('self') | m.Name('cls'), attr=m.Name())):
      return value.func.attr.value
  return None


def returned_item(n: Names, value) -> bool:
  """``value`` is ``out['opt']``: ``out`` bound once, to a call of this file's function that
  returns a dict with an optimizer at that key (dopamine's SAC ``train``: ``returns =
  {'network_optim': optim, ...}; return returns``, then ``self.network_optimizer =
  train_returns['network_optim']``), or to a checkpoint restore into a dict holding an
  optimizer at that key (``out = restore_checkpoint(d, {'opt': opt, 'epoch': 0})``: what is
  restored has its target's structure)."""
  if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name)
          and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Index)
          and isinstance(key := value.slice[0].slice.value, (cst.SimpleString, cst.Integer))):
    return False
  found = n.assignment(value.value)
  if found is None or len(found[0]) != 1:
    return False
  if key.evaluated_value in restored_keys(n, found[1]):
    return True  # (an int index: a restore into a list or tuple display, `ck[0]`)
  if isinstance(key, cst.Integer):
    return False
  function = own_function(found[1])
  return function is not None and key.evaluated_value in n.facts.bundle_keys.get(function, ())


def restored_keys(n: Names, value) -> frozenset:
  """The keys at which ``value``, a checkpoint restore (``codemod.legacy_api.RESTORES``) into
  a dict display (or a name bound once to one), gets an optimizer back: the display's string
  keys whose value is an optimizer; into a list or tuple display, the indexes of its
  optimizers. Empty for anything else."""
  if not isinstance(value, cst.Call):
    return frozenset()

  def holds(e) -> bool:
    return produces_optimizer(n, e) or (
        isinstance(e, cst.Name) and n.binding(e) in n.facts.opt_vars)
  for q in sorted(n.qnames(value.func) & _RESTORE_NAMES):
    target = call_argument(value, *api.RESTORES[q])
    if isinstance(target, (cst.List, cst.Tuple)) and not any(
        isinstance(e, cst.StarredElement) for e in target.elements):
      return frozenset(i for i, e in enumerate(target.elements) if holds(e.value))
    target = dict_display(n, target)
    if target is not None:
      return frozenset(
          e.key.evaluated_value for e in target.elements
          if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
          and holds(e.value))
  return frozenset()


def dict_display(n: Names, expr) -> Optional[cst.Dict]:
  """``expr`` if it is a dict display, or the dict display a name is bound to once (``ckpt =
  {'opt': opt, 'epoch': 0}``, then a restore into ``ckpt``); else None."""
  if isinstance(expr, cst.Name) and (found := n.assignment(expr)) is not None \
      and len(found[0]) == 1:
    expr = found[1]
  return expr if isinstance(expr, cst.Dict) else None


def produces_optimizer(n: Names, value) -> bool:
  """``value`` is a call that returns a (legacy) optimizer: a create, an apply, a replicate
  or ``replace`` of one, a function of this file returning one, another module's converted
  factory."""
  if isinstance(value, cst.Subscript):
    return returned_item(n, value)
  if not isinstance(value, cst.Call):
    return False
  f = n.facts
  func = value.func
  if m.matches(func, m.Attribute(attr=m.Name('apply_gradient'))):
    return True
  if (recv := create_receiver(n, value)) is not None and n.is_def(recv):
    return True
  if n.qnames(func) & api.REPLICATE_FNS:
    if not value.args:
      return False
    arg = value.args[0].value
    if isinstance(arg, cst.Name):
      return n.binding(arg) in f.opt_vars
    if (chain := attr_chain(arg)) is not None:
      return chain in f.attr_chains
    return produces_optimizer(n, arg)
  for q in sorted(n.qnames(func) & _RESTORE_NAMES):
    # `opt2 = restore_checkpoint(d, opt)`: what is restored has its target's structure
    target = call_argument(value, *api.RESTORES[q])
    if target is not None and (produces_optimizer(n, target) or (
        isinstance(target, cst.Name) and n.binding(target) in f.opt_vars)):
      return True
  if m.matches(func, _METHOD_ON_NAME):
    return n.binding(func.value) in f.opt_vars  # `opt.replace(target=p)` too
  if m.matches(value, RESET_CALL):  # `opt = opt.optimizer_def.create(p)`: reset (OM001)
    return n.binding(func.value.value) in f.opt_vars
  if (m.matches(func, m.Attribute(value=m.Attribute(), attr=m.Name('replace')))
      and func.value.attr.value in f.annotated_fields):
    return True  # `state.optimizer.replace(target=p)`: the optimizer field of a container
  if m.matches(func, _METHOD_ON_CALL):
    return produces_optimizer(n, func.value)  # `Adam(...).create(p).replicate()`
  if isinstance(func, cst.Name) and func.value in f.opt_factories:
    return True  # a function of this module that returns `Def(...).create(...)`
  if wraps_factory(n, func):
    return True  # `jax.jit(step)(opt, batch)`
  factory = n.factory_of_call(value)
  return factory is not None and factory.converted  # another module's, converted there


def holds_optimizer(n: Names, expr) -> bool:
  """``expr`` is one of this file's optimizers: a name holding one (not another module's),
  or a call producing one."""
  f = n.facts
  if isinstance(expr, cst.Name):
    b = n.binding(expr)
    return b in f.opt_vars and b not in f.rebound and b not in f.flow_vars
  return produces_optimizer(n, expr) and n.factory_of_call(expr) is None


def made_here(n: Names, expr) -> bool:
  """``expr`` is an optimizer this file creates: a name assigned one (not a parameter,
  unless :attr:`Facts.made_here_params` has it), a create, or a step / replicate of one."""
  f = n.facts
  if isinstance(expr, cst.Name):
    b = n.binding(expr)
    return (b in f.opt_vars and b not in f.rebound and b not in f.flow_vars
            and (b not in f.params or b in f.made_here_params))
  if not isinstance(expr, cst.Call) or not produces_optimizer(n, expr) or \
      n.factory_of_call(expr) is not None:
    return False
  func = expr.func
  if n.qnames(func) & api.REPLICATE_FNS:
    return bool(expr.args) and made_here(n, expr.args[0].value)
  if isinstance(func, cst.Attribute) and func.attr.value in (
      'apply_gradient', 'replicate', 'unreplicate', 'replace'):
    return made_here(n, func.value)
  return True


def makes_bare_array(n: Names, value) -> bool:
  """``value`` is a call returning one bare array, not a pytree of them (``jnp.zeros(3)``,
  ``np.random.randn(4, 2)``, ``jax.random.normal(key, (3,))``): its function's qualified name
  starts with one of :data:`codemod.legacy_api.ARRAY_CALL_PREFIXES` and is not one of
  :data:`codemod.legacy_api.NOT_ARRAY_CALLS`."""
  if not isinstance(value, cst.Call):
    return False
  return any(q.startswith(api.ARRAY_CALL_PREFIXES) and q not in api.NOT_ARRAY_CALLS
             for q in n.qnames(value.func))


def is_bare_array(n: Names, expr) -> bool:
  """``expr`` is such a call, or a name every assignment of which is one."""
  if isinstance(expr, cst.Name):
    return n.facts.array_vars.get(n.binding(expr), False)
  return makes_bare_array(n, expr)
