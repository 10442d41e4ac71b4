"""LibCST's ``PositionProvider`` positions, computed one top-level statement at a time.

The provider generates the whole module's code while recording every node's range: on the
ecosystem tree it cost a fifth of a run, for the handful of nodes a finding or a value
followed needs. A top-level statement starts at column 0, so its nodes' positions are the
ones the provider gives for a module holding that statement alone, shifted by the lines
before it (the module's header and the earlier statements, as the module's code writes
them). :class:`StatementPositions` computes a statement's map when one of its nodes is
first asked about; ``tests/test_positions.py`` checks it against the provider on every
node of the codemod's fixtures.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider


class _Shifted:
  """A statement's position map, read ``lines`` lines further down."""

  __slots__ = ('raw', 'lines')

  def __init__(self, raw, lines: int):
    self.raw, self.lines = raw, lines

  def get(self, node, default=None):
    found = self.raw.get(node)
    if found is None:
      return default
    return CodeRange(CodePosition(found.start.line + self.lines, found.start.column),
                     CodePosition(found.end.line + self.lines, found.end.column))

  def __contains__(self, node) -> bool:
    return node in self.raw


class StatementPositions:
  """``get(node)`` as ``MetadataWrapper(module).resolve(PositionProvider).get(node)`` (a
  ``libcst.CodeRange``, lines 1-based, columns 0-based), for nodes of ``module``.

  ``hint``: the index in ``module.body`` of the top-level statement holding the node,
  when the caller knows it (a traversal in progress); otherwise the statements are
  searched from the first, their maps computed as they are searched.
  """

  def __init__(self, module: cst.Module):
    self.module = module
    self._index = {id(st): i for i, st in enumerate(module.body)}
    self._starts: Optional[list[int]] = None
    self._maps: dict[int, object] = {}
    self._whole = None

  def index(self, statement) -> Optional[int]:
    """The index of ``statement`` in the module's body, or None (not a top-level one)."""
    return self._index.get(id(statement))

  def _lines_before(self, i: int) -> int:
    if self._starts is None:
      starts, line = [], len(self.module.header)
      for st in self.module.body:
        starts.append(line)
        line += self.module.code_for_node(st).count('\n')
      self._starts = starts
    return self._starts[i]

  def of_statement(self, i: int):
    """The position map (``.get(node, default)``) of the nodes of top-level statement ``i``."""
    got = self._maps.get(i)
    if got is None:
      alone = self.module.with_changes(body=[self.module.body[i]], header=[], footer=[])
      raw = cst.MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
      lines = self._lines_before(i)
      got = self._maps[i] = _Shifted(raw, lines) if lines else raw
    return got

  def get(self, node, default=None, hint: Optional[int] = None):
    if hint is not None:
      found = self.of_statement(hint).get(node)
      if found is not None:
        return found
    for i in self._maps:
      found = self._maps[i].get(node)
      if found is not None:
        return found
    for i in range(len(self.module.body)):
      if i not in self._maps:
        found = self.of_statement(i).get(node)
        if found is not None:
          return found
    # the module's own header and footer lines (no statement's), or a node not in it
    if self._whole is None:
      self._whole = cst.MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(
          PositionProvider)
    return self._whole.get(node, default)
