"""Rule family *attributes*: members of a legacy ``Optimizer`` read on a value.

The renames come from the member table (``codemod.legacy_api.OPTIMIZER_MEMBERS``):
OM003 (``.target`` -> ``.params``, ``replace(target=)`` -> ``replace(params=)``),
OM004 (``.state.step`` -> ``.step``). Flagged: OM103 (state surgery), OM116
(members with no ``TrainState`` counterpart, a method used as a value), OM117
(a value nothing proves is an optimizer), OM120 (``.step`` used as an array),
OM121 (reflection on the legacy fields by name).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.facts.values import RESET_CALL, pickled_value
from codemod.names import attr_chain, code, named_like_optimizer, template
from codemod.rules.apply_gradient import stepped_here, stepped_in_scope

#: keyword renames of ``replace(...)``: legacy field -> TrainState field
_FIELD_RENAMES = {mem.path[0]: mem.train_state for mem in api.OPTIMIZER_MEMBERS
                  if mem.train_state is not None and len(mem.path) == 1}


def _member(attr: cst.Attribute):
  """``(member, receiver)`` when ``attr`` ends a renamed member's path (``x.state.step``)."""
  for path, member in api.RENAMES.items():
    node, ok = attr, True
    for part in reversed(path):
      if not (isinstance(node, cst.Attribute) and node.attr.value == part):
        ok = False
        break
      node = node.value
    if ok:
      return member, node
  return None, None


# -- checks -----------------------------------------------------------------------------------
def legacy_only_uses(q) -> list[cst.Attribute]:
  """Members of a proven optimizer that no rule converts (``opt.state``, ``opt.state_dict``)."""
  return [a for a in q.f.legacy_attrs
          if id(a) not in q.handled and id(a) not in q.hp_owner_ids and q.is_optimizer(a.value)
          and not viewed(q, a)]


_LITERAL = m.OneOf(m.Integer(), m.Float(), m.SimpleString(), m.Name('True'), m.Name('False'),
                   m.Name('None'), m.UnaryOperation(operator=m.Minus(),
                                                    expression=m.OneOf(m.Integer(), m.Float())))


def view_def(q) -> Optional[str]:
  """The shim def for the legacy view of this file's optimizers (OM017), as source:
  ``optim_compat.Adam(learning_rate=0.01)`` when every def the file builds is that one call
  (one table def) and no optimizer or def comes from elsewhere (another module, a factory, a
  user class; a container class of another module is fine: its field holds what this file
  puts there); else None. The view reads only the def's layout: arguments that are not
  literals are left out (``optim_compat.Adam()``), except for a def whose layout its
  hyper-parameters decide (:data:`~codemod.legacy_api.LAYOUT_BY_HYPER_PARAMS`: then None)."""
  if q.view_def is not False:
    return q.view_def
  f, n, found = q.f, q.n, None
  calls = [c for c in f.def_calls if id(c) not in f.wn_inner]
  names = {n.legacy_def(c) for c in calls}
  if (calls and len(names) == 1 and not names & {api.MULTI, api.WEIGHT_NORM}
      and not (f.flow_vars or f.flow_used or f.flow_def_vars or f.def_var_factories
               or f.def_uses or f.flow_def_creates  # (`get_optimizer(cfg).create(p)`)
               or f.shimmed_def_calls or f.subclasses)
      and all(v is not None for v in f.def_vars.values())
      and all(a.keyword is None or a.keyword.value != 'focus' for c in calls for a in c.args)
      and len({code(c.with_changes(func=cst.Name('D'))) for c in calls}) == 1):
    name = names.pop()
    if all(not a.star and m.matches(a.value, _LITERAL) for a in calls[0].args):
      found = f'optim_compat.{name}{code(calls[0].with_changes(func=cst.Name("D")))[1:]}'
    elif name not in api.LAYOUT_BY_HYPER_PARAMS:
      found = f'optim_compat.{name}()'
  elif not calls and not _groups_anywhere(q):
    found = ''  # no def here: the layout is read off the TrainState's opt_state at run time
  q.view_def = found
  return found


def _groups_anywhere(q) -> bool:
  """The file names ``MultiOptimizer`` or passes ``focus=``: a TrainState it handles may hold
  optimizer groups, whose layout the opt_state alone does not give."""
  return api.MULTI in q.f.refs.values() or any(
      a.keyword is not None and a.keyword.value == 'focus'
      for c in m.findall(q.analysis.module, m.Call()) for a in c.args)


