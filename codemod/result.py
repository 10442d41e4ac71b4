""":class:`FileResult`: what the codemod made of one file (no LibCST: a run whose files are
all cache hits reads results without loading the engine; ``codemod.engine`` re-exports it)."""
from __future__ import annotations

import dataclasses

from codemod.findings import Finding, line_map


@dataclasses.dataclass
class FileResult:
  path: str
  original: str
  new: str | None = None          # None: not processed (error) or skipped
  findings: list[Finding] = dataclasses.field(default_factory=list)
  error: str | None = None
  encoding: str = 'utf-8'
  cells: list[int] | None = None  # notebooks: the cell of each finding
  #: module-level functions returning an optimizer -> converted to return a TrainState
  #: (read by the cross-module pre-pass, ``codemod.flow``)
  factories: dict[str, bool] = dataclasses.field(default_factory=dict)
  inject_lr: bool = False         # the file's defs are built with inject_hyperparams
  #: module-level functions taking optimizers -> ``((position, parameter), ...)``, and
  #: whether the rewrite makes them TrainStates (read by ``codemod.flow``)
  steps: dict[str, tuple[tuple, bool]] = dataclasses.field(default_factory=dict)
  #: module-level functions returning an optimizer in a tuple, list or dict -> converted
  bundles: dict[str, bool] = dataclasses.field(default_factory=dict)
  #: module-level classes whose optimizer fields the rewrite makes TrainStates -> the fields
  fields: dict[str, tuple] = dataclasses.field(default_factory=dict)

  def where(self, i: int) -> str:
    """The file (``nb.ipynb:cell3`` in a notebook) of finding ``i``."""
    return self.path if self.cells is None else f'{self.path}:cell{self.cells[i]}'

  @property
  def changed(self) -> bool:
    return self.new is not None and self.new != self.original

  @property
  def manual(self) -> list[Finding]:
    return [f for f in self.findings if not f.fixed]

  def diff(self) -> str:
    """The unified diff of the rewrite, as ``git apply`` / ``patch`` take it: a last line
    without a newline is marked (``\\ No newline at end of file``, so the next file's header
    starts a line), and a UTF-8 BOM the file starts with is on its first lines (as written).
    Encoded as the file is by :meth:`diff_bytes`."""
    if not self.changed:
      return ''
    import difflib
    bom = '\ufeff' if self.encoding.lower().replace('_', '-') == 'utf-8-sig' else ''
    lines = difflib.unified_diff(
        (bom + self.original).splitlines(keepends=True), (bom + self.new).splitlines(keepends=True),
        fromfile=f'a/{self.path.lstrip("/")}', tofile=f'b/{self.path.lstrip("/")}')
    return ''.join(line if line.endswith('\n') else line + '\n\\ No newline at end of file\n'
                   for line in lines)

  def diff_bytes(self) -> bytes:
    """:meth:`diff` in the file's own encoding (a Latin-1 file's patch applies to its bytes)."""
    encoding = 'utf-8' if self.encoding.lower().replace('_', '-') == 'utf-8-sig' else self.encoding
    return self.diff().encode(encoding, errors='surrogateescape')

  def at_new_lines(self) -> list[Finding]:
    """The findings at their lines in ``new`` (what ``rewrite --write`` leaves on disk: a
    flagged line sits below its TODO comment, added imports shift the rest), not in
    ``original``; a notebook's findings at their lines in their cell's new source.
    Unchanged findings when nothing changed or a notebook's JSON cannot be read."""
    if not self.changed:
      return self.findings
    if self.cells is None:
      where = line_map(self.original, self.new)
      return [f.moved(where(f.line)) for f in self.findings]
    from codemod.sources import notebook_cells
    try:
      old_cells, new_cells = ([src for _, src in notebook_cells(t)]
                              for t in (self.original, self.new))
    except (ValueError, TypeError, AttributeError):
      return self.findings
    maps: dict = {}  # one line map per changed cell
    moved = []
    for cell, f in zip(self.cells, self.findings):
      old, new = (c[cell] if 0 <= cell < len(c) else '' for c in (old_cells, new_cells))
      if old == new:
        moved.append(f)
        continue
      if cell not in maps:
        maps[cell] = line_map(old, new)
      moved.append(f.moved(maps[cell](f.line)))
    return moved
