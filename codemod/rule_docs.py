"""``optim-migrate rule``: one rule's documentation, the same text as its page in ``docs/``.

    optim-migrate rule OM009        # one rule (Markdown, as ``ruff rule`` prints it)
    optim-migrate rule              # every rule id, its safety and summary
    optim-migrate rule --all        # every rule's text, one after the other

:func:`rule_text` builds the text from the rule table (``codemod.rules.RULES``):
its id, safety and summary, and, when the table has them, the ``why``, ``example``
and ``fix`` fields. Without an ``example`` field the example is cut from the
codemod's test fixtures (``tests/fixtures/codemod/<id>_*/before.py`` and
``after.py``, else any fixture whose ``findings.txt`` names the rule): the lines
around the sites the rule reports, before and after the rewrite. The docs build
(``docs/_gen/rules.py``) writes :func:`rule_text` to ``docs/rules/<id>.md``.

Exit status: 0; 2 for an id that names no rule (the message lists the ids).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
import sys
import textwrap
from typing import Optional

EXIT_OK, EXIT_ERROR = 0, 2

#: Where the codemod's before/after fixtures are, in a source checkout.
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures' / 'codemod'

#: Rule families by id prefix (``--select OM1`` picks a family, as in ruff).
FAMILIES = {
    'OM0': 'flax.optim rewrites',
    'OM1': 'flax.optim uses flagged for a human',
    'OM2': 'removed JAX / Flax APIs',
}

SAFETY_TEXT = {
    'safe': ('`safe`: applied by default: `optim-migrate rewrite` shows it in its diff, '
             '`--write` applies it.'),
    'unsafe': ('`unsafe`: applied only with `--unsafe-fixes` (or `unsafe-fixes = true` under '
               '`[tool.optim-migrate]`): the rewrite can change what the program does (see '
               'the summary). Without the flag the site is reported and gets a '
               '`# TODO(optim-migrate)` comment, like a manual item.'),
    'manual': ('`manual`: never rewritten. The codemod writes a '
               '`# TODO(optim-migrate): <id>: <what to do>` comment above the line and a report '
               'entry; `rewrite --check` exits 1 while the TODO is there.'),
}

FIX_FALLBACK = {
    'safe': ('Run `optim-migrate rewrite --write PATH`, or edit the code into the form shown '
             'under *After*.'),
    'unsafe': ('Decide whether the change is right for your program (see the TODO the codemod '
               'writes), then either rerun with `--unsafe-fixes` or edit the code into the form '
               'shown under *After* yourself, and delete the TODO.'),
    'manual': ('Do what the TODO comment says at that site (its text is specific to the site), '
               'then delete the TODO line: it stays a manual item ("still to do, from an earlier '
               'run") until you do. If the file kept its legacy optimizer code, it still runs on '
               'the shim (`optim_compat`) meanwhile; rerun `optim-migrate rewrite` after the '
               'edit.'),
}

#: Context lines kept around each reported site in a fixture example.
CONTEXT = 2
#: At most this many excerpts per example.
MAX_EXCERPTS = 3


@dataclasses.dataclass(frozen=True)
class Example:
  """A before/after pair: where it comes from and the two sources."""
  source: str  # e.g. 'tests/fixtures/codemod/om007_annotations', or 'the rule table'
  before: str
  after: str
  options: str = ''  # e.g. '--unsafe-fixes'


def _rules() -> dict:
  from codemod.rules import RULES
  return RULES


def normalize_id(rule_id: str) -> str:
  return rule_id.strip().upper()


def family(rule_id: str) -> str:
  for prefix, name in FAMILIES.items():
    if rule_id.startswith(prefix):
      return f'{name} ({prefix}xx)'
  return f'{rule_id[:3]}xx'


def _field(rule, *names) -> str:
  for name in names:
    value = getattr(rule, name, None)
    if value:
      return str(value).strip()
  return ''


def _table_example(rule) -> Optional[Example]:
  """The table's own ``example`` field: (before, after), {'before', 'after'} or an object."""
  value = getattr(rule, 'example', None) or getattr(rule, 'examples', None)
  if not value:
    return None
  if isinstance(value, (list, tuple)) and value and not isinstance(value[0], str):
    value = value[0]  # several examples: the first
  if isinstance(value, dict):
    before, after = value.get('before', ''), value.get('after', '')
  elif isinstance(value, (list, tuple)) and len(value) == 2:
    before, after = value
  elif hasattr(value, 'before'):
    before, after = value.before, getattr(value, 'after', '')
  else:  # a single text: shown as it is
    before, after = str(value), ''
  options = getattr(rule, 'options', None) or {}
  flags = ' '.join('--' + key.replace('_', '-') + ('' if value is True else
                                                   f' {",".join(map(str, value))}')
                   for key, value in sorted(options.items()) if value)
  return Example('the rule table', textwrap.dedent(before).strip('\n'),
                 textwrap.dedent(after).strip('\n'), flags)


