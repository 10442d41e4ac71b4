"""Ecosystem check: the codemod over real public repositories at pinned commits.

    python bench/ecosystem.py                    # every repository of the table
    python bench/ecosystem.py --repos score_sde,google/brax --jobs 2
    python bench/ecosystem.py --diff             # also: what changed since the recorded run
    python bench/ecosystem.py --merge-tree DIR   # only copy the sources into DIR/<owner>+<name>/
    python bench/ecosystem.py --report-only --results   # the recorded run's tables, no run

As ruff's ecosystem check: ``bench/ecosystem_repos.toml`` lists repositories (``repo``,
``commit``, ``legacy_files``, ``why``, optionally ``own_api``: the repository's own copy of
the Optimizer API, whose users are no legacy files). Their sources are never committed here; each is
taken from ``--source DIR/<owner>+<name>/`` (a local copy), else from the cache
``--cache DIR/<owner>+<name>/`` (default ``$OPTIM_MIGRATE_ECOSYSTEM_CACHE`` or
``/work/cache/ecosystem``), else, with ``--clone`` and a network, cloned into the cache at
its commit. A cache or source folder that records its commit (a ``.ecosystem-commit``
file, or a git checkout) must be at the table's commit.

Per repository, on a fresh temporary copy of the tree, run the codemod as a user does
(``optim-migrate rewrite --write --report r.json .`` from the tree's root, with this
checkout's ``codemod`` package), then classify each *legacy file* (one whose original code
imports or names ``flax.optim``, or uses the Optimizer API: ``.apply_gradient(`` (not
given a Python function: ``model.apply_gradient(loss_fn)`` is the user's own method),
``.target`` / ``.state.step`` / ``.optimizer_def`` on an optimizer-looking value,
``.create(`` on a def-looking one such as ``optimizer_def`` or ``get_optimizer(config)``):

- ``converted``: no flax.optim reference left, no TODO, no unflagged legacy reference;
- ``converted_todo``: converted, with ``# TODO(optim-migrate)`` lines left;
- ``fallback``: kept on legacy code with TODOs, and ``optim_compat.install()`` runs before its
  first flax.optim use (the codemod's shim fallback, OM014): it runs on flax >= 0.6;
- ``kept``: still imports flax.optim, with TODOs, and no fallback (does not run on flax >= 0.6);
- ``kept_silent``: still imports flax.optim and carries no TODO at all;
- ``shim``: no flax.optim left, pointed at ``optim_compat``'s legacy API (runs);
- ``residual``: converted, yet a legacy reference (``.apply_gradient(``, ``.target`` on
  an optimizer, ``.state.step``, ``.param_states``, ``.optimizer_def``, ``.hyper_params``,
  ``.replace(target=...)`` on an optimizer,
  ``optimizer_def.create(``, ``optim.X`` after its import is gone, ...) is left with no
  TODO in the comment lines just above its statement (at most 3 lines up, plus the
  contiguous comment block);
- ``crash``: the codemod failed on a file whose input parses (the file is untouched);
- ``unparsed_input``: the original does not parse with this Python (not counted).

Then a second ``rewrite --write`` must change no file (idempotent), and every changed or
legacy file must parse (``ast``; notebooks cell by cell, IPython lines masked). Printed:
per repository and in total, markdown tables of those counts, files changed, idempotent
and parse shares, crashes and wall time. The run is recorded in ``--json``
(``bench/ecosystem_last.json``); ``--diff`` first prints the per-file outcome changes
against the recorded run. ``--results FILE`` rewrites the generated part of that markdown
file (between ``<!-- ecosystem:begin -->`` and ``<!-- ecosystem:end -->``).

Exit status: 0 when the run completed (whatever the counts; ``--strict``: 1 when a
done-when target is missed), 2 when a repository's source cannot be had or a run of the
codemod dies (no report).
"""
from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE = ROOT / 'bench' / 'ecosystem_repos.toml'
LAST_JSON = ROOT / 'bench' / 'ecosystem_last.json'
RESULTS_MD = ROOT / 'bench' / 'ecosystem_results.md'
CACHE_ENV = 'OPTIM_MIGRATE_ECOSYSTEM_CACHE'
DEFAULT_CACHE = pathlib.Path('/work/cache/ecosystem')
COMMIT_FILE = '.ecosystem-commit'
TODO = 'TODO(optim-migrate)'
BEGIN, END = '<!-- ecosystem:begin -->', '<!-- ecosystem:end -->'
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))  # this checkout's codemod (its file walker)

OUTCOMES = ('converted', 'converted_todo', 'residual', 'shim', 'fallback', 'kept', 'kept_silent',
            'crash')
#: Outcomes that run on the modern stack (no flax.optim import left, or the shim before it). A
#: ``residual`` file is not counted: a legacy reference left with no TODO fails there, or may.
RUNNABLE = ('converted', 'converted_todo', 'shim', 'fallback')
LABELS = {'converted': 'converted, no legacy reference left',
          'converted_todo': 'converted, TODOs on lines left',
          'residual': 'converted, unflagged legacy reference left',
          'shim': 'pointed at the shim (optim_compat)',
          'fallback': 'kept on legacy code (TODOs), runs on the shim (optim_compat.install(), OM014)',
          'kept': 'kept on legacy code (TODOs), still imports flax.optim, no shim',
          'kept_silent': 'still imports flax.optim, no TODO',
          'crash': 'internal crash, file untouched'}
#: Public names of flax.optim 0.5.3 (a ``from optim_compat import <these>`` is the shim).
LEGACY_NAMES = {'optim', 'Optimizer', 'OptimizerDef', 'OptimizerState', 'MultiOptimizer',
                'ModelParamTraversal', 'Adam', 'AdaBelief', 'Adafactor', 'Adagrad', 'Adadelta',
                'GradientDescent', 'LAMB', 'LARS', 'Momentum', 'RMSProp', 'WeightNorm',
                'DynamicScale'}
_OPTISH = re.compile(r'(^|_)opt($|_|s$)|optim', re.I)
_MAGIC = re.compile(r'^\s*([%!?]|\w+\s*=\s*[%!])|\?\s*$')


class EcosystemError(RuntimeError):
  """A repository cannot be checked (no source, wrong commit, the codemod died)."""


# --------------------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True)
class Repo:
  """One row of ``ecosystem_repos.toml``."""
  repo: str            # owner/name
  commit: str          # 40 hex digits
  legacy_files: int    # as counted when the row was added (a check of the source)
  why: str
  #: modules of the repository holding its own copy of the Optimizer API (t5x.optimizers):
  #: a file that never names flax.optim and imports one uses that copy, not flax.optim
  own_api: tuple = ()

  @property
  def key(self) -> str:
    """``owner+name``: the folder name in the cache and under ``--source``."""
    return self.repo.replace('/', '+')


