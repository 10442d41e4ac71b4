"""``docs/_generated/cli_help.md``: ``optim-migrate <command> --help`` of every command.

Taken from the parsers themselves (``codemod.cli.main``), so the reference lists
exactly the options the installed command takes.
"""
from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

from _gen import write


def help_text(argv: list[str]) -> str:
  from codemod import cli
  out = io.StringIO()
  old = os.environ.get('COLUMNS')
  os.environ['COLUMNS'] = '100'  # argparse wraps to the terminal width: fix it
  try:
    with contextlib.redirect_stdout(out):
      try:
        cli.main(argv)
      except SystemExit:
        pass
  finally:
    if old is None:
      os.environ.pop('COLUMNS', None)
    else:
      os.environ['COLUMNS'] = old
  return out.getvalue().rstrip()


def commands() -> list[str]:
  top = help_text(['--help'])
  found = re.search(r'\{([\w,-]+)\}', top)
  if not found:
    raise RuntimeError(f'no subcommand list in `optim-migrate --help`:\n{top}')
  return found.group(1).split(',')


def page() -> str:
  out = ['`optim-migrate --help`:', '', '```text', help_text(['--help']), '```', '']
  for name in commands():
    out += [f'### `optim-migrate {name}`', '', '```text', help_text([name, '--help']), '```', '']
  return '\n'.join(out)


def generate(docs: pathlib.Path) -> list[str]:
  return write.sync(docs / '_generated', {'cli_help.md': page()})
