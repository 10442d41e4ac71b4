"""Run the codemod over files: diff, write atomically, report.

Per-file isolation: a file that cannot be read, parsed or transformed is
reported (exit status 2) and left untouched; the others are still processed.
Output is re-parsed before it is written, and written through a temporary file
in the same directory plus ``os.replace``, so a file is never half-written.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import io
import os
import pathlib
import re
import stat
import tempfile
import tokenize
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from codemod.modern import rewrite as om2xx
from codemod.rules import TODO_PREFIX, Options
from codemod.transform import KEEPS_LEGACY, Finding, MigrateCommand

#: A TODO line this codemod wrote (``# TODO(optim-migrate): OM100: message``).
_TODO_LINE = re.compile(r'^([ \t]*)' + re.escape(TODO_PREFIX) + r'(OM\d{3}): (.*?)[ \t]*$', re.M)

#: Words a file the codemod acts on must contain (see :func:`may_need_rewrite`).
MARKERS = ('optim', 'apply_gradient', '.target')
_WORD_FLAX = re.compile(r'\bflax\b')
_WORD_OPTIM = re.compile(r'\boptim\b')


def may_need_rewrite(text: str) -> bool:
  """Cheap text prefilter, before any parse: False only for files the codemod leaves alone.

  Every rule needs ``flax.optim`` referenced in the file (which takes the words
  ``flax`` and ``optim``, in every import form) except the flag on
  ``.apply_gradient`` calls in files that never import it. So ``torch.optim``,
  ``optimizer = optax.adam(...)`` or another library's ``.target`` alone do not
  cost a parse.
  """
  if 'apply_gradient' in text:
    return True
  return ('optim' in text and 'flax' in text and _WORD_OPTIM.search(text) is not None
          and _WORD_FLAX.search(text) is not None)


def wanted(text: str, flow=None) -> bool:
  """:func:`may_need_rewrite`, or ``text`` may call a factory of ``flow`` (another module's
  optimizer, :class:`codemod.flow.Flow`), or the OM2xx family may apply to it (removed JAX /
  Flax APIs, :func:`codemod.modern.rewrite.may_apply`): the files worth a parse."""
  return _flax_optim_wanted(text, flow) or om2xx.may_apply(text)


def _flax_optim_wanted(text: str, flow=None) -> bool:
  return may_need_rewrite(text) or (flow is not None and flow.mentioned(text))


def has_todos(text: str) -> bool:
  """``text`` holds a TODO this codemod wrote (reported until it is deleted)."""
  return TODO_PREFIX in text


@dataclasses.dataclass
class FileResult:
  path: str
  original: str
  new: str | None = None          # None: not processed (error) or skipped
  findings: list[Finding] = dataclasses.field(default_factory=list)
  error: str | None = None
  encoding: str = 'utf-8'
  cells: list[int] | None = None  # notebooks: the cell of each finding
  #: module-level functions returning an optimizer -> converted to return a TrainState
  #: (read by the cross-module pre-pass, ``codemod.flow``)
  factories: dict[str, bool] = dataclasses.field(default_factory=dict)
  inject_lr: bool = False         # the file's defs are built with inject_hyperparams
  #: module-level functions taking optimizers -> ``((position, parameter), ...)``, and
  #: whether the rewrite makes them TrainStates (read by ``codemod.flow``)
  steps: dict[str, tuple[tuple, bool]] = dataclasses.field(default_factory=dict)
  #: module-level functions returning an optimizer in a tuple, list or dict -> converted
  bundles: dict[str, bool] = dataclasses.field(default_factory=dict)

  def where(self, i: int) -> str:
    """The file (``nb.ipynb:cell3`` in a notebook) of finding ``i``."""
    return self.path if self.cells is None else f'{self.path}:cell{self.cells[i]}'

  @property
  def changed(self) -> bool:
    return self.new is not None and self.new != self.original

  @property
  def manual(self) -> list[Finding]:
    return [f for f in self.findings if not f.fixed]

  def diff(self) -> str:
    if not self.changed:
      return ''
    return ''.join(difflib.unified_diff(
        self.original.splitlines(keepends=True), self.new.splitlines(keepends=True),
        fromfile=f'a/{self.path.lstrip("/")}', tofile=f'b/{self.path.lstrip("/")}'))


def rewrite_source(source: str, path: str = '<string>',
                   options: Options | None = None, flow=None) -> FileResult:
  """Rewrite one module's source text; never raises for bad input.

  ``flow``: a :class:`codemod.flow.Flow` (the tree's optimizer factories and
  this file's module name), or None (no cross-module information, e.g. stdin).

  Returns:
    A :class:`FileResult`; ``error`` is set (``path:line:col: message``) when
    the source does not parse or the rewrite failed.
  """
  result = FileResult(path, source)
  if not _flax_optim_wanted(source, flow):
    result.new = source
  else:
    try:
      module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
      result.error = _parse_error(path, source, e)
      return result
    result = _rewrite_module(module, source, path, options, flow)
  # the OM2xx family (removed JAX / Flax APIs, codemod.modern) on what that pass left
  return _open_todos(om2xx.apply(result, options, _parse_error), options)


def _open_todos(result: FileResult, options: Options | None) -> FileResult:
  """Add a manual item for each TODO an earlier run wrote that this run did not raise
  again (e.g. after the file was converted and no longer imports flax.optim): ``--check``
  keeps failing until the TODO is dealt with and deleted."""
  if result.error or TODO_PREFIX not in result.original:
    return result
  options = options or Options()
  raised = {(f.rule, f.message) for f in result.findings if not f.fixed}
  new = result.new if result.new is not None else result.original
  for line, col, rule, message in _todo_comments(result.original):
    if (rule, message) in raised or not options.enabled(rule):
      continue
    if f'{TODO_PREFIX}{rule}: {message}' not in new:
      continue  # this run removed it (a stale "keeps its legacy code" TODO)
    result.findings.append(Finding(line, col, rule,
                                   f'still to do, from an earlier run: {message}', False))
  return result


def _todo_comments(source: str):
  """``(line, column, rule, message)`` of the comments (not string contents) that are a
  TODO this codemod wrote; none when the source does not tokenize."""
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (tokenize.TokenError, SyntaxError):
    return
  for tok in tokens:
    if tok.type == tokenize.COMMENT and (found := _TODO_LINE.match(tok.line.rstrip('\r\n'))):
      if tok.start[1] == len(found.group(1)):  # the whole line is the comment
        yield tok.start[0], tok.start[1] + 1, found.group(2), found.group(3)


def _transform(command: MigrateCommand, module: cst.Module) -> cst.Module:
  """``command.transform_module(module)`` without its deep copy of the module.

  LibCST's ``Codemod.transform_module`` copies the tree into a fresh
  ``MetadataWrapper`` for the command's own metadata; ``MigrateCommand`` declares
  none (its passes wrap the tree themselves), and trees are immutable, so the
  parsed module is used as is, and the same parse serves a second pass. The
  import helpers ``CodemodCommand.transform_module`` runs afterwards for
  entries left in the context's scratch run here too.
  """
  if command.get_inherited_dependencies():  # it would need the wrapper: LibCST's own path
    return command.transform_module(module)
  new_module = command.transform_module_impl(module)
  for visitor in (AddImportsVisitor, RemoveImportsVisitor):
    if visitor.CONTEXT_KEY in command.context.scratch:
      new_module = visitor(command.context).transform_module(new_module)
  return new_module


def _rewrite_module(module: cst.Module, source: str, path: str,
                    options: Options | None, flow=None) -> FileResult:
  """:func:`rewrite_source` after the parse (``module`` is ``source`` parsed)."""
  result = FileResult(path, source)
  command = MigrateCommand(CodemodContext(filename=path), options, flow)
  command.parsed = (module, source)
  try:
    new_module = _transform(command, module)
  except Exception as e:  # noqa: BLE001 - one file's failure must not stop the run
    result.error = f'{path}: codemod failed: {type(e).__name__}: {e}'
    return result
  options = options or Options()
  new_source = new_module.code
  parsed: dict[str, ast.Module] = {}  # CPython's parse of a text, for the re-parse check
  if new_source != source and any(f.fixed and f.rule != 'OM006' for f in command.findings):
    imports = _import_finding(source, new_source, parsed)  # OM006 reports its own import rewrites
    if imports is not None:
      command.findings.append(imports)
  unselected = [f for f in command.findings if f.fixed and not options.enabled(f.rule)]
  if unselected:
    # a partial migration would not run: keep the file, say which fixes it needs
    rules = sorted({f.rule for f in unselected})
    first = unselected[0]
    result.new = source
    result.findings = [Finding(first.line, first.col, 'OM100',
                               f'this file needs fixes {", ".join(rules)}, which are not selected: '
                               'left unchanged (a partial migration would not run)', False)
                       ] if options.enabled('OM100') else []  # ignored like any OM100 item
    result.factories = dict.fromkeys(command.factories, False)
    result.steps = {f: (params, False) for f, (params, _) in command.steps.items()}
    result.bundles = dict.fromkeys(command.bundles, False)
    return result
  converted = [f for f in command.findings if f.fixed and f.rule in _CONVERSIONS]
  # a flag that says the file keeps its legacy code, raised after other uses were converted
  uncertain = [f for f in command.findings if not f.fixed and f.rule == 'OM100'
               and f.message.endswith(KEEPS_LEGACY)]
  if converted and uncertain and not options.keep_legacy:
    # a blocking OM100 item found only after other uses were converted: the result would be
    # half-migrated, so the file keeps its legacy optimizer code (second pass)
    kept = _rewrite_module(module, source, path, dataclasses.replace(options, keep_legacy=True),
                           flow)
    seen = {(f.line, f.col, f.rule) for f in kept.findings}
    kept.findings = [*kept.findings, *(
        f for f in uncertain if (f.line, f.col, f.rule) not in seen)]
    return kept
  if new_source != source:
    problem = None if new_source in parsed else _reparse_problem(new_source, source)
    if problem:
      result.error = f'{path}: internal error, output does not parse ({problem}); file left as is'
      return result
  result.new = new_source
  result.findings = command.findings
  result.factories = command.factories
  result.steps = command.steps
  result.bundles = command.bundles
  result.inject_lr = command.inject_lr
  return result


def _imports(source: str, parsed: dict | None = None) -> Optional[dict[str, ast.stmt]]:
  """``{import statement as code: its node}`` (first occurrence), or None if it does not parse.

  ``parsed`` gets ``source``'s tree when it parses: :func:`_reparse_problem` would
  parse it again with the same parser (``ast.parse`` is ``compile`` with
  ``PyCF_ONLY_AST``) to say whether it is valid Python.
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return None
  if parsed is not None:
    parsed[source] = tree
  found = {}
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      found.setdefault(ast.unparse(node), node)
  return found


def _import_finding(source: str, new_source: str, parsed: dict | None = None) -> Optional[Finding]:
  """The ``OM005`` report entry for the imports a rewrite added and dropped, or None.

  Positioned at the first dropped import (else line 1); the message lists both.
  ``parsed``: see :func:`_imports` (it gets ``new_source``'s tree).
  """
  before, after = _imports(source), _imports(new_source, parsed)
  if before is None or after is None:
    return None
  added = [k for k in after if k not in before]
  dropped = [k for k in before if k not in after]
  if not added and not dropped:
    return None
  first = min((before[k] for k in dropped), key=lambda n: (n.lineno, n.col_offset), default=None)
  parts = ([f'added {"; ".join(f"`{k}`" for k in added)}'] if added else []) + (
      [f'dropped {"; ".join(f"`{k}`" for k in dropped)}'] if dropped else [])
  return Finding(first.lineno if first else 1, first.col_offset + 1 if first else 1, 'OM005',
                 'imports: ' + ', '.join(parts), True)


#: Fixes that change optimizer code (OM005 imports and OM006 DynamicScale paths do not).
_CONVERSIONS = frozenset({'OM001', 'OM002', 'OM003', 'OM004', 'OM007', 'OM008', 'OM009', 'OM010',
                          'OM011', 'OM012', 'OM013'})


def _parse_error(path: str, source: str, error: cst.ParserSyntaxError) -> str:
  """``path:line:col: cannot parse: message``, positioned by CPython where it can."""
  try:
    compile(source, path, 'exec', dont_inherit=True)
  except SyntaxError as e:
    if e.lineno:
      return f'{path}:{e.lineno}:{e.offset or 1}: cannot parse: {e.msg}'
  except (ValueError, OverflowError):
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


def read_source(path: pathlib.Path) -> tuple[str, str]:
  """``(text, encoding)``: decoded per PEP 263 (coding cookie or BOM), newlines kept.

  Raises:
    OSError, UnicodeDecodeError, SyntaxError: unreadable file or bad cookie.
  """
  return decode_source(path.read_bytes())


def decode_source(data: bytes) -> tuple[str, str]:
  """``(text, encoding)`` of Python source bytes, per PEP 263 (cookie or BOM).

  Raises:
    UnicodeDecodeError, SyntaxError: bytes that do not decode, or a bad cookie.
  """
  encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
  return data.decode(encoding), encoding


def write_atomic(path: pathlib.Path, text: str, encoding: str = 'utf-8') -> None:
  """Replace ``path`` with ``text`` via a temporary file and ``os.replace``.

  A symlink is written through (its target is replaced; the link stays). A
  file with other hard links is rewritten in place instead (a rename would
  detach this name from the others); if that write fails, its old bytes are
  put back before the error is raised.

  ``encoding`` is the file's own (``utf-8-sig`` keeps a BOM); newlines are
  written as they are in ``text``.

  Raises:
    PermissionError: the file is read-only (its owner's write bit is clear, or
      this user may not write it): nothing is written, though a rename in a
      writable directory could replace it.
    OSError: the temporary file or the write failed (``path`` is unchanged).
  """
  path = path.resolve()
  st = path.stat()
  if not st.st_mode & stat.S_IWUSR or not os.access(path, os.W_OK):
    raise PermissionError(f'{path} is read-only; make it writable to rewrite it')
  data = text.encode(encoding)
  if st.st_nlink > 1:
    old = path.read_bytes()
    try:
      with open(path, 'r+b') as f:
        f.write(data)
        f.truncate()
    except BaseException:
      with open(path, 'wb') as f:
        f.write(old)
      raise
    return
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    os.chmod(tmp, st.st_mode)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def rewrite_file(path: pathlib.Path, options: Options | None = None, flow=None) -> FileResult:
  """Rewrite one file in memory (``result.encoding`` is the file's encoding).

  A ``.ipynb`` notebook is rewritten cell by cell (``codemod.notebook``); its
  findings carry ``<path>:cell<N>`` as their file.
  """
  if path.suffix == '.ipynb':
    return _rewrite_notebook_file(path, options)
  try:
    source, encoding = read_source(path)
  except (OSError, UnicodeDecodeError, SyntaxError) as e:
    return FileResult(str(path), '', error=f'{path}: cannot read: {e}')
  result = rewrite_source(source, str(path), options, flow)
  result.encoding = encoding
  return result


def _rewrite_notebook_file(path: pathlib.Path, options) -> FileResult:
  from codemod import notebook
  try:
    text = path.read_bytes().decode('utf-8')
  except (OSError, UnicodeDecodeError) as e:
    return FileResult(str(path), '', error=f'{path}: cannot read: {e}')
  result = FileResult(str(path), text)
  if not wanted(text):
    result.new = text
    return result
  try:
    new, findings, error = notebook.rewrite_notebook(text, str(path), options)
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
