"""The rule tables of ``docs/codemod.md``, generated from the catalog (``codemod.rules.catalog``).

    python -m codemod.rules.tables            # rewrite the tables between the markers
    python -m codemod.rules.tables --check    # exit 1 when they differ from the catalog

Each table sits between ``<!-- rule-table:<kind> -->`` and ``<!-- /rule-table:<kind> -->``
(``fix``: the OM0xx rules, ``manual``: the OM1xx ones); nothing else of the page is
touched. ``tests/test_codemod_rules.py`` fails when the page drifts from the catalog. (The
per-rule pages under ``docs/rules/`` are written at docs build time from the same catalog.)
"""
from __future__ import annotations

import pathlib
import re
import sys

from codemod.rules import RULES

PAGE = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'codemod.md'
_HEADERS = {'fix': '| rule | safety | what it does |', 'manual': '| rule | safety | flagged |'}


def table(kind: str) -> str:
  """The Markdown table of the rules of ``kind`` (``'fix'`` or ``'manual'``)."""
  rows = [_HEADERS[kind], '|---|---|---|']
  for rule in RULES.values():
    if rule.kind == kind:
      rows.append(f'| `{rule.id}` | {rule.safety} | {rule.readme or rule.summary} |')
  return '\n'.join(rows) + '\n'


def _block(kind: str) -> re.Pattern:
  return re.compile(rf'(<!-- rule-table:{kind} -->\n)(.*?)(<!-- /rule-table:{kind} -->)', re.S)


def render(text: str) -> str:
  """``text`` (the page) with each marked table regenerated.

  Raises:
    ValueError: a table's markers are missing.
  """
  for kind in _HEADERS:
    pattern = _block(kind)
    if not pattern.search(text):
      raise ValueError(f'{PAGE.name}: no <!-- rule-table:{kind} --> ... <!-- /rule-table:{kind} --> '
                       'block')
    text = pattern.sub(lambda m, kind=kind: m.group(1) + table(kind) + m.group(3), text)
  return text


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  text = PAGE.read_text(encoding='utf-8')
  new = render(text)
  if '--check' in argv:
    if new != text:
      print(f'{PAGE}: the rule tables differ from codemod/rules/catalog*.py; run '
            'python -m codemod.rules.tables', file=sys.stderr)
      return 1
    return 0
  if new != text:
    PAGE.write_text(new, encoding='utf-8')
  return 0


if __name__ == '__main__':
  sys.exit(main())
