"""The text prefilters of a run: which files are worth a parse (no LibCST, so that a run
whose files are all cache hits, or fail every prefilter, never loads the engine;
``codemod.engine`` re-exports these)."""
from __future__ import annotations

from codemod import legacy_api
from codemod.modern import table
from codemod.rules import TODO_PREFIX

#: The file prefilter of the flax.optim rules (``codemod.legacy_api.may_need_rewrite``).
may_need_rewrite = legacy_api.may_need_rewrite
#: The OM2xx prefilter's groups (as ``codemod.modern.rewrite.may_apply`` builds them).
_OM2XX_KEYED = table.by_first_word(table.prefilter_words())


def om2xx_may_apply(text: str) -> bool:
  """``codemod.modern.rewrite.may_apply``: False only for files no OM2xx entry can apply to."""
  return table.passes(text, _OM2XX_KEYED)


def wanted(text: str, flow=None) -> bool:
  """:func:`may_need_rewrite`, or ``text`` may call a factory of ``flow`` (another module's
  optimizer, :class:`codemod.flow.Flow`), or the OM2xx family may apply to it (removed JAX /
  Flax APIs, :func:`om2xx_may_apply`): the files worth a parse."""
  return flax_optim_wanted(text, flow) or om2xx_may_apply(text)


def flax_optim_wanted(text: str, flow=None) -> bool:
  return may_need_rewrite(text) or (flow is not None and flow.mentioned(text))


def has_todos(text: str) -> bool:
  """``text`` holds a TODO this codemod wrote (reported until it is deleted)."""
  return TODO_PREFIX in text
