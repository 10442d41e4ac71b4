"""Facts: one analysis pass per module, producing plain data (``codemod.facts.model``).

:func:`analyze` sets aside the statements no rule can see (``reduce``), resolves
LibCST's scope, qualified-name and position metadata once, and runs the
analysis visit (``analyzer``); the plan (``codemod.plan``) and the cross-module
flow (``codemod.flow``) read what it found.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemod import legacy_api as api
from codemod.facts.analyzer import Analyzer
from codemod.facts.bound import bound_names
from codemod.facts.model import Analysis, Facts
from codemod.facts.setaside import reduce
from codemod.names import METADATA, Names

__all__ = ['Analysis', 'Facts', 'analyze']


def useful_flow(flow):
  """``flow`` when it knows any factory or step function of another module, or a class a
  subclass elsewhere sets a learning rate for (``Flow.inject_classes``), else None."""
  return flow if flow is not None and (flow.factories or flow.steps
                                       or flow.inject_classes) else None


def analyze(full: cst.Module, text: Optional[str] = None, flow=None,
            cache: Optional[dict] = None) -> Analysis:
  """The facts of ``full`` (parsed from ``text``), given the other modules' ``flow``.

  ``cache``: a dict kept with the parsed module; the reduced tree and its metadata are
  stored there, so that analysing the module again (another flow, in the cross-module
  pre-pass) resolves no metadata twice.
  """
  text = full.code if text is None else text
  flow = useful_flow(flow)
  whole = flow is not None and flow.mentioned(text)  # a factory's name is no word reduce knows
  key = 'whole' if whole else 'reduced'
  cache = {} if cache is None else cache
  if key not in cache:
    reduced, originals = (full, {}) if whole else reduce(full)
    wrapper = cst.MetadataWrapper(reduced, unsafe_skip_copy=True)
    cache[key] = (reduced, originals, wrapper.resolve_many(METADATA))
  reduced, originals, metadata = cache[key]
  facts = Facts(flow=flow)
  names = Names(metadata, facts)
  reduced.visit(Analyzer(names))
  fields, classes = _constructed_fields(full, reduced, names, facts)
  if fields - facts.annotated_fields:
    # `TrainingState(optimizer=optimizer)` of this module's class, with a proven optimizer:
    # that field holds one wherever it is read, as if annotated so (analysed again with it)
    facts = Facts(flow=flow)
    facts.annotated_fields |= fields
    facts.container_classes |= classes
    names = Names(metadata, facts)
    reduced.visit(Analyzer(names))
  if 'bound' not in cache:
    # the whole module, set-aside statements too; only the names the rewrite emits are asked about
    cache['bound'] = bound_names(full, api.EMITTED_NAMES, text)
  facts.bound_names = cache['bound']
  return Analysis(module=reduced, full=full, text=text, names=names, facts=facts,
                  originals=originals, flow=flow)


def _constructed_fields(full: cst.Module, reduced: cst.Module, names: Names,
                        facts: Facts) -> tuple[set, set]:
  """The fields of this module's classes (``struct.dataclass``, ``NamedTuple``, any class
  with annotated fields, whatever their annotation) that a call of the class sets, by
  keyword, to a name this module proves an optimizer (``TrainingState(key=k,
  optimizer=optimizer)`` beside ``optimizer: Any``), and those classes. Only in a module
  that uses flax.optim."""
  if not facts.uses_legacy or not facts.opt_vars:
    return set(), set()
  declared = {}
  for stmt in full.body:
    if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
      declared[stmt.name.value] = {
          small.target.value for line in stmt.body.body
          if isinstance(line, cst.SimpleStatementLine) for small in line.body
          if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)}
  if not any(declared.values()):
    return set(), set()
  fields, classes = set(), set()
  for call in m.findall(reduced, m.Call(func=m.OneOf(*(m.Name(c) for c in declared if declared[c])))):
    for arg in call.args:
      if (arg.keyword is not None and arg.keyword.value in declared[call.func.value]
          and isinstance(arg.value, cst.Name)
          and names.binding(arg.value) in facts.opt_vars):
        fields.add(arg.keyword.value)
        classes.add(call.func.value)
  return fields, classes
