"""The README stays short and current: its commands parse, its links resolve, CI runs its test command."""
import contextlib
import io
import pathlib
import re
import shlex

import pytest

from codemod import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text(encoding='utf-8')


def _blocks(lang: str) -> list[str]:
  return re.findall(rf'^```{lang}\n(.*?)^```', README, flags=re.S | re.M)


def _commands() -> list[str]:
  """Each shell command of the README's bash blocks, continuation lines joined, comments cut."""
  out = []
  for block in _blocks('bash'):
    for line in block.replace('\\\n', ' ').splitlines():
      line = re.sub(r'\s+#\s.*$', '', line).strip()
      if line and not line.startswith('#'):
        out.append(line)
  return out


def _optim_migrate_commands() -> list[list[str]]:
  argvs = []
  for command in _commands():
    for part in re.split(r'\s*&&\s*', command):
      words = shlex.split(part)
      if words[:1] == ['optim-migrate']:
        argvs.append(words[1:])
  return argvs


def test_the_readme_is_short():
  size = len(README.encode('utf-8'))
  assert size <= 12 * 1024, f'README.md is {size} bytes; keep it under 12 KB (details go to docs/)'
  assert not re.search(r'__[A-Z_]+__', README), 'a placeholder is left in the README'


def test_ci_runs_the_readmes_test_command_exactly():
  test_command = next(c for c in _commands() if 'pytest' in c)
  assert test_command in (ROOT / '.ci' / 'run').read_text(encoding='utf-8')


@pytest.mark.parametrize('argv', _optim_migrate_commands(), ids=lambda a: ' '.join(a)[:60])
def test_every_optim_migrate_command_in_the_readme_parses(argv):
  """Each ``optim-migrate ...`` line of the README is accepted by the real argument parser
  (a renamed or dropped option fails here)."""
  parser = cli.build_parser()
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      parser.parse_args(argv)
    except SystemExit as e:
      pytest.fail(f'optim-migrate {" ".join(argv)}: exit {e.code}\n{err.getvalue()}')


def test_the_readme_names_at_least_the_main_commands():
  names = {argv[0] for argv in _optim_migrate_commands()}
  assert {'demo', 'rewrite', 'run', 'check', 'convert-checkpoint', 'rule'} <= names, names


def test_every_relative_link_in_the_readme_exists():
  links = re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', README)
  local = [link for link in links if not re.match(r'[a-z]+:', link)]
  assert local, 'the README links into docs/'
  missing = [link for link in local if not (ROOT / link).exists()]
  assert not missing, f'README links to missing files: {missing}'
