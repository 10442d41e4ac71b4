"""What ``optim-migrate rewrite`` and ``check`` print for CI: ``--output-format``,
``--statistics`` and ``--show-fixes`` (as ruff's), rendered in this one module.

Formats (``FORMATS``):

``full``
  Today's output (``codemod.runner`` prints it: the diffs or ``would rewrite`` lines on
  stdout, the open findings as ``path:line:col: OMxxx [safety] message`` on stderr).
``concise``
  One line per finding on stdout, fixed ones included: ``path:line:col: OMxxx [kind]
  message`` (:meth:`codemod.findings.Finding.format`; ``kind`` is ``fixed`` when the fix
  is applied (or, under ``--check`` / the diff, would be), else the rule's safety). A file
  error is its message on one line.
``json``
  The rows ``--report FILE.json`` writes (:meth:`Entry.row`, the schema is documented in
  ``docs/ci.md``), as one JSON array on stdout.
``github``
  GitHub Actions workflow commands, one per finding: ``::error`` for a finding that keeps
  its file on legacy code (``blocks``) or an unsafe fix left undone, and for a file error;
  ``::notice`` for an applied safe fix; ``::warning`` otherwise (a manual item, an unsafe
  fix applied with ``--unsafe-fixes``). Properties ``file``, ``line``, ``col``, ``title``.
``sarif``
  One SARIF 2.1.0 log on stdout: the rule catalog as ``tool.driver.rules``, a result per
  finding with ``physicalLocation`` (``artifactLocation.uri`` relative to the run root,
  ``uriBaseId`` ``%SRCROOT%``; ``region.startLine`` / ``startColumn``), file errors as
  ``invocations[0].toolExecutionNotifications``.

Notebooks: a finding's line and column count in its cell (``nb.ipynb:cell3:5:1``). The
``github`` annotation names the notebook file with no line (a line of the ``.ipynb`` JSON
is not what anyone reads) and starts its message with ``cell3:5:1:``; a SARIF result points
at the notebook file (no region) and names the cell as a *logical location*
(``{"name": "cell3", "kind": "notebookCell"}``) with ``properties.cell``, ``cellLine`` and
``cellColumn``.

The entries are built from the structured :class:`codemod.findings.Finding` objects
(:func:`entries_of`): no printed text is parsed back.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import re
import urllib.parse
from typing import Iterable, Mapping, Optional, Sequence

#: The ``--output-format`` values, ``full`` (today's output) first.
FORMATS = ('full', 'concise', 'json', 'github', 'sarif')
#: The formats ``optim-migrate check`` offers: its findings are numeric comparisons of a
#: pytree, with no source file and line, so ``github`` and ``sarif`` have nothing to point at.
CHECK_FORMATS = ('full', 'concise', 'json')

SARIF_VERSION = '2.1.0'
SARIF_SCHEMA = ('https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/'
                'sarif-schema-2.1.0.json')
#: Where the built docs site lives (its rule pages are ``<url>/rules/<id>.html``): the
#: SARIF rules' ``helpUri``. The environment variable overrides it; with neither, the rules
#: carry their page's text (``help``) and no ``helpUri``.
DOCS_URL: Optional[str] = None
DOCS_URL_ENV = 'OPTIM_MIGRATE_DOCS_URL'
TOOL_NAME = 'optim-migrate'


@dataclasses.dataclass(frozen=True)
class Entry:
  """One report entry: a finding at a site, or a file the run could not process.

  Attributes:
    path: the file as the run names it (for a notebook: the ``.ipynb`` file).
    line, col: 1-based position (a notebook: in its cell); ``None``: no position (a file
      error, an importer whose import line was not found).
    rule: the rule id; ``None`` for an error (the file could not be read, parsed,
      rewritten or written, or a named path does not exist).
    message: one line of text.
    applied: the fix is applied (``--write``), or would be (diff, ``--check``).
    blocks: the finding keeps its file on legacy optimizer code.
    cell: the notebook cell (counted from 0 over all cells), else ``None``.
  """
  path: str
  line: Optional[int]
  col: Optional[int]
  rule: Optional[str]
  message: str
  applied: bool = False
  blocks: bool = False
  cell: Optional[int] = None

  @property
  def safety(self) -> Optional[str]:
    from codemod.rules import RULES
    return RULES[self.rule].safety if self.rule else None

  @property
  def where(self) -> str:
    """``path``, or ``path:cell<N>`` in a notebook (the report's ``file``)."""
    return self.path if self.cell is None else f'{self.path}:cell{self.cell}'

  @property
  def is_error(self) -> bool:
    return self.rule is None

  def row(self) -> dict:
    """The ``--report`` row: ``file``, ``line``, ``column``, ``rule``, ``safety``,
    ``message``, ``applied``, ``blocks`` (``rule`` and ``safety`` are ``None`` for an
    error; the schema: ``docs/ci.md``)."""
    return {'file': self.where, 'line': self.line, 'column': self.col, 'rule': self.rule,
            'safety': self.safety, 'message': self.message, 'applied': self.applied,
            'blocks': self.blocks}

  def concise(self) -> str:
    """``path:line:col: OMxxx [kind] message`` (the error message alone for an error), the
    message shortened by :func:`short_message` (one line to read; the report and the
    ``full`` / ``json`` formats keep the whole note)."""
    if self.is_error:
      return self.message
    message = short_message(self.message)
    if self.line is None:
      return f'{self.where}: {self.rule} [{self.kind}] {message}'
    return f'{self.where}:{self.line}:{self.col}: {self.rule} [{self.kind}] {message}'

  @property
  def kind(self) -> str:
    """``fixed``, ``unsafe`` or ``manual`` (:func:`codemod.findings.kind`)."""
    from codemod.findings import kind
    return kind(self.applied, self.safety)

  @property
  def level(self) -> str:
    """``error``, ``warning`` or ``notice`` (the GitHub annotation; SARIF says ``note``)."""
    if self.is_error or (not self.applied and (self.blocks or self.safety == 'unsafe')):
      return 'error'
    if self.applied and self.safety == 'safe':
      return 'notice'
    return 'warning'


CONCISE_WIDTH = 200  # characters of a message ``concise`` prints before it shortens it


def short_message(message: str, width: int = CONCISE_WIDTH) -> str:
  """``message`` for one ``concise`` line: unchanged up to ``width`` characters; longer,
  its closing parenthetical note (the numerics note OM001 carries, say) becomes ``(...)``,
  and what is still too long is cut at a word with ``...``."""
  if len(message) <= width:
    return message
  if message.endswith(')'):
    depth = 0
    for i in range(len(message) - 1, -1, -1):
      depth += {')': 1, '(': -1}.get(message[i], 0)
      if depth == 0:
        if i > 0 and message[i - 1] == ' ':
          message = message[:i] + '(...)'
        break
  if len(message) <= width:
    return message
  return message[:width].rsplit(' ', 1)[0] + ' ...'


def sort_key(entry: 'Entry') -> tuple:
  """Entries in file order: path, notebook cell, line, column (an error, or an entry of
  the whole file, first)."""
  return (entry.path, entry.cell if entry.cell is not None else -1, entry.line or 0,
          entry.col or 0)


def entries_of(result) -> list[Entry]:
  """The entries of one :class:`codemod.engine.FileResult`: one per finding, or the error."""
  if result.error:
    return [Entry(result.path, None, None, None, result.error)]
  return [Entry(result.path, f.line, f.col, f.rule, f.message, f.fixed, f.blocks,
                None if result.cells is None else result.cells[i])
          for i, f in enumerate(result.findings)]


def entry_of_row(row: Mapping) -> Entry:
  """An entry from a row built as :meth:`Entry.row` builds them (``codemod.runner``'s rows
  for importers outside the run, OM125, which have no :class:`Finding`)."""
  return Entry(row['file'], row['line'], row['column'], row['rule'], row['message'],
               row['applied'], row.get('blocks', False))


def error_entry(path: str, message: str) -> Entry:
  return Entry(path, None, None, None, message)


# ---------------------------------------------------------------------------
# the formats


def render(fmt: str, entries: Sequence[Entry], root: Optional[pathlib.Path] = None) -> str:
  """The text ``--output-format fmt`` prints for ``entries`` (not ``full``: the runner
  prints that itself). ``root``: the run root SARIF URIs are relative to (default: the
  current directory).

  Raises:
    ValueError: ``fmt`` is not one of ``concise``, ``json``, ``github``, ``sarif``.
  """
  if fmt == 'concise':  # line formats, read by people: in file order
    return ''.join(e.concise() + '\n' for e in sorted(entries, key=sort_key))
  if fmt == 'json':
    return report_json(entries)
  if fmt == 'github':
    return ''.join(github_line(e) + '\n' for e in entries)
  if fmt == 'sarif':
    return json.dumps(sarif_log(entries, root), indent=1) + '\n'
  raise ValueError(f'no output format {fmt!r} to render here; valid: {FORMATS[1:]}')


def report_json(entries: Iterable[Entry]) -> str:
  """The ``--report`` file's text (and ``--output-format json``'s)."""
  return json.dumps([e.row() for e in entries], indent=1) + '\n'


def escape_data(text: str) -> str:
  """A workflow command's message: ``%``, ``\\r``, ``\\n`` as ``%25``, ``%0D``, ``%0A``."""
  return text.replace('%', '%25').replace('\r', '%0D').replace('\n', '%0A')


def escape_property(text: str) -> str:
  """A workflow command's property value: :func:`escape_data` plus ``:`` and ``,``."""
  return escape_data(text).replace(':', '%3A').replace(',', '%2C')


def github_line(entry: Entry) -> str:
  """``::<level> file=PATH,line=L,col=C,title=OMxxx::message`` (GitHub Actions workflow
  command; a notebook entry has no line: its message starts with ``cell<N>:L:C:``)."""
  props = [('file', entry.path)]
  message = entry.message
  if entry.cell is not None:
    if entry.line is not None:
      message = f'cell{entry.cell}:{entry.line}:{entry.col}: {message}'
  elif entry.line is not None:
    props += [('line', str(entry.line)), ('col', str(entry.col))]
  props.append(('title', entry.rule or f'{TOOL_NAME}: error'))
  text = ','.join(f'{k}={escape_property(v)}' for k, v in props)
  return f'::{entry.level} {text}::{escape_data(message)}'


# ---------------------------------------------------------------------------
# SARIF


def _version() -> str:
  import importlib.metadata
  try:
    return importlib.metadata.version('flax-optim-migrate')
  except importlib.metadata.PackageNotFoundError:
    return '0+unknown'


def _docs_url() -> Optional[str]:
  url = os.environ.get(DOCS_URL_ENV) or DOCS_URL
  return url.rstrip('/') if url else None


#: SARIF's level for each annotation level.
_SARIF_LEVEL = {'error': 'error', 'warning': 'warning', 'notice': 'note'}
#: A rule's default level by safety (a result's own level says what happened at the site).
_DEFAULT_LEVEL = {'safe': 'note', 'unsafe': 'error', 'manual': 'warning'}


def sarif_rules() -> list[dict]:
  """``tool.driver.rules``: every rule of the catalog (``codemod.rules.RULES``), in id order."""
  from codemod import rule_docs
  from codemod.rules import RULES
  base = _docs_url()
  out = []
  for rule_id, rule in RULES.items():
    entry = {'id': rule_id,
             'shortDescription': {'text': rule.summary},
             'fullDescription': {'text': rule.why or rule.summary},
             'help': {'text': rule.why or rule.summary,
                      'markdown': rule_docs.rule_text(rule_id)},
             'defaultConfiguration': {'level': _DEFAULT_LEVEL[rule.safety]},
             'properties': {'safety': rule.safety, 'family': rule.family}}
    if base:
      entry['helpUri'] = f'{base}/rules/{rule_id}.html'
    out.append(entry)
  return out


def artifact_uri(path: str, root: pathlib.Path) -> tuple[str, bool]:
  """``(uri, relative)``: ``path`` as a URI relative to ``root`` (percent-encoded, ``/``
  separated), or an absolute ``file://`` URI when it lies outside ``root``."""
  p = pathlib.Path(path)
  absolute = p if p.is_absolute() else root / p
  try:
    rel = pathlib.Path(os.path.normpath(absolute)).relative_to(os.path.normpath(root))
  except ValueError:
    return pathlib.Path(os.path.normpath(absolute)).as_uri(), False
  return urllib.parse.quote(rel.as_posix()), True


def _location(entry: Entry, root: pathlib.Path) -> dict:
  uri, relative = artifact_uri(entry.path, root)
  artifact = {'uri': uri, **({'uriBaseId': '%SRCROOT%'} if relative else {})}
  physical: dict = {'artifactLocation': artifact}
  if entry.line is not None and entry.cell is None:
    physical['region'] = {'startLine': entry.line, 'startColumn': entry.col or 1}
  location: dict = {'physicalLocation': physical}
  if entry.cell is not None:
    location['logicalLocations'] = [{'name': f'cell{entry.cell}',
                                     'fullyQualifiedName': entry.where,
                                     'kind': 'notebookCell'}]
  return location


def sarif_log(entries: Sequence[Entry], root: Optional[pathlib.Path] = None) -> dict:
  """The SARIF 2.1.0 log of ``entries`` (one run; see the module docstring)."""
  from codemod.rules import RULES
  root = (root or pathlib.Path.cwd()).absolute()
  index = {rule_id: i for i, rule_id in enumerate(RULES)}
  results, notifications = [], []
  for e in entries:
    if e.is_error:
      notifications.append({'level': 'error', 'message': {'text': e.message},
                            'locations': [_location(e, root)]})
      continue
    result = {'ruleId': e.rule, 'ruleIndex': index[e.rule], 'level': _SARIF_LEVEL[e.level],
              'message': {'text': e.message}, 'locations': [_location(e, root)],
              'properties': {'safety': e.safety, 'applied': e.applied, 'blocks': e.blocks}}
    if e.cell is not None:
      result['properties'].update(cell=e.cell, cellLine=e.line, cellColumn=e.col)
    results.append(result)
  run = {'tool': {'driver': {'name': TOOL_NAME, 'version': _version(),
                             'rules': sarif_rules()}},
         'originalUriBaseIds': {'%SRCROOT%': {'uri': root.as_uri() + '/'}},
         'columnKind': 'unicodeCodePoints',
         'invocations': [{'executionSuccessful': not notifications,
                          'toolExecutionNotifications': notifications}],
         'results': results}
  if _docs_url():
    run['tool']['driver']['informationUri'] = _docs_url() + '/'
  return {'$schema': SARIF_SCHEMA, 'version': SARIF_VERSION, 'runs': [run]}


# ---------------------------------------------------------------------------
# --statistics, --show-fixes


def statistics(entries: Iterable[Entry]) -> list[dict]:
  """Per rule id: ``{'rule', 'count', 'applied', 'safety', 'summary'}`` (``applied``: how
  many of them are fixed), most frequent first, ties by id (as ruff sorts them). File
  errors are not counted."""
  from codemod.rules import RULES
  counts = collections.Counter(e.rule for e in entries if not e.is_error)
  applied = collections.Counter(e.rule for e in entries if not e.is_error and e.applied)
  return [{'rule': r, 'count': n, 'applied': applied[r], 'safety': RULES[r].safety,
           'summary': RULES[r].summary}
          for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def statistics_text(entries: Iterable[Entry], fmt: str = 'full') -> str:
  """``--statistics``: the table (``count  rule  [safety]  summary``, one line per rule), or
  for ``fmt == 'json'`` the :func:`statistics` rows as a JSON array."""
  rows = statistics(entries)
  if fmt == 'json':
    return json.dumps(rows, indent=1) + '\n'
  width = max([len(str(r['count'])) for r in rows] + [1])
  return ''.join(f"{r['count']:>{width}}\t{r['rule']}\t[{r['safety']}]\t{r['summary']}\n"
                 for r in rows)


_DEF_FIX = re.compile(r'^flax\.optim\.(\w+)\(\.\.\.\) -> ')


def numeric_note(entry: Entry) -> Optional[str]:
  """For an applied def conversion (OM001's ``flax.optim.Adam(...) -> <Optax> (<distance>:
  <details>)``): ``"Adam: <distance>"``, the distance from legacy without its details
  (``bitwise equal to legacy``, ``measured <= 6 ulp from legacy``, ``stock Optax, preferred:
  measured intrinsic``, ...); None for any other entry."""
  match = _DEF_FIX.match(entry.message) if entry.applied and not entry.is_error else None
  if match is None or not entry.message.endswith(')'):
    return None
  depth = 0
  for i in range(len(entry.message) - 1, -1, -1):  # the closing parenthetical
    depth += {')': 1, '(': -1}.get(entry.message[i], 0)
    if depth == 0:
      break
  parts = entry.message[i + 1:-1].split(': ')
  head = ': '.join(parts[:2]) if parts[0].startswith('stock Optax') else parts[0]
  return f'{match.group(1)}: {head}'


def show_fixes_text(entries: Iterable[Entry], verb: str = 'Fixed') -> str:
  """``--show-fixes``: the fixes applied, per file (``verb``: ``Fixed``, or ``Would fix``
  when nothing is written), each rule with its count and summary, then each def converted
  with its distance from legacy (:func:`numeric_note`; helper-39: it showed only in the
  ``json`` format and the report)."""
  from codemod.rules import RULES
  per_file: dict = {}
  notes: dict = {}
  for e in entries:
    if not e.is_error and e.applied:
      per_file.setdefault(e.where, collections.Counter())[e.rule] += 1
      note = numeric_note(e)
      if note is not None:
        notes.setdefault(e.where, []).append(f'      line {e.line}: {note}')
  total = sum(sum(c.values()) for c in per_file.values())
  if not total:
    return f'{verb} 0 findings.\n' if verb == 'Fixed' else 'No fixes to apply.\n'
  lines = [f'{verb} {total} finding(s) in {len(per_file)} file(s):']
  for where, counts in per_file.items():
    lines.append(f'- {where}:')
    lines += [f'    {n} x {rule} ({RULES[rule].summary})' for rule, n in sorted(counts.items())]
    if where in notes:
      lines += ['    numerics (the whole note: --output-format json or --report):', *notes[where]]
  return '\n'.join(lines) + '\n'


# ---------------------------------------------------------------------------
# optim-migrate check


def check_row(label: str, legacy: str, tx: str, report) -> dict:
  """One ``check --output-format json`` row: the comparison ``report``
  (:class:`equivalence_tests.checker.Report`) of ``legacy`` (the def expression) against
  ``tx`` (the Optax expression), ``label`` its name (a ``[[tool.optim-migrate.check]]``
  entry's name or index; ``''`` on the command line)."""
  worst = report.worst
  return {'name': label, 'legacy': legacy, 'tx': tx, 'ok': bool(report.ok),
          'max_ulp': float(report.max_ulp), 'bound': float(report.max_ulp_bound),
          'steps': int(report.steps), 'grads': report.grads,
          'runs': [f'{m}x{n}' for m, n in report.runs],
          'worst': None if worst is None else {
              'leaf': worst.path, 'index': list(worst.index), 'step': int(worst.step),
              'mode': worst.mode, 'devices': int(worst.n_devices),
              'legacy': float(worst.legacy_value), 'tx': float(worst.tx_value),
              'ulp': float(worst.ulp)},
          'per_leaf': {k: float(v) for k, v in report.per_leaf.items()},
          'replicas_not_bitwise': [f'{m}x{n} {who}'
                                   for (m, n, who), ok in report.replicas_bitwise.items()
                                   if not ok],
          'notes': list(report.notes)}


def check_concise(row: Mapping) -> str:
  """``check``'s one line per comparison: ``NAME: OK|DIFFERS max X ulp (bound B)`` and
  where the worst difference is."""
  status = 'OK' if row['ok'] else 'DIFFERS'
  text = f"{row['name'] or 'check'}: {status} max {row['max_ulp']:g} ulp (bound {row['bound']:g})"
  if row['worst']:
    w = row['worst']
    text += (f": worst {w['leaf']}{w['index']} at step {w['step']}, {w['mode']} on "
             f"{w['devices']} device(s)")
  if row['replicas_not_bitwise']:
    text += '; replicas not bitwise equal: ' + ', '.join(row['replicas_not_bitwise'])
  return text


def render_check(fmt: str, rows: Sequence[Mapping]) -> str:
  """``check --output-format fmt`` for ``rows`` (:func:`check_row`): ``json``, one array;
  ``concise``, one :func:`check_concise` line per row.

  Raises:
    ValueError: ``fmt`` is not ``json`` or ``concise`` (``full`` is the tables ``check``
      prints as it goes; ``github`` and ``sarif`` need a source location).
  """
  if fmt == 'json':
    return json.dumps(list(rows), indent=1) + '\n'
  if fmt == 'concise':
    return ''.join(check_concise(row) + '\n' for row in rows)
  raise ValueError(f'check has no output format {fmt!r} to render; valid: {CHECK_FORMATS[1:]}')
