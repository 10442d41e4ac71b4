"""Rewrite Jupyter notebooks (``.ipynb``) cell by cell.

All code cells are rewritten together, as one module (so an import in the
first cell resolves a name in the tenth), separated by marker statements that
no rule touches, then split back. IPython syntax (``%magic``, ``!shell``,
``x?``) is masked as a ``pass`` statement carrying a marker and restored
verbatim; ``%%cell`` magics are left alone. Outputs, metadata and markdown
cells are kept. Findings are reported as ``notebook.ipynb:cell<N>:<line>:<col>``
(``N`` counts every cell from 0, as the notebook lists them). IPython syntax that
mentions flax.optim cannot be rewritten, so it is flagged and the notebook is
left as it is (never half-migrated). ``%time`` / ``%timeit`` / ``%prun`` lines
are rewritten (their columns are counted without the magic).
"""
from __future__ import annotations

import json
import re

from codemod import legacy_api
from codemod.findings import Finding
from codemod.rules import Options

_CELL = '__optim_migrate_cell__ = {}\n'
_CELL_RE = re.compile(r'^__optim_migrate_cell__ = (\d+)\n', re.M)
_MASK = 'pass  # __optim_migrate_masked_{}__'
_MASK_RE = re.compile(r'^([ \t]*)pass  # __optim_migrate_masked_(\d+)__$', re.M)
_MAGIC = re.compile(r'^\s*([%!?]|\w+\s*=\s*[%!])|\?\s*$')


class NotebookError(ValueError):
  """A file that is not a notebook this module can read (the message says why)."""


_TIMED = re.compile(r'^([ \t]*)(%(?:time|timeit|prun)[ \t]+)(?!-)(\S.*)$')
_TIMED_TAG = '  # __optim_migrate_prefix_{}__'
_TIMED_RE = re.compile(r'^([ \t]*)(.*?)  # __optim_migrate_prefix_(\d+)__$', re.M)


def _mask(source: str, masked: list[str], prefixes: list[str], legacy_lines: list[int]) -> str:
  """IPython lines -> Python: ``%time stmt`` keeps ``stmt`` (tagged), others become ``pass``.

  ``legacy_lines`` gets the (1-based) lines of masked IPython that mention flax.optim markers.
  """
  lines = []
  continued = None  # the indent of a masked line that ends in a backslash
  for n, line in enumerate(source.split('\n'), 1):
    timed = _TIMED.match(line)
    if continued is None and timed and '#' not in timed.group(3):
      lines.append(timed.group(1) + timed.group(3) + _TIMED_TAG.format(len(prefixes)))
      prefixes.append(timed.group(2))
    elif continued is not None or _MAGIC.search(line):
      # a shell or magic line, or its continuation (`!cmd \` then `  --flag`), each
      # masked at the first line's indent, so blocks around it still parse
      indent = line[:len(line) - len(line.lstrip())] if continued is None else continued
      lines.append(indent + _MASK.format(len(masked)))
      masked.append(line)
      if legacy_api.mentions_legacy(line):
        legacy_lines.append(n)
      continued = indent if line.endswith('\\') else None
    else:
      lines.append(line)
  return '\n'.join(lines)


def _ipython_finding(line: int, what: str) -> Finding:
  return Finding(line, 1, 'OM107', f'{what} may use the flax.optim API (it names `optim`, '
                                   '`.apply_gradient` or an Optimizer member such as `.target`) '
                                   'and is IPython syntax, not Python: the codemod cannot rewrite '
                                   'it, so the notebook is left as it is; convert the line by '
                                   'hand (or make it Python), then rerun', False, blocks=True)


