"""``optim-migrate``: the toolkit's command line.

    optim-migrate rewrite PATH... [--write|--check] [--diff] [--select/--ignore RULES]
        [--unsafe-fixes] [--prefer-stock-optax] [--jobs N] [--report FILE.json] [-]   # diff by default; exit 0/1/2
        [--output-format full|concise|json|github|sarif] [--statistics] [--show-fixes]  # docs/ci.md
        [--no-cache] [--no-shim-fallback]      # (docs/cli.md: every option)
    optim-migrate run SCRIPT [ARGS...]        # run a legacy script on the shim
    optim-migrate convert-checkpoint SRC DST --optimizer "Adam(...)"  # a legacy checkpoint -> TrainState
    optim-migrate check --legacy "Adam(...)" --tx "optax.adam(...)" --params shapes.json  # prove a migration
    optim-migrate record ...                  # record a legacy def's trajectory (old stack)
    optim-migrate demo [--steps N] [--devices N] [--examples DIR]  # the bundled example, end to end
    optim-migrate rule [OM0xx | --all]        # a rule's documentation (as docs/rules/<id>.md)
    optim-migrate --version                   # the installed package's version
"""
from __future__ import annotations

import argparse
import importlib.machinery
import os
import pathlib
import sys
import types
from typing import Optional

EXIT_CLEAN, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2
#: Exit status after Ctrl-C (SIGINT), as a shell reports a program that SIGINT ended.
EXIT_INTERRUPTED = 130
#: The distribution name (``[project] name`` in pyproject.toml) whose metadata gives ``--version``.
DIST_NAME = 'flax-optim-migrate'

#: Modules that add subcommands: each has ``register(subparsers)``, which adds
#: its parsers with ``set_defaults(func=...)`` (``func(args) -> exit status``).
EXTRA_COMMANDS: tuple[str, ...] = ('codemod.convert_checkpoint', 'equivalence_tests.cli',
                                   'codemod.rule_docs')


def version_text() -> str:
  """``--version``'s line: ``optim-migrate X.Y.Z`` from the installed package's metadata.

  Without installed metadata (run from a source tree on ``PYTHONPATH``) the line says the
  version is unknown and why; nothing is raised.
  """
  import importlib.metadata
  try:
    return f'optim-migrate {importlib.metadata.version(DIST_NAME)}'
  except importlib.metadata.PackageNotFoundError:
    return (f'optim-migrate: version unknown: the {DIST_NAME} package is not installed '
            '(run from a source tree?)')


class _VersionAction(argparse.Action):
  """``--version``: print :func:`version_text` and exit 0 (looked up only when asked)."""

  def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
               help='print the installed version and exit'):
    super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

  def __call__(self, parser, namespace, values, option_string=None):
    print(version_text())
    parser.exit(0)


def cmd_rewrite(args) -> int:
  from codemod import runner
  return runner.cmd_rewrite(args)


