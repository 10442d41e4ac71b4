"""OM2xx fixes of references: renamed attributes and names (OM201 / OM204), and the flagged
ones (OM221, OM222, OM224)."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ScopeProvider

from codemod.modern.base import _CELLS, _FLAGS, _RENAMES
from codemod.modern.helpers import _dotted, _dotted_name, _names, _unsafe_why


class _References:
  """References: renames and flags."""

  # -- references: renames and flags -------------------------------------------------------
  def leave_Attribute(self, original, updated):
    if not self._loads(original):
      return updated
    name = self.qname_in(original, _RENAMES)
    if name is not None:
      return self._rename(original, updated, name)
    self._flag_reference(original)
    return updated

  def leave_Name(self, original, updated):
    if id(original) in self.facts.attr_names:
      return updated
    if not self._loads(original):
      return updated
    if self.qname_in(original, _RENAMES) is not None:
      moved = self._moved_name(original)
      return updated.with_changes(value=moved) if moved else updated
    self._flag_reference(original)
    return updated

  def _rename(self, original: cst.Attribute, updated: cst.Attribute, old: str):
    api = _RENAMES[old]
    new = api.new
    rule = api.rule
    if rule == 'OM204' and not self._in_annotation(original):
      rule = 'OM205'
    replacement = None
    base = updated.value
    for q in self.qnames(original.value):
      if new.startswith(q + '.') and _names(base):
        replacement = _dotted([*_names(base), *new[len(q) + 1:].split('.')])
        break
    if replacement is None:
      if not self.opts.fixable(rule):
        self.decide(original, rule, '', self._rename_message(old, new, rule))
        return updated
      module, attr = new.rsplit('.', 1)
      expr = self.module_expr(original, module)
      if expr is None:
        self.flag(original, 'OM224', f'`{old}` -> `{new}`: no name for module `{module}` here '
                  '(bound to something else, or imported only after this line): import it '
                  'above and rerun')
        return updated
      replacement = _dotted([*_names(expr), attr])
      self._drop_if_unused(original.value)
    if self.decide(original, rule, self._rename_message(old, new, rule),
                   self._rename_message(old, new, rule)):
      return replacement.with_changes(lpar=updated.lpar, rpar=updated.rpar)
    return updated

  def _drop_if_unused(self, base) -> None:
    """Schedule the removal of the import binding ``base``'s root name (``jnp`` of
    ``jnp.DeviceArray``), done only if nothing uses it after the rewrite."""
    root = base
    while isinstance(root, cst.Attribute):
      root = root.value
    if not isinstance(root, cst.Name):
      return
    scope = self.get_metadata(ScopeProvider, root, None)
    for a in (scope[root.value] if scope is not None else ()):
      node = getattr(a, 'node', None)
      entry = None
      if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative and \
          not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
          if (alias.asname.name.value if alias.asname else _dotted_name(alias.name)) == root.value:
            entry = (_dotted_name(node.module), _dotted_name(alias.name),
                     alias.asname.name.value if alias.asname else None)
      elif isinstance(node, cst.Import):
        for alias in node.names:
          if alias.asname is not None and alias.asname.name.value == root.value:
            entry = (_dotted_name(alias.name), None, root.value)
      if entry is not None and entry not in self.removes:
        self.removes.append(entry)

  @staticmethod
  def _rename_message(old: str, new: str, rule: str) -> str:
    api = _RENAMES[old]
    text = f'`{old}` -> `{new}`: {api.since}'
    if rule != 'OM205':
      return text
    differs = api.extra or ('under jit a tracer is a `jax.Array` but was no `DeviceArray` '
                            'before jax 0.4.1 (`isinstance` checks change)')
    return (f'`{old}` -> `{new}` outside an annotation: {differs}; {api.since} '
            f'({_unsafe_why(rule)})')

  def _flag_reference(self, node) -> None:
    name = self.qname_in(node, _FLAGS)
    if name is None or name in _CELLS or id(node) in self.second_arg_funcs:
      return
    api = _FLAGS[name]
    self.flag(node, api.rule, api.extra.format(name=name))
    return
