"""A mixin for the codemod's LibCST visitors and transformers: no per-attribute hooks.

LibCST calls ``on_visit_attribute`` / ``on_leave_attribute`` for every child attribute of
every node, and its default looks up a ``visit_<Node>_<attribute>`` method by name each
time (about a million lookups on the ecosystem tree for one traversal). No visitor of this
codemod defines such a method, so they skip the lookup.
"""
from __future__ import annotations


class NoAttributeHooks:
  """Put before ``cst.CSTVisitor`` / ``cst.CSTTransformer`` in the bases. A subclass must not
  define ``visit_<Node>_<attribute>`` / ``leave_<Node>_<attribute>`` methods (they would never
  be called; ``tests/test_codemod_speed.py`` checks that none does)."""

  def on_visit_attribute(self, node, attribute) -> None:
    return None

  def on_leave_attribute(self, original_node, attribute) -> None:
    return None
