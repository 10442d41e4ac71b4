"""``optim-migrate rewrite``: the whole-tree run (ruff conventions).

    optim-migrate rewrite PATH... [--write | --check] [--diff] [--select/--ignore RULES]
        [--unsafe-fixes] [--prefer-stock-optax] [--no-shim-fallback] [--jobs N]
        [--no-cache] [--report FILE.json] [--output-format FORMAT] [--statistics]
        [--show-fixes] [-]

Shows a unified diff by default; ``--write`` applies it, ``--check`` writes
nothing and prints the files and items that remain. ``--diff`` with ``--write``
also prints the diff of what was written, with ``--check`` the diff after each
``would rewrite`` line (all on stdout). ``-`` reads a module from stdin (Python
source; notebook JSON is refused) and writes the rewritten module to stdout
(the diff with ``--diff``). Exit status: 0 nothing to do, 1 changes or manual items remain (or
were just written), 2 a file could not be read, parsed or processed (bad
options too), 130 interrupted (Ctrl-C: workers are stopped at once, and each file is
either written whole or left as it was).
``--output-format`` (``codemod.output_formats``: ``concise``, ``json``, ``github``,
``sarif``), ``--statistics`` and ``--show-fixes`` change what is printed, never the exit
status (docs/ci.md).

Options may also come from ``[tool.optim-migrate]`` in the nearest
``pyproject.toml`` (``select``, ``ignore``, ``exclude``, ``jobs``,
``prefer-stock-optax``, ``unsafe-fixes``, ``shim-fallback``); command-line flags win.

Results are cached per file (:mod:`codemod.cache`: keyed by the file's bytes, its path,
the options, the flow facts it can use and the tool's own files); ``--no-cache`` bypasses it.
"""
from __future__ import annotations

import collections
import contextlib
import fnmatch
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import pickle
import signal
import sys
import threading
import time
from typing import Iterable, Optional

from codemod import cache as cache_lib, engine, flow as flow_lib, output_formats
from codemod.config import ConfigError, read_table
from codemod.legacy_api import has_legacy_use
from codemod.sources import SourceFile
from codemod.rules import RULES, Options, check_rule_ids

EXIT_CLEAN, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2
#: Exit status after Ctrl-C (SIGINT), as shells report a program that SIGINT ended.
EXIT_INTERRUPTED = 130
#: Directory names never descended into (plus hidden ones and virtualenvs).
SKIP_DIRS = {'__pycache__', 'build', 'dist', 'site-packages', 'node_modules', 'venv', 'env'}
#: Files at or above this count get a progress bar (on a terminal only).
PROGRESS_MIN_FILES = 20
#: Fewer files to parse than this run in-process (a worker costs a process start, and where
#: processes are spawned rather than forked, the codemod's imports again).
POOL_MIN_FILES = 8
CONFIG_KEYS = {'select', 'ignore', 'exclude', 'jobs', 'prefer-stock-optax', 'unsafe-fixes',
               'shim-fallback'}
#: Sub-tables other subcommands read (``[[tool.optim-migrate.check]]``): not ours to check.
OTHER_KEYS = {'check'}


def find_config(start: pathlib.Path) -> Optional[pathlib.Path]:
  """The nearest ``pyproject.toml`` at or above ``start`` that has ``[tool.optim-migrate]``.

  Raises:
    ConfigError: a ``pyproject.toml`` on the way up cannot be read, is not valid TOML, or
      has a ``tool`` or ``tool.optim-migrate`` that is not a table (names the file).
  """
  start = start.resolve()
  for d in [start, *start.parents] if start.is_dir() else [start.parent, *start.parent.parents]:
    candidate = d / 'pyproject.toml'
    if candidate.is_file():
      table = read_table(candidate)
      if table is not None:
        return candidate
  return None


