"""Every rule of the codemod, as data: id, fix safety, summary, why, and an example.

One table: ``optim-migrate rule OMxxx`` prints an entry, the README's rule
tables are generated from it (``codemod.rules.readme``), and the tests run each
example through the codemod (``before`` must give ``after`` and report the
rule). ``readme`` is the entry's README table cell (the summary when empty).
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Rule:
  """A rule: its id, its fix safety (``safe``, ``unsafe``: only with ``--unsafe-fixes``, or
  ``manual``: a TODO), the family module that implements it (``codemod.rules.<family>``), a
  one-line summary, why it exists, and an example: ``before`` rewritten (with ``options``,
  ``codemod.rules.Options`` keywords) gives ``after``. ``files``: a multi-module example,
  ``{path: (before, after)}``, run over a tree."""
  id: str
  safety: str
  summary: str
  family: str = ''
  why: str = ''
  before: str = ''
  after: str = ''
  options: Mapping[str, object] = dataclasses.field(default_factory=dict)
  files: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
  readme: str = ''

  @property
  def module(self) -> str:
    """The file that implements it: ``codemod/rules/<family>.py``, else ``codemod/<family>``."""
    here = pathlib.Path(__file__).resolve().parent
    if (here / f'{self.family}.py').exists():
      return f'codemod/rules/{self.family}.py'
    return f'codemod/{self.family}' + ('' if (here.parent / self.family).is_dir() else '.py')

  @property
  def kind(self) -> str:
    """``fix`` (OM0xx: the codemod rewrites) or ``manual`` (OM1xx: it flags)."""
    return 'fix' if self.id.startswith('OM0') else 'manual'

  def describe(self) -> str:
    """The entry as ``optim-migrate rule`` prints it (Markdown)."""
    out = [f'# {self.id} ({self.safety})', '', self.summary, '']
    if self.why:
      out += ['## Why', '', self.why, '']
    if self.options:
      out += ['Options: ' + ', '.join(f'{k}={v!r}' for k, v in self.options.items()), '']
    examples = [(None, self.before, self.after)] if self.before else [
        (path, before, after) for path, (before, after) in self.files.items()]
    if examples:
      out += ['## Example', '']
      for path, before, after in examples:
        label = f' ({path})' if path else ''
        out += [f'Before{label}:', '', '```python', before.rstrip('\n'), '```', '',
                f'After{label}:', '', '```python', after.rstrip('\n'), '```', '']
    out.append(f'Implemented in `{self.module}`.')
    return '\n'.join(out) + '\n'


def table() -> dict[str, Rule]:
  """Every rule, by id, in id order (the entries live in ``catalog_fixes`` and
  ``catalog_manual``)."""
  from codemod.rules.catalog_fixes import FIXES
  from codemod.rules.catalog_manual import MANUAL
  return {r.id: r for r in sorted((*FIXES, *MANUAL), key=lambda r: r.id)}
