"""``docs/rules/``: one page per rule id of ``codemod.rules.RULES``, and an index.

Each page is exactly what ``optim-migrate rule <id>`` prints
(``codemod.rule_docs.rule_text``), so the two cannot differ.
"""
from __future__ import annotations

import pathlib

from _gen import write


def cell(text: str) -> str:
  return text.replace('|', '\\|').replace('\n', ' ')


def index_page(rules) -> str:
  from codemod import rule_docs
  out = ['# Rules', '',
         'Every rule the codemod applies or reports, by id. Each page gives the summary, why, '
         'the safety, a before/after example from the test fixtures, and how to fix it by hand. '
         'The same text is printed by `optim-migrate rule <id>`; `optim-migrate rule` lists the '
         'ids.', '',
         'Safety, as in ruff: `safe` fixes are applied by default, `unsafe` ones only with '
         '`--unsafe-fixes`, `manual` ones become a `# TODO(optim-migrate): <id>: ...` comment '
         'and a report entry. `--select` / `--ignore` take ids or prefixes (`OM1` is every id '
         'starting with OM1).', '']
  families: dict[str, list] = {}
  for rule in rules.values():
    families.setdefault(rule_docs.family(rule.id), []).append(rule)
  for name, members in families.items():
    out += [f'## {name[0].upper()}{name[1:]}', '', '| rule | safety | summary |', '|---|---|---|']
    out += [f'| [{r.id}]({r.id}.md) | {r.safety} | {cell(r.summary)} |' for r in members]
    out += ['']
  out += ['```{toctree}', ':hidden:', '', *rules, '```', '']
  return '\n'.join(out)


def generate(docs: pathlib.Path) -> list[str]:
  from codemod import rule_docs
  from codemod.rules import RULES
  pages = {f'{rule_id}.md': rule_docs.rule_text(rule_id) for rule_id in RULES}
  pages['index.md'] = index_page(RULES)
  return write.sync(docs / 'rules', pages)