def rewrite_notebook(text: str, path: str, options: Options | None, rewrite_source):
  """Rewrite the code cells of notebook JSON ``text``.

  ``rewrite_source(source, path, options)``: the codemod on one module's text
  (``codemod.engine.rewrite_source``), run on the code cells joined.

  Returns:
    ``(new_text, findings, error)``: the notebook JSON (unchanged text when
    nothing changed), findings as ``(cell, Finding)`` pairs, and an error
    message (``path:cell<N>:line:col: ...``) or None.

  Raises:
    NotebookError: not JSON, or no ``cells`` list.
  """
  try:
    nb = json.loads(text)
  except json.JSONDecodeError as e:
    raise NotebookError(f'{path}:{e.lineno}:{e.colno}: not a notebook: {e.msg}') from e
  if not isinstance(nb, dict) or not isinstance(nb.get('cells'), list):
    raise NotebookError(f'{path}: not a notebook: no "cells" list')
  masked: list[str] = []
  prefixes: list[str] = []
  ipython: list = []  # (cell, Finding) for IPython syntax that mentions flax.optim
  parts, starts, code_cells = [], {}, []
  line = 1
  for i, cell in enumerate(nb['cells']):
    if not isinstance(cell, dict):
      raise NotebookError(f'{path}:cell{i}: not a notebook: a cell is not an object')
    if cell.get('cell_type') != 'code':
      continue
    src = cell.get('source', '')
    if isinstance(src, list) and all(isinstance(s, str) for s in src):
      src = ''.join(src)
    if not isinstance(src, str):
      raise NotebookError(f'{path}:cell{i}: not a notebook: "source" is not a string or a list '
                          'of strings')
    if src.lstrip().startswith('%%'):
      if legacy_api.mentions_legacy(src):
        ipython.append((i, _ipython_finding(1, 'this %% cell magic')))
      continue  # a cell magic: not Python
    legacy_lines: list[int] = []
    body = _mask(src, masked, prefixes, legacy_lines)
    ipython.extend((i, _ipython_finding(n, 'this IPython line')) for n in legacy_lines)
    if not body.endswith('\n'):
      body += '\n'
    header = _CELL.format(i)
    parts.append(header + body)
    starts[i] = line + 1
    line += 1 + body.count('\n')
    code_cells.append(i)
  if ipython:  # never half-migrate: legacy code the codemod cannot see keeps the notebook legacy
    return text, ipython, None
  if not code_cells:
    return text, [], None
  module = ''.join(parts)
  result = rewrite_source(module, path, options)

  def where(lineno):
    cell = max((c for c in code_cells if starts[c] <= lineno), default=code_cells[0])
    return cell, lineno - starts[cell] + 1

  findings = []
  for f in result.findings:
    cell, ln = where(f.line)
    findings.append((cell, f.moved(ln)))
  if result.error:
    m = re.match(r'.*?:(\d+):(\d+): (.*)', result.error)
    if m:
      cell, ln = where(int(m.group(1)))
      return text, findings, f'{path}:cell{cell}:{ln}:{m.group(2)}: {m.group(3)}'
    return text, findings, result.error
  if not result.changed:
    return text, sorted(findings, key=lambda cf: (cf[0], cf[1].line)), None
  new = _MASK_RE.sub(lambda mm: masked[int(mm.group(2))], result.new)
  new = _TIMED_RE.sub(lambda mm: mm.group(1) + prefixes[int(mm.group(3))] + mm.group(2), new)
  pieces = _CELL_RE.split(new)
  head, rest = pieces[0], pieces[1:]
  new_sources = {int(rest[k]): rest[k + 1] for k in range(0, len(rest), 2)}
  if head.strip():  # imports added before the first marker belong to the first code cell
    new_sources[code_cells[0]] = head + new_sources.get(code_cells[0], '')
  for i in code_cells:
    cell = nb['cells'][i]
    old = cell.get('source', '')
    old_text = ''.join(old) if isinstance(old, list) else old
    src = new_sources.get(i, '')
    trailing = len(old_text) - len(old_text.rstrip('\n'))
    if len(src) - len(src.rstrip('\n')) > trailing:  # (LibCST's blank line after added imports)
      src = src.rstrip('\n') + '\n' * trailing
    if src != old_text:
      cell['source'] = src.splitlines(keepends=True) if isinstance(old, list) else src
  indent, separators = 1, None
  m = re.match(r'\{\s*\n( +)"', text)
  if m:
    indent = len(m.group(1))
  elif re.match(r'\s*\{\s*"', text):  # saved on one line (helper-19): kept on one line
    indent = None
    separators = (',', ':') if re.match(r'\s*\{\s*"[^"]*":\S', text) else None
  out = json.dumps(nb, indent=indent, separators=separators, ensure_ascii=False) + (
      '\n' if text.endswith('\n') else '')
  return out, sorted(findings, key=lambda cf: (cf[0], cf[1].line)), None
