"""The codemod's rules: the catalog (``catalog``), the options that select them, and one
module per rule family (``defs``, ``apply_gradient``, ``attributes``, ``methods``,
``restores``, ``references``, ``imports``, ``crossmodule``), each holding the checks, the
site decisions and the fixes of its rules.

Safety follows ruff / TorchFix: ``safe`` fixes are applied by default,
``unsafe`` ones only with ``--unsafe-fixes`` (otherwise they are reported,
with an inline TODO, like ``manual`` ones), ``manual`` ones become an inline
``# TODO(optim-migrate): <rule-id>: <what to do>`` comment and a report entry.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional


from codemod.rules.catalog import Rule
from codemod.rules.catalog_fixes import FIXES
from codemod.rules.catalog_manual import MANUAL

#: Every rule by id, in id order (the catalog: ``codemod.rules.catalog``; the OM2xx family, JAX / Flax APIs
#: removed beside flax.optim, registers its own table, ``codemod.modern.table``).
RULES = {r.id: r for r in sorted((*FIXES, *MANUAL), key=lambda r: r.id)}

from codemod.modern import table as _om2xx  # noqa: E402

RULES.update({i: Rule(i, safety, summary) for i, safety, summary in _om2xx.RULES})

#: Starts every comment line the codemod writes (``<prefix><rule>: <message>``).
TODO_PREFIX = '# TODO(optim-migrate): '


@dataclasses.dataclass(frozen=True)
class Options:
  """Which rules run and how (``rewrite``'s flags / ``[tool.optim-migrate]``).

  ``select`` / ``ignore`` hold rule ids or prefixes (``OM0`` = every fix,
  ``OM1`` = every manual rule), as in ruff.
  """
  select: Optional[tuple[str, ...]] = None
  ignore: tuple[str, ...] = ()
  unsafe_fixes: bool = False
  prefer_stock_optax: bool = False
  #: a file that keeps its legacy code gets optim_compat.install() (OM014); False
  #: (``--no-shim-fallback``, ``shim-fallback = false``): it gets its TODOs only
  shim_fallback: bool = True

  def enabled(self, rule: str) -> bool:
    if self.select is not None and not any(rule.startswith(s) for s in self.select):
      return False
    return not any(rule.startswith(s) for s in self.ignore)

  def fixable(self, rule: str) -> bool:
    """The rule's fix is applied (enabled, and safe or unsafe with --unsafe-fixes)."""
    safety = RULES[rule].safety
    return self.enabled(rule) and (safety == 'safe' or (safety == 'unsafe' and self.unsafe_fixes))


def check_rule_ids(ids: Iterable[str]) -> list[str]:
  """Ids/prefixes in ``ids`` that name no rule (for a clear CLI error)."""
  return [i for i in ids if not any(r.startswith(i) for r in RULES)]