def load_table(path: pathlib.Path = TABLE) -> list[Repo]:
  """The repositories of ``path`` (``[[repo]]`` tables), in file order.

  Raises:
    EcosystemError: unreadable or not TOML, a row missing a key or with a bad value
      (``repo`` not ``owner/name``, ``commit`` not 40 hex digits, ``legacy_files`` not an
      int >= 0), or a repository listed twice; the message names the file and row.
  """
  try:
    import tomllib
  except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
  try:
    data = tomllib.loads(path.read_text(encoding='utf-8'))
  except (OSError, tomllib.TOMLDecodeError) as e:
    raise EcosystemError(f'{path}: cannot read: {e}') from e
  rows = data.get('repo')
  if not isinstance(rows, list) or not rows:
    raise EcosystemError(f'{path}: no [[repo]] tables')
  out, seen = [], set()
  for i, row in enumerate(rows, 1):
    where = f'{path}: [[repo]] #{i}'
    missing = {'repo', 'commit', 'legacy_files', 'why'} - set(row)
    if missing:
      raise EcosystemError(f'{where}: missing {sorted(missing)}')
    if not re.fullmatch(r'[\w.-]+/[\w.-]+', str(row['repo'])):
      raise EcosystemError(f'{where}: repo {row["repo"]!r} is not owner/name')
    if not re.fullmatch(r'[0-9a-f]{40}', str(row['commit'])):
      raise EcosystemError(f'{where} ({row["repo"]}): commit {row["commit"]!r} is not 40 hex '
                           'digits')
    if isinstance(row['legacy_files'], bool) or not isinstance(row['legacy_files'], int) \
        or row['legacy_files'] < 0:
      raise EcosystemError(f'{where} ({row["repo"]}): legacy_files must be an int >= 0')
    if row['repo'] in seen:
      raise EcosystemError(f'{where}: {row["repo"]} is listed twice')
    seen.add(row['repo'])
    own = row.get('own_api', [])
    if not isinstance(own, list) or not all(
        isinstance(x, str) and re.fullmatch(r'\w+(\.\w+)*', x) for x in own):
      raise EcosystemError(f'{where} ({row["repo"]}): own_api must be a list of module names')
    out.append(Repo(row['repo'], row['commit'], row['legacy_files'], str(row['why']),
                    tuple(own)))
  return out


def select(repos: list[Repo], names: Optional[str]) -> list[Repo]:
  """The rows named in ``names`` (comma-separated ``owner/name`` or ``name``), table order.

  Raises:
    EcosystemError: a name matches no row (the message lists the table).
  """
  if not names:
    return repos
  wanted = [n.strip() for n in names.split(',') if n.strip()]
  picked = set()
  for n in wanted:
    hits = [r.repo for r in repos if n in (r.repo, r.repo.split('/')[1], r.key)]
    if not hits:
      raise EcosystemError(f'--repos: {n!r} names no repository of the table '
                           f'({", ".join(r.repo for r in repos)})')
    picked.update(hits)
  return [r for r in repos if r.repo in picked]


# --------------------------------------------------------------------------- sources