def surgery_receiver(q, recv) -> bool:
  """``recv`` (whose ``.state`` is read or written back) is one the rewrite makes a
  TrainState: this file's optimizer, or, where the view reads its layout off the opt_state (no
  def in this file), a name this function steps with a converted ``.apply_gradient``
  (hypernerf's ``optimizer = state.optimizer``, reset, then stepped)."""
  return q.is_optimizer(recv) or (view_def(q) == '' and (
      stepped_here(q, recv) or stepped_in_scope(q, recv)))


def view_def_text(q) -> str:
  """How the report names the view's layout."""
  d = view_def(q)
  return d if d else "its opt_state's Optax classes (optim_compat.legacy_view.inferred_def)"


def viewed(q, attr: cst.Attribute) -> bool:
  """``opt.state`` only read (``Facts.state_reads``) in a file whose defs :func:`view_def`
  can stand for, ``opt`` a name holding this file's optimizer (not a parameter other code may
  fill with another def's): it becomes ``optim_compat.legacy_state(opt, <def>)`` (OM017)."""
  if not (attr.attr.value == 'state' and id(attr) in q.f.state_reads
          or state_dict_call(q, attr) is not None):
    return False
  return view_receiver(q, attr.value)


def view_receiver(q, recv) -> bool:
  """``recv`` (whose ``.state`` is read or written) holds this file's optimizer and
  :func:`view_def` stands for its def."""
  if isinstance(recv, cst.Attribute) and q.annotated_field(recv):
    recv = recv.value  # `state.optimizer`: a container this file fills (not a parameter)
    if not isinstance(recv, cst.Name) or q.n.binding(recv) in q.f.params \
        or q.n.binding(recv) not in q.f.container_vars:
      return False
  if not isinstance(recv, cst.Name) or view_def(q) is None:
    return False
  b = q.n.binding(recv)  # (a parameter: only if given nothing but this file's optimizers)
  return b not in q.f.params or b in q.f.made_here_params


def state_dict_call(q, attr: cst.Attribute) -> Optional[cst.Call]:
  """``opt.state_dict()`` (called, no arguments) whose attribute is ``attr``, else None."""
  call = q.f.calls_by_func.get(id(attr)) if attr.attr.value == 'state_dict' else None
  return call if call is not None and not call.args else None


def method_reference(q, attr: cst.Attribute) -> bool:
  """``jax.jit(opt.apply_gradient)``: a legacy method used as a value."""
  return (attr.attr.value == 'apply_gradient' and id(attr) not in q.f.call_funcs
          and (q.is_optimizer(attr.value) or (
              isinstance(attr.value, cst.Name) and q.n.binding(attr.value) in q.f.opt_vars)))