def load_config(path: Optional[pathlib.Path]) -> dict:
  """``[tool.optim-migrate]`` of ``path`` as a checked dict (``{}`` when None).

  Raises:
    ConfigError: the file cannot be read or is not TOML, ``tool`` or ``tool.optim-migrate``
      is not a table, a key is unknown or has a wrong value type, ``select`` is empty,
      ``select`` / ``ignore`` holds an empty string, or
      ``select`` / ``ignore`` holds an id that names no rule (names the file and key).
  """
  if path is None:
    return {}
  table = read_table(path) or {}
  unknown = sorted(set(table) - CONFIG_KEYS - OTHER_KEYS)
  if unknown:
    raise ConfigError(f'{path}: [tool.optim-migrate]: unknown key(s) {unknown}; '
                      f'valid: {sorted(CONFIG_KEYS)}')
  for key in ('select', 'ignore', 'exclude'):
    if key in table and not (isinstance(table[key], list) and
                             all(isinstance(x, str) for x in table[key])):
      raise ConfigError(f'{path}: [tool.optim-migrate] {key} must be a list of strings')
  for key in ('select', 'ignore'):
    if any(not x.strip() for x in table.get(key, ())):
      raise ConfigError(f'{path}: [tool.optim-migrate] {key} has an empty rule id: name rule '
                        'ids or prefixes, e.g. "OM001"')
  if table.get('select') == []:
    raise ConfigError(f'{path}: [tool.optim-migrate] select is empty: it would apply no rule '
                      '(name rule ids, e.g. OM001, OM002)')
  for key in ('select', 'ignore'):
    bad = check_rule_ids(table.get(key, ()))
    if bad:
      raise ConfigError(f'{path}: [tool.optim-migrate] {key}: unknown rule id(s) {bad}; '
                        f'valid: {sorted(RULES)}')
  for key in ('prefer-stock-optax', 'unsafe-fixes', 'shim-fallback'):
    if key in table and not isinstance(table[key], bool):
      raise ConfigError(f'{path}: [tool.optim-migrate] {key} must be true or false')
  jobs = table.get('jobs')
  # a TOML boolean is a Python bool, itself an int: `jobs = true` is no count of workers
  if 'jobs' in table and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
    shown = str(jobs).lower() if isinstance(jobs, bool) else repr(jobs)  # as TOML spells it
    raise ConfigError(f'{path}: [tool.optim-migrate] jobs = {shown}: must be an integer >= 1')
  return table


def _is_venv(d: pathlib.Path) -> bool:
  return (d / 'pyvenv.cfg').exists()


def iter_python_files(paths: Iterable[str], exclude: Iterable[str] = ()) -> list[pathlib.Path]:
  """``.py`` files under ``paths``, sorted per path.

  A file named on the command line is taken as given. In directories: hidden
  directories, ``.git``, virtualenvs (a ``pyvenv.cfg``), ``build``/``dist``/
  ``__pycache__``/``site-packages`` and ``exclude`` globs (matched against the
  path relative to the directory, and against each name) are skipped; symlinks
  are not followed out of the directory, and dangling ones are skipped (a path
  that does not exist, a dangling link named on the command line included, is
  left out: ``cmd_rewrite`` reports it). A file reached twice (named twice,
  under two given directories, or through a hard link) is listed once, where
  it is first reached.
  """
  exclude = list(exclude)

  def excluded(rel: pathlib.PurePath) -> bool:
    text = rel.as_posix()
    return any(fnmatch.fnmatch(text, g) or any(fnmatch.fnmatch(p, g) for p in rel.parts)
               for g in exclude)

  out = []
  for p in map(pathlib.Path, paths):
    if not p.exists() or str(p) == '-':
      continue
    if not p.is_dir():
      if p.is_file():
        out.append(p)
      continue
    root = p.resolve()
    found = []
    for dirpath, dirnames, filenames in os.walk(p, followlinks=False):
      d = pathlib.Path(dirpath)
      dirnames[:] = sorted(n for n in dirnames
                           if not n.startswith('.') and n not in SKIP_DIRS
                           and not _is_venv(d / n) and not excluded((d / n).relative_to(p)))
      for name in filenames:
        f = d / name
        if not name.endswith(('.py', '.ipynb')) or name.startswith('.') \
            or excluded(f.relative_to(p)):
          continue
        if f.exists() and not f.is_file():
          continue  # a FIFO, socket or device named *.py: reading it could block forever
        if f.is_symlink():
          if not f.exists():
            continue  # dangling: nothing to rewrite (named on the command line: an error)
          try:
            f.resolve().relative_to(root)
          except ValueError:
            continue  # a link out of the tree
        found.append(f)
    out.extend(sorted(found))
  seen, unique = set(), []
  for f in out:  # a file named twice, inside two given folders or hard-linked: rewritten once
    try:
      st = os.stat(f)
      key = (st.st_dev, st.st_ino)
    except OSError:
      key = os.path.realpath(f)
    if key not in seen:
      seen.add(key)
      unique.append(f)
  return unique


@contextlib.contextmanager
def gc_paused():
  """Python's cyclic garbage collector paused within (resumed after, also on error; left
  off if it was off).

  A file's syntax tree and its metadata are millions of objects that live until the file
  is done, and the collector re-traversed them all again and again: a third of the CPU time
  on a 0.25 MB module, a growing share on larger ones. The rewrite leaves little cyclic
  garbage (the same peak memory without the collector); it is collected after the file.
  """
  was = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was:
      gc.enable()


def _work(args) -> engine.FileResult:
  """One file's rewrite with the cyclic collector paused (``args``: path, options, flow,
  the file's bytes or None)."""
  path, options, flow, data = args
  with gc_paused():
    return engine.rewrite_file(pathlib.Path(path), options, flow, SourceFile(path, data))


