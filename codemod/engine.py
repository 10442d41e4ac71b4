"""One file through the codemod: prefilter, parse, facts, plan, rewrite, check.

    text --prefilter--> parse --codemod.facts--> facts --codemod.plan--> plan
         --codemod.rewrite--> new module (+ imports) --CPython parse--> FileResult

Per-file isolation: a file that cannot be read, parsed or rewritten is
reported (exit status 2) and left untouched; a rule family that fails is named
with the site it failed at (``codemod.failures``); the others files are still
processed. Output is re-parsed before it is written, and written through a
temporary file in the same directory plus ``os.replace``, so a file is never
half-written.
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
import functools
import pathlib
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext

from codemod import deep
from codemod import facts as facts_lib
from codemod import legacy_api, prefilter, shim_imports, undefined
from codemod.failures import RuleFailure
from codemod.modern import rewrite as om2xx
from codemod.findings import TODO_PREFIX, Finding, todo_comments
from codemod.plan import make_plan
from codemod.rewrite import apply_plan
from codemod.rules import Options
from codemod.result import FileResult  # noqa: F401 - re-exported
from codemod.rules.imports import import_finding
from codemod.sources import SourceFile, decode_source, parse, read_source, write_atomic  # noqa: F401

#: The prefilters and the result class live in light modules (no LibCST: a run whose files
#: are all cache hits loads neither), kept here for their callers.
may_need_rewrite = legacy_api.may_need_rewrite
wanted, has_todos = prefilter.wanted, prefilter.has_todos
_flax_optim_wanted = prefilter.flax_optim_wanted


def rewrite_source(source: str, path: str = '<string>',
                   options: Options | None = None, flow=None) -> FileResult:
  """Rewrite one module's source text; never raises for bad input.

  ``flow``: a :class:`codemod.flow.Flow` (the tree's optimizer factories and
  this file's module name), or None (no cross-module information, e.g. stdin).

  Returns:
    A :class:`FileResult`; ``error`` is set (``path:line:col: message``) when
    the source does not parse or the rewrite failed.
  """
  text = shim_imports.analysed(source)
  options = _options(options, source, text)
  result = FileResult(path, text)
  if not _flax_optim_wanted(text, flow):
    result.new = text
  else:
    try:
      module = parse(text)
    except cst.ParserSyntaxError as e:
      result.error = parse_error(path, text, e)
      return _put_back(result, source, text)
    result = rewrite_parsed(module, text, path, options, flow)
  result = _put_back(result, source, text)
  # the OM2xx family (removed JAX / Flax APIs, codemod.modern) on what that pass left
  return open_todos(_names_checked(om2xx.apply(result, options, parse_error)), options)


def _names_checked(result: FileResult) -> FileResult:
  """``result``, or an internal error leaving the file as it is when its rewrite uses a name
  no binding reaches that the original did not (``codemod.undefined``)."""
  if result.error is None and result.changed:
    why = undefined.problem(result.original, result.new)
    if why:
      result.error = f'{result.path}: internal error, in the rewrite {why}; file left as is'
      result.new = None
  return result


def open_todos(result: FileResult, options: Options | None) -> FileResult:
  """Add a manual item for each TODO an earlier run wrote that this run did not raise
  again (e.g. after the file was converted and no longer imports flax.optim): ``--check``
  keeps failing until the TODO is dealt with and deleted."""
  if result.error or TODO_PREFIX not in result.original:
    return result
  options = options or Options()
  raised = {(f.rule, f.message) for f in result.findings if not f.fixed}
  in_new = _todo_index(result.new if result.new is not None else result.original)
  for line, col, rule, message in todo_comments(result.original):
    if (rule, message) in raised or not options.enabled(rule):
      continue
    if not in_new(f'{rule}: {message}'):
      continue  # this run removed it (a stale "keeps its legacy code" TODO)
    result.findings.append(Finding(line, col, rule,
                                   f'still to do, from an earlier run: {message}', False))
  return result


def _todo_index(text: str):
  """A test of ``f'{TODO_PREFIX}{rest}' in text`` for a one-line ``rest``, built in one pass
  (a search of the whole text per TODO was quadratic in files with thousands of them): the
  text after each ``TODO_PREFIX`` up to its line's end, sorted; ``rest`` is in ``text`` iff
  one of those starts with it (they sort together right after ``rest``)."""
  tails, start = [], text.find(TODO_PREFIX)
  while start >= 0:
    begin = start + len(TODO_PREFIX)
    end = text.find('\n', begin)
    tails.append(text[begin:] if end < 0 else text[begin:end])
    start = text.find(TODO_PREFIX, start + 1)
  tails.sort()

  def found(rest: str) -> bool:
    i = bisect.bisect_left(tails, rest)
    return i < len(tails) and tails[i].startswith(rest)
  return found


def plan_parsed(module: cst.Module, source: str, options: Options | None = None, flow=None,
                cache: Optional[dict] = None):
  """``(analysis, plan)`` of a parsed module: what its rewrite will do, nothing rewritten.

  Raises:
    codemod.failures.RuleFailure: a rule family failed while planning.
  """
  options = options or Options()
  key = ('plan', options)
  if cache is not None and key in cache and cache[key][0] == flow:
    return cache[key][1]  # planned already, with the same flow (the cross-module pre-pass)
  def plan():
    analysis = facts_lib.analyze(module, source, flow, cache)
    return analysis, make_plan(analysis, options)
  planned = deep.retry_deep(plan)  # (a 600-term sum: deeper than the default limit)
  if cache is not None:
    cache[key] = (flow, planned)
  return planned


def rewrite_parsed(module: cst.Module, source: str, path: str,
                   options: Options | None = None, flow=None,
                   cache: Optional[dict] = None, planned=None) -> FileResult:
  """:func:`rewrite_source` after the parse (``module`` is ``source`` parsed; ``cache``:
  see :func:`codemod.facts.analyze`; ``planned``: its :func:`plan_parsed`, when known)."""
  options = options or Options()
  result = FileResult(path, source)
  try:
    analysis, plan = planned or plan_parsed(module, source, options, flow, cache)
    _summarize(result, plan)
    if plan.verdict == 'untouched':
      result.new = source
      result.findings = plan.findings
      return result
    new_source = deep.retry_deep(
        lambda: apply_plan(analysis, plan, CodemodContext(filename=path)).code)
  except RuleFailure as e:
    result.error = (f'{path}:{e.line}:{e.col}: rule family {e.family} failed: '
                    f'{type(e.error).__name__}: {e.error}; file left as is')
    return result
  except Exception as e:  # noqa: BLE001 - one file's failure must not stop the run
    result.error = f'{path}: codemod failed: {type(e).__name__}: {e}'
    return result
  findings = list(plan.findings)
  parsed: dict[str, ast.Module] = {}  # CPython's parse of a text, for the re-parse check
  if new_source != source and (any(f.fixed and f.rule not in ('OM006', 'OM014') for f in findings)
                               or plan.drops_imports):
    # (OM006 and OM014, the shim fallback, report their own imports)
    imports = import_finding(source, new_source, parsed)
    if imports is not None:
      findings.append(imports)
  if new_source != source:
    problem = None if new_source in parsed else _reparse_problem(new_source, source)
    if problem:
      result.error = f'{path}: internal error, output does not parse ({problem}); file left as is'
      return result
  result.new = new_source
  result.findings = findings
  return result


def _summarize(result: FileResult, plan) -> None:
  summary = plan.summary
  result.factories = dict(summary.factories)
  result.steps = dict(summary.steps)
  result.bundles = dict(summary.bundles)
  result.fields = {cls: tuple(fields) for cls, (fields, converted) in summary.fields.items()
                   if converted}
  result.inject_lr = summary.inject_lr


def parse_error(path: str, source: str, error: cst.ParserSyntaxError) -> str:
  """``path:line:col: cannot parse: message``, positioned by CPython where it can."""
  try:
    compile(source, path, 'exec', dont_inherit=True)
  except SyntaxError as e:
    if e.lineno:
      return f'{path}:{e.lineno}:{e.offset or 1}: cannot parse: {e.msg}'
  except (ValueError, OverflowError, RecursionError, MemoryError):
    pass
  return f'{path}:{error.editor_line}:{error.editor_column}: cannot parse: {error.message}'


def _reparse_problem(new_source: str, source: str) -> str | None:
  """Why ``new_source`` is not valid Python, or None.

  CPython's own parser checks it (0.9 s for 20,000 statements, where a LibCST
  re-parse takes 7.5 s); LibCST's parser is the judge only when CPython cannot
  parse the input either (syntax newer than the running interpreter).
  """
  try:
    compile(new_source, '<rewritten>', 'exec', flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    return None
  except SyntaxError as e:
    try:
      compile(source, '<original>', 'exec', flags=ast.PyCF_ONLY_AST, dont_inherit=True)
      return f'line {e.lineno}: {e.msg}'
    except SyntaxError:
      pass
  try:
    cst.parse_module(new_source)
  except cst.ParserSyntaxError as e:
    return e.message
  return None


def rewrite_file(path: pathlib.Path, options: Options | None = None, flow=None,
                 source: Optional[SourceFile] = None) -> FileResult:
  """Rewrite one file in memory (``result.encoding`` is the file's encoding).

  ``source``: the file as the run already read it (and maybe parsed it, in the
  cross-module pre-pass); otherwise it is read here. A ``.ipynb`` notebook is
  rewritten cell by cell (``codemod.notebook``); its findings carry
  ``<path>:cell<N>`` as their file.
  """
  source = source or SourceFile(path)
  if path.suffix == '.ipynb':
    return _rewrite_notebook_file(path, options, source, flow)
  try:
    text, encoding = source.text, source.encoding
  except (OSError, UnicodeDecodeError, SyntaxError) as e:
    return FileResult(str(path), '', error=f'{path}: cannot read: {e}')
  analysed = source.analysed_text
  options = _options(options, text, analysed)
  result = FileResult(str(path), analysed)
  if not _flax_optim_wanted(analysed, flow):
    result.new = analysed
  else:
    try:
      module = source.module
    except cst.ParserSyntaxError as e:
      result.error = parse_error(str(path), analysed, e)
      return _put_back(result, text, analysed)
    result = rewrite_parsed(module, analysed, str(path), options, flow, source.cache)
  result = _put_back(result, text, analysed)
  result = open_todos(_names_checked(om2xx.apply(result, options, parse_error)), options)
  result.encoding = encoding
  return result


def plan_file(source: SourceFile, options: Options | None = None, flow=None):
  """``(analysis, plan)`` of a file (parsed once, however often it is planned: its parse and
  metadata stay in ``source``); None when it cannot be read or parsed (the run reports it).

  Raises:
    codemod.failures.RuleFailure: a rule family failed while planning.
  """
  try:
    module = source.module
  except (OSError, UnicodeDecodeError, SyntaxError, cst.ParserSyntaxError):
    return None
  analysed = source.analysed_text
  return plan_parsed(module, analysed, _options(options, source.text, analysed), flow,
                     source.cache)


def _options(options: Options | None, text: str, analysed: str) -> Options | None:
  """The options a file's rewrite runs with (``text`` as written, ``analysed`` as the codemod
  reads it): a file whose legacy imports are all the shim's (``codemod.shim_imports``) runs on
  the shim already, so it gets no ``optim_compat.install()`` (OM014) when it keeps its legacy
  code."""
  if analysed == text or shim_imports.names_flax_optim(text):
    return options
  options = options or Options()
  return dataclasses.replace(options, shim_fallback=False) if options.shim_fallback else options


def _put_back(result: FileResult, original: str, analysed: str) -> FileResult:
  """``result`` of the ``analysed`` text, as a rewrite of ``original``: the shim imports it
  keeps are put back as written (``codemod.shim_imports.restore``)."""
  if analysed != original:
    result.original = original
    result.new = shim_imports.restore(result.new)
  return result


def plan_notebook(source: SourceFile, options: Options | None = None, flow=None):
  """``(analysis, plan)`` of a notebook's code cells, joined as its rewrite joins them
  (``codemod.notebook``); None when it cannot be read or parsed, or when IPython lines
  mention flax.optim (the rewrite then keeps the notebook as it is)."""
  from codemod import notebook
  joined = []

  def capture(module_text, path, _options):
    joined.append(module_text)
    return FileResult(path, module_text)  # (unchanged: nothing is rewritten)
  try:
    notebook.rewrite_notebook(source.data.decode('utf-8'), str(source.path), options, capture)
    if not joined:
      return None
    text = shim_imports.analysed(joined[0])  # (as rewrite_source reads it)
    module = parse(text)
  except (OSError, UnicodeDecodeError, notebook.NotebookError, cst.ParserSyntaxError):
    return None
  return plan_parsed(module, text, _options(options, joined[0], text), flow)


def _rewrite_notebook_file(path: pathlib.Path, options, source: SourceFile,
                           flow=None) -> FileResult:
  from codemod import notebook  # (its JSON handling is needed for notebooks only)
  try:
    text = source.data.decode('utf-8')
  except (OSError, UnicodeDecodeError) as e:
    return FileResult(str(path), '', error=f'{path}: cannot read: {e}')
  result = FileResult(str(path), text)
  # the prefilter reads the code cells (in the JSON, `...inline\nfrom flax import optim`
  # has no word boundary before `from`: a string source with a magic line was skipped)
  if not wanted(source.words(), flow):
    result.new = text
    return result
  try:  # (the cells get the tree's flow: a notebook at the root imports the tree's modules)
    new, findings, error = notebook.rewrite_notebook(
        text, str(path), options, functools.partial(rewrite_source, flow=flow))
  except notebook.NotebookError as e:
    result.error = str(e)
    return result
  if error:
    result.error = error
    return result
  result.new = new
  result.findings = [f for _, f in findings]
  result.cells = [c for c, _ in findings]
  return result
