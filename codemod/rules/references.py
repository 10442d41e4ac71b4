"""Rule family *references*: legacy names that have a modern home, where they are written.

OM006 (``DynamicScale`` / ``dynamic_scale`` -> ``flax.training.dynamic_scale``),
OM007 (annotations: ``optim.Optimizer`` -> ``train_state.TrainState``,
``optim.OptimizerDef`` -> ``optax.GradientTransformation``), a user
``OptimizerDef`` subclass kept on the shim (OM104, its legacy names ->
``optim_compat``), ``ModelParamTraversal`` -> ``flax.traverse_util``, pre-Linen
``flax.nn`` models (OM105), and legacy names with no conversion (OM103 for
``OptimizerState``, OM109 otherwise). The names come from ``codemod.legacy_api``.
"""
from __future__ import annotations

import re

from typing import Optional

import libcst as cst

from codemod import legacy_api as api
from codemod.names import code
from codemod.rules.defs import Problem


def ref_problem(q, ref_id, sym) -> Optional[Problem]:
  f = q.f
  if sym in api.DYNAMIC_SCALE:
    return None
  if ref_id in f.in_subclass:
    import optim_compat
    if sym in optim_compat.LOADED_NAMES or hasattr(optim_compat, sym):  # without loading jax
      return None
  elif ref_id in f.in_annotation:
    if sym in api.ANNOTATIONS:
      return None
  elif ref_id in f.call_funcs and (sym in api.DEF_NAMES or sym == api.TRAVERSAL):
    return None
  elif ref_id in f.dual_members:
    return None  # (the tuple drops it: OM015)
  if surgery_class(q, sym):
    return None
  rule = 'OM103' if sym == 'OptimizerState' else 'OM109'
  return Problem(rule, f'flax.optim.{sym} has no automatic conversion here; see optim_compat for '
                       'a drop-in')


def surgery_class(q, sym: str) -> bool:
  """``sym`` is a legacy state class in a file whose state surgery the legacy view converts
  (``opt.replace(state=...)`` with one table def: ``codemod.rules.attributes.view_def``): it
  becomes the shim's class, which ``optim_compat.with_legacy_state`` reads."""
  from codemod.rules.attributes import surgery_receiver, view_def
  return (sym in api.STATE_CLASSES and bool(q.f.state_writes) and view_def(q) is not None
          and all(surgery_receiver(q, w.func.value) for w in q.f.state_writes.values()))


def prepare(q) -> None:
  for ref_id, sym in q.f.refs.items():
    problem = ref_problem(q, ref_id, sym)
    if problem:
      q.bad_refs[ref_id] = problem


def blocks(q) -> bool:
  return bool(q.bad_refs)


# -- sites ------------------------------------------------------------------------------------
def visit_reference(p, node) -> None:
  """A legacy name with no conversion (OM103 / OM109), a ``flax.nn`` model (OM105), or a
  hyper-parameter read with no literal value (OM119), where the node is entered."""
  q = p.q
  if (problem := q.bad_refs.get(id(node))) is not None:
    p.flag(node, problem.rule, problem.text, blocks=True, note=problem.note)
  elif id(node) in q.f.nn_refs and q.f.uses_legacy:
    p.flag(node, 'OM105', 'pre-Linen flax.nn model: migrate the model to Linen first '
                          '(the optimizer parts are converted)')
  elif (problem := q.bad_hp.get(id(node))) is not None:
    p.flag(node, problem.rule, problem.text, blocks=True, note=problem.note)


def visit_class(p, node: cst.ClassDef) -> None:
  if any(node is c for c in p.q.f.subclasses):
    name = node.name.value
    if any(api.is_def_class(p.q.n.symbol(b.value)) for b in node.bases):
      # (where the file keeps its legacy code, no TrainState gets it from this run)
      how = (f' and TrainState gets optim_compat.to_optax({name}(...))' if p.q.converts else
             f', as the legacy code here that uses it does; once that code converts, TrainState '
             f'takes optim_compat.to_optax({name}(...)) as tx=')
      p.flag(node, 'OM104', f'`{name}` subclasses a flax.optim class: it runs on the shim '
                            f'(optim_compat){how}; port it to an optax.GradientTransformation '
                            'when convenient')
    else:  # (an Optimizer / OptimizerState subclass: no def, nothing to_optax takes)
      p.flag(node, 'OM104', f'`{name}` subclasses a flax.optim class that is not a def: it runs '
                            'on the shim (optim_compat), as the legacy code that uses it does; '
                            'port that code to a TrainState when convenient')


def leave_reference(p, original) -> bool:
  """Legacy names that have a modern home: DynamicScale, annotations, traversals, subclasses.
  True when the name is rewritten."""
  q = p.q
  sym = q.f.refs.get(id(original))
  if sym is None or id(original) in q.bad_refs:
    return False
  n = q.n
  if sym in api.DYNAMIC_SCALE:
    if isinstance(original, cst.Name) or not q.opts.fixable('OM006') or (
        isinstance(original.value, cst.Name)
        and api.LEGACY + '.dynamic_scale' in n.qnames(original.value)):
      return False  # the import statement is rewritten
    p.fix(original, apply_dynamic_scale, [('OM006', f'flax.optim {sym} -> '
                                                    'flax.training.dynamic_scale')],
          data={'sym': sym})
    return True
  if q.blocked:
    return False
  if id(original) in q.f.in_subclass:
    p.fix(original, apply_shim_name, [], data={'sym': sym})
    return True
  if surgery_class(q, sym):
    p.fix(original, apply_state_class, [('OM017', f'flax.optim {sym} -> '
                                                  f'{api.STATE_CLASSES[sym]}: the legacy state '
                                                  'class the legacy view reads and writes')],
          data={'sym': sym})
    return True
  if id(original) in q.f.in_annotation:
    source, _ = api.ANNOTATIONS[sym]
    p.fix(original, apply_annotation, [('OM007', f'annotation flax.optim.{sym} -> {source}')],
          data={'sym': sym})
    return True
  if sym == api.TRAVERSAL:
    p.fix(original, apply_traversal, [])
    return True
  return False


