"""Report entries (:class:`Finding`) and the ``# TODO(optim-migrate): ...`` comments they become.

A finding is structured: its rule, where it is, whether the fix was applied, and
whether it forces the file to keep its legacy optimizer code (``blocks``). The
keep-legacy decision reads ``blocks`` (``codemod.plan``); the message is only
rendered text, for people. A blocking message usually ends with
:data:`KEEPS_LEGACY` (``kept_note``), as the TODO lines have always said.
"""
from __future__ import annotations

import dataclasses
import difflib
import io
import re
import tokenize
from typing import Callable, Iterator, Mapping, Optional

from codemod.rules import RULES, TODO_PREFIX

#: Ends the message of a finding that keeps its file on legacy code (the TODO text users see).
KEEPS_LEGACY = '(this file keeps its legacy optimizer code)'
#: A TODO line this codemod wrote (``# TODO(optim-migrate): OM117: message``).
TODO_LINE = re.compile(r'^([ \t]*)' + re.escape(TODO_PREFIX) + r'(OM\d{3}): (.*?)[ \t]*$', re.M)

#: Longest code excerpt a message quotes (longer ones are cut, multi-line ones folded).
EXCERPT_CHARS = 80
_QUOTED = re.compile(r'`([^`]*)`')


def one_line(message: str) -> str:
  """``message`` as one line, for a ``# TODO`` comment and a report entry.

  A quoted source excerpt (between backticks) that spans lines (a call written
  over several lines) is folded onto one line and, past :data:`EXCERPT_CHARS`
  characters, cut with ``...``; any other line break becomes a space. A comment
  holding a line break would not be a comment (LibCST refuses to build it).
  """
  def fold(match):
    text = match.group(1)
    if '\n' not in text and '\r' not in text and len(text) <= EXCERPT_CHARS:
      return match.group(0)
    text = ' '.join(text.split())
    if len(text) > EXCERPT_CHARS:
      text = text[:EXCERPT_CHARS - 3].rstrip() + '...'
    return f'`{text}`'
  return ' '.join(_QUOTED.sub(fold, message).splitlines())


@dataclasses.dataclass
class Finding:
  """One report entry: ``path:line:col: rule [safety] message``.

  Attributes:
    line, col: 1-based position of the site in the file (a notebook: in its cell).
    rule: the rule id (``codemod.rules.RULES``).
    message: the rendered text (the TODO comment says ``<rule>: <message>``).
    fixed: the fix was applied (False: a manual item, a TODO in the file).
    blocks: this finding forces the file to keep its legacy optimizer code.
    reason: ``message`` without its closing :data:`KEEPS_LEGACY` note (``None``: the
      message has none); what another module's TODO quotes as the reason.
    data: the values the message was rendered from (names, excerpts, the other
      module's function), for tools that read the report.
  """
  line: int
  col: int
  rule: str
  message: str
  fixed: bool
  blocks: bool = False
  reason: Optional[str] = None
  data: Mapping[str, object] = dataclasses.field(default_factory=dict)

  @property
  def safety(self) -> str:
    return RULES[self.rule].safety

  @property
  def why(self) -> str:
    """``<rule>: <reason>``: how another file's message names this finding."""
    return f'{self.rule}: {self.message if self.reason is None else self.reason}'

  def format(self, path: str) -> str:
    return f'{path}:{self.line}:{self.col}: {self.rule} [{kind(self.fixed, self.safety)}] ' \
        f'{self.message}'

  def moved(self, line: int) -> 'Finding':
    """The same finding at another line (a notebook cell's own numbering)."""
    return dataclasses.replace(self, line=line)


def kind(applied: bool, safety: str) -> str:
  """What a finding's line says it is: ``fixed`` when its fix is applied (or would be);
  ``unsafe`` when only ``--unsafe-fixes`` would apply it; else ``manual``, a TODO to do by
  hand (a finding of a safe rule left unapplied is one: the codemod flagged that site)."""
  return 'fixed' if applied else ('unsafe' if safety == 'unsafe' else 'manual')


#: Above this many lines, difflib's popularity heuristic (``autojunk``) is on: without it a
#: file of many repeated blocks (helper-27: 400 copies of one function, 220 KB) took 61 s to
#: match, with it 0.5 s, to the same positions; smaller files keep the exact matching.
EXACT_MATCH_LINES = 2000


def line_opcodes(a: list, b: list) -> list:
  """``difflib.SequenceMatcher(None, a, b).get_opcodes()`` of two lists of lines
  (:data:`EXACT_MATCH_LINES`)."""
  return difflib.SequenceMatcher(None, a, b,
                                 autojunk=len(a) > EXACT_MATCH_LINES).get_opcodes()


def line_map(before: str, after: str) -> Callable[[int], int]:
  """``where(line)``: the 1-based line of ``after`` that holds line ``line`` of ``before``
  (``difflib``'s matching blocks of lines). A line the rewrite kept (a flagged statement
  under its new TODO comment) maps exactly; a line inside a rewritten block maps to the same
  offset in its replacement's code lines (its new TODO comments skipped: a converted call
  with a TODO above it maps to the call), cut to the replacement's last line; a deleted line
  to the line that follows the deletion. Out-of-range lines are clamped to ``after``'s
  lines."""
  a, b = before.splitlines(), after.splitlines()
  ops = line_opcodes(a, b)
  last = max(len(b), 1)

  def where(line: int) -> int:
    i = line - 1
    for tag, i1, i2, j1, j2 in ops:
      if i1 <= i < i2:
        if tag == 'equal':
          return j1 + (i - i1) + 1
        code = [j for j in range(j1, j2) if not TODO_LINE.match(b[j])]
        if code:
          return code[min(i - i1, len(code) - 1)] + 1
        return min(j1 + min(i - i1, max(j2 - j1 - 1, 0)) + 1, last)
    return min(max(line, 1), last)
  return where


def render(text: str, kept_note: bool) -> tuple[str, Optional[str]]:
  """``(message, reason)`` of a flag: ``text`` on one line, with the :data:`KEEPS_LEGACY`
  note appended when ``kept_note``."""
  if not kept_note:
    return one_line(text), None
  return one_line(f'{text} {KEEPS_LEGACY}'), one_line(text)


def without_note(message: str) -> str:
  """``message`` (an earlier run's TODO text) without its closing :data:`KEEPS_LEGACY` note."""
  return message.replace(' ' + KEEPS_LEGACY, '')


def todo_text(rule: str, message: str) -> str:
  """The comment line a manual finding writes into the file."""
  return f'{TODO_PREFIX}{rule}: {message}'


def stale_todo(comment: str) -> bool:
  """``comment`` is a TODO an earlier run wrote saying the file keeps its legacy code (a run
  that converts the file deletes it). Read from the file's own comments: the only record of
  an earlier run's verdict is the text it wrote."""
  return comment.startswith(TODO_PREFIX) and comment.endswith(KEEPS_LEGACY)


def todo_comments(source: str) -> Iterator[tuple[int, int, str, str]]:
  """``(line, column, rule, message)`` of the comments (not string contents) that are a
  TODO this codemod wrote; none when the source does not tokenize."""
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (tokenize.TokenError, SyntaxError):
    return
  for tok in tokens:
    if tok.type == tokenize.COMMENT and (found := TODO_LINE.match(tok.line.rstrip('\r\n'))):
      if tok.start[1] == len(found.group(1)):  # the whole line is the comment
        yield tok.start[0], tok.start[1] + 1, found.group(2), found.group(3)
