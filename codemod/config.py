"""``[tool.optim-migrate]`` in ``pyproject.toml``: the one reader of the project's config.

``rewrite`` reads its keys (``codemod.run_options.load_config``) and ``check`` its
``[[tool.optim-migrate.check]]`` entries (``equivalence_tests.cli``), both through
:func:`read_table`, so a malformed file gets the same message from either.
"""
from __future__ import annotations

import difflib
import pathlib
from typing import Optional


class ConfigError(ValueError):
  """A bad ``[tool.optim-migrate]`` table or option value (message names it)."""


def read_table(path: pathlib.Path) -> Optional[dict]:
  """``[tool.optim-migrate]`` of the TOML file ``path``, or None when it has none.

  Raises:
    ConfigError: unreadable, not TOML, or ``tool`` / ``tool.optim-migrate`` is not a table
      (the message names the file).
  """
  try:
    import tomllib
  except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
  try:
    data = tomllib.loads(pathlib.Path(path).read_text(encoding='utf-8'))
  except (OSError, ValueError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
    raise ConfigError(f'{path}: cannot read: {e}') from e
  tool = data.get('tool', {})
  if not isinstance(tool, dict):
    raise ConfigError(f'{path}: tool must be a table ([tool]), got {tool!r}')
  table = tool.get('optim-migrate')
  # (helper-36: `[tool.optim_migrat]` too; difflib's ratio >= 0.8 of the normalised name)
  misspelt = [k for k in tool if k != 'optim-migrate' and any(
      difflib.SequenceMatcher(None, k.replace('_', '-').lower(), right).ratio() >= 0.8
      for right in ('optim-migrate', 'flax-optim-migrate'))]
  if table is None and misspelt:  # (helper-35: `[tool.optim_migrate]` was ignored silently)
    raise ConfigError(f'{path}: [tool.{misspelt[0]}] is not read: the table is '
                      '[tool.optim-migrate]')
  if table is not None and not isinstance(table, dict):
    raise ConfigError(f'{path}: tool.optim-migrate must be a table ([tool.optim-migrate]), '
                      f'got {table!r}')
  return table
