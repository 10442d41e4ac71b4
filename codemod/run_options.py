"""``rewrite``'s options: ``[tool.optim-migrate]`` found and checked, flags over it.

:func:`find_config` looks up the nearest ``pyproject.toml`` with the table,
:func:`load_config` checks its keys (:data:`CONFIG_KEYS`), :func:`build_options`
puts the command-line flags over it (``codemod.runner`` calls them).
"""
from __future__ import annotations

import difflib
import pathlib
from typing import Optional

from codemod.config import ConfigError, read_table
from codemod.rules import RULES, Options, check_rule_ids

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
      raise ConfigError(f'{path}: ' + unknown_ids_message(f'[tool.optim-migrate] {key}', bad))
  for key in ('prefer-stock-optax', 'unsafe-fixes', 'shim-fallback'):
    if key in table and not isinstance(table[key], bool):
      raise ConfigError(f'{path}: [tool.optim-migrate] {key} must be true or false')
  jobs = table.get('jobs')
  # a TOML boolean is a Python bool, itself an int: `jobs = true` is no count of workers
  if 'jobs' in table and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
    shown = str(jobs).lower() if isinstance(jobs, bool) else repr(jobs)  # as TOML spells it
    raise ConfigError(f'{path}: [tool.optim-migrate] jobs = {shown}: must be an integer >= 1')
  return table


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


def did_you_mean(given: str, known) -> str:
  """``'did you mean A, B or C? '`` with the (at most 3) ids of ``known`` closest to
  ``given`` (upper-cased), or ``''`` when none is close."""
  close = difflib.get_close_matches(given.upper(), sorted(known), n=3)
  if not close:
    return ''
  return ('did you mean ' + ', '.join(close[:-1]) + (' or ' if len(close) > 1 else '')
          + close[-1] + '? ')


def unknown_ids_message(flag: str, bad: list[str]) -> str:
  """The error for rule ids (or prefixes) in ``flag`` that name no rule: the ids, the closest
  known ids or prefixes of each (``om001`` -> ``OM001``), and where the list is, rather than
  the whole list."""
  hints = []
  for given in bad:
    hint = did_you_mean(given, set(RULES) | {rule[:len(given)] for rule in RULES})
    if hint:
      hints.append((f'{given}: ' if len(bad) > 1 else '') + hint)
  return f'{flag}: unknown rule id(s) {bad}; ' + ''.join(hints) + '`optim-migrate rule` lists every rule'


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
      raise ConfigError(unknown_ids_message(flag, bad))
  return Options(select=select, ignore=ignore,
                 unsafe_fixes=args.unsafe_fixes or config.get('unsafe-fixes', False),
                 prefer_stock_optax=args.prefer_stock_optax or config.get('prefer-stock-optax', False),
                 shim_fallback=not getattr(args, 'no_shim_fallback', False)
                 and config.get('shim-fallback', True))