#: ``prctl`` option: the signal a process gets when the thread that created it ends.
_PR_SET_PDEATHSIG = 1


def _worker_init(parent: int) -> None:
  """In each pool worker, before any file: Ctrl-C is the parent's to handle (the worker
  ignores SIGINT, which a terminal sends to the whole process group; the parent stops the
  pool), and the worker ends when the parent does, even by ``kill -9`` (which runs no
  clean-up in the parent): on Linux the kernel sends it SIGKILL (``PR_SET_PDEATHSIG``),
  elsewhere a thread polls the parent's pid. Workers write no file (the parent writes the
  results), so killing one loses nothing."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if hasattr(signal, 'pthread_sigmask'):  # the parent blocks it while it forks: _Pool._spawn
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  if sys.platform.startswith('linux'):
    try:
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
      armed = False
    if armed:
      if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
      return
  threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                   name='optim-migrate-watch-parent').start()


def _watch_parent(parent: int, every_s: float = 0.5) -> None:
  """End this process once ``parent`` is no longer its parent (it died: the worker was
  re-parented)."""
  while os.getppid() == parent:
    time.sleep(every_s)
  os._exit(1)


def _pool_context():
  """The multiprocessing context of the pool: ``fork`` on Linux (no start-up import, no
  helper process such as a fork server that could outlive the run), else the platform's
  default."""
  if sys.platform.startswith('linux'):
    return multiprocessing.get_context('fork')
  return multiprocessing.get_context()


@contextlib.contextmanager
def _sigint_blocked():
  """SIGINT held pending (POSIX) while the pool forks a worker: the worker inherits the
  mask and unblocks it only once it ignores SIGINT, so a Ctrl-C at that moment gets no
  worker traceback; the parent gets the pending signal (a KeyboardInterrupt) on exit."""
  if not hasattr(signal, 'pthread_sigmask'):
    yield
    return
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pool_worker(conn, parent: int) -> None:
  """A pool worker: rewrites each task ``conn`` brings (``_work``'s arguments) and sends
  back ``(FileResult, None)``, or ``(None, message)`` when that raised; ``None`` or a closed
  pipe ends it."""
  _worker_init(parent)
  while True:
    try:
      task = conn.recv()
    except (EOFError, OSError):
      return
    if task is None:
      return
    try:
      out = (_work(task), None)
    except Exception as e:  # noqa: BLE001 - reported as this file's error
      out = (None, f'{type(e).__name__}: {e}')
    try:
      conn.send(out)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
      conn.send((None, f'cannot return the result: {type(e).__name__}: {e}'))


class _Pool:
  """``n`` worker processes that take one file at a time; their results are read by the
  calling thread (no helper thread: a Ctrl-C ends the workers and returns at once, and a
  worker killed while sending leaves nothing waiting on its half-sent result, as
  ``concurrent.futures``' manager thread could at exit). A worker that dies fails its
  file alone; a new one takes its place."""

  def __init__(self, n: int):
    self.context = _pool_context()
    self.parent = os.getpid()
    self.idle: list = []
    self.busy: dict = {}  # connection -> (process, task key)
    self.pending: collections.deque = collections.deque()
    try:
      for _ in range(n):
        self._spawn()
    except BaseException:  # Ctrl-C while they start: none is left behind
      self.close(now=True)
      raise

  def _spawn(self) -> None:
    """Start a worker and add it to the idle ones (a Ctrl-C meanwhile is raised after)."""
    here, there = self.context.Pipe()
    process = self.context.Process(target=_pool_worker, args=(there, self.parent),
                                   daemon=True, name='optim-migrate-worker')
    with _sigint_blocked():
      try:
        process.start()
      finally:
        there.close()  # the worker's end lives in the worker only: its death is an EOF here
      self.idle.append((process, here))

  @property
  def active(self) -> bool:
    """Tasks are queued or running."""
    return bool(self.pending or self.busy)

  def submit(self, key, task) -> None:
    """Queue ``task`` (``_work``'s arguments); its result comes back with ``key``."""
    self.pending.append((key, task))
    self._dispatch()

  def _dispatch(self) -> None:
    while self.pending and self.idle:
      process, conn = self.idle.pop()
      key, task = self.pending.popleft()
      try:
        conn.send(task)
      except OSError:  # it died idle: the task goes to a new worker
        self.pending.appendleft((key, task))
        self._drop(process, conn)
        self._spawn()
        continue
      self.busy[conn] = (process, key)

  def collect(self, timeout: Optional[float] = None) -> list:
    """``(key, FileResult or None, error message or None)`` of the tasks that finished
    within ``timeout`` seconds (None: wait for at least one; 0: only those done), the
    queue handed on to the workers freed."""
    if not self.busy:
      return []
    sentinels = {process.sentinel: conn for conn, (process, _) in self.busy.items()}
    ready = multiprocessing.connection.wait([*self.busy, *sentinels], timeout)
    out = []
    for conn in {sentinels.get(r, r) for r in ready}:
      process, key = self.busy.pop(conn)
      try:
        result, error = conn.recv()
      except (EOFError, OSError):  # died before its result was whole
        process.join(5)
        self._drop(process, conn)
        if self.pending:
          self._spawn()
        out.append((key, None, 'the worker process rewriting it died (exit status '
                               f'{process.exitcode})'))
        continue
      self.idle.append((process, conn))
      out.append((key, result, error))
    self._dispatch()
    return out

  @staticmethod
  def _drop(process, conn) -> None:
    conn.close()
    if process.is_alive():
      process.kill()
    process.join()

  def close(self, now: bool) -> None:
    """End the workers: ``now`` kills them (what they were doing is dropped), else each
    idle one is told to stop and any left after 5 s is killed."""
    workers = [*self.idle, *((p, c) for c, (p, _) in self.busy.items())]
    self.idle, self.busy = [], {}
    self.pending.clear()
    for process, conn in workers:
      if now:
        process.kill()
      else:
        with contextlib.suppress(OSError):
          conn.send(None)
    deadline = time.monotonic() + (0 if now else 5)
    for process, conn in workers:
      process.join(max(0.0, deadline - time.monotonic()))
      if process.is_alive():
        process.kill()
        process.join()
      conn.close()


def _candidate(source: SourceFile, flow=None) -> int:
  """Cheap prefilter on raw bytes: 0 if this file cannot hold legacy code (nor call a
  factory of ``flow``), else its size in bytes plus one (unreadable files pass:
  ``rewrite_file`` reports them)."""
  try:
    data = source.data
  except OSError:
    return 1
  text = source.words()
  return len(data) + 1 if engine.wanted(text, flow) or engine.has_todos(text) else 0


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
  """A :class:`engine.FileResult` per file (input order), ``jobs`` processes; writes nothing.

  Each file is read once (``sources``: the :class:`codemod.sources.SourceFile` of each
  path, shared with the cross-module pre-pass). Files without any marker are never parsed;
  a file the pre-pass parsed is rewritten here, from that parse; the rest go to a process
  pool when there are several, largest first (so that no long file starts last while the
  other workers idle), with their bytes. ``flows``: each file's
  :class:`codemod.flow.Flow` (cross-module optimizers), or None. Each file is rewritten
  with the cyclic garbage collector paused (:func:`gc_paused`).

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
  results: dict[int, engine.FileResult] = {}
  todo, sizes = [], {}
  for i, f in enumerate(files):
    size = _candidate(sources[f], flows[i])
    if size:
      todo.append(i)
      sizes[i] = size
    else:
      results[i] = engine.FileResult(str(f), '', new='')
  keys = {}
  if cache is not None:
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
  pool = _Pool(min(jobs, len(todo))) if jobs > 1 and len(todo) >= POOL_MIN_FILES else None

  def done(i, result, error=None):
    results[i] = result if error is None else engine.FileResult(
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
  factories, steps = flow_lib.build_flows(named + extra, options, [p for p, _, _ in extra],
                                          sources)
  if not factories and not steps:
    return [None] * len(files)
  return [flow_lib.Flow(factories, names[0][0] if names else None,
                        names[0][1] if names else False, steps) for _, names, _ in named]


def _named(files, roots) -> list[tuple[pathlib.Path, list[tuple[str, bool]], str]]:
  """Each file with its module names (:func:`codemod.flow.module_names`) and the path
  messages name it by (relative to its root)."""
  named = []
  for f in files:
    owners = [r for p, rs in roots.items() for r in rs
              if f == pathlib.Path(p) or pathlib.Path(p) in f.parents]
    shown = f.relative_to(owners[0]).as_posix() if owners and owners[0] in f.parents else str(f)
    named.append((f, flow_lib.module_names(f, owners) if f.suffix == '.py' else [], shown))
  return named


def outside_importers(results, files: list[pathlib.Path], paths: list[str],
                      exclude: Iterable[str] = ()) -> list[dict]:
  """Report rows (``OM125``, manual) for files outside the run that import a function this
  run converted: a factory that now returns a ``TrainState``, or a step function that now
  takes one (pre-commit passes only the changed files; ``rewrite models/`` leaves out the
  scripts that use them). Those files are read, never written; their call sites fail until
  they are rewritten too.

  Searched: the directories given (raised past parent packages), the directory of each
  file given, and the working directory when it holds ``.git`` or ``pyproject.toml`` (a
  repository root, as pre-commit runs from) and the paths lie under it. An importer is a file
  whose import lines name the converted function's module and whose text names the
  function (:func:`codemod.flow.imported_modules`); the row points at that import line.
  """
  roots = flow_lib.roots_of(paths)
  cwd = pathlib.Path.cwd()
  repository = (cwd / '.git').exists() or (cwd / 'pyproject.toml').exists()
  search = {r.absolute() for rs in roots.values() for r in rs if r.absolute() != cwd}
  if repository and any(cwd in pathlib.Path(p).absolute().parents for p in paths):
    search.add(cwd)
  changed = {}
  for (path, names, _), result in zip(_named(files, roots), results):
    if result.error or not result.changed or not names:
      continue
    what = {f: 'returns a TrainState' for f, ok in result.factories.items() if ok}
    what.update({f: 'returns a TrainState in what it returns' for f, ok in result.bundles.items()
                 if ok})
    what.update({f: 'takes a TrainState as ' + ', '.join(f'`{n}`' for _, n in params)
                 for f, (params, ok) in result.steps.items() if ok})
    if what:
      for name, _ in [*names, *flow_lib.module_names(path, search)]:
        changed[name] = (result.path, what)  # the path this run names it by
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
    if not any(fn in text for _, what in changed.values() for fn in what):
      continue
    if not has_legacy_use(text):
      continue  # no flax.optim word, `.apply_gradient`, `.target` or `.state.step`: migrated
    names = flow_lib.module_names(f, search)
    module, is_package = names[0] if names else (None, False)
    imported = flow_lib.imported_modules(text, module, is_package)
    lines = text.splitlines()
    seen = set()
    for dotted, (shown, what) in sorted(changed.items()):
      for fn, change in sorted(what.items()):
        if fn not in text or not ({dotted, f'{dotted}.{fn}'} & imported) or (shown, fn) in seen:
          continue
        seen.add((shown, fn))
        last = dotted.rsplit('.', 1)[-1]
        line = next((i for i, text_line in enumerate(lines, 1)
                     if 'import' in text_line and last in text_line), None)
        shown_here = f.relative_to(cwd).as_posix() if cwd in f.absolute().parents else str(f)
        rows.append({'file': shown_here, 'line': line, 'column': 1 if line else None,
                     'rule': 'OM125', 'safety': RULES['OM125'].safety,
                     'message': f'imports {fn} from {shown}, which this run rewrites so that it '
                                f'{change}; this file is not in the run: where it still uses '
                                'it the flax.optim way, it fails: rewrite it too (optim-migrate '
                                f'rewrite {shown_here})', 'applied': False})
  return rows


def report_entries(result: engine.FileResult) -> list[dict]:
  """JSON report rows for one file: one per site, plus one for a file error
  (``codemod.output_formats.Entry.row``)."""
  return [e.row() for e in output_formats.entries_of(result)]


def _split(values, flag: str = '--select') -> Optional[tuple[str, ...]]:
  """The rule ids of ``--select`` / ``--ignore`` (each given value comma-separated).

  Raises:
    ConfigError: a value names no id (``''``, ``',,'``) or has an empty item (``OM1,,OM2``,
      ``OM1,``); the message names ``flag`` and the value.
  """
  if values is None:
    return None
  out = []
  for v in values:
    items = [x.strip() for x in v.split(',')]
    if not any(items):
      raise ConfigError(f'{flag} is empty (got {v!r}): name rule ids or prefixes, e.g. '
                        'OM001,OM002')
    if not all(items):
      raise ConfigError(f'{flag} {v!r}: empty entry; expected comma-separated rule ids or '
                        'prefixes, e.g. OM001,OM002')
    out.extend(items)
  return tuple(out)


def build_options(args, config: dict) -> Options:
  """Flags over ``[tool.optim-migrate]`` (``config`` as checked by :func:`load_config`).

  Raises:
    ConfigError: ``--select`` / ``--ignore`` is empty or has an empty item (``''``, ``',,'``,
      ``OM1,``), or an id in them names no rule (names the option).
  """
  select = _split(args.select, '--select') if args.select is not None else (
      tuple(config['select']) if 'select' in config else None)
  ignore = (_split(args.ignore, '--ignore') if args.ignore is not None
            else tuple(config.get('ignore', ())))
  for flag, given in (('--select', args.select), ('--ignore', args.ignore)):
    bad = check_rule_ids(_split(given, flag) or ())
    if bad:
      raise ConfigError(f'{flag}: unknown rule id(s) {bad}; valid: {sorted(RULES)}')
  return Options(select=select, ignore=ignore,
                 unsafe_fixes=args.unsafe_fixes or config.get('unsafe-fixes', False),
                 prefer_stock_optax=args.prefer_stock_optax or config.get('prefer-stock-optax', False),
                 shim_fallback=not getattr(args, 'no_shim_fallback', False)
                 and config.get('shim-fallback', True))


def _summary(results, n_missing, verb) -> str:
  changed = sum(r.changed and not r.error for r in results)  # a failed write is only failed
  flagged = sum(bool(r.manual) for r in results)
  failed = sum(bool(r.error) for r in results) + n_missing
  rules = collections.Counter(f.rule for r in results for f in r.findings)
  top = ', '.join(f'{rule} x{n}' for rule, n in rules.most_common(5)) or 'none'
  n_manual = sum(len(r.manual) for r in results)
  return (f'{len(results)} file(s) scanned: {changed} {verb}, {flagged} flagged '
          f'({n_manual} manual item(s)), {failed} failed ({failed} error(s)); top rules: {top}')


def _unwritable(path: pathlib.Path) -> Optional[str]:
  """Why ``path`` cannot be written as a file, or None (nothing is created)."""
  if path.is_dir():
    return 'is a directory'
  parent = path.parent
  if not parent.is_dir():
    return f'its directory {parent} ' + ('is not a directory' if parent.exists()
                                         else 'does not exist')
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'its directory {parent} is not writable'
  if path.exists() and not os.access(path, os.W_OK):
    return 'the file is not writable'
  return None


def cmd_rewrite(args) -> int:
  """Run ``rewrite`` (see the module docstring). Returns the exit status.

  A ``--report`` that is empty, cannot be written, or names a file the run reads, is
  refused (exit 2) before anything is written. Ctrl-C exits 130 with one line: before the
  writes, nothing is written; during them, the file being written is finished and the rest
  are left as they were (the line says how many were written).
  """
  if args.write and args.check:
    print('rewrite: --write and --check exclude each other', file=sys.stderr)
    return EXIT_ERROR
  stdin = [p for p in args.paths if p == '-']
  paths = [p for p in args.paths if p != '-']
  fmt = getattr(args, 'output_format', 'full')
  problem = _format_problem(args, fmt, bool(stdin))
  if problem:
    print(f'rewrite: {problem}', file=sys.stderr)
    return EXIT_ERROR
  # `full` (today's output) prints as it goes; another format prints the entries at the end
  full = fmt == 'full' and not getattr(args, 'statistics', False)
  first = pathlib.Path(paths[0]) if paths else pathlib.Path.cwd()
  try:
    config_path = find_config(first if first.exists() else pathlib.Path.cwd())
    config = load_config(config_path)
    options = build_options(args, config)
  except ConfigError as e:
    print(f'rewrite: {e}', file=sys.stderr)
    return EXIT_ERROR
  jobs = args.jobs if args.jobs is not None else (
      config.get('jobs') or os.cpu_count() or 1)
  if jobs < 1:
    print('rewrite: --jobs must be >= 1', file=sys.stderr)
    return EXIT_ERROR
  if args.report == '':
    print("rewrite: --report '': empty path; name the JSON file to write", file=sys.stderr)
    return EXIT_ERROR
  problem = args.report and _unwritable(pathlib.Path(args.report))
  if problem:
    print(f'rewrite: --report {args.report}: cannot write there: {problem}', file=sys.stderr)
    return EXIT_ERROR
  if stdin:
    if paths or len(stdin) > 1:
      print('rewrite: `-` (stdin) cannot be combined with paths', file=sys.stderr)
      return EXIT_ERROR
    return _rewrite_stdin(args, options)
  # named paths left out, with why (a FIFO or device: reading it could block forever)
  missing = {p: ('no such file or directory' if not pathlib.Path(p).exists() else
                 'not a regular file or directory; left alone')
             for p in paths if not (pathlib.Path(p).is_dir() or pathlib.Path(p).is_file())}
  for p, why in missing.items():
    if full:
      print(f'{p}: {why}', file=sys.stderr)
  files = iter_python_files(paths, config.get('exclude', ()))
  if args.report and any(os.path.realpath(f) == os.path.realpath(args.report) for f in files):
    print(f'rewrite: --report {args.report}: is one of the files this run reads; name another '
          'file', file=sys.stderr)
    return EXIT_ERROR
  sources: dict = {}  # each file read once, parsed at most once (codemod.sources)
  store = None if getattr(args, 'no_cache', False) else cache_lib.Cache(
      cache_lib.default_directory(first if first.exists() else pathlib.Path.cwd(), config_path),
      options)
  try:
    results = run_files(files, options, jobs, tree_flows(files, paths, options, sources),
                        sources, store)
    outside = outside_importers(results, files, paths, config.get('exclude', ()))
  except KeyboardInterrupt:  # Ctrl-C before any write: the pool is already stopped
    print('optim-migrate rewrite: interrupted; no file was written', file=sys.stderr)
    return EXIT_INTERRUPTED
  with _sigint_deferred() as interrupted:
    status = _report_and_write(args, results, interrupted, fmt, full)
  if status is not None:
    return status
  for row in outside:
    if full:
      where = f"{row['file']}:{row['line']}:{row['column']}" if row['line'] else row['file']
      print(f"{where}: {row['rule']} [manual] {row['message']}", file=sys.stderr)
  entries = ([e for r in results for e in output_formats.entries_of(r)]
             + [output_formats.entry_of_row(row) for row in outside]
             + [output_formats.error_entry(p, f'{p}: {why}') for p, why in missing.items()])
  if args.report:
    try:
      pathlib.Path(args.report).write_text(output_formats.report_json(entries), encoding='utf-8')
    except OSError as e:
      print(f'rewrite: --report {args.report}: {e}', file=sys.stderr)
      return EXIT_ERROR
  _print_formats(args, fmt, entries)
  verb = 'rewritten' if args.write else 'would be rewritten'
  summary = _summary(results, len(missing), verb)
  if outside:
    summary += (f'; {len({row["file"] for row in outside})} file(s) outside this run import '
                'what it converted (flagged above)')
  print(summary, file=sys.stderr)
  if missing or any(r.error for r in results):
    return EXIT_ERROR
  if outside or any(r.changed or r.manual for r in results):
    return EXIT_CHANGES
  return EXIT_CLEAN


def _format_problem(args, fmt: str, stdin: bool) -> Optional[str]:
  """Why ``--output-format`` / ``--statistics`` / ``--show-fixes`` cannot go with the
  other options, or None."""
  if fmt in ('json', 'sarif') and args.diff:
    return (f'--output-format {fmt} writes one {fmt.upper()} document on stdout; --diff '
            'would mix a diff into it (drop --diff, or use --output-format full/concise/github)')
  if stdin and (fmt != 'full' or getattr(args, 'statistics', False)):
    return ('`-` (stdin) writes the module (or its diff) to stdout: --output-format '
            f'{fmt}{" and --statistics" if getattr(args, "statistics", False) else ""} '
            'need file paths')
  return None


def _print_formats(args, fmt: str, entries: list) -> None:
  """The findings in ``fmt`` on stdout (not ``full``: printed as the run went),
  ``--statistics`` in their place, and ``--show-fixes`` on stderr."""
  if getattr(args, 'statistics', False):
    sys.stdout.write(output_formats.statistics_text(entries, fmt))
  elif fmt != 'full':
    sys.stdout.write(output_formats.render(fmt, entries))
  if getattr(args, 'show_fixes', False):
    sys.stderr.write(output_formats.show_fixes_text(entries, 'Fixed' if args.write
                                                    else 'Would fix'))


def _report_and_write(args, results, interrupted: list, fmt: str = 'full',
                      full: bool = True) -> Optional[int]:
  """Print each result's items and diff, writing its file with ``--write``; None when done.

  ``full``: today's output, printed as it goes (items on stderr, ``would rewrite`` lines);
  another ``fmt`` prints its entries at the end, and diffs here only with ``--diff``.

  A Ctrl-C here (``interrupted``: see :func:`_sigint_deferred`) ends the loop once the file
  being written is whole: each file is either written or left as it was, and the return is
  :data:`EXIT_INTERRUPTED` after a line that says how many were written.
  """
  written = 0
  for result in results:
    if interrupted:
      break
    if result.error:
      if full:
        print(result.error, file=sys.stderr)
      continue
    for i, finding in enumerate(result.findings):
      if not finding.fixed and full:
        print(finding.format(result.where(i)), file=sys.stderr)
    if result.changed:
      if args.write:
        try:
          engine.write_atomic(pathlib.Path(result.path), result.new, result.encoding)
        except OSError as e:
          result.error = f'{result.path}: cannot write: {e}'
          if full:
            print(result.error, file=sys.stderr)
        else:
          written += 1
          if args.diff:  # what was written
            sys.stdout.write(result.diff())
      elif args.check:
        if fmt == 'full':
          print(f'would rewrite {result.path}', file=sys.stdout)
        if args.diff:
          sys.stdout.write(result.diff())
      elif fmt == 'full' or args.diff:  # another format: the diff only when asked for
        sys.stdout.write(result.diff())
  if interrupted:
    n_changed = sum(r.changed and not r.error for r in results)
    print(f'optim-migrate: interrupted: {written} of {n_changed} file(s) to rewrite were written, '
          'the others left unchanged' if args.write else 'optim-migrate: interrupted',
          file=sys.stderr)
    return EXIT_INTERRUPTED
  return None


@contextlib.contextmanager
def _sigint_deferred():
  """Within: a SIGINT (Ctrl-C) appends to the yielded list instead of raising
  KeyboardInterrupt, so a loop can stop between two files (main thread only; elsewhere
  signals are not delivered to this thread anyway)."""
  got: list = []
  if threading.current_thread() is not threading.main_thread():
    yield got
    return
  old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
  try:
    yield got
  finally:
    signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)


def _looks_like_notebook(source: str) -> bool:
  """Whether ``source`` is notebook JSON (an object with a ``cells`` list or ``nbformat``)."""
  if not source.lstrip().startswith('{'):
    return False
  try:
    data = json.loads(source)
  except ValueError:
    return False
  return isinstance(data, dict) and (isinstance(data.get('cells'), list) or 'nbformat' in data)


def _rewrite_stdin(args, options: Options) -> int:
  """``rewrite -``: a Python module from stdin, the result on stdout. Returns the exit status.

  Input that cannot be decoded, does not parse, or is notebook JSON (``-`` reads Python
  source only) is an error (exit 2): stdout gets the input unchanged, stderr the reason.
  """
  data = sys.stdin.buffer.read()
  try:
    source, encoding = engine.decode_source(data)  # the coding cookie, as for files
  except (UnicodeDecodeError, SyntaxError) as e:
    print(f'<stdin>: cannot read: {e}', file=sys.stderr)
    sys.stdout.buffer.write(data)
    return EXIT_ERROR
  if _looks_like_notebook(source):
    print('<stdin>: this is notebook (.ipynb) JSON, but `-` reads Python source only; give '
          'the notebook as a file (optim-migrate rewrite NOTEBOOK.ipynb)', file=sys.stderr)
    sys.stdout.buffer.write(data)
    return EXIT_ERROR
  out = lambda text: (sys.stdout.flush(), sys.stdout.buffer.write(text.encode(encoding)))
  result = engine.rewrite_source(source, '<stdin>', options)
  if result.error:
    print(result.error, file=sys.stderr)
    out(source)
    return EXIT_ERROR
  for finding in result.manual:
    print(finding.format('<stdin>'), file=sys.stderr)
  if args.check:
    if result.changed:  # as for files: the verdict, and the text only with --diff
      print('would rewrite <stdin>', flush=True)
      if args.diff:
        out(result.diff())
  elif args.diff:
    out(result.diff())
  else:
    out(result.new)
  if args.report:
    pathlib.Path(args.report).write_text(
        output_formats.report_json(output_formats.entries_of(result)))
  if getattr(args, 'show_fixes', False):
    sys.stderr.write(output_formats.show_fixes_text(output_formats.entries_of(result),
                                                    'Would fix'))
  return EXIT_CHANGES if (result.changed or result.manual) else EXIT_CLEAN


def add_arguments(p) -> None:
  """``rewrite``'s options on an argparse parser."""
  p.add_argument('paths', nargs='+', help='files or directories; `-` reads stdin, writes stdout')
  mode = p.add_mutually_exclusive_group()
  mode.add_argument('--write', action='store_true', help='apply the changes in place')
  mode.add_argument('--check', action='store_true',
                    help='write nothing; list what would change (exit 1 if anything would)')
  p.add_argument('--diff', action='store_true',
                 help='print a unified diff (the default); with --write, also print the diff '
                      'of what was written; with --check, also print the diff after each '
                      '"would rewrite" line')
  p.add_argument('--select', action='append', default=None, metavar='RULES',
                 help='only these rules (ids or prefixes, comma-separated)')
  p.add_argument('--ignore', action='append', default=None, metavar='RULES',
                 help='skip these rules (ids or prefixes, comma-separated)')
  p.add_argument('--unsafe-fixes', action='store_true', help='also apply fixes marked unsafe')
  p.add_argument('--no-shim-fallback', action='store_true',
                 help='a file that keeps its legacy optimizer code gets its TODOs only, not '
                      'optim_compat.install() (OM014), which runs it on the shim')
  p.add_argument('--prefer-stock-optax', action='store_true',
                 help='emit stock Optax where the faithful optim_compat transform would be '
                      'emitted (the report gives the measured difference)')
  p.add_argument('--jobs', '-j', type=int, default=None, help='worker processes (default: CPUs)')
  p.add_argument('--no-cache', action='store_true',
                 help='neither read nor write the result cache (.optim-migrate-cache/ in the '
                      'project root)')
  p.add_argument('--report', metavar='FILE.json', help='write one JSON entry per site')
  p.add_argument('--output-format', choices=output_formats.FORMATS, default='full',
                 help='how findings are printed: full (default: diffs on stdout, open '
                      'findings on stderr), concise (one line per finding), json (the '
                      '--report rows), github (workflow annotations), sarif (SARIF 2.1.0); '
                      'on stdout')
  p.add_argument('--statistics', action='store_true',
                 help='print the count of findings per rule instead of the findings')
  p.add_argument('--show-fixes', action='store_true',
                 help='list the fixes applied (or, without --write, that would be) per file, '
                      'on stderr')
