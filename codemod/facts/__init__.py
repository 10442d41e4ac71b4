"""Facts: one analysis pass per module, producing plain data (``codemod.facts.model``).

:func:`analyze` sets aside the statements no rule can see (``reduce``), resolves
LibCST's scope, qualified-name and position metadata once, and runs the
analysis visit (``analyzer``); the plan (``codemod.plan``) and the cross-module
flow (``codemod.flow``) read what it found.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from codemod import legacy_api as api
from codemod.facts.analyzer import Analyzer
from codemod.facts.bound import bound_names
from codemod.facts.model import Analysis, Facts
from codemod.facts.setaside import reduce
from codemod.names import METADATA, Names

__all__ = ['Analysis', 'Facts', 'analyze']


def useful_flow(flow):
  """``flow`` when it knows any factory or step function of another module, else None."""
  return flow if flow is not None and (flow.factories or flow.steps) else None


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
  if 'bound' not in cache:
    # the whole module, set-aside statements too; only the names the rewrite emits are asked about
    cache['bound'] = bound_names(full, api.EMITTED_NAMES, text)
  facts.bound_names = cache['bound']
  return Analysis(module=reduced, full=full, text=text, names=names, facts=facts,
                  originals=originals, flow=flow)