def reflection_problem(q, call: cst.Call) -> Optional[str]:
  """``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` / ``dataclasses.replace`` naming a
  legacy Optimizer field on a converted optimizer: no rule rewrites them, and on a
  ``TrainState`` ``hasattr(x, 'target')`` is silently False. ``pickle.dump`` of one: a
  ``TrainState``'s ``tx`` does not pickle."""
  fn = q.n.qnames(call.func) & api.REFLECTION_FNS
  if not fn or not call.args or call.args[0].keyword is not None:
    return None
  recv = pickled_value(q.n, call) if fn <= api.PICKLERS else call.args[0].value
  excerpt = code(call)
  if fn <= api.PICKLERS and (q.is_container(recv) or (
      isinstance(recv, (cst.Dict, cst.List, cst.Tuple, cst.Set)) and q.mentions_optimizer(recv))):
    return (f'`{excerpt}`: `{code(recv)}` holds a TrainState, whose Optax transformation '
            "(`tx`: closures) pickle cannot serialize (AttributeError: Can't pickle local "
            'object): pickle it with each TrainState as `<it>.replace(tx=None)` and give the tx '
            'back after loading, or save `flax.serialization.to_bytes(...)`; a pickle the '
            'legacy code wrote loads only with flax.optim (or optim_compat.install())')
  if not (q.is_optimizer(recv) or q.maybe_optimizer(recv)):
    return None
  if fn <= api.PICKLERS:
    return (f'`{excerpt}`: a TrainState holds its Optax transformation (`tx`: closures), which '
            "pickle cannot serialize (AttributeError: Can't pickle local object; a flax.optim "
            'Optimizer pickled): save `flax.serialization.to_bytes(...)` of it (or pickle '
            '`jax.device_get(flax.serialization.to_state_dict(...))`) and restore into a fresh '
            'TrainState; a pickle the legacy code wrote loads only with flax.optim (or '
            'optim_compat.install())')
  if fn == {'flax.serialization.to_state_dict'}:
    if not q.is_optimizer(recv) and isinstance(recv, cst.Name) and q.n.binding(
        recv) in q.f.params and not named_like_optimizer(recv):
      return None  # a helper's pytree parameter (scenic's `_traverse_with_names(tree)`)
    return (f'`{excerpt}`: a TrainState\'s state dict has the keys `step`, `params`, `opt_state` '
            '(a flax.optim Optimizer\'s: `target`, `state` with `step` and `param_states`): '
            'code that reads it by key, and checkpoints written from it, change layout '
            '(old checkpoints: optim-migrate convert-checkpoint or restore_legacy)')
  if fn == {'dataclasses.replace'}:
    fields = sorted(a.keyword.value for a in call.args[1:]
                    if a.keyword is not None and a.keyword.value in api.OPTIMIZER_FIELDS)
    if not fields:
      return None
    return (f'`{excerpt}`: a TrainState has no field {", ".join(f"`{x}`" for x in fields)} '
            '(`target` is `params`, `state.step` is `step`, the optimizer state is '
            '`opt_state`): convert it by hand')
  if len(call.args) < 2:
    return None
  attr = call.args[1].value
  if isinstance(attr, cst.SimpleString):
    if attr.evaluated_value not in api.FLOW_FAILING_ATTRS:
      return None
    what = f"no attribute '{attr.evaluated_value}'"
  else:
    what = 'other attributes than a flax.optim Optimizer (the name is computed here)'
  effect = 'this is silently False' if fn == {'builtins.hasattr'} else 'this fails'
  return (f'`{excerpt}`: a TrainState has {what}, so {effect} (`target` is `params`, '
          '`state.step` is `step`): convert it by hand')


def resets(q) -> list[cst.Attribute]:
  """``o.optimizer_def`` of ``o = o.optimizer_def.create(o.target)`` (the reset idiom) where
  ``o`` may hold this file's optimizer but is not proven to (the rebinding makes it unsure):
  converted, the rest of the file made ``o`` a TrainState that then reached flax.optim
  members (helper-29's D2); the file stays on the shim (OM116). A proven one is flagged as
  any legacy-only member (:func:`legacy_only_uses`)."""
  return [a for a in q.f.legacy_attrs if _unsure_reset(q, a)]


def prepare(q) -> None:
  """``o = o.optimizer_def.create(p)`` where ``o`` is proven this file's optimizer and ``p``
  a name or an attribute chain (read twice by the rewrite): converted (:func:`apply_reset`),
  its ``.optimizer_def`` consumed."""
  for attr in q.f.legacy_attrs:
    call = q.f.def_resets.get(id(attr))
    if (call is not None and m.matches(call, RESET_CALL) and q.is_optimizer(attr.value)
        and attr_chain(call.args[0].value) is not None):
      q.handled.add(id(attr))
      q.resets.add(id(call))


def _unsure_reset(q, attr) -> bool:
  return (id(attr) in q.f.def_resets and not q.is_optimizer(attr.value)
          and q.maybe_read_as_optimizer(attr.value))


def _rename_unproven(q, attr: cst.Attribute) -> bool:
  """``attr`` is ``.target`` / ``.state.step`` on a value that may be a flax.optim Optimizer
  and that nothing here proves one (flagged OM117, not converted)."""
  member, recv = _member(attr)
  return member is not None and not (q.is_optimizer(recv) or stepped_here(q, recv)) and (
      q.maybe_read_as_optimizer(recv)
      or (named_like_optimizer(recv) and not q.annotated_plain(recv)))


