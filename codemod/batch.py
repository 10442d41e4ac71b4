"""The per-file run over a whole tree: a result per file, nothing written.

:func:`run_files` (text prefilter, result cache, in-process or pool, progress bar),
:func:`tree_flows` (the cross-module pre-pass, :mod:`codemod.flow`) and
:func:`outside_importers` (files outside the run that import what it converted,
OM125). ``codemod.runner`` prints and writes what they return.
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Iterable, Optional

from codemod import flow as flow_lib, prefilter
from codemod.legacy_api import has_legacy_use
from codemod.result import FileResult
from codemod.rules import RULES, Options
from codemod.sources import SourceFile
from codemod.walk import iter_python_files

#: Files at or above this count get a progress bar (on a terminal only).
PROGRESS_MIN_FILES = 20
#: Fewer files to parse than this run in-process (a worker costs a process start, and where
#: processes are spawned rather than forked, the codemod's imports again).
POOL_MIN_FILES = 8


def _candidate(source: SourceFile, flow=None, cache=None) -> int:
  """Cheap prefilter on raw bytes: 0 if this file cannot hold legacy code (nor call a
  factory of ``flow``), else its size in bytes plus one (unreadable files, and ``.py``
  files holding a NUL byte, pass: ``rewrite_file`` reports them). ``cache``: a
  :class:`codemod.cache.Cache` whose stored verdict (by the bytes' hash) replaces the
  scan for the prefilters' words; the flow's factory names are looked for either way."""
  try:
    data = source.data
  except OSError:
    return 1
  if b'\0' in data and source.path.suffix == '.py':
    return len(data) + 1  # binary, or UTF-16/32 (which CPython cannot run): reported, not passed
  text = source.words()
  if flow is not None and flow.mentioned(text):
    return len(data) + 1

  def scan() -> bool:
    return prefilter.wanted(text) or prefilter.has_todos(text)
  return len(data) + 1 if (scan() if cache is None else cache.verdict(data, scan)) else 0


def _data(source: SourceFile):
  """The bytes a worker gets (None: unreadable, the worker reports it)."""
  try:
    return source.data
  except OSError:
    return None


def _progress(total: int):
  """A rich progress bar on a terminal with many files, else a no-op."""
  if total < PROGRESS_MIN_FILES or not sys.stderr.isatty():
    return None
  from rich.console import Console
  from rich.progress import Progress
  return Progress(transient=True, console=Console(stderr=True))


def run_files(files: list[pathlib.Path], options: Options, jobs: int, flows=None,
              sources: Optional[dict] = None, cache=None):
  """A :class:`codemod.result.FileResult` per file (input order), ``jobs`` processes; writes nothing.

  Each file is read once (``sources``: the :class:`codemod.sources.SourceFile` of each
  path, shared with the cross-module pre-pass). Files without any marker are never parsed;
  a file the pre-pass parsed is rewritten here, from that parse; the rest go to a process
  pool when there are several, largest first (so that no long file starts last while the
  other workers idle), with their bytes. ``flows``: each file's
  :class:`codemod.flow.Flow` (cross-module optimizers), or None. Each file is rewritten
  with the cyclic garbage collector paused (:func:`codemod.pool.gc_paused`).

  A worker process that dies (killed, out of memory) fails the file it had (an error
  result naming it) and is replaced; the other files are still rewritten.

  ``cache``: a :class:`codemod.cache.Cache`; a file whose entry is there is not rewritten
  (the entry is its result), the others' results are stored in it.

  Raises:
    KeyboardInterrupt: Ctrl-C; the workers are killed before it propagates (it does not
      wait for the files in progress; nothing was written).
  """
  flows = flows or [None] * len(files)
  sources = {} if sources is None else sources
  for f in files:
    sources.setdefault(f, SourceFile(f))
  results: dict[int, FileResult] = {}
  todo, sizes = [], {}
  for i, f in enumerate(files):
    size = _candidate(sources[f], flows[i], cache)
    if size:
      todo.append(i)
      sizes[i] = size
    else:
      results[i] = FileResult(str(f), '', new='')
  keys = {}
  if cache is not None:
    cache.save_verdicts()
    for i in list(todo):
      source = sources[files[i]]
      try:
        keys[i] = cache.key(source.data, str(files[i]), flows[i])
        hit = cache.get(keys[i], source.data.decode('utf-8') if files[i].suffix == '.ipynb'
                        else source.text)  # the text rewrite_file starts from
      except (OSError, UnicodeDecodeError, SyntaxError):
        continue  # unreadable or undecodable: the rewrite reports it
      if hit is not None:
        hit.path = str(files[i])
        results[i] = hit
        todo.remove(i)
  progress, task = _progress(len(files)), None
  parsed = [i for i in todo if sources[files[i]].cache]  # planned by the pre-pass
  todo = [i for i in todo if not sources[files[i]].cache]
  if parsed or todo:  # the engine (LibCST) loads only for a file to rewrite, before any fork
    from codemod import engine
    from codemod.pool import _Pool, gc_paused
  pool = _Pool(min(jobs, len(todo))) if jobs > 1 and len(todo) >= POOL_MIN_FILES else None

  def done(i, result, error=None):
    results[i] = result if error is None else FileResult(
        str(files[i]), '', error=f'{files[i]}: {error}')
    if cache is not None and i in keys:
      cache.put(keys[i], results[i])
    if progress is not None:
      progress.advance(task)

  interrupted = True
  try:
    if progress is not None:  # after the workers are forked: rich's refresh thread is not copied
      progress.start()
      task = progress.add_task('optim-migrate', total=len(files), completed=len(results))
    if pool is not None:
      for i in sorted(todo, key=lambda i: -sizes[i]):
        pool.submit(i, (str(files[i]), options, flows[i], _data(sources[files[i]])))
    # the files the pre-pass parsed (their parse is here), while the workers run
    for i in parsed + ([] if pool is not None else todo):
      with gc_paused():
        done(i, engine.rewrite_file(files[i], options, flows[i], sources[files[i]]))
      for got in pool.collect(0) if pool is not None else ():
        done(*got)
    while pool is not None and pool.active:
      for got in pool.collect():
        done(*got)
    interrupted = False
  finally:  # Ctrl-C (KeyboardInterrupt) above all: the workers are killed, not awaited
    if pool is not None:
      pool.close(now=interrupted)
    if progress is not None:
      progress.stop()
  return [results[i] for i in range(len(files))]


def tree_flows(files: list[pathlib.Path], paths: list[str], options: Options,
               sources: Optional[dict] = None) -> list:
  """The cross-module pre-pass (:mod:`codemod.flow`): each file's Flow, or None for all
  files when no module of the tree defines an optimizer factory or step function another
  one imports. ``sources``: the run's :class:`codemod.sources.SourceFile` by path (the
  pre-pass adds those it reads; the files it parses keep their parse there)."""
  roots = flow_lib.roots_of(paths)
  named = _named(files, roots)
  sources = {} if sources is None else sources
  texts = {}
  for path, _, _ in named:
    try:
      texts[path] = sources.setdefault(path, SourceFile(path)).words()
    except OSError:
      continue  # reported by the per-file run
  # modules the files import that the run does not include are read (never written)
  extra = flow_lib.outside_modules(named, [r for rs in roots.values() for r in rs], texts)
  inject_classes = flow_lib.injecting_subclasses(named + extra, texts)
  factories, steps = flow_lib.build_flows(named + extra, options, [p for p, _, _ in extra],
                                          sources, inject_classes)
  # another package's def factory that returns Optax today, unless the run has its source
  factories = {**flow_lib.upstream_def_factories(texts.values()), **factories}
  if not factories and not steps and not inject_classes:
    return [None] * len(files)
  return [flow_lib.Flow(factories, names[0][0] if names else None,
                        names[0][1] if names else False, steps, inject_classes)
          for _, names, _ in named]


def _named(files, roots) -> list[tuple[pathlib.Path, list[tuple[str, bool]], str]]:
  """Each file with its module names (:func:`codemod.flow.module_names`) and the path
  messages name it by (relative to its root)."""
  given = [(pathlib.Path(p), rs) for p, rs in roots.items()]
  raised: dict = {}  # each root raised past its packages once (codemod.modules.package_root)
  named = []
  for f in files:
    owners = [r for p, rs in given for r in rs if f == p or _within(p, f)]
    shown = f.relative_to(owners[0]).as_posix() if owners and _within(owners[0], f) else str(f)
    if f.suffix == '.py':
      for r in owners:
        if r not in raised:
          raised[r] = flow_lib.package_root(r)
      names = flow_lib.module_names(f, [raised[r] for r in owners], raised=True)
    else:
      names = []
    named.append((f, names, shown))
  return named


def _within(directory: pathlib.Path, f: pathlib.Path) -> bool:
  """``directory in f.parents`` (the same test, by parts: ``f.parents`` builds a path per
  parent; on Windows, where paths compare without case, that test itself)."""
  if os.name == 'nt':
    return directory in f.parents
  d, parts = directory.parts, f.parts
  if not d:  # '.': a parent of every relative path
    return not f.anchor
  return len(d) < len(parts) and parts[:len(d)] == d


def _repository_root(cwd: pathlib.Path) -> Optional[pathlib.Path]:
  """The working directory or the nearest directory above it that holds ``.git`` or
  ``pyproject.toml`` (a repository root), else None."""
  for folder in (cwd, *cwd.parents):
    if (folder / '.git').exists() or (folder / 'pyproject.toml').exists():
      return folder
  return None


def outside_importers(results, files: list[pathlib.Path], paths: list[str],
                      exclude: Iterable[str] = ()) -> list[dict]:
  """Report rows (``OM125``, manual) for files outside the run that import a function this
  run converted: a factory that now returns a ``TrainState``, or a step function that now
  takes one, or a container class whose optimizer field now holds one (its module imported
  and one of its fields read) (pre-commit passes only the changed files; ``rewrite models/``
  leaves out the scripts that use them). Those files are read, never written; their call
  sites fail until they are rewritten too.

  Searched: the directories given (raised past parent packages), the directory of each
  file given, and the repository the working directory lies in (the nearest directory at or
  above it holding ``.git`` or ``pyproject.toml``: pre-commit runs from its root, a user
  from anywhere in it) when the paths lie under it. An importer is a file
  whose import lines name the converted function's module and whose text names the
  function (:func:`codemod.flow.imported_modules`); the row points at that import line.
  """
  roots = flow_lib.roots_of(paths)
  cwd = pathlib.Path.cwd()
  search = {r.absolute() for rs in roots.values() for r in rs if r.absolute() != cwd}
  repository = _repository_root(cwd)
  if repository is not None and any(repository in pathlib.Path(p).absolute().parents
                                    for p in paths):
    search.add(repository)
  changed = {}
  for (path, names, _), result in zip(_named(files, roots), results):
    if result.error or not result.changed or not names:
      continue
    what = {f: 'returns a TrainState' for f, ok in result.factories.items() if ok}
    what.update({f: 'returns a TrainState in what it returns' for f, ok in result.bundles.items()
                 if ok})
    what.update({f: 'takes a TrainState as ' + ', '.join(f'`{n}`' for _, n in params)
                 for f, (params, ok) in result.steps.items() if ok})
    what.update({cls: 'holds a TrainState in its field ' + ', '.join(f'`{x}`' for x in fields)
                 for cls, fields in result.fields.items()})
    read = dict(result.fields)  # (a class's importers may read its fields without naming it)
    if what:
      for name, _ in [*names, *flow_lib.module_names(path, search)]:
        changed[name] = (result.path, what, read)  # the path this run names it by
  if not changed:
    return []
  inside = {f.resolve() for f in files}
  rows = []
  for f in iter_python_files(sorted(map(str, search)), exclude):
    if f.suffix != '.py' or f.resolve() in inside:
      continue
    inside.add(f.resolve())
    try:
      text = f.read_bytes().decode('latin-1')
    except OSError:
      continue
    if not any(fn in text for _, what, _ in changed.values() for fn in what) and not any(
        flow_lib.reads_field(text, fields) for _, _, read in changed.values()
        for fields in read.values()):
      continue
    if not has_legacy_use(text):
      continue  # no flax.optim word, `.apply_gradient`, `.target` or `.state.step`: migrated
    names = flow_lib.module_names(f, search)
    module, is_package = names[0] if names else (None, False)
    imported = flow_lib.imported_modules(text, module, is_package)
    lines = text.splitlines()
    seen = set()
    for dotted, (shown, what, read) in sorted(changed.items()):
      for fn, change in sorted(what.items()):
        # (a container class: its module imported and one of its fields read, as a helper
        # handed instances does without naming the class)
        named = fn in text or (fn in read and flow_lib.reads_field(text, read[fn]))
        if not named or not ({dotted, f'{dotted}.{fn}'} & imported) or (shown, fn) in seen:
          continue
        seen.add((shown, fn))
        last = dotted.rsplit('.', 1)[-1]
        line = next((i for i, text_line in enumerate(lines, 1)
                     if 'import' in text_line and last in text_line), None)
        shown_here = f.relative_to(cwd).as_posix() if cwd in f.absolute().parents else str(f)
        rows.append({'file': shown_here, 'line': line, 'column': 1 if line else None,
                     'rule': 'OM125', 'safety': RULES['OM125'].safety,
                     'message': (f'imports {fn} from {shown}' if fn in text else
                                 f'imports {shown}, whose {fn} it may read')
                                + f', which this run rewrites so that it {change}; this file '
                                'is not in the run: where it still uses it the flax.optim way, '
                                f'it fails: rewrite it too (optim-migrate rewrite {shown_here})',
                     'applied': False})
  return rows
