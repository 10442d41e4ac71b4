"""OM2xx fixes of imports: relocated modules (``jax.config``: OM203) and renamed names that
from-imports bind (OM201 / OM204), and the module of a moved name."""
from __future__ import annotations

import builtins
from typing import Optional

import libcst as cst
from libcst.metadata import ScopeProvider

from codemod.modern.base import _FROM_MOVES, _MODULE_MOVES, _RELOCATE, _RENAMES
from codemod.modern.helpers import _dotted, _dotted_name, _fix_semicolons, _unsafe_why


class _Imports:
  """Imports: relocations and renames of imported names."""

  # -- imports ---------------------------------------------------------------------------
  def visit_Import(self, node):
    return False

  def visit_ImportFrom(self, node):
    return False

  def _redundant_jax_config(self, node: cst.Import) -> bool:
    """``import jax.config`` alone, where ``import jax`` binds ``jax`` too: dropped (OM203)."""
    if not self._alone_jax_config(node):
      return False
    return self.decide(node, 'OM203', '`import jax.config` removed: `import jax` is there (the '
                       'jax.config submodule was removed in jax 0.4.29)', '')

  def _alone_jax_config(self, node: cst.Import) -> bool:
    return (len(node.names) == 1 and node.names[0].asname is None
            and _dotted_name(node.names[0].name) == 'jax.config' and self.facts.plain_jax_import
            and self.opts.fixable('OM203'))

  def leave_Import(self, original, updated):
    if self._alone_jax_config(original):
      return updated  # dropped with its line (leave_SimpleStatementLine)
    names = list(updated.names)
    for i, alias in enumerate(original.names):
      moved = _MODULE_MOVES.get(_dotted_name(alias.name))
      if moved is not None:
        # `import jax.experimental.optimizers [as o]` -> `import jax.example_libraries....`
        # (uses through `jax.` are renamed where they are read)
        if self.decide(original, moved.rule, f'`import {_dotted_name(alias.name)}` -> '
                       f'`import {moved.new}`: {moved.since}', ''):
          names[i] = names[i].with_changes(name=_dotted(moved.new.split('.')))
        continue
      if _dotted_name(alias.name) != 'jax.config':
        continue
      api = _RELOCATE['jax.config']
      message = '`import jax.config` -> `import jax` (the jax.config submodule was removed in jax 0.4.29)'
      if alias.asname is None:
        if self.decide(original, api.rule, message, message):
          names[i] = names[i].with_changes(name=cst.Name('jax'))
      elif len(original.names) == 1:
        local = alias.asname.name.value
        if self.decide(original, api.rule, f'`import jax.config as {local}` -> '
                       f'`from jax import config as {local}`', message):
          return cst.ImportFrom(module=cst.Name('jax'), names=[
              cst.ImportAlias(name=cst.Name('config'), asname=alias.asname)])
      else:
        self.flag(original, 'OM224', '`import jax.config as ...` beside other imports: the '
                  'jax.config submodule is gone (jax 0.4.29); use `from jax import config as ...`')
    return updated.with_changes(names=names)

  def leave_SimpleStatementLine(self, original, updated):
    # the line's statements in order, as groups: a list of small statements kept on one line,
    # or an import moved to a line of its own (before what followed it on the line: in
    # `from jax.config import config; config.update(...)` the import must come first)
    groups: list = [[]]
    moved_any = False
    for orig_small, small in zip(original.body, updated.body):
      if isinstance(orig_small, cst.ImportFrom) and isinstance(small, cst.ImportFrom):
        kept, moved = self._relocate(orig_small, small)
        if kept is not None:
          groups[-1].append(kept)
        if moved:
          moved_any = True
          groups.extend(cst.SimpleStatementLine(body=[m]) for m in moved)
          groups.append([])
        continue
      if isinstance(orig_small, cst.Expr) and self._drop(orig_small):
        continue
      if isinstance(orig_small, cst.Import) and self._redundant_jax_config(orig_small):
        continue
      groups[-1].append(small)
    if not moved_any:
      if not groups[0]:
        marker = updated.with_changes(body=[cst.Pass()])
        self._dropped.add(id(marker))
        return marker
      return updated.with_changes(body=_fix_semicolons(groups[0]))
    lines = [g if isinstance(g, cst.SimpleStatementLine) else
             cst.SimpleStatementLine(body=_fix_semicolons(g)) for g in groups if g]
    # the line's comments (above it, after it) stay with its first part
    first, *rest = lines
    return cst.FlattenSentinel([first.with_changes(
        leading_lines=updated.leading_lines, trailing_whitespace=updated.trailing_whitespace),
        *rest])

  def _plan(self, node: cst.ImportFrom, alias: cst.ImportAlias):
    """How a from-imported removed name moves, or None: ``(new module, new name, the local
    name its uses get or None to keep theirs, rule, message)``. Pure, so that the import and
    its uses (visited before or after it) agree."""
    key = (id(node), id(alias))
    if key in self._plans:
      return self._plans[key]
    module = _dotted_name(node.module)
    qname = f'{module}.{_dotted_name(alias.name)}'
    plan = None
    if (new := _FROM_MOVES.get(qname)) is not None:
      local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
      new_module, new_name = new.rsplit('.', 1)
      # (a builtin's name is kept off: `from jax.numpy import alltrue` -> `all as alltrue`, so
      # that the module's own `all(...)` stays the builtin)
      rename = None if (alias.asname or new_name == local or new_name in self.facts.bound
                        or hasattr(builtins, new_name)) else new_name
      rule = self._reference_rule(node, local, qname)
      api = _RENAMES.get(qname) or _RELOCATE[qname]
      shown = f'{new_name} as {local}' if (new_name != local and rename is None) else new_name
      was = _dotted_name(alias.name) + (f' as {local}' if alias.asname else '')
      message = f'`from {module} import {was}` -> `from {new_module} import {shown}`: {api.since}'
      plan = (new_module, new_name, rename, rule, message)
    self._plans[key] = plan
    return plan

  def _relocate(self, original: cst.ImportFrom, updated: cst.ImportFrom):
    """``from jax import tree_map, jit`` -> (``from jax import jit``,
    [``from jax.tree_util import tree_map``]); (``updated``, []) when nothing moves."""
    if original.relative or original.module is None or isinstance(original.names, cst.ImportStar):
      return updated, []
    module = _dotted_name(original.module)
    if (api := _MODULE_MOVES.get(module)) is not None:
      # `from jax.experimental.optimizers import adam` -> `from jax.example_libraries....`
      if self.decide(original, api.rule, f'`from {module} import ...` -> `from {api.new} '
                     f'import ...`: {api.since}', ''):
        return updated.with_changes(module=_dotted(api.new.split('.'))), []
      return updated, []
    kept, moved = [], []
    for alias in original.names:
      plan = self._plan(original, alias)
      if plan is None:
        if module == 'jax.config':
          self.flag(original, 'OM224', f'`from jax.config import {_dotted_name(alias.name)}`: the '
                    'jax.config submodule was removed in jax 0.4.29; `jax.config` is the config '
                    'object, read its options from it')
        kept.append(alias)
        continue
      new_module, new_name, rename, rule, message = plan
      if not self.decide(original, rule, message, message + f' ({_unsafe_why(rule)})'):
        kept.append(alias)
        continue
      local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
      asname = None if (rename is not None or new_name == local) else \
          cst.AsName(name=cst.Name(local))
      moved.append(cst.ImportFrom(module=_dotted(new_module.split('.')), names=[
          cst.ImportAlias(name=cst.Name(new_name), asname=asname)]))
    if len(kept) == len(original.names):
      return updated, []
    if not kept:
      return None, moved
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(names=kept), moved

  def _moved_name(self, name: cst.Name) -> Optional[str]:
    """The new local name of a use of a from-imported name whose import moves and renames it."""
    scope = self.get_metadata(ScopeProvider, name, None)
    for a in (scope[name.value] if scope is not None else ()):
      node = getattr(a, 'node', None)
      if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
          local = alias.asname.name.value if alias.asname else _dotted_name(alias.name)
          if local == name.value and (plan := self._plan(node, alias)) is not None:
            if plan[2] is not None and self.opts.fixable(plan[3]):
              return plan[2]
    return None

  def _reference_rule(self, node: cst.ImportFrom, local: str, qname: str) -> str:
    """The rule of a from-imported name's relocation: the entry's, or for ``DeviceArray``
    OM205 (unsafe) when any use of the name is outside an annotation."""
    api = _RENAMES.get(qname) or _RELOCATE[qname]
    if api.rule != 'OM204':
      return api.rule
    scope = self.get_metadata(ScopeProvider, node, None)
    if scope is None:
      return 'OM205'
    for a in scope.assignments[local]:
      if getattr(a, 'node', None) is node:
        if any(not self._in_annotation(ref.node) for ref in a.references):
          return 'OM205'
    return 'OM204'

  def _in_annotation(self, node) -> bool:
    return id(node) in self.facts.annotated