def bundle_item_reads(q) -> bool:
  """This file calls another module's bundle factory that the run converts (``opts =
  make_optimizers(p)``, ``d, opt = make_pair(p)``: its items are TrainStates now) and reads
  ``.target`` / ``.state.step`` on a value nothing here proves: likely one of those items,
  on which the legacy read fails at run time. The file keeps its legacy code (the pre-pass
  then holds the factory with it, both on the shim; a held factory keeps the file so, as
  its items are shim Optimizers) instead of converting around the read (helper-44 D1:
  AttributeError after ``--write``)."""
  if q.bundle_item_reads is None:  # (asked by the verdict, then at each OM117 flag)
    q.bundle_item_reads = any(fac.bundle and (fac.converted or fac.held)
                              for fac in q.f.flow_used.values()) and any(
        _rename_unproven(q, a) for a in q.f.member_attrs)
  return q.bundle_item_reads


def blocks(q) -> bool:
  return bool(legacy_only_uses(q)) or bool(resets(q)) or any(
      method_reference(q, a) for a in q.f.member_attrs) or bundle_item_reads(q)


# -- sites ------------------------------------------------------------------------------------
def visit_attribute(p, node: cst.Attribute) -> None:
  if node.attr.value == 'step' and m.matches(node.value, m.Attribute(attr=m.Name('state'))):
    p.state_of_step.add(id(node.value))  # `.state.step` is flagged once, at `.step`


def leave_method_reference(p, original) -> None:
  if method_reference(p.q, original):
    # e.g. jax.jit(opt.apply_gradient): a method reference has no TrainState counterpart
    p.flag(original, 'OM116', '`.apply_gradient` used as a value (not called) cannot be '
                              'converted: call it, or convert by hand', blocks=True)


def leave_legacy_only(p, original) -> bool:
  """Flags (OM103 / OM116 / OM117) or converts (OM017) a member a TrainState lacks; True
  when it flagged the member as having no equivalent."""
  q = p.q
  attr = original.attr.value
  rule = api.LEGACY_ONLY_ATTRS.get(attr)
  if not rule or id(original) not in q.legacy_attr_ids:
    return False
  if _unsure_reset(q, original):
    recv = code(original.value)
    p.flag(original, 'OM116', f'`{recv}.optimizer_def.create(...)` makes a fresh flax.optim '
                              f'Optimizer from `{recv}`\'s def (a reset of its state), and '
                              f'nothing here proves `{recv}` is this file\'s optimizer: as a '
                              f'TrainState that is `{recv}.replace(step=0, params=..., '
                              f'opt_state={recv}.tx.init(...))`; convert it so, then rerun',
           blocks=True)
    return True
  if id(original) not in q.handled and id(original) not in q.hp_owner_ids \
      and surgery_receiver(q, original.value):
    if not viewed(q, original):
      p.flag(original, rule, f'`.{attr}` of a flax.optim Optimizer has no TrainState '
                             'equivalent yet', blocks=True)
      return True
    elif not q.blocked and (call := state_dict_call(q, original)) is not None:
      p.fix(call, apply_legacy_state_dict, [('OM017', f'`{code(call)}` -> the legacy state '
                                                      'dict of the TrainState (`target`, `state` '
                                                      'with `step` and `param_states`), laid out '
                                                      f'as {view_def_text(q)} lays out its state')],
            data={'def': view_def(q)})
    elif not q.blocked:
      p.fix(original, apply_legacy_view, [('OM017', f'`{code(original)}` (only read here) -> '
                                                    f'the legacy view of the TrainState\'s '
                                                    f'opt_state, laid out as {view_def_text(q)} '
                                                    'lays out its state')],
            data={'def': view_def(q)})
  elif (id(original) not in p.state_of_step and q.converts and not q.annotated_field(original)
        and not q.is_optimizer(original.value) and q.maybe_read_as_optimizer(original.value)):
    # (not `tr.state` where this file's class declares `state: optim.Optimizer`: the field)
    # `res = opt.optimize(f); opt = res[0]`: `opt` is rebound, its create still converts
    p.flag(original, 'OM117', f'if `{code(original.value)}` is a flax.optim Optimizer '
                              f'(a TrainState after this rewrite), `.{attr}` has no TrainState '
                              'equivalent: convert it by hand' + q.created_by())
  return False


