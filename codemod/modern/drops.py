"""OM202: statements that only enable omnistaging, dropped."""
from __future__ import annotations

from typing import Sequence

import libcst as cst

from codemod.modern.base import _DROP
from codemod.modern.helpers import _code, _own_comment


class _Drops:
  """OM202: statements that only enable omnistaging, dropped (a ``pass`` stands
  for a block left empty)."""

  # -- OM202: statements that only enable omnistaging --------------------------------------
  def _drop(self, expr: cst.Expr) -> bool:
    call = expr.value
    if not isinstance(call, cst.Call) or call.args:
      return False
    name = self.qname_in(call.func, _DROP)
    if name is None:
      return False
    if not self.decide(call, _DROP[name].rule, f'`{_code(call)}` removed: {_DROP[name].why}', ''):
      return False
    if ('jax', 'config', None) not in self.removes:  # its import, when nothing else uses it
      self.removes.append(('jax', 'config', None))
    return True

  def leave_IndentedBlock(self, original, updated):
    body, footer = self._without_dropped(updated.body)
    if not body:
      return updated
    return updated.with_changes(body=body, footer=[*updated.footer, *footer]) \
        if footer else updated.with_changes(body=body)

  def leave_Module(self, original, updated):
    body, footer = self._without_dropped(updated.body)
    return updated.with_changes(body=body, footer=[*footer, *updated.footer])

  def _without_dropped(self, statements: Sequence[cst.BaseStatement]):
    """``statements`` without the removed ones (their comment lines go to the next statement,
    or to the block's footer, except the removed call's own comment: see :func:`_own_comment`);
    a block left empty keeps one ``pass``."""
    if not any(id(s) in self._dropped for s in statements):
      return list(statements), []
    out, carried = [], []
    for s in statements:
      if id(s) in self._dropped:
        lines = list(s.leading_lines)
        carried.extend(lines[:len(lines) - _own_comment(lines)])
        continue
      if carried:
        # the removed lines' blank lines stand in for this one's; comments are all kept
        own = list(s.leading_lines)
        lines = [*carried, *own] if not own else \
            [*(ln for ln in carried if ln.comment is not None), *own]
        s = s.with_changes(leading_lines=lines)
        carried = []
      out.append(s)
    carried = [ln for ln in carried if ln.comment is not None]
    if not out:
      keep = statements[-1]
      return [keep.with_changes(leading_lines=[*keep.leading_lines])], []
    return out, carried