def recorded_commit(folder: pathlib.Path) -> Optional[str]:
  """The commit ``folder`` says it holds (``.ecosystem-commit``, or ``git rev-parse HEAD``
  of a checkout), or None when it records none."""
  marker = folder / COMMIT_FILE
  if marker.is_file():
    return marker.read_text().strip() or None
  if (folder / '.git').exists():
    proc = subprocess.run(['git', '-C', str(folder), 'rev-parse', 'HEAD'], capture_output=True,
                          text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None
  return None


def clone(repo: Repo, dest: pathlib.Path) -> None:
  """``git clone`` ``repo`` from GitHub into ``dest`` at its commit (needs a network).

  Raises:
    EcosystemError: git failed (its message).
  """
  tmp = dest.with_name(dest.name + '.partial')
  shutil.rmtree(tmp, ignore_errors=True)
  steps = [['git', 'clone', '--quiet', '--filter=blob:none', '--no-checkout',
            f'https://github.com/{repo.repo}.git', str(tmp)],
           ['git', '-C', str(tmp), 'checkout', '--quiet', repo.commit]]
  for cmd in steps:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
      shutil.rmtree(tmp, ignore_errors=True)
      raise EcosystemError(f'{repo.repo}: {" ".join(cmd[:3])} failed: {proc.stderr.strip()}')
  (tmp / COMMIT_FILE).write_text(repo.commit + '\n')
  tmp.rename(dest)


def source_of(repo: Repo, cache: pathlib.Path, sources: Optional[pathlib.Path] = None,
              allow_clone: bool = False) -> pathlib.Path:
  """The folder holding ``repo``'s tree at its commit.

  ``sources/<owner>+<name>`` first, then ``cache/<owner>+<name>``, then (``allow_clone``)
  a clone into the cache.

  Raises:
    EcosystemError: no folder (says where it looked), or one that records another commit.
  """
  looked = []
  for base in ([sources] if sources else []) + [cache]:
    folder = base / repo.key
    looked.append(str(folder))
    if folder.is_dir():
      have = recorded_commit(folder)
      if have is not None and have != repo.commit:
        raise EcosystemError(f'{repo.repo}: {folder} holds commit {have}, the table pins '
                             f'{repo.commit}')
      return folder
  if allow_clone:
    cache.mkdir(parents=True, exist_ok=True)
    clone(repo, cache / repo.key)
    return cache / repo.key
  raise EcosystemError(f'{repo.repo}: no source tree (looked in {", ".join(looked)}); '
                       'give --source DIR holding <owner>+<name>/, or --clone where a network '
                       'is available')


def materialise(src: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
  """Copy tree ``src`` to ``dest`` (which must not exist), without ``.git`` and the
  commit marker; symlinks are copied as links. Returns ``dest``."""
  shutil.copytree(src, dest, symlinks=True,
                  ignore=shutil.ignore_patterns('.git', COMMIT_FILE))
  return dest


# --------------------------------------------------------------------------- reading code

def code_units(path: pathlib.Path, text: str) -> list[tuple[Optional[int], str]]:
  """The Python sources of a file: ``[(None, text)]`` for ``.py``; for a notebook one
  ``(cell index from 0, source)`` per code cell, IPython lines (``%magic``, ``!shell``,
  ``x?``) masked as ``pass`` (same line count) and ``%%`` cells left out.

  Raises:
    ValueError: a notebook that is not JSON with a ``cells`` list.
  """
  if path.suffix != '.ipynb':
    return [(None, text)]
  try:
    nb = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{path}: not notebook JSON: {e}') from e
  cells = nb.get('cells') if isinstance(nb, dict) else None
  if not isinstance(cells, list):
    raise ValueError(f'{path}: notebook JSON without a cells list')
  units = []
  for i, cell in enumerate(cells):
    if not isinstance(cell, dict) or cell.get('cell_type') != 'code':
      continue
    src = cell.get('source', '')
    src = ''.join(src) if isinstance(src, list) else str(src)
    if src.lstrip().startswith('%%'):
      continue
    lines = []
    for line in src.split('\n'):
      if _MAGIC.search(line):
        line = line[:len(line) - len(line.lstrip())] + 'pass'
      lines.append(line)
    units.append((i, '\n'.join(lines)))
  return units


def parse_units(units) -> Optional[list[tuple[Optional[int], str, ast.Module]]]:
  """Each unit with its ``ast`` tree, or None when any unit does not parse."""
  out = []
  for cell, src in units:
    try:
      out.append((cell, src, ast.parse(src)))
    except (SyntaxError, ValueError):
      return None
  return out


def _dotted(node: ast.AST) -> Optional[str]:
  """``a.b.c`` for a chain of Names and Attributes, else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    parts.append(node.id)
    return '.'.join(reversed(parts))
  return None


def _chain(node: ast.AST) -> tuple[Optional[str], list[str]]:
  """The root Name of an attribute / call / subscript chain and its attribute names."""
  names = []
  while True:
    if isinstance(node, ast.Attribute):
      names.append(node.attr)
      node = node.value
    elif isinstance(node, (ast.Call,)):
      node = node.func
    elif isinstance(node, ast.Subscript):
      node = node.value
    else:
      break
  root = node.id if isinstance(node, ast.Name) else None
  return root, list(reversed(names))


def flax_optim_bindings(tree: ast.Module) -> dict[str, int]:
  """Local names bound to ``flax.optim`` (or something from it) -> first line; also the
  key ``'flax.optim'`` for an ``import flax.optim`` / attribute use of ``flax.optim``."""
  out: dict[str, int] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name == 'flax.optim' or a.name.startswith('flax.optim.'):
          out.setdefault(a.asname or 'flax.optim', node.lineno)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      if node.module == 'flax':
        for a in node.names:
          if a.name == 'optim':
            out.setdefault(a.asname or 'optim', node.lineno)
      elif node.module == 'flax.optim' or node.module.startswith('flax.optim.'):
        for a in node.names:
          out.setdefault(a.asname or a.name, node.lineno)
    elif isinstance(node, ast.Attribute) and _dotted(node) == 'flax.optim':
      out.setdefault('flax.optim', node.lineno)
  return out


def installs_shim(tree: ast.Module) -> bool:
  """Whether the module calls ``optim_compat.install()`` at its top level (the codemod's
  shim fallback, OM014: flax.optim then resolves to the shim on flax >= 0.6)."""
  return any(isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
             and ast.unparse(st.value.func) == 'optim_compat.install' for st in tree.body)


#: optim_compat calls of converted code (their arguments may name a legacy def).
_CONVERTED_CALLS = frozenset({'optim_compat.to_optax', 'optim_compat.legacy_state',
                              'optim_compat.with_legacy_state',
                              'optim_compat.legacy_state_dict'})


def uses_shim(tree: ast.Module) -> bool:
  """Whether the module takes flax.optim's API from ``optim_compat`` (the shim): an
  ``import optim_compat as <alias>``, ``from optim_compat import <legacy name>``,
  ``optim_compat.install()``, or ``optim_compat.<legacy name>`` (``class D(
  optim_compat.OptimizerDef)``) anywhere but inside ``optim_compat.to_optax(...)`` (a
  def wrapped for a TrainState is converted code) or a legacy-view call on a TrainState
  (``optim_compat.legacy_state(state, optim_compat.Adam(1e-2))``: the def gives the layout
  of the view, issue 17's conversion of state surgery)."""
  found = False

  class Visit(ast.NodeVisitor):
    def visit_Import(self, node):
      nonlocal found
      found |= any(a.name.split('.')[0] == 'optim_compat' and a.asname and
                   a.asname != 'optim_compat' for a in node.names)

    def visit_ImportFrom(self, node):
      nonlocal found
      if node.module and node.module.split('.')[0] == 'optim_compat':
        found |= any(a.name in LEGACY_NAMES for a in node.names)

    def visit_Call(self, node):
      nonlocal found
      name = _dotted(node.func)
      if name in _CONVERTED_CALLS:
        return  # its argument is a def handed to a TrainState, or the layout of its view
      found |= name == 'optim_compat.install'
      self.generic_visit(node)

    def visit_Attribute(self, node):
      nonlocal found
      found |= _dotted(node) in {f'optim_compat.{n}' for n in LEGACY_NAMES}
      self.generic_visit(node)

  Visit().visit(tree)
  return found


def optimizer_roots(tree: ast.Module) -> set[str]:
  """Names an optimizer plausibly lives in: the root of every ``.apply_gradient(`` receiver,
  and the targets of assignments from a ``.create(...)`` or ``.apply_gradient(...)`` call."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == 'apply_gradient':
      root, _ = _chain(node.func.value)
      if root:
        out.add(root)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) and \
        isinstance(node.value.func, ast.Attribute) and \
        node.value.func.attr in ('create', 'apply_gradient'):
      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
        for n in ast.walk(t):
          if isinstance(n, ast.Name):
            out.add(n.id)
  return out


def _optimizer_like(receiver: ast.AST, roots: set[str]) -> bool:
  root, names = _chain(receiver)
  return any(_OPTISH.search(n) for n in [root or '', *names]) or (root in roots and not names)


def _def_like(receiver: ast.AST) -> bool:
  """A value named like an optimizer def (``optimizer_def``, ``opt_def``, ``self.optim_def``)
  or made by a call named like a def factory (``losses.get_optimizer(config)``)."""
  root, names = _chain(receiver)
  last = names[-1] if names else (root or '')
  if isinstance(receiver, ast.Call):
    return bool(re.search(r'optim', last, re.I))
  return bool(re.search(r'(opt|optim|optimizer)_?def', last, re.I))


@dataclasses.dataclass(frozen=True)
class Site:
  """A legacy reference: ``line`` in its unit (1-based), ``kind``, the source line."""
  cell: Optional[int]
  line: int
  kind: str
  text: str

  def where(self) -> str:
    return f'{self.line}' if self.cell is None else f'cell{self.cell}:{self.line}'


def legacy_sites(cell: Optional[int], src: str, tree: ast.Module,
                 roots: Iterable[str] = (), optim_names: Iterable[str] = ()) -> list[Site]:
  """The flax.optim references of one unit (comments and strings are not code).

  ``roots``: names that held optimizers (:func:`optimizer_roots`, of the original);
  ``optim_names``: names the original bound to flax.optim (``optim`` after ``from flax
  import optim``): their attribute use in a file that no longer binds them is a reference.
  Kinds: ``flax.optim``, ``apply_gradient``, ``compute_gradient``, ``target``,
  ``state.step``, ``param_states``, ``optimizer_def``, ``hyper_params``, ``optim.<name>``,
  ``replicate``, ``optimize``, ``def.create`` (``optimizer_def.create(params)``),
  ``replace(target=)`` (also ``state=``, ``optimizer_def=``).
  """
  roots = set(roots) | optimizer_roots(tree)
  optim_names = set(optim_names)
  bound_here = flax_optim_bindings(tree)
  locally = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and
             isinstance(n.ctx, ast.Store)}
  locally |= {(a.asname or a.name).split('.')[0] for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
  # `model.apply_gradient(loss_fn)`: a flax.optim Optimizer takes gradients, never a Python
  # function, so a call given a lambda or a name only a `def` binds is the user's own method
  functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                ast.AsyncFunctionDef))}
  functions -= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
  lines = src.split('\n')
  sites = []

  def add(node, kind):
    text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ''
    sites.append(Site(cell, node.lineno, kind, text))

  for name, line in bound_here.items():
    sites.append(Site(cell, line, 'flax.optim', lines[line - 1].strip()))
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      attr, recv = node.func.attr, node.func.value
      if attr in ('apply_gradient', 'compute_gradient'):
        first = node.args[0] if node.args else None
        if not (attr == 'apply_gradient' and (isinstance(first, ast.Lambda) or (
            isinstance(first, ast.Name) and first.id in functions))):
          add(node.func, attr)
      elif attr in ('replicate', 'unreplicate') and not node.args and not node.keywords and \
          _optimizer_like(recv, roots):
        add(node.func, 'replicate')
      elif attr == 'optimize' and _optimizer_like(recv, roots):
        add(node.func, 'optimize')
      elif attr == 'create' and _def_like(recv):
        add(node.func, 'def.create')
      elif attr == 'replace' and _optimizer_like(recv, roots) and any(
          k.arg in ('target', 'state', 'optimizer_def') for k in node.keywords):
        add(node.func, 'replace(target=)')  # a TrainState's replace has no such field
    if not isinstance(node, ast.Attribute):
      continue
    if node.attr == 'target' and _optimizer_like(node.value, roots):
      add(node, 'target')
    elif node.attr == 'step' and isinstance(node.value, ast.Attribute) and \
        node.value.attr == 'state' and _optimizer_like(node.value.value, roots):
      add(node, 'state.step')
    elif node.attr == 'param_states' and not _of_legacy_view(node.value):
      add(node, 'param_states')  # (not of `optim_compat.legacy_state(...)`: the view, OM017)
    elif node.attr == 'optimizer_def' and _optimizer_like(node.value, roots):
      add(node, 'optimizer_def')
    elif node.attr == 'hyper_params':
      add(node, 'hyper_params')
    elif isinstance(node.value, ast.Name) and node.value.id in optim_names and \
        node.value.id not in bound_here and node.value.id not in locally:
      add(node, f'optim.{node.attr}')
  seen, out = set(), []
  for s in sorted(sites, key=lambda s: (s.cell or 0, s.line, s.kind)):
    if (s.cell, s.line, s.kind) not in seen:
      seen.add((s.cell, s.line, s.kind))
      out.append(s)
  return out


def _of_legacy_view(node) -> bool:
  """``node`` is a call of the legacy view (``optim_compat.legacy_state(...)``)."""
  return isinstance(node, ast.Call) and _dotted(node.func) in _CONVERTED_CALLS


def statement_starts(tree: ast.Module) -> dict[int, int]:
  """Each line of a statement -> the statement's first line (for a compound statement,
  the lines of its header, up to its body; its body's lines belong to the inner ones)."""
  out: dict[int, int] = {}
  for n in ast.walk(tree):
    if not isinstance(n, ast.stmt):
      continue
    body = getattr(n, 'body', None)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
      end = max(n.lineno, body[0].lineno - 1)
    else:
      end = n.end_lineno or n.lineno
    for line in range(n.lineno, end + 1):
      out.setdefault(line, n.lineno)
  return out


def flagged(site: Site, src_lines: list[str], starts: dict[int, int]) -> bool:
  """Whether a ``# TODO(optim-migrate)`` comment line is near ``site``: on the lines of its
  statement up to the site, in the 3 lines above the statement, or in the block of comment
  lines directly above it."""
  start = starts.get(site.line, site.line)
  lo = max(1, start - 3)
  k = lo - 1
  while k >= 1 and src_lines[k - 1].lstrip().startswith('#'):
    k -= 1
  lo = k + 1
  return any(TODO in src_lines[i - 1] for i in range(lo, site.line + 1)
             if src_lines[i - 1].lstrip().startswith('#') or i == site.line)


# --------------------------------------------------------------------------- classification

@dataclasses.dataclass
class FileOutcome:
  """One legacy file after the run."""
  path: str
  outcome: str                       # one of OUTCOMES, or 'unparsed_input'
  todos: int = 0                     # TODO(optim-migrate) comment lines in the output
  residual: list = dataclasses.field(default_factory=list)   # [where, kind, text] unflagged,
  #                                  where = line (cell<N>:line) in the rewritten file
  error: Optional[str] = None        # the codemod's error for this file
  output_parses: bool = True
  idempotent: bool = True
  blocking: list = dataclasses.field(default_factory=list)   # [rule, message] keeping it legacy
  manual: list = dataclasses.field(default_factory=list)     # [rule, message] of manual items

  def as_json(self) -> dict:
    return dataclasses.asdict(self)


def read_units(path: pathlib.Path, text: str):
  """:func:`parse_units` of :func:`code_units` (None when it does not parse or read)."""
  try:
    return parse_units(code_units(path, text))
  except ValueError:
    return None


def imports_module(tree: ast.Module, modules: Iterable[str]) -> bool:
  """``tree`` imports one of ``modules`` (``import a.b``, ``from a.b import x``, ``from a
  import b``)."""
  modules = set(modules)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import) and any(a.name in modules for a in node.names):
      return True
    if isinstance(node, ast.ImportFrom) and node.module and not node.level and (
        node.module in modules or any(f'{node.module}.{a.name}' in modules for a in node.names)):
      return True
  return False


def is_legacy(path: pathlib.Path, text: str, own_api: Iterable[str] = ()) -> bool:
  """Whether a file's source uses flax.optim (see the module docstring); a file that does
  not parse counts when its text names ``flax.optim``, ``from flax import optim`` or
  ``.apply_gradient(``. A file that never names flax.optim and imports one of ``own_api``
  (the repository's own copy of the Optimizer API) uses that copy: not a legacy file."""
  units = read_units(path, text)
  if units is None:
    return bool(re.search(r'flax\.optim|from\s+flax\s+import\s+[^\n]*\boptim\b|'
                          r'\.apply_gradient\(', text))
  if own_api and not any(flax_optim_bindings(t) for _, _, t in units) and any(
      imports_module(t, own_api) for _, _, t in units):
    return False
  return any(legacy_sites(c, s, t) for c, s, t in units)


def count_todos(units) -> int:
  return sum(1 for _, src, _ in units for line in src.split('\n')
             if line.lstrip().startswith('#') and TODO in line)


def classify(path: pathlib.Path, original: str, output: Optional[str], error: Optional[str],
             rows: list[dict]) -> FileOutcome:
  """The outcome of one legacy file (see the module docstring).

  ``output``: the file after the run (None: unreadable), ``error``: the codemod's error
  for it, ``rows``: its report rows (``rule``, ``message``, ``applied``).
  """
  rel = str(path)
  before = read_units(path, original)
  manual = [[r.get('rule'), r.get('message')] for r in rows
            if not r.get('applied') and r.get('rule')]
  blocking = [m for m in manual if m[1] and 'keeps its legacy' in m[1]]
  if before is None:
    return FileOutcome(rel, 'unparsed_input', error=error, manual=manual)
  if error is not None:
    return FileOutcome(rel, 'crash', error=error, manual=manual,
                       output_parses=output is not None and read_units(path, output) is not None)
  after = read_units(path, output) if output is not None else None
  if after is None:
    return FileOutcome(rel, 'crash', error='output does not parse', output_parses=False,
                       manual=manual, blocking=blocking)
  todos = count_todos(after)
  out = FileOutcome(rel, '', todos=todos, manual=manual, blocking=blocking)
  still = any(flax_optim_bindings(t) for _, _, t in after)
  if still:
    if any(installs_shim(t) for _, _, t in after):
      out.outcome = 'fallback'
    else:
      out.outcome = 'kept' if todos else 'kept_silent'
    return out
  if any(uses_shim(t) for _, _, t in after):
    out.outcome = 'shim'
    return out
  roots = set().union(*(optimizer_roots(t) for _, _, t in before))
  optim_names = set().union(*(flax_optim_bindings(t) for _, _, t in before)) - {'flax.optim'}
  for cell, src, tree in after:
    lines = src.split('\n')
    starts = statement_starts(tree)
    for site in legacy_sites(cell, src, tree, roots, optim_names):
      if not flagged(site, lines, starts):
        out.residual.append([site.where(), site.kind, site.text])
  out.outcome = 'residual' if out.residual else ('converted_todo' if todos else 'converted')
  return out


# --------------------------------------------------------------------------- running

def snapshot(tree: pathlib.Path) -> dict[str, str]:
  """``relative path -> sha256`` of every regular file under ``tree``."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(tree):
    # the codemod's result cache (it carries its own .gitignore): not the repository's files
    dirnames[:] = sorted(d for d in dirnames if d != '.optim-migrate-cache')
    for name in filenames:
      p = pathlib.Path(dirpath) / name
      if p.is_file() and not p.is_symlink():
        out[p.relative_to(tree).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
  return out


def codemod_command(report: pathlib.Path, jobs: Optional[int]) -> list[str]:
  """``optim-migrate rewrite --write --report REPORT .`` with this checkout's codemod (in
  isolated mode, so a ``codemod`` folder in the tree cannot shadow it)."""
  boot = ('import sys; sys.path.insert(0, %r); from codemod.cli import main; '
          'sys.exit(main(sys.argv[1:]))' % str(ROOT))
  cmd = [sys.executable, '-I', '-c', boot, 'rewrite', '--write', '--report', str(report)]
  if jobs is not None:
    cmd += ['--jobs', str(jobs)]
  return cmd + ['.']


@dataclasses.dataclass
class Run:
  exit: int
  seconds: float
  rows: list
  stderr: str


def run_codemod(tree: pathlib.Path, report: pathlib.Path, jobs: Optional[int],
                timeout: float) -> Run:
  """One ``rewrite --write`` over ``tree`` (from its root).

  Raises:
    EcosystemError: it timed out, died (a traceback, an exit status other than 0/1/2) or
      wrote no report; the message has the end of its stderr.
  """
  if report.exists():
    report.unlink()
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(codemod_command(report, jobs), cwd=str(tree), capture_output=True,
                          text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    raise EcosystemError(f'rewrite timed out after {timeout:.0f} s') from e
  seconds = time.perf_counter() - t0
  tail = proc.stderr.strip()[-2000:]
  if proc.returncode not in (0, 1, 2) or 'Traceback (most recent call last)' in proc.stderr:
    raise EcosystemError(f'rewrite died (exit {proc.returncode}): {tail}')
  try:
    rows = json.loads(report.read_text(encoding='utf-8'))
  except (OSError, ValueError) as e:
    raise EcosystemError(f'rewrite (exit {proc.returncode}) wrote no report: {tail}') from e
  return Run(proc.returncode, seconds, rows, proc.stderr)


def _norm(path: str) -> str:
  """A report's file name relative to the tree root, without a notebook cell suffix."""
  path = re.sub(r':cell\d+$', '', path)
  return path[2:] if path.startswith('./') else path


#: Seconds one module import may take in the probe (a script that trains at import times out).
IMPORT_TIMEOUT = 60.0
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def import_status(python: str, tree: pathlib.Path, rel: str) -> str:
  """Whether module ``rel`` (a ``.py`` path under ``tree``) imports with ``python``, from the
  tree's root in a fresh process (``JAX_PLATFORMS=cpu``, no bytecode written): ``ok``,
  ``missing <module>`` (a dependency not installed), ``timeout``, or ``error <the last
  line of the traceback>``."""
  module = '.'.join(pathlib.PurePosixPath(rel).with_suffix('').parts)
  code = ('import sys, importlib; sys.argv = ["probe"]; sys.path.insert(0, "."); '
          f'importlib.import_module({module!r})')
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
  env.update(JAX_PLATFORMS='cpu', PYTHONDONTWRITEBYTECODE='1', TF_CPP_MIN_LOG_LEVEL='3')
  try:
    proc = subprocess.run([python, '-c', code], cwd=str(tree), capture_output=True, text=True,
                          env=env, timeout=IMPORT_TIMEOUT, stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired:
    return 'timeout'
  if proc.returncode == 0:
    return 'ok'
  missing = _MISSING.findall(proc.stderr)
  if missing:
    return f'missing {missing[-1]}'
  lines = [line for line in proc.stderr.strip().splitlines()
           if line and not line.startswith((' ', '---', 'For simplicity'))]
  return 'error ' + (lines[-1][:200] if lines else f'exit {proc.returncode}')


def probe_imports(files: dict, originals_tree: pathlib.Path, tree: pathlib.Path,
                  legacy_python: str, jobs: int) -> None:
  """Add ``imports: [original on the old stack, rewrite on this one]`` (:func:`import_status`)
  to each parsed legacy ``.py`` file entry of ``files``."""
  import concurrent.futures
  todo = [n for n, f in files.items() if n.endswith('.py') and f['outcome'] != 'unparsed_input']
  with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
    old = pool.map(lambda n: import_status(legacy_python, originals_tree, n), todo)
    new = pool.map(lambda n: import_status(sys.executable, tree, n), todo)
    for n, o, w in zip(todo, list(old), list(new)):
      files[n]['imports'] = [o, w]


def check_repo(repo: Repo, src: pathlib.Path, work: pathlib.Path, jobs: Optional[int] = None,
               timeout: float = 3600.0, keep: Optional[pathlib.Path] = None,
               legacy_python: Optional[str] = None) -> dict:
  """Copy ``src`` to ``work/tree``, run the codemod twice, classify; the repo's JSON entry.
  With ``legacy_python`` (the old stack's interpreter), also import each legacy module as
  written there and as rewritten here (:func:`probe_imports`).

  Raises:
    EcosystemError: see :func:`run_codemod`.
  """
  from codemod.runner import iter_python_files
  tree = materialise(src, work / 'tree')
  report = work / 'report.json'
  names = [p.relative_to(tree).as_posix() for p in iter_python_files([str(tree)])]
  originals = {n: (tree / n).read_bytes().decode('utf-8', 'replace') for n in names}
  legacy = [n for n in names if is_legacy(tree / n, originals[n], repo.own_api)]
  before = snapshot(tree)
  first = run_codemod(tree, report, jobs, timeout)
  after = snapshot(tree)
  outputs = {n: (tree / n).read_bytes().decode('utf-8', 'replace') for n in legacy if n in after}
  outputs.update({n: (tree / n).read_bytes().decode('utf-8', 'replace') for n in after
                  if before.get(n) != after[n] and n not in outputs})
  if keep is not None:  # the tree as the first run left it, and its report
    dest = keep / repo.key
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tree, dest, symlinks=True)
    shutil.copy(report, keep / f'{repo.key}.report.json')
  second = run_codemod(tree, work / 'report2.json', jobs, timeout)
  again = snapshot(tree)
  changed = sorted(n for n in after if before.get(n) != after[n])
  unstable = sorted(n for n in again if after.get(n) != again[n])
  rows_by_file = collections.defaultdict(list)
  errors = {}
  for row in first.rows:
    f = _norm(str(row.get('file', '')))
    rows_by_file[f].append(row)
    if row.get('rule') is None and row.get('message'):
      errors[f] = row['message']
  files = {}
  for n in legacy:
    output = outputs.get(n)  # as the first run left it
    res = classify(pathlib.Path(n), originals[n], output, errors.get(n),
                   rows_by_file.get(n, []))
    res.idempotent = n not in unstable
    if res.outcome != 'unparsed_input' and output is not None:
      res.output_parses = read_units(tree / n, output) is not None
    files[n] = res.as_json()
  if legacy_python is not None:  # (the tree as the first run left it: the second changed none)
    probe_imports(files, materialise(src, work / 'original'), tree, legacy_python, jobs or 2)
  # a changed file that was no legacy file must still parse
  other_changed = [n for n in changed if n not in files]
  other_bad = [n for n in other_changed
               if n.endswith(('.py', '.ipynb')) and read_units(tree / n, outputs[n]) is None
               and read_units(tree / n, originals.get(n, '')) is not None]
  other_errors = {f: m for f, m in errors.items() if f not in files}
  return {'commit': repo.commit, 'python_files': len(names), 'legacy_files': len(legacy),
          'table_legacy_files': repo.legacy_files, 'files_changed': len(changed),
          'other_files_changed': other_changed, 'other_outputs_unparsed': other_bad,
          'other_errors': other_errors, 'second_run_changed': unstable,
          'exit': [first.exit, second.exit], 'seconds': [round(first.seconds, 2),
                                                         round(second.seconds, 2)],
          'files': files}


# --------------------------------------------------------------------------- totals

def tally(entry: dict) -> dict:
  """Counts and shares of one repository's entry (or of a merged one)."""
  files = entry['files'].values()
  counts = collections.Counter(f['outcome'] for f in files)
  parsed = [f for f in files if f['outcome'] != 'unparsed_input']
  n = len(parsed)
  runnable = sum(counts[o] for o in RUNNABLE)
  crashes = counts['crash'] + len(entry.get('other_errors', {}))
  idem_den = len(set(entry['files']) | set(entry.get('other_files_changed', [])))
  idem = idem_den - len(entry.get('second_run_changed', []))
  parses = sum(f['output_parses'] for f in parsed) + \
      len(entry.get('other_files_changed', [])) - len(entry.get('other_outputs_unparsed', []))
  parse_den = n + len(entry.get('other_files_changed', []))
  probed = [f['imports'] for f in parsed if f.get('imports')]
  imports = {'probed': len(probed),
             'old_ok': sum(o == 'ok' for o, _ in probed),
             'new_ok': sum(w == 'ok' for _, w in probed),
             'both_missing': sum(o.startswith('missing') and w.startswith('missing')
                                 for o, w in probed),
             'regressed': sum(o == 'ok' and w != 'ok' for o, w in probed),
             'fixed': sum(o != 'ok' and w == 'ok' for o, w in probed)}
  return {'imports': imports,
          'legacy': len(entry['files']), 'parsed': n, 'unparsed_input': counts['unparsed_input'],
          **{o: counts[o] for o in OUTCOMES}, 'runnable': runnable, 'crashes': crashes,
          'residual_sites': sum(len(f['residual']) for f in parsed),
          'files_changed': entry['files_changed'], 'idempotent': idem, 'idempotent_of': idem_den,
          'parses': parses, 'parses_of': parse_den, 'seconds': sum(entry['seconds'][:1])}


def merged(entries: Iterable[dict]) -> dict:
  """All repositories' entries as one (file names prefixed with the repository)."""
  out = {'files': {}, 'other_files_changed': [], 'other_outputs_unparsed': [],
         'other_errors': {}, 'second_run_changed': [], 'files_changed': 0, 'seconds': [0.0]}
  for name, e in entries:
    out['files'].update({f'{name}:{k}': v for k, v in e['files'].items()})
    for key in ('other_files_changed', 'other_outputs_unparsed', 'second_run_changed'):
      out[key] += [f'{name}:{k}' for k in e.get(key, [])]
    out['other_errors'].update({f'{name}:{k}': v for k, v in e.get('other_errors', {}).items()})
    out['files_changed'] += e['files_changed']
    out['seconds'][0] += e['seconds'][0]
  return out


def share(num: int, den: int) -> str:
  return '–' if den == 0 else f'{100.0 * num / den:.0f}%'


def targets(t: dict) -> list[tuple[str, bool, str]]:
  """The done-when targets: ``(text, met, measured)``."""
  return [
      ('100% of legacy files that parse run on the modern stack', t['runnable'] == t['parsed'],
       f'{t["runnable"]}/{t["parsed"]}'),
      ('0 crashes', t['crashes'] == 0, str(t['crashes'])),
      ('0 legacy references left with no TODO', t['residual_sites'] == 0,
       f'{t["residual_sites"]} in {t["residual"]} file(s)'),
      ('100% idempotent', t['idempotent'] == t['idempotent_of'],
       f'{t["idempotent"]}/{t["idempotent_of"]}'),
      ('100% outputs parse', t['parses'] == t['parses_of'], f'{t["parses"]}/{t["parses_of"]}'),
      ('>= 80% converted with no TODO', t['parsed'] and t['converted'] >= 0.8 * t['parsed'],
       share(t['converted'], t['parsed'])),
  ]


def render(results: dict, meta: dict) -> str:
  """Markdown: per-repository table, totals, targets, and the files that are not clean."""
  head = ('| repository | legacy files | converted | converted + TODOs | unflagged residual | '
          'shim | kept legacy, on the shim (OM014) | kept legacy (TODOs) | kept, no TODO | '
          'crash | runs on modern stack | files changed | idempotent | outputs parse | wall s |')
  rows = [head, '|' + '---|' * 15]

  def row(name, t):
    return (f'| {name} | {t["legacy"]}' + (f' ({t["unparsed_input"]} unparsed)'
                                           if t['unparsed_input'] else '') +
            f' | {t["converted"]} | {t["converted_todo"]} | {t["residual"]} | {t["shim"]} | '
            f'{t["fallback"]} | {t["kept"]} | {t["kept_silent"]} | {t["crashes"]} | '
            f'{share(t["runnable"], t["parsed"])} | {t["files_changed"]} | '
            f'{share(t["idempotent"], t["idempotent_of"])} | '
            f'{share(t["parses"], t["parses_of"])} | {t["seconds"]:.1f} |')

  for name, entry in results.items():
    rows.append(row(f'[{name}](https://github.com/{name}/tree/{entry["commit"][:12]})',
                    tally(entry)))
  total = tally(merged(results.items()))
  rows.append(row(f'**total ({len(results)})**', total))
  out = [f'Codemod at `{meta.get("codemod_commit", "?")}`, {meta.get("date", "?")}, '
         f'Python {meta.get("python", "?")}; `{meta.get("command", "")}`.', '', *rows, '',
         '| outcome per legacy file | files | share |', '|---|---|---|']
  for o in OUTCOMES:
    out.append(f'| {LABELS[o]} | {total[o]} | {share(total[o], total["parsed"])} |')
  out += [f'| runs on the modern stack (converted, or on the shim) | {total["runnable"]} | '
          f'{share(total["runnable"], total["parsed"])} |',
          f'| (input does not parse, not counted) | {total["unparsed_input"]} | |', '',
          '| done-when target | met | measured |', '|---|---|---|']
  out += [f'| {text} | {"yes" if ok else "**no**"} | {measured} |'
          for text, ok, measured in targets(total)]
  i = total['imports']
  if i['probed']:
    out += ['', f'Import probe (`--import-probe`): each of the {i["probed"]} parsed legacy `.py` '
            'modules imported in a fresh process from its tree\'s root, as written on the old '
            'stack (flax 0.5.3) and as rewritten on this one:', '',
            '| imports | modules |', '|---|---|',
            f'| as written, on the old stack | {i["old_ok"]} |',
            f'| as rewritten, on the modern stack | {i["new_ok"]} |',
            f'| neither: a dependency missing on both stacks | {i["both_missing"]} |',
            f'| **on the old stack only (a regression, or an API that died: listed below)** | '
            f'{i["regressed"]} |',
            f'| on the modern stack only | {i["fixed"]} |']
  return '\n'.join(out) + '\n'


def details(results: dict) -> str:
  """Markdown list of each file that is not ``converted``: its outcome and what says why."""
  out = []
  for name, entry in results.items():
    for path, f in sorted(entry['files'].items()):
      o = f['outcome']
      if o in ('converted', 'converted_todo', 'shim'):
        continue
      if o == 'crash':
        why = f['error']
      elif o == 'residual':
        why = '; '.join(f'{w} {k}: `{t}`' for w, k, t in f['residual'][:3])
      elif o in ('fallback', 'kept', 'kept_silent'):
        why = '; '.join(f'{r}: {m}' for r, m in (f['blocking'] or f['manual'])[:2]) or 'no TODO'
      else:
        why = ''
      out.append(f'- `{name}:{path}` {o}: {why}')
    for path, f in sorted(entry['files'].items()):
      if f.get('imports') and f['imports'][0] == 'ok' and f['imports'][1] != 'ok':
        out.append(f'- `{name}:{path}` imports on the old stack, not rewritten on the modern '
                   f'one: {f["imports"][1]}')
    for path in entry.get('second_run_changed', []):
      out.append(f'- `{name}:{path}` not idempotent (the second run changed it)')
    for path, msg in entry.get('other_errors', {}).items():
      out.append(f'- `{name}:{path}` error in a file that is no legacy file: {msg}')
  return '\n'.join(out) + ('\n' if out else '')


def diff_runs(old: dict, new: dict) -> list[str]:
  """Per-file outcome changes (and repositories added or removed) from ``old`` to ``new``
  (both the ``repos`` of a recorded JSON)."""
  lines = []
  for name in sorted(set(old) | set(new)):
    if name not in new:
      lines.append(f'{name}: not in this run')
      continue
    if name not in old:
      lines.append(f'{name}: new (not in the recorded run)')
      continue
    o, n = old[name], new[name]
    if o.get('commit') != n.get('commit'):
      lines.append(f'{name}: commit {o.get("commit", "?")[:12]} -> {n["commit"][:12]}')
    for path in sorted(set(o['files']) | set(n['files'])):
      a = o['files'].get(path, {}).get('outcome', '(not legacy)')
      b = n['files'].get(path, {}).get('outcome', '(not legacy)')
      if a != b:
        lines.append(f'{name}:{path}: {a} -> {b}')
      elif a == 'residual' and o['files'][path]['residual'] != n['files'][path]['residual']:
        lines.append(f'{name}:{path}: residual {len(o["files"][path]["residual"])} -> '
                     f'{len(n["files"][path]["residual"])} site(s)')
    for key in ('second_run_changed',):
      gone = sorted(set(o.get(key, [])) - set(n.get(key, [])))
      came = sorted(set(n.get(key, [])) - set(o.get(key, [])))
      lines += [f'{name}:{p}: now idempotent' for p in gone]
      lines += [f'{name}:{p}: no longer idempotent' for p in came]
  return lines


def write_results(path: pathlib.Path, text: str) -> None:
  """Replace the part of ``path`` between the markers with ``text`` (the file is created
  with just that part when missing or without markers)."""
  block = f'{BEGIN}\n{text}{END}\n'
  old = path.read_text(encoding='utf-8') if path.exists() else ''
  if BEGIN in old and END in old:
    pre, rest = old.split(BEGIN, 1)
    post = rest.split(END, 1)[1].lstrip('\n')
    path.write_text(pre + block + ('\n' + post if post else ''), encoding='utf-8')
  else:
    path.write_text(old + ('\n' if old else '') + block, encoding='utf-8')


def codemod_commit() -> str:
  proc = subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short=10', 'HEAD'],
                        capture_output=True, text=True)
  commit = proc.stdout.strip() or 'unknown'
  dirty = subprocess.run(['git', '-C', str(ROOT), 'status', '--porcelain', '--', 'codemod'],
                         capture_output=True, text=True).stdout.strip()
  return commit + ('+dirty' if dirty else '')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--table', default=str(TABLE), help='repositories (TOML)')
  parser.add_argument('--repos', help='only these (comma-separated owner/name or name)')
  parser.add_argument('--cache', default=os.environ.get(CACHE_ENV, str(DEFAULT_CACHE)),
                      help=f'cache of source trees, <owner>+<name>/ (default ${CACHE_ENV} or '
                           f'{DEFAULT_CACHE})')
  parser.add_argument('--source', help='folder of local copies, <owner>+<name>/ (before the cache)')
  parser.add_argument('--clone', action='store_true',
                      help='git clone a repository missing from the cache (needs a network)')
  parser.add_argument('--jobs', type=int, default=None, help="the codemod's --jobs")
  parser.add_argument('--timeout', type=float, default=3600.0, help='seconds per codemod run')
  parser.add_argument('--json', default=str(LAST_JSON), help='the recorded run (read by --diff, '
                      'then replaced)')
  parser.add_argument('--no-record', action='store_true', help='do not replace --json')
  parser.add_argument('--diff', action='store_true', help='print the changes since --json')
  parser.add_argument('--results', nargs='?', const=str(RESULTS_MD), default=None,
                      help=f'rewrite the generated part of this markdown file '
                           f'(default {RESULTS_MD.relative_to(ROOT)})')
  parser.add_argument('--keep', help='copy each rewritten tree and its report here')
  parser.add_argument('--import-probe', action='store_true',
                      help='also import each legacy module as written on the old stack (the '
                           'legacy virtualenv, built if missing) and as rewritten on this one')
  parser.add_argument('--merge-tree', metavar='DIR',
                      help='copy the selected sources into DIR/<owner>+<name>/ and stop')
  parser.add_argument('--strict', action='store_true', help='exit 1 when a target is missed')
  parser.add_argument('--report-only', action='store_true',
                      help='run nothing: print (and with --results write) the tables of --json')
  args = parser.parse_args(argv)
  if args.report_only:
    try:
      data = json.loads(pathlib.Path(args.json).read_text(encoding='utf-8'))
      results, meta = data['repos'], data['meta']
    except (OSError, ValueError, KeyError) as e:
      print(f'ecosystem: --report-only: cannot read {args.json}: {e}', file=sys.stderr)
      return 2
    try:  # the table's order (the JSON keeps its keys sorted)
      order = [r.repo for r in load_table(pathlib.Path(args.table)) if r.repo in results]
    except EcosystemError:
      order = []
    results = {k: results[k] for k in order + sorted(set(results) - set(order))}
    text = render(results, meta)
    print(text + ('\n## files not converted cleanly\n\n' + details(results)
                  if details(results) else ''))
    if args.results:
      write_results(pathlib.Path(args.results), text)
    return 0
  try:
    repos = select(load_table(pathlib.Path(args.table)), args.repos)
    cache = pathlib.Path(args.cache)
    sources = pathlib.Path(args.source) if args.source else None
    srcs = {r.repo: source_of(r, cache, sources, args.clone) for r in repos}
  except EcosystemError as e:
    print(f'ecosystem: {e}', file=sys.stderr)
    return 2
  if args.merge_tree:
    dest = pathlib.Path(args.merge_tree)
    for r in repos:
      if (dest / r.key).exists():
        print(f'ecosystem: {dest / r.key} exists; give an empty --merge-tree', file=sys.stderr)
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    for r in repos:
      materialise(srcs[r.repo], dest / r.key)
    print(f'copied {len(repos)} tree(s) into {dest}', file=sys.stderr)
    return 0
  keep = pathlib.Path(args.keep) if args.keep else None
  if keep:
    keep.mkdir(parents=True, exist_ok=True)
  legacy_python = None
  if args.import_probe:
    from equivalence_tests import legacy_env
    legacy_python = str(legacy_env.ensure())
  results, failed = {}, []
  for r in repos:
    with tempfile.TemporaryDirectory(prefix='ecosystem-') as tmp:
      try:
        entry = check_repo(r, srcs[r.repo], pathlib.Path(tmp), args.jobs, args.timeout, keep,
                           legacy_python)
      except EcosystemError as e:
        print(f'ecosystem: {r.repo}: {e}', file=sys.stderr)
        failed.append(r.repo)
        continue
    t = tally(entry)
    note = '' if entry['legacy_files'] == r.legacy_files else \
        f' (the table says {r.legacy_files} legacy files)'
    print(f'{r.repo}: {t["legacy"]} legacy file(s){note}: ' +
          ', '.join(f'{o} {t[o]}' for o in OUTCOMES if t[o]) +
          f'; {t["files_changed"]} changed, {entry["seconds"][0]:.1f} s', file=sys.stderr,
          flush=True)
    results[r.repo] = entry
  meta = {'codemod_commit': codemod_commit(),
          'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
          'python': sys.version.split()[0],
          'command': 'python bench/ecosystem.py' + (f' --repos {args.repos}' if args.repos else '')
                     + (f' --jobs {args.jobs}' if args.jobs else '')
                     + (' --import-probe' if args.import_probe else '')}
  record = pathlib.Path(args.json)
  if args.diff:
    try:
      old = json.loads(record.read_text(encoding='utf-8'))['repos']
    except (OSError, ValueError, KeyError) as e:
      print(f'ecosystem: --diff: cannot read {record}: {e}', file=sys.stderr)
      old = None
    if old is not None:
      if args.repos:
        old = {k: v for k, v in old.items() if k in results}
      changes = diff_runs(old, results)
      print(f'## changes since the recorded run ({len(changes)})\n')
      print('\n'.join(changes) if changes else 'none')
      print()
  text = render(results, meta)
  print(text)
  more = details(results)
  if more:
    print('## files not converted cleanly\n\n' + more)
  if not args.no_record:
    record.write_text(json.dumps({'meta': meta, 'repos': results}, indent=1, sort_keys=True)
                      + '\n', encoding='utf-8')
  if args.results:
    write_results(pathlib.Path(args.results), text)
  if failed:
    return 2
  if args.strict and not all(ok for _, ok, _ in targets(tally(merged(results.items())))):
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