def _findings(folder: pathlib.Path, rule_id: str) -> list[int]:
  """Line numbers (of ``before.py``) where ``findings.txt`` has ``rule_id``."""
  path = folder / 'findings.txt'
  if not path.is_file():
    return []
  lines = []
  for row in path.read_text().splitlines():
    parts = row.split()
    if len(parts) >= 2 and parts[1] == rule_id:
      try:
        lines.append(int(parts[0].split(':')[0]))
      except ValueError:
        continue
  return sorted(set(lines))


def _options(folder: pathlib.Path) -> str:
  path = folder / 'options.json'
  if not path.is_file():
    return ''
  try:
    raw = json.loads(path.read_text())
  except ValueError:
    return ''
  flags = []
  for key, value in sorted(raw.items()):
    flag = '--' + key.replace('_', '-')
    if value is True:
      flags.append(flag)
    elif isinstance(value, (list, tuple)):
      flags.append(f'{flag} {",".join(map(str, value))}')
    elif value not in (False, None):
      flags.append(f'{flag} {value}')
  return ' '.join(flags)


def _string_spans(lines: list[str]) -> list[tuple[int, int]]:
  """``[(first, last)]`` 0-based line indices of the multi-line string literals in ``lines``."""
  import io
  import tokenize
  spans = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO('\n'.join(lines) + '\n').readline):
      if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
        spans.append((tok.start[0] - 1, tok.end[0] - 1))
  except (tokenize.TokenError, SyntaxError):
    pass
  return spans


def _trim(lines: list[str], start: int, stop: int) -> list[str]:
  """``lines[start:stop]``, moved off any multi-line string it would cut in two."""
  for first, last in _string_spans(lines):
    if first < start <= last:
      start = last + 1
    if first < stop <= last:
      stop = first
  return lines[start:max(start, stop)]


def _excerpts(before: list[str], after: list[str], lines: list[int]) -> tuple[str, str]:
  """The diff hunks of before -> after that touch ``lines`` (1-based, of ``before``)."""
  wanted = {n - 1 for n in lines}
  b_parts, a_parts = [], []
  matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
  for group in matcher.get_grouped_opcodes(CONTEXT):
    touched = False
    for tag, i1, i2, _, _ in group:
      if tag == 'equal':
        continue
      span = set(range(i1, i2)) if i2 > i1 else {i1}
      if span & wanted:
        touched = True
    if not touched:
      continue
    b_parts.append(_trim(before, group[0][1], group[-1][2]))
    a_parts.append(_trim(after, group[0][3], group[-1][4]))
    if len(b_parts) == MAX_EXCERPTS:
      break
  def join(parts):
    texts = ['\n'.join(line.rstrip() for line in p).strip('\n') for p in parts]
    return '\n# ...\n'.join(t for t in texts if t)
  return join(b_parts), join(a_parts)


