"""Per-test results of an example run (pytest's JUnit XML) and the summary table.

Pure Python (no jax, no TF): tests/test_examples_harness.py covers it.
"""
from __future__ import annotations

import dataclasses
import pathlib
import xml.etree.ElementTree as ET


@dataclasses.dataclass
class TestResult:
  name: str               # 'file.py::Class::test' (file '' when pytest did not say)
  outcome: str            # 'passed' | 'failed' | 'error' | 'skipped'
  first_line: str = ''    # first line of the failure's message (the exception line where it has one)


@dataclasses.dataclass
class RunResult:
  example: str
  variant: str
  tests: list[TestResult]
  status: str = 'ok'      # 'ok' | 'timeout' | 'no-tests' | 'crashed: <why>'
  patches_used: list[str] = dataclasses.field(default_factory=list)
  measured: str = ''      # when and against which codemod ('2026-12-03 01:10, codemod at 2f985a3'); '' = not recorded
  seconds: float = 0.0    # wall time of the pytest run

  def passed(self) -> int:
    return sum(t.outcome == 'passed' for t in self.tests)

  def collected(self) -> int:
    """Test cases that ran (a collection error of a file counts as one failed item)."""
    return sum(t.outcome != 'skipped' for t in self.tests)


def _first_line(elem: ET.Element) -> str:
  """The exception line of a JUnit failure: its message, else the text's last 'E ' line."""
  text = elem.text or ''
  e_lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith('E ')]
  exc = [ln for ln in e_lines if _looks_like_exception(ln)]
  if exc:
    return exc[0][:300]
  msg = (elem.get('message') or '').strip()
  if msg:
    return msg.splitlines()[0][:300]
  if e_lines:
    return e_lines[0][:300]
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  return lines[-1][:300] if lines else ''


def _looks_like_exception(line: str) -> bool:
  head = line.split(':', 1)[0].strip()
  return bool(head) and ' ' not in head and (head.endswith('Error') or head.endswith('Exception')
                                            or head in ('KeyboardInterrupt', 'SystemExit'))


def parse_junit(path: pathlib.Path) -> list[TestResult]:
  """Read pytest's ``--junitxml`` file.

  Raises:
    ValueError: the file is not JUnit XML (names the file).
  """
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as e:
    raise ValueError(f'{path}: not JUnit XML: {e}') from e
  out = []
  for case in root.iter('testcase'):
    cls, name = case.get('classname', ''), case.get('name', '')
    if not cls:
      full = name      # a module that failed at collection: classname '', name = the module
    else:
      # xunit1: classname 'train_test.TrainTest' (or 'train_test' for a function), file 'train_test.py'
      mod, _, klass = cls.rpartition('.') if '.' in cls else (cls, '', '')
      file = case.get('file') or f'{mod.replace(".", "/")}.py'
      full = f'{file}::{klass}::{name}' if klass else f'{file}::{name}'
    outcome, first = 'passed', ''
    for tag in ('failure', 'error', 'skipped'):
      elem = case.find(tag)
      if elem is not None:
        outcome = {'failure': 'failed', 'error': 'error', 'skipped': 'skipped'}[tag]
        first = _first_line(elem) if tag != 'skipped' else (elem.get('message') or '')
        break
    out.append(TestResult(full, outcome, first))
  return out


def cell(run: RunResult | None, expected: int | None) -> str:
  """One table cell: 'passed/expected', with the run's status where it is not ok."""
  if run is None:
    return 'not run'
  total = expected if expected is not None else run.collected()
  text = f'{run.passed()}/{total}'
  if run.status != 'ok':
    text += f' ({run.status})'
  return text


def file_of(t: TestResult) -> str:
  """The test module a result belongs to ('train_test'), for results and collection errors alike."""
  head = t.name.split('::', 1)[0]
  return head[:-3] if head.endswith('.py') else head


def is_collection_error(t: TestResult) -> bool:
  """pytest records a module that failed to import as one error item named after the module."""
  return '::' not in t.name and t.outcome == 'error'


def expected_counts(runs: list[RunResult]) -> dict[str, int]:
  """Per example, the number of test cases it has: for each test module, the most any variant ran.

  A module that failed at collection in every variant counts as 1 (its item).
  """
  per_file: dict[tuple[str, str], int] = {}
  for r in runs:
    counts: dict[str, int] = {}
    for t in r.tests:
      if t.outcome == 'skipped':
        continue
      key = file_of(t)
      counts.setdefault(key, 0)
      if not is_collection_error(t):
        counts[key] += 1
    for key, n in counts.items():
      k = (r.example, key)
      per_file[k] = max(per_file.get(k, 0), n)
  out: dict[str, int] = {}
  for (ex, _), n in per_file.items():
    out[ex] = out.get(ex, 0) + max(n, 1)
  return out


def table(runs: list[RunResult], variants: list[str], examples: list[str]) -> str:
  """Markdown table: one row per example, one column per variant ('passed/expected')."""
  exp = expected_counts(runs)
  by = {(r.example, r.variant): r for r in runs}
  head = '| example | ' + ' | '.join(variants) + ' |'
  rule = '|---|' + '---|' * len(variants)
  rows = [head, rule]
  for ex in examples:
    rows.append(f'| {ex} | ' + ' | '.join(cell(by.get((ex, v)), exp.get(ex)) for v in variants) + ' |')
  return '\n'.join(rows)


def failures(runs: list[RunResult]) -> str:
  """Markdown list of every failing test with its first error line, per example and variant."""
  lines = []
  for r in runs:
    bad = [t for t in r.tests if t.outcome in ('failed', 'error')]
    if not bad and r.status == 'ok':
      continue
    lines.append(f'- **{r.example} / {r.variant}**' + (f' ({r.status})' if r.status != 'ok' else ''))
    for t in bad:
      lines.append(f'  - `{t.name}`: {t.outcome}: `{t.first_line}`')
  return '\n'.join(lines)


def provenance(runs: list[RunResult]) -> str:
  """Markdown list: for each (example, variant) cell, when it was measured and how long it ran,
  so a table merged from several invocations says which cells are current."""
  groups: dict[str, list[str]] = {}
  for r in runs:
    key = r.measured or 'not recorded (an earlier session)'
    groups.setdefault(key, []).append(f'{r.example} / {r.variant}' + (f' ({r.seconds:.0f} s)' if r.seconds else ''))
  return '\n'.join(f'- {when}: {", ".join(cells)}' for when, cells in sorted(groups.items(), reverse=True))