def leave_rename(p, original) -> None:
  """``.target`` / ``.state.step`` (the member table's renames) on an optimizer (OM003,
  OM004), or flagged on a value that may be one (OM117)."""
  q = p.q
  member, recv = _member(original)
  if member is None:
    return
  if q.is_optimizer(recv) or stepped_here(q, recv):
    p.fix(original, apply_rename, [(member.rule, member.fixed)], data={'member': member})
    if id(original) in q.f.step_array_uses:
      p.flag(original, 'OM120', '`.step` is a Python int on a TrainState fresh from '
                                'TrainState.create or stepped outside jit (legacy: an int32 '
                                'array): use jnp.asarray(<state>.step, jnp.int32) here')
  elif _rename_unproven(q, original):
    # (named like one: `state.optimizer` of a container nothing here follows, say one a
    # notebook builds from another module's class)
    p.flag(original, 'OM117', f'if `{code(recv)}` is a flax.optim Optimizer, '
                              f'`.{".".join(member.path)}` is `.{member.train_state}` on a '
                              'TrainState' + q.created_by(), blocks=bundle_item_reads(q))


def pickles_train_state(q, call: cst.Call) -> bool:
  """``pickle.dump(opt, f)`` (or of ``unreplicate(opt)``, ``jax.device_get(opt)``) where
  ``opt`` is one of the optimizers this file converts: it pickles the TrainState without its
  tx (OM018)."""
  return (q.converts and bool(q.n.qnames(call.func) & api.PICKLERS) and bool(call.args)
          and call.args[0].keyword is None and not call.args[0].star
          and q.is_optimizer(pickled_value(q.n, call)))


def leave_reflection(p, original) -> bool:
  q = p.q
  if pickles_train_state(q, original):
    arg = original.args[0].value
    p.fix(original, apply_without_tx, [('OM018', f'`{code(arg)}` pickled -> `{code(arg)}'
                                            '.replace(tx=None)`: a TrainState\'s Optax '
                                            'transformation (closures) does not pickle; the '
                                            'pickle holds step, params and opt_state, and a '
                                            'loaded one has tx=None (give it `.replace(tx=...)` '
                                            'before stepping it); a pickle the legacy code wrote '
                                            'loads only with flax.optim (or '
                                            'optim_compat.install()), as a flax.optim Optimizer')])
    return True
  if q.converts and any(v is original for v in q.f.pickle_unsure.values()) \
      and q.pickles_converted():
    p.flag(original, 'OM121', f'`{code(original)}`: this file pickles its optimizers as '
                              'TrainStates without their tx (OM018), and what is loaded here is '
                              'read as an Optimizer but also used otherwise (stepped, handed '
                              'on): a loaded TrainState needs `.replace(tx=...)` before it steps '
                              'and its `.target` is `.params`; convert its uses by hand (a pickle '
                              'the legacy code wrote loads only with flax.optim, or '
                              'optim_compat.install())')
    return True
  if q.converts and (problem := reflection_problem(q, original)):
    p.flag(original, 'OM121', problem)
    return True
  return False


def leave_replace(p, original) -> bool:
  """``opt.replace(target=...)`` -> ``replace(params=...)`` (OM003). The chain's last link."""
  q = p.q
  if not m.matches(original.func, m.Attribute(attr=m.Name('replace'))):
    return False
  recv = original.func.value
  if id(original) in q.f.state_writes and surgery_receiver(q, recv):
    if not view_receiver(q, recv):
      p.flag(original, 'OM103', '`.replace(state=...)` of a flax.optim Optimizer (state '
                                'surgery) is converted to optim_compat.with_legacy_state(<it>, '
                                '..., <def>) only where the file makes that optimizer from one '
                                'table def: convert it by hand', blocks=True)
    elif not q.blocked:
      p.fix(original, apply_with_legacy_state,
            [('OM017', f'`.replace(state=...)` (state surgery) -> optim_compat.with_legacy_state'
                       f'(<it>, ..., {view_def_text(q)}): the legacy state written back into the '
                       "TrainState's opt_state (step and every Optax count set to its step)")],
            data={'def': view_def(q)})
  elif q.is_optimizer(recv):
    if any(a.keyword is not None and a.keyword.value in _FIELD_RENAMES for a in original.args):
      frozen = _frozen_target(q, original)
      p.fix(original, apply_replace, [('OM003', 'replace(target=...) -> replace(params=...)' + (
          _KIND_NOTE.format({'call': 'the frozen params',
                             'parameter': 'the parameter (this module hands on frozen params)',
                             'helper': 'the helper\'s result (this module re-freezes params)'
                             }[frozen])
          if frozen else ''))], data={'frozen': frozen})
  elif ((fields := {a.keyword.value for a in original.args if a.keyword is not None}
          & api.OPTIMIZER_FIELDS) and not fields <= q.f.annotated_fields
        and q.maybe_optimizer(recv)):
    # (not `tr.replace(state=...)` where this file's class declares `state: optim.Optimizer`)
    p.flag(original, 'OM117', f'if `{code(recv)}` is a flax.optim Optimizer, '
                              '`.replace(target=...)` is `.replace(params=...)` on a TrainState '
                              '(`state=` has no counterpart)' + q.created_by())
  return True