def cmd_run(args) -> int:
  """Run SCRIPT as ``__main__`` with ``flax.optim`` resolving to the shim.

  As ``python SCRIPT`` would (``__file__`` absolute, ``sys.argv[0]`` as given): a syntax
  error in SCRIPT, or an exception it raises, prints the script's error (no frames of this
  tool) and exits 1, as does a SCRIPT python would not decode (a byte its declared encoding,
  UTF-8 by default, does not hold, or a NUL byte: named by line and column). A SCRIPT that
  is missing, a directory or unreadable exits 2.
  """
  import optim_compat
  optim_compat.install()
  script = pathlib.Path(args.script)
  if script.is_dir():
    print(f'{script}: is a directory, not a script', file=sys.stderr)
    return EXIT_ERROR
  if not script.is_file():
    print(f'{script}: no such file', file=sys.stderr)
    return EXIT_ERROR
  try:
    source = script.read_bytes()
  except OSError as e:
    print(f'{script}: cannot read: {e.strerror or e}', file=sys.stderr)
    return EXIT_ERROR
  # As CPython >= 3.9 runs ``python SCRIPT``: ``__file__`` and the code's filename are the
  # working directory joined with SCRIPT as given (not normalized: ``./`` and symlinks kept),
  # sys.argv[0] is SCRIPT as given, sys.path[0] the script's directory (symlinks resolved).
  # runpy.run_path would set sys.argv[0] to the path, so the module is run here.
  path = args.script if os.path.isabs(args.script) else os.path.join(os.getcwd(), args.script)
  problem = _undecodable(source)
  if problem:  # as python refuses it (compile() of bytes would pass a bad comment over)
    print(f'{script}: {problem}', file=sys.stderr)
    return 1
  try:  # compiled here first, so a syntax error shows no frames of this tool
    code = compile(source, path, 'exec', dont_inherit=True)
  except SyntaxError as e:
    import traceback
    sys.stderr.write(''.join(traceback.format_exception_only(type(e), e)))
    return 1
  sys.argv = [args.script, *args.args]
  sys.path.insert(0, str(script.resolve().parent))
  main = types.ModuleType('__main__')
  main.__file__, main.__cached__, main.__spec__ = path, None, None
  main.__loader__ = importlib.machinery.SourceFileLoader('__main__', path)
  saved_main = sys.modules.get('__main__')
  sys.modules['__main__'] = main
  try:
    exec(code, main.__dict__)  # noqa: S102 - running the user's script is this command's job
  except Exception as e:  # noqa: BLE001 - reported as python would, from the script's frames
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
      tb = tb.tb_next
    tb = tb or e.__traceback__
    sys.excepthook(type(e), e.with_traceback(tb), tb)
    hint = _removed_api_hint(e, _failing_file(e.__traceback__, path, args.script))
    if hint:
      print(hint, file=sys.stderr)
    return 1
  except SystemExit as e:
    status = e.code
    if status is None:
      return 0
    if isinstance(status, int):
      return status
    print(status, file=sys.stderr)
    return 1
  finally:
    if saved_main is not None:
      sys.modules['__main__'] = saved_main
  return 0


def _undecodable(source: bytes) -> Optional[str]:
  """Why python would not run ``source`` before parsing it, or None: a byte its declared
  encoding (PEP 263; UTF-8 when none is declared) does not decode, an unknown encoding, or
  a NUL byte; each named by line and column (1-based)."""
  import io
  import tokenize

  def where(offset: int) -> str:
    line, line_start = source.count(b'\n', 0, offset) + 1, source.rfind(b'\n', 0, offset) + 1
    return f'line {line}, column {offset - line_start + 1}'

  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
  except SyntaxError as e:  # a first or second line that is not UTF-8 says this too
    encoding, cookie_problem = 'utf-8', e
  else:
    cookie_problem = None
  try:
    source.decode(encoding)
    if cookie_problem is not None:  # an unknown encoding, or a BOM against the cookie
      return f'SyntaxError: {cookie_problem}'
  except UnicodeDecodeError as e:
    why = ('not UTF-8, and the file declares no other encoding' if encoding in
           ('utf-8', 'utf-8-sig') else f'not valid {encoding}, the encoding the file declares')
    return (f'SyntaxError: {where(e.start)}: byte 0x{source[e.start]:02x} is {why} (PEP 263); '
            'save the file as UTF-8 or declare its encoding in a `# -*- coding: NAME -*-` line')
  nul = source.find(b'\0')
  if nul >= 0:
    return (f'SyntaxError: {where(nul)}: a NUL byte (python runs no source with one; '
            'UTF-16 text?)')
  return None


