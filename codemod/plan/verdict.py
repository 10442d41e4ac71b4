"""The module's verdict, decided once from its facts: convert it, or keep its legacy code.

Every rule family says whether anything it finds forces the file to keep its
legacy optimizer code (its ``blocks``): a def it cannot convert, an apply-time
override Optax cannot take, a method used as a value, an optimizer another
module keeps legacy... One such finding keeps the whole file legacy, with the
TODOs saying why: converting the rest would half-migrate it. A file that never
references flax.optim, and uses no converted factory of another module, is
*unproven*: nothing in it is converted, its legacy-looking uses are flagged.
"""
from __future__ import annotations

from codemod.rules import (references, apply_gradient, attributes, crossmodule, defs, imports,
                           methods, restores)

#: The families whose findings may keep a file legacy.
BLOCKING_FAMILIES = (imports, crossmodule, apply_gradient, references, defs, attributes, methods,
                     restores)


def prepare(q) -> None:
  """What the families derive from the facts before anything is decided."""
  apply_gradient.prepare(q)   # injected learning rates, per-group rates
  references.prepare(q)      # legacy names with no conversion
  defs.prepare(q)             # hyper-parameter reads
  attributes.prepare(q)       # resets of a proven optimizer (`o.optimizer_def.create(p)`)
  q.maybe_vars = q.derived_names()
  imports.prepare(q)          # emitted names bound to something else
  crossmodule.prepare(q)      # calls of other modules' step functions


def decide(q) -> None:
  """Set ``q.unproven`` and ``q.blocked``."""
  f = q.f
  q.unproven = not f.uses_legacy and not f.flow_fields and not any(
      fac.converted for fac in f.flow_used.values())
  q.blocked = any(family.blocks(q) for family in BLOCKING_FAMILIES)
