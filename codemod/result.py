""":class:`FileResult`: what the codemod made of one file (no LibCST: a run whose files are
all cache hits reads results without loading the engine; ``codemod.engine`` re-exports it)."""
from __future__ import annotations

import dataclasses

from codemod.findings import Finding


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
    if not self.changed:
      return ''
    import difflib
    return ''.join(difflib.unified_diff(
        self.original.splitlines(keepends=True), self.new.splitlines(keepends=True),
        fromfile=f'a/{self.path.lstrip("/")}', tofile=f'b/{self.path.lstrip("/")}'))