def _failing_file(tb, path: str, script: str) -> str:
  """The user's file the error came from, as the hint names it: the innermost frame of
  ``tb`` in a file that is neither a library (the interpreter's or an installed package's)
  nor this tool; ``script`` (SCRIPT as given) when that is the script itself or none is
  found. Shown relative to the working directory when it lies below it."""
  import sysconfig
  libraries = {os.path.realpath(p) for p in (sysconfig.get_paths().get(k) for k in (
      'stdlib', 'platstdlib', 'purelib', 'platlib')) if p}
  ours = {os.path.realpath(os.path.dirname(m.__file__)) for m in (
      sys.modules.get('optim_compat'), sys.modules.get('codemod')) if m and m.__file__}
  found = None
  while tb is not None:
    name = tb.tb_frame.f_code.co_filename
    real = os.path.realpath(name)
    if not name.startswith('<') and not any(
        real == d or real.startswith(d + os.sep) for d in libraries | ours):
      found = name
    tb = tb.tb_next
  if found is None or found == path:
    return script
  rel = os.path.relpath(found)
  return found if rel.startswith(os.pardir) else rel


def _removed_api_hint(e: BaseException, where: str) -> Optional[str]:
  """What to do when SCRIPT died on an API removed beside flax.optim (``jax.tree_map``,
  ``jax.config``, ``flax.nn``...), which ``run`` does not patch, or on what such an API's
  value became (``.unfreeze()`` of the dict ``init`` returns since flax 0.7.1); or None.
  ``where``: the user's file it died in (:func:`_failing_file`), the file to rewrite."""
  from codemod.modern import table
  if isinstance(e, ValueError) and 'should be absolute' in str(e):
    return ('optim-migrate run: Flax >= 0.7 saves checkpoints with orbax, which needs an '
            'absolute directory: pass os.path.abspath(dir) to save_checkpoint '
            f'(`optim-migrate rewrite --write {where}` does so, OM013)')
  if isinstance(e, AttributeError) and isinstance(getattr(e, 'obj', None), dict):
    api = table.dict_method_gone(getattr(e, 'name', None))
    if api is None:
      return None
    return (f'optim-migrate run: `.{api.extra}()` of a dict: {api.why} ({api.rule}). '
            f'`optim-migrate rewrite --write {where}` rewrites it to `{api.new}(...)` where it '
            'proves the value a FrozenDict or what `init` returned, and flags the other uses '
            f'(OM208); `{api.new}` takes both')
  if isinstance(e, ModuleNotFoundError):
    qname = e.name
  elif isinstance(e, AttributeError) and isinstance(getattr(e, 'obj', None), types.ModuleType):
    qname = f'{e.obj.__name__}.{e.name}'
  else:
    return None
  api = qname and table.removed(qname)
  if api is None:
    return None
  return (f'optim-migrate run: `{qname}` is one of the APIs removed beside flax.optim '
          f'({api.since}); `run` redirects flax.optim only. `optim-migrate rewrite --write '
          f'{where}` rewrites it ({api.rule}: {table.rule_summary(api.rule)})')


def cmd_demo(args) -> int:
  for option, value in (('--steps', args.steps), ('--devices', args.devices)):
    if value < 1:
      print(f'demo: {option} {value}: must be >= 1', file=sys.stderr)
      return EXIT_ERROR
  from codemod import demo
  return demo.main(steps=args.steps, devices=args.devices, examples=args.examples)


