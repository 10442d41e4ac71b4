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


def _like(key: str, right: str, ratio: float = 0.8) -> bool:
  """Whether ``key`` is ``right`` misspelt (difflib ratio of the lower-case, ``-`` for ``_``)."""
  return difflib.SequenceMatcher(None, key.replace('_', '-').lower(), right).ratio() >= ratio


def _misplaced(data: dict) -> list:
  """Dotted names of tables in ``data`` that look meant as ``[tool.optim-migrate]``.

  Misspelt (``[tool.optim_migrat]``), at the top level (``[optim-migrate]``) or under a misspelt
  ``tool`` (``[tools.optim-migrate]``).
  """
  names = ('optim-migrate', 'flax-optim-migrate')
  found = []
  for top, value in data.items():
    if any(_like(top, n) for n in names):
      found.append(top)
    elif isinstance(value, dict) and (top == 'tool' or _like(top, 'tool', 0.75)):
      found += [f'{top}.{k}' for k in value
                if (top, k) != ('tool', 'optim-migrate') and any(_like(k, n) for n in names)]
  return found


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
  if table is None:
    misplaced = _misplaced(data)
    if misplaced:  # (helper-35/36/39: these were ignored silently, their `exclude` lost)
      raise ConfigError(f'{path}: [{misplaced[0]}] is not read: the table is '
                        '[tool.optim-migrate]')
  if table is not None and not isinstance(table, dict):
    raise ConfigError(f'{path}: tool.optim-migrate must be a table ([tool.optim-migrate]), '
                      f'got {table!r}')
  return table