def fixture_example(rule_id: str, fixtures: pathlib.Path = FIXTURES) -> Optional[Example]:
  """An excerpt of the shortest fixture showing ``rule_id`` at work, or None.

  Fixtures named ``<id lowercased>_*`` come first, then any fixture whose
  ``findings.txt`` reports the rule.
  """
  if not fixtures.is_dir():
    return None
  folders = [f for f in fixtures.iterdir() if (f / 'before.py').is_file()
             and (f / 'after.py').is_file()]
  size = lambda f: (len((f / 'before.py').read_text().splitlines()), f.name)
  named = sorted((f for f in folders if f.name.startswith(rule_id.lower() + '_')), key=size)
  others = sorted((f for f in folders if f not in named), key=size)
  for folder in named + others:
    lines = _findings(folder, rule_id)
    if not lines:
      continue
    before = (folder / 'before.py').read_text().splitlines()
    after = (folder / 'after.py').read_text().splitlines()
    b, a = _excerpts(before, after, lines)
    if not b and not a:
      continue
    rel = f'tests/fixtures/codemod/{folder.name}'
    return Example(rel, b, a, _options(folder))
  return None


def _block(code: str) -> str:
  fence = '````' if '```' in code else '```'
  return f'{fence}python\n{code}\n{fence}'


def rule_text(rule_id: str, fixtures: pathlib.Path = FIXTURES) -> str:
  """The Markdown documentation of one rule (``docs/rules/<id>.md`` is this text).

  Raises:
    KeyError: ``rule_id`` names no rule (the message names the closest known ids).
  """
  rules = _rules()
  key = normalize_id(rule_id)
  if key not in rules:
    from codemod.run_options import did_you_mean
    raise KeyError(f'unknown rule id {rule_id!r}; {did_you_mean(key, rules)}`optim-migrate rule` '
                   'lists every rule')
  rule = rules[key]
  safety = rule.safety
  out = [f'# {key}', '',
         f'**{safety}** · {family(key)}', '',
         rule.summary.strip(), '']
  why = _field(rule, 'why', 'rationale')
  if why:
    out += ['## Why', '', why, '']
  out += ['## Safety', '', SAFETY_TEXT.get(safety, f'`{safety}`.'), '']
  example = _table_example(rule) or fixture_example(key, fixtures)
  if example is not None:
    out += ['## Example', '']
    where = ('From the rule catalog' if example.source == 'the rule table'
             else f'From `{example.source}`')
    if example.options:
      where += f', rewritten with `{example.options}`'
    out += [where + ':', '']
    if example.after:
      out += ['Before:', '', _block(example.before), '', 'After:', '', _block(example.after), '']
    else:
      out += [_block(example.before), '']
  fix = _field(rule, 'fix', 'how_to_fix', 'manual_fix', 'by_hand')
  out += ['## How to fix by hand', '', fix or FIX_FALLBACK.get(safety, ''), '']
  out += ['## Turning it off', '',
          f'`optim-migrate rewrite --ignore {key} ...`, or `ignore = ["{key}"]` under '
          '`[tool.optim-migrate]` in `pyproject.toml`. An ignored rule leaves the output, the '
          'report and the exit status; a fix a file needs that is not selected keeps that file '
          'unchanged.', '']
  return '\n'.join(out)


def rule_list() -> str:
  rules = _rules()
  width = max(len(r.safety) for r in rules.values())
  return '\n'.join(f'{r.id}  {r.safety:<{width}}  {r.summary}' for r in rules.values())


def cmd_rule(args) -> int:
  rules = _rules()
  if args.all:
    text = '\n\n'.join(rule_text(i) for i in rules)
  elif args.id is None:
    text = rule_list()
  else:
    try:
      text = rule_text(args.id)
    except KeyError as e:
      print(f'rule: {e.args[0]}', file=sys.stderr)
      return EXIT_ERROR
  try:
    print(text)
    sys.stdout.flush()
  except BrokenPipeError:  # `optim-migrate rule --all | head`: the reader left, not an error
    import os
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  return EXIT_OK


def register(subparsers) -> None:
  import argparse
  p = subparsers.add_parser('rule', help="print a rule's documentation (as its docs page)",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('id', nargs='?', default=None, help='a rule id, e.g. OM009 (case-insensitive)')
  p.add_argument('--all', action='store_true', help="print every rule's text")
  p.set_defaults(func=cmd_rule)
