"""Every rule of the codemod, as data: id, fix safety, summary, why, and an example.

One table: ``optim-migrate rule OMxxx`` prints an entry (``codemod.rule_docs``,
also the docs site's rule pages), docs/codemod.md's rule tables are generated from it
(``codemod.rules.tables``), and the tests run each example through the codemod
(``before`` must give ``after`` and report the rule). ``readme`` is the entry's
rule-table cell (the summary when empty).
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Rule:
  """A rule: its id, its fix safety (``safe``, ``unsafe``: only with ``--unsafe-fixes``, or
  ``manual``: a TODO), the family module that implements it (``codemod.rules.<family>``), a
  one-line summary, why it exists, and an example: ``before`` rewritten (with ``options``,
  ``codemod.rules.Options`` keywords) gives ``after`` (rules that need more than one module,
  OM123-OM125, have none: their fixtures are ``tests/fixtures/flow``)."""
  id: str
  safety: str
  summary: str
  family: str = ''
  why: str = ''
  before: str = ''
  after: str = ''
  options: Mapping[str, object] = dataclasses.field(default_factory=dict)
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
    """``fix`` (OM0xx: the codemod rewrites), ``manual`` (OM1xx: it flags), ``modern``
    (OM2xx: removed JAX / Flax APIs, ``codemod.modern``)."""
    return {'OM0': 'fix', 'OM1': 'manual'}.get(self.id[:3], 'modern')

  @property
  def example(self):
    """``(before, after)``, or None (what ``codemod.rule_docs`` shows)."""
    return (self.before, self.after) if self.before else None