def build_parser() -> argparse.ArgumentParser:
  """The ``optim-migrate`` argument parser, every subcommand registered (nothing runs)."""
  parser = argparse.ArgumentParser(prog='optim-migrate', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--version', action=_VersionAction)
  sub = parser.add_subparsers(dest='command', required=True)
  p = sub.add_parser('rewrite', help='rewrite legacy flax.optim code to Optax + TrainState')
  from codemod import runner
  runner.add_arguments(p)
  p.set_defaults(func=cmd_rewrite)
  p = sub.add_parser('run', help='run an unmodified legacy script with the shim installed',
                     usage='%(prog)s [-h] SCRIPT [ARGS ...]')
  p.add_argument('script', metavar='SCRIPT',
                 help='the legacy script, run as `python SCRIPT` runs it')
  p.add_argument('args', nargs=argparse.REMAINDER, metavar='ARGS',
                 help="the script's own arguments (optional; everything after SCRIPT)")
  p.set_defaults(func=cmd_run)
  p = sub.add_parser('demo', help='migrate the bundled example and train both versions')
  p.add_argument('--steps', type=int, default=200)
  p.add_argument('--devices', type=int, default=2,
                 help='CPU devices for pmap (must divide the example\'s batch of 64)')
  p.add_argument('--examples', default=None, metavar='DIR',
                 help='a directory holding legacy/ and migrated/train_digits.py (default: '
                      './examples, else the copy installed with this package)')
  p.set_defaults(func=cmd_demo)
  import importlib
  for module in EXTRA_COMMANDS:
    importlib.import_module(module).register(sub)
  return parser


def main(argv=None) -> int:
  parser = build_parser()
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv == ['run']:  # (argparse would call the script's optional arguments required too)
    print('optim-migrate run: give the SCRIPT to run (then its own arguments, if any)',
          file=sys.stderr)
    return EXIT_ERROR
  if argv[:1] == ['run'] and len(argv) > 1 and not argv[1].startswith('-'):
    # everything after SCRIPT belongs to the script, `--` included (an error the script
    # itself raises is reported by cmd_run as python would, never here)
    try:
      return cmd_run(argparse.Namespace(script=argv[1], args=argv[2:]))
    except OSError as e:
      return _os_error('run', e)
  if argv and argv[0].startswith('-') and argv[0] not in ('-h', '--help', '--version'):
    # (argparse would report the missing command, not the option it does not know)
    parser.error(f'unrecognized option {argv[0]!r}: options go after a command '
                 f'(optim-migrate COMMAND {argv[0]} ...); commands: '
                 f'{", ".join(_commands(parser))}')
  args, extra = parser.parse_known_args(argv)
  if extra:  # the subcommand's usage and error, not the top level's
    _unknown_arguments(parser, args.command, extra)
  try:
    return args.func(args)
  except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (a pool's workers are ended)
    print(f'optim-migrate {args.command}: interrupted', file=sys.stderr)
    return EXIT_INTERRUPTED
  except BrokenPipeError:  # `... | head`: the reader left; not an error to report
    return _reader_left()
  except OSError as e:  # e.g. a path inside a directory this user cannot enter
    return _os_error(args.command, e)


def _unknown_arguments(parser: argparse.ArgumentParser, command: str, extra: list[str]):
  """Exit 2 with ``command``'s usage and the arguments it does not take, each option with
  its closest spelling ``command`` has (difflib), if any."""
  import difflib
  sub = next(action.choices[command] for action in parser._subparsers._group_actions)
  known = [o for action in sub._actions for o in action.option_strings]
  hints = [f'{arg} (did you mean {close[0]}?)' if close else arg
           for arg in extra
           for close in [difflib.get_close_matches(arg.split('=', 1)[0], known, n=1, cutoff=0.8)
                         if arg.startswith('-') else []]]
  sub.error(f'unrecognized arguments: {" ".join(hints)}')


def _commands(parser: argparse.ArgumentParser) -> list[str]:
  """The subcommand names of ``parser``, in their order."""
  return [name for action in parser._subparsers._group_actions  # (argparse keeps them there)
          for name in action.choices]


def _reader_left() -> int:
  """Exit status 1, silently, when stdout's reader closed the pipe: stdout is pointed at
  ``os.devnull`` so that the interpreter's final flush raises nothing either (what the
  Python docs advise for SIGPIPE)."""
  try:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
  except (OSError, ValueError):
    pass
  return 1


def _os_error(command: str, e: OSError) -> int:
  """One line naming the path and the reason, exit 2, for an OS error no command caught
  (a ``PermissionError`` from ``Path.exists()`` on a path under a directory without the
  execute bit, say); nothing was written."""
  where = f'{e.filename}: ' if getattr(e, 'filename', None) else ''
  print(f'optim-migrate {command}: {where}{e.strerror or e}', file=sys.stderr)
  return EXIT_ERROR


if __name__ == '__main__':
  sys.exit(main())
