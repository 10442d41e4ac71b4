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

import ast

import collections
import contextlib
import json
import os
import pathlib
import signal
import sys
import threading
from typing import Optional

from codemod import cache as cache_lib, flow as flow_lib, output_formats, sources as sources_lib
from codemod.config import ConfigError
from codemod.result import FileResult
from codemod.rules import Options
# the parts of the run, re-exported here where they were defined before (tests, bench/ and
# codemod.cli import them from codemod.runner); those of codemod.pool, which loads the
# engine (LibCST), at first use (:func:`__getattr__`)
from codemod.batch import (POOL_MIN_FILES, PROGRESS_MIN_FILES, _candidate, _data,  # noqa: F401
                           _named, _progress, outside_importers, run_files, tree_flows)
from codemod.run_options import (CONFIG_KEYS, OTHER_KEYS, _split, build_options,  # noqa: F401
                                 find_config, load_config)
from codemod.walk import SKIP_DIRS, _is_venv, iter_python_files, named_file_problem  # noqa: F401

EXIT_CLEAN, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2
#: Exit status after Ctrl-C (SIGINT), as shells report a program that SIGINT ended.
EXIT_INTERRUPTED = 130

#: The names of codemod.pool re-exported here, loaded at first use.
_POOL_NAMES = frozenset({'_PR_SET_PDEATHSIG', '_Pool', '_pool_context', '_pool_worker',
                         '_sigint_blocked', '_watch_parent', '_work', '_worker_init',
                         'gc_paused'})


def __getattr__(name: str):
  if name in _POOL_NAMES:
    from codemod import pool
    return getattr(pool, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def report_entries(result: FileResult) -> list[dict]:
  """JSON report rows for one file: one per site, plus one for a file error
  (``codemod.output_formats.Entry.row``)."""
  return [e.row() for e in output_formats.entries_of(result)]



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


def _write_diff(result) -> None:
  """``result``'s diff on stdout, in the file's encoding (its bytes where stdout has them)."""
  buffer = getattr(sys.stdout, 'buffer', None)
  if buffer is None or result.encoding.lower().replace('_', '-') in ('utf-8', 'utf8', 'utf-8-sig'):
    sys.stdout.write(result.diff())
    return
  sys.stdout.flush()
  buffer.write(result.diff_bytes())
  buffer.flush()


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
  missing = {p: ("empty path (pathlib reads '' as the current directory; name it `.`)"
                 if p == '' else
                 'a symbolic link that leads nowhere (dangling, or a loop)'
                 if pathlib.Path(p).is_symlink() and not pathlib.Path(p).exists() else
                 'no such file or directory' if not pathlib.Path(p).exists() else
                 'not a regular file or directory; left alone')
             for p in paths if p == '' or not (pathlib.Path(p).is_dir()
                                               or pathlib.Path(p).is_file())}
  missing.update((p, why) for p in paths if p not in missing and pathlib.Path(p).is_file()
                 for why in [named_file_problem(pathlib.Path(p))] if why)
  skipped: list = []
  files = iter_python_files([p for p in paths if p != ''], config.get('exclude', ()), skipped)
  # a directory with nothing to take is a wrong path far more often than a finished job
  missing.update((p, 'no .py or .ipynb file taken in this directory (hidden folders, '
                  'virtualenvs, build/dist, the config\'s `exclude` globs and symlinks to '
                  'files outside it are skipped)')
                 for p in paths if pathlib.Path(p).is_dir() and not any(
                     f.is_relative_to(p) for f in files)  # (no second walk when it took some)
                 and not iter_python_files([p], config.get('exclude', ())))
  for p, why in missing.items():
    if full:
      print(f"{p or repr(p)}: {why}", file=sys.stderr)
  for f, why in skipped:  # (a note, not a failure: a directory may hold such names)
    if full:
      print(f'{f}: skipped: {why}', file=sys.stderr)
  if args.report and any(os.path.realpath(f) == os.path.realpath(args.report) for f in files):
    print(f'rewrite: --report {args.report}: is one of the files this run reads; name another '
          'file', file=sys.stderr)
    return EXIT_ERROR
  sources: dict = {}  # each file read once, parsed at most once (codemod.sources)
  store = None if getattr(args, 'no_cache', False) else cache_lib.Cache(
      cache_lib.default_directory(first if first.exists() else pathlib.Path.cwd(), config_path),
      options)
  try:
    with flow_lib.scan_cache(store):
      flows = tree_flows(files, paths, options, sources)
    results = run_files(files, options, jobs, flows, sources, store)
    outside = outside_importers(results, files, paths, config.get('exclude', ()))
  except KeyboardInterrupt:  # Ctrl-C before any write: the pool is already stopped
    print('optim-migrate rewrite: interrupted; no file was written', file=sys.stderr)
    return EXIT_INTERRUPTED
  # a file named on the command line gets a verdict even where the prefilters passed it
  # over unread (not a parse: bytes that do not decode, a syntax error, broken notebook JSON)
  named = {pathlib.Path(p) for p in paths if pathlib.Path(p).is_file()}
  for f, result in zip(files, results):
    if f in named and not result.error and result.original == '' and result.new == '' \
        and (why := sources_lib.unreadable(sources.get(f) or sources_lib.SourceFile(f))):
      result.error = why
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
  if results or not missing:  # not "0 file(s) scanned" after missing paths alone
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
    if result.changed and args.write:
      try:
        sources_lib.write_atomic(pathlib.Path(result.path), result.new, result.encoding)
      except OSError as e:
        result.error = f'{result.path}: cannot write: {e}'
        if full:
          print(result.error, file=sys.stderr)
      else:
        written += 1
        # the findings where the user now finds them: in the file as written
        result.findings = result.at_new_lines()
    for i, finding in enumerate(result.findings):
      if not finding.fixed and full:
        print(finding.format(result.where(i)), file=sys.stderr)
    if result.changed and not result.error:
      if args.write:
        if args.diff:  # what was written
          _write_diff(result)
      elif args.check:
        if full:
          print(f'would rewrite {result.path}', file=sys.stdout)
        if args.diff:
          _write_diff(result)
      elif full or args.diff:  # another format or --statistics: the diff only when asked for
        _write_diff(result)
  if interrupted:
    n_changed = sum(r.changed and not r.error for r in results)
    print(f'optim-migrate: interrupted: {written} of {n_changed} file(s) to rewrite were written, '
          'the others left unchanged (each file is whole; run the same command again to '
          'finish)' if args.write else 'optim-migrate: interrupted',
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
  from codemod import engine
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
  try:  # (the rewrite parses only what may need it: stdin was asked for, so it must parse)
    ast.parse(source)
  except SyntaxError as e:
    print(f'<stdin>:{e.lineno or 0}:{e.offset or 0}: cannot parse: {e.msg}', file=sys.stderr)
    out(source)
    return EXIT_ERROR
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