def leave_dual_support(p, original: cst.Tuple) -> None:
  """``isinstance(x, (optim.Optimizer, train_state.TrainState))`` -> ``isinstance(x,
  train_state.TrainState)`` (OM015): after the rewrite every optimizer this run converts is a
  TrainState; the legacy class is gone from Flax >= 0.6."""
  q = p.q
  legacy = q.f.dual_tuples.get(id(original))
  if legacy is None or not q.converts or not q.opts.fixable('OM015'):
    return
  dropped = ', '.join(code(q.f.ref_nodes[i]) if i in q.f.ref_nodes else '?' for i in legacy)
  p.fix(original, apply_dual_support,
        [('OM015', f'`{code(original)}` -> without {dropped}: code that takes both a flax.optim '
                   'Optimizer and a TrainState; a legacy (or optim_compat) Optimizer that '
                   'other code still hands in no longer matches here')],
        data={'legacy': set(legacy)})


def leave_legacy_branch(p, original: cst.If) -> None:
  """``if isinstance(x, optim.Optimizer): <legacy> else: <rest>`` -> ``<rest>`` (OM015):
  after the rewrite the optimizers this run converts are TrainStates, which take the else
  branch the author wrote for them."""
  q = p.q
  if id(original) not in q.f.legacy_branches or not q.converts or not q.opts.fixable('OM015'):
    return
  p.fix(original, apply_legacy_branch,
        [('OM015', f'`if {code(original.test)}:` branch dropped, its else (if any) kept: code that '
                   'takes both a flax.optim Optimizer and a TrainState; a legacy (or '
                   'optim_compat) Optimizer that other code still hands in now takes the '
                   'else branch')])


def leave_docstring(p, original: cst.SimpleString) -> None:
  """The docstring of a function whose parameter it types as a flax.optim ``Optimizer`` /
  ``OptimizerDef`` (``Facts.doc_types``): that type is rewritten as an annotation is (OM007)."""
  q = p.q
  found = q.f.doc_types.get(id(original))
  if not found or not q.converts or not q.opts.fixable('OM007'):
    return
  p.fix(original, apply_docstring_types,
        [('OM007', f'docstring type {old} -> {new}') for old, new in found.items()],
        data={'types': found})


# -- fixes ----------------------------------------------------------------------------------
def apply_dual_support(ctx, original, updated, fix):
  kept = [u for o, u in zip(original.elements, updated.elements)
          if id(o.value) not in fix.data['legacy']]
  if len(kept) == 1:
    return kept[0].value  # `isinstance(x, train_state.TrainState)`
  last = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return updated.with_changes(elements=[*kept[:-1], last])


def apply_legacy_branch(ctx, original, updated, fix):
  rest = updated.orelse
  if rest is None:
    return cst.RemovalSentinel.REMOVE  # (its block keeps other statements)
  if isinstance(rest, cst.If):  # `elif ...:` becomes `if ...:`
    return rest.with_changes(leading_lines=updated.leading_lines)
  body = list(rest.body.body) if isinstance(rest.body, cst.IndentedBlock) else [
      cst.SimpleStatementLine(body=list(rest.body.body))]
  body[0] = body[0].with_changes(leading_lines=[*updated.leading_lines,
                                                *body[0].leading_lines])
  return cst.FlattenSentinel(body)


def apply_docstring_types(ctx, original, updated, fix):
  text = updated.value
  for old, new in fix.data['types'].items():
    text = re.sub(rf'(?<![\w.]){re.escape(old)}(?!\w|\.\w)', new, text)  # (`T.` ends a sentence)
  return updated.with_changes(value=text)


def apply_dynamic_scale(ctx, original, updated, fix):
  ctx.add_import('flax.training', 'dynamic_scale', 'dynamic_scale_lib')
  return cst.parse_expression('dynamic_scale_lib' + (
      '.DynamicScale' if fix.data['sym'] == 'DynamicScale' else ''))


def apply_shim_name(ctx, original, updated, fix):
  ctx.add_import('optim_compat')
  return cst.parse_expression(f'optim_compat.{fix.data["sym"]}')


def apply_state_class(ctx, original, updated, fix):
  ctx.add_import('optim_compat')
  return cst.parse_expression(api.STATE_CLASSES[fix.data['sym']])


def apply_annotation(ctx, original, updated, fix):
  source, (module, obj) = api.ANNOTATIONS[fix.data['sym']]
  ctx.add_import(module, obj)
  return cst.parse_expression(source)


def apply_traversal(ctx, original, updated, fix):
  ctx.add_import('flax', 'traverse_util')
  return cst.parse_expression('traverse_util.ModelParamTraversal')