def leave_reset(p, original) -> bool:
  """``o.optimizer_def.create(p)`` on a proven optimizer (OM001): a fresh state from
  ``o``'s transformation, step 0 (:func:`apply_reset`)."""
  if id(original) not in p.q.resets:
    return False
  recv = code(original.func.value.value)
  p.fix(original, apply_reset, [('OM001', f'`{code(original)}` (a fresh optimizer from '
                                          f'`{recv}`\'s def, step 0) -> `{recv}.replace(step=0, '
                                          f'params=..., opt_state={recv}.tx.init(...))`')])
  return True


# -- fixes ----------------------------------------------------------------------------------
def apply_reset(ctx, original, updated, fix):
  """``o.optimizer_def.create(p)`` -> ``o.replace(step=0, params=p, opt_state=o.tx.init(p))``:
  legacy ``OptimizerDef.create`` built ``Optimizer(def, init_state(p), p)``, its step 0 and
  each moment fresh; the TrainState keeps its class, ``apply_fn`` and ``tx``."""
  recv, params = updated.func.value.value, updated.args[0].value
  return template('O.replace(step=0, params=P, opt_state=O.tx.init(P))', O=recv, P=params)


def apply_rename(ctx, original, updated, fix):
  member = fix.data['member']
  recv = updated
  for _ in member.path:
    recv = recv.value
  return updated.with_changes(value=recv, attr=cst.Name(member.train_state))


_KIND_NOTE = (': {} take the kind the TrainState\'s params have (`flax.core.freeze(p)` '
              'matched them when Flax `init` returned a FrozenDict; since flax 0.7.1 it returns '
              'a dict, and a FrozenDict there would not match opt_state\'s tree at the next '
              'step)')


def _frozen_target(q, call: cst.Call) -> str:
  """How ``opt.replace(target=V)`` on a receiver that is a name or an attribute chain keeps
  ``V`` of the kind the TrainState's params have: ``'call'`` for ``V`` =
  ``flax.core.freeze(p)`` (or ``freeze(p)`` imported from Flax); ``'parameter'`` for ``V`` a
  parameter of the enclosing function in a module that calls ``freeze`` (l2p's
  ``state_with_new_param(state, param_dict)``, handed ``flax.core.freeze(...)`` by its
  callers); ``'helper'`` for ``V`` a call of a function of the user's (not jax's, flax's,
  numpy's) in such a module (``scale_kernel(opt.target, 0.5)``, which unfreezes, edits and
  freezes again); else ``''``."""
  recv = call.func.value
  value = next((a.value for a in call.args if a.keyword is not None
                and a.keyword.value == 'target'), None)
  if not (isinstance(recv, cst.Name) or attr_chain(recv) is not None):
    return ''
  if (isinstance(value, cst.Call) and isinstance(value.func, (cst.Attribute, cst.Name))
      and bool(q.n.qnames(value.func) & api.FREEZE_FUNCTIONS) and len(value.args) == 1
      and value.args[0].keyword is None and not value.args[0].star):
    return 'call'
  if isinstance(value, cst.Name) and _a_parameter(q, value) and _calls_freeze(q):
    return 'parameter'
  if (isinstance(value, cst.Call) and _calls_freeze(q)
      and not any(name.split('.', 1)[0] in _LIBRARIES for name in q.n.qnames(value.func))):
    return 'helper'  # `replace(target=scale_kernel(opt.target, 0.5))`, which re-freezes
  return ''


#: Packages whose functions are not the user's re-freezing helpers (``jax.tree_util.tree_map``
#: keeps its tree's kind).
_LIBRARIES = frozenset({'jax', 'flax', 'numpy', 'jnp', 'np', 'optax', 'builtins'})


def _a_parameter(q, name: cst.Name) -> bool:
  """Every binding of ``name`` is a function's parameter."""
  scope = q.n.scope(name)
  assignments = list(scope[name.value]) if scope is not None else []
  return bool(assignments) and all(isinstance(getattr(a, 'node', None), cst.Param)
                                   for a in assignments)


def _calls_freeze(q) -> bool:
  """The module calls ``flax.core.freeze`` (or ``freeze`` imported from Flax)."""
  if not hasattr(q, 'calls_freeze'):
    q.calls_freeze = any(q.n.qnames(c.func) & api.FREEZE_FUNCTIONS
                         for c in q.f.calls_by_func.values())
  return q.calls_freeze


def apply_replace(ctx, original, updated, fix):
  args = [a.with_changes(keyword=cst.Name(_FIELD_RENAMES[a.keyword.value]))
          if a.keyword is not None and a.keyword.value in _FIELD_RENAMES else a
          for a in updated.args]
  kind = fix.data.get('frozen') if fix.data else ''
  if kind:
    # `replace(params=flax.core.freeze(p))` -> the kind the TrainState's params have:
    # `F.freeze(p) if isinstance(R.params, F.FrozenDict) else F.unfreeze(p)`
    args = [a.with_changes(value=_of_params_kind(ctx, updated.func.value, a.value, kind))
            if a.keyword is not None and a.keyword.value == 'params' else a for a in args]
  return updated.with_changes(args=args)


def _of_params_kind(ctx, recv, value: cst.BaseExpression, kind: str) -> cst.BaseExpression:
  """``value`` (``flax.core.freeze(p)``, a parameter ``p`` or a helper's result) in the kind
  of ``R.params``."""
  if kind == 'call' and isinstance(value.func, cst.Attribute):
    module, inner = code(value.func.value), value.args[0].value
  else:  # `freeze(p)` after `from flax.core import freeze`, a parameter, a helper's result
    module = 'flax.core'
    ctx.add_import('flax')
    if kind == 'call':
      inner = value.args[0].value
    else:
      inner, value = value, template('flax.core.freeze(V)', V=value)
  return template(f'F if isinstance(R.params, {module}.FrozenDict) else {module}.unfreeze(V)',
                  F=value, R=recv, V=inner)


def apply_without_tx(ctx, original, updated, fix):
  """``pickle.dump(x, f)`` -> ``pickle.dump(x.replace(tx=None), f)`` (OM018)."""
  first = updated.args[0]
  value = template('X.replace(tx=None)', X=first.value)
  return updated.with_changes(args=[first.with_changes(value=value), *updated.args[1:]])


def apply_legacy_view(ctx, original, updated, fix, function='legacy_state'):
  ctx.add_import('optim_compat')
  if not fix.data['def']:  # (the layout read off the opt_state)
    return cst.Call(func=cst.parse_expression(f'optim_compat.{function}'),
                    args=[cst.Arg(updated.value)])
  return cst.Call(func=cst.parse_expression(f'optim_compat.{function}'),
                  args=[cst.Arg(updated.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))),
                        cst.Arg(cst.parse_expression(fix.data['def']))])


def apply_with_legacy_state(ctx, original, updated, fix):
  """``opt.replace(state=s[, target=p])`` -> ``optim_compat.with_legacy_state(opt[.replace(
  params=p)], s, <def>)`` (OM017)."""
  ctx.add_import('optim_compat')
  recv = updated.func.value
  state = next(a.value for a in updated.args if a.keyword is not None
               and a.keyword.value == 'state')
  rest = [a for a in updated.args if not (a.keyword is not None and a.keyword.value == 'state')]
  if rest:  # (`target=p` beside it: params=p, then the state)
    rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    recv = apply_replace(ctx, original, updated.with_changes(args=rest), None)
  if not fix.data['def']:
    return template('optim_compat.with_legacy_state(R, S)', R=recv, S=state)
  return template(f'optim_compat.with_legacy_state(R, S, {fix.data["def"]})', R=recv, S=state)


def apply_legacy_state_dict(ctx, original, updated, fix):
  """``opt.state_dict()`` -> ``optim_compat.legacy_state_dict(opt, <def>)`` (OM017)."""
  return apply_legacy_view(ctx, original.func, updated.func, fix, 'legacy_state_dict')
