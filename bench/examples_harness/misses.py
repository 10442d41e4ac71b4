"""Unflagged misses: run each migrated example's train and eval steps once and find the failures
on lines the codemod did not flag.

Trees (under ``<cache>/examples-runs``): ``misses-before`` (old stack, sources unmodified: the
control), ``misses-after`` (modern stack, after ``rewrite --write``) and ``misses-after-fixed``
(the same, with each flagged line fixed the way its TODO says: ``.target`` -> ``.params`` and
``.state.step`` -> ``.step`` on the line under an OM100 TODO), so that what lies behind a
flagged line is reached too. The two after trees run as the AFTER variant does: only the harness
patches no OM2xx rule could remove (the OM2xx rules rewrite the other jax / flax API changes, so a
gap in them shows here too). A failure is *flagged* when a ``# TODO(optim-migrate)`` sits on one of the
:data:`NEAR` lines above the failing line of the example's code, else *unflagged*.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess

from examples_harness import stacks

NEAR = 4
#: seconds one driver run may take (EXAMPLES_DRIVER_TIMEOUT overrides: imagenet's ResNet50 compiles
#: slowly on a loaded machine)
DRIVER_TIMEOUT = int(os.environ.get('EXAMPLES_DRIVER_TIMEOUT', '1800'))
TITLES = {'misses-before': 'before (old stack, unmodified)', 'misses-after': 'after (modern, rewritten)',
          'misses-after-fixed': 'after, flagged lines fixed as their TODO says'}
TODO = 'TODO(optim-migrate)'
KEPT = 'this file keeps its legacy optimizer code'
#: TODO text -> (old, new) applied to the next code line by the 'fixed' tree
MECHANICAL = [("`.target` is `.params`", '.target', '.params'),
              ("`.state.step` is `.step`", '.state.step', '.step')]


def is_flagged(lines: list[str], lineno: int, near: int = NEAR) -> bool:
  """Whether a TODO(optim-migrate) comment is on ``lineno`` (1-based) or the ``near`` lines above it."""
  lo = max(0, lineno - 1 - near)
  return any(TODO in ln for ln in lines[lo:lineno])


def fix_flagged(text: str) -> tuple[str, int]:
  """Apply the mechanical fix each OM100 TODO describes to the code line under it.

  Returns the new text and the number of lines changed.
  """
  lines = text.splitlines(keepends=True)
  changed = 0
  for i, ln in enumerate(lines):
    if TODO not in ln:
      continue
    for said, old, new in MECHANICAL:
      if said in ln:
        j = i + 1
        while j < len(lines) and lines[j].lstrip().startswith('#'):
          j += 1
        if j < len(lines) and old in lines[j]:
          lines[j] = lines[j].replace(old, new)
          changed += 1
  return ''.join(lines), changed


def classify(records: list[dict], tree: pathlib.Path) -> list[dict]:
  """Add 'where' (file:line of the innermost example frame), 'text' and 'flagged' to failed phases."""
  out = []
  for rec in records:
    rec = dict(rec)
    frames = rec.get('frames') or []
    if not rec['ok'] and not frames and rec.get('blame'):
      file, _, line = rec['blame'].rpartition(':')
      frames = [{'file': file, 'line': int(line), 'text': rec.get('blame_text') or ''}]
    if not rec['ok'] and frames:
      f = frames[-1]
      path = tree / 'linen_examples' / f['file']
      lines = path.read_text().splitlines() if path.exists() else []
      rec.update(where=f"{f['file']}:{f['line']}", text=(f['text'] or '').strip(),
                 flagged=is_flagged(lines, f['line']),
                 kept_legacy=any(KEPT in ln for ln in lines))
    out.append(rec)
  return out


def _driver(example, tree, py, env, legacy_workdir=None):
  exdir = tree / 'linen_examples' / example
  work = tree / 'work' / example
  shutil.rmtree(work, ignore_errors=True)
  work.mkdir(parents=True)
  out = tree / 'results' / f'{example}.json'
  out.parent.mkdir(parents=True, exist_ok=True)
  drv = pathlib.Path(__file__).resolve().parent / 'drivers.py'
  extra = [str(legacy_workdir)] if legacy_workdir else []
  proc = subprocess.run([*stacks.nice(), 'timeout', str(DRIVER_TIMEOUT), str(py), str(drv), example, str(work),
                         str(out), *extra], cwd=exdir, capture_output=True, text=True, env=env)
  (tree / 'results' / f'{example}.log').write_text(proc.stdout + proc.stderr)
  (tree / 'results' / f'{example}.measured').write_text(stacks.measured(tree))
  if not out.exists():
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ['']
    why = f'timed out ({DRIVER_TIMEOUT} s)' if proc.returncode in (124, 137) else f'crashed (exit {proc.returncode})'
    return [{'phase': 'driver', 'ok': False, 'error': f'driver {why}: {tail[0]}'}]
  return json.loads(out.read_text())


def run(examples, src, runs_dir, pythons, run_env, prepare_tree, log,
        trees=('misses-before', 'misses-after', 'misses-after-fixed'), reuse=False) -> list[str]:
  """Run the drivers on the named trees; return the markdown section.

  ``reuse``: a tree that exists is not rebuilt (its rewritten sources and the other examples'
  results stay; rebuild the section of every example with ``report``).
  """
  variant_of = {'misses-before': 'before', 'misses-after': 'after', 'misses-after-fixed': 'after'}
  bad = [t for t in trees if t not in variant_of]
  if bad:
    raise SystemExit(f'--misses-trees: unknown tree {bad[0]!r} (known: {", ".join(variant_of)})')
  made = {}
  n_fixed = 0
  for name in trees:
    if reuse and (runs_dir / name / 'linen_examples').is_dir():
      made[name] = (runs_dir / name, variant_of[name])
      log(f'misses: reusing the tree {runs_dir / name} (rewritten {stacks.tree_age(runs_dir / name)})')
      continue
    root = prepare_tree(variant_of[name], src, runs_dir, pythons, name=name)
    if name == 'misses-after-fixed':
      for path in sorted((root / 'linen_examples').rglob('*.py')):
        text, n = fix_flagged(path.read_text())
        if n:
          path.write_text(text)
          n_fixed += n
    made[name] = (root, variant_of[name])
  # misses-before first: its workdirs hold the flax.optim checkpoints the other trees restore
  trees = dict(sorted(made.items(), key=lambda kv: kv[0] != 'misses-before'))
  table = {}
  for ex in examples:
    legacy = None
    for name, (tree, variant) in trees.items():
      stack = 'old' if variant == 'before' else 'modern'
      env = run_env(variant, tree / 'results' / f'{ex}-patches.jsonl')
      recs = classify(_driver(ex, tree, pythons[stack], env, legacy), tree)
      if name == 'misses-before':
        legacy = tree / 'work' / ex
      table[(ex, name)] = recs
      bad = [r for r in recs if not r['ok']]
      log(f'misses: {ex} / {name}: {len(recs) - len(bad)}/{len(recs)} phases ok')
  (runs_dir / 'misses.json').write_text(json.dumps({f'{k[0]}|{k[1]}': v for k, v in table.items()}, indent=1))
  return markdown(table, examples, n_fixed, list(trees), split_sizes(runs_dir, list(trees)),
                  stamps_of(runs_dir, examples, list(trees)))


def stamps_of(runs_dir, examples, names) -> dict:
  """{(example, tree): the stamp its driver run left} for the runs that left one."""
  out = {}
  for name in names:
    for ex in examples:
      f = runs_dir / name / 'results' / f'{ex}.measured'
      if f.exists():
        out[(ex, name)] = f.read_text().strip()
  return out


def split_sizes(runs_dir, names) -> dict:
  """{tree: the tfds split size its metadata was written with ('published' or a number)}."""
  out = {}
  for name in names:
    f = runs_dir / name / 'tfds-split-size'
    out[name] = f.read_text().strip() if f.exists() else 'not recorded'
  return out


def report(examples, runs_dir, names=('misses-after-fixed',)) -> list[str]:
  """The section from the driver outputs an earlier (possibly unfinished) run left in ``runs_dir``."""
  table, n_fixed = {}, 0
  for name in names:
    tree = runs_dir / name
    for ex in examples:
      res = tree / 'results' / f'{ex}.json'
      if res.exists():
        table[(ex, name)] = classify(json.loads(res.read_text()), tree)
    if name == 'misses-after-fixed' and (tree / 'linen_examples').exists():
      n_fixed = sum(ln.count(TODO) and any(said in ln for said, _, _ in MECHANICAL)
                    for p in (tree / 'linen_examples').rglob('*.py') for ln in p.read_text().splitlines())
  return markdown(table, examples, n_fixed, list(names), split_sizes(runs_dir, list(names)),
                  stamps_of(runs_dir, examples, list(names)))


def markdown(table, examples, n_fixed, names, sizes=None, stamps=None) -> list[str]:
  """The section; ``stamps``: {(example, tree): when the driver ran (stacks.measured)}."""
  sizes, stamps = sizes or {}, stamps or {}
  lines = ['## Train / eval steps run once (misses)', '',
           f'`misses-after-fixed` applies the fix each flagged line\'s TODO states ({n_fixed} lines), to reach '
           'what lies behind it. A failure is **unflagged** when no `# TODO(optim-migrate)` is on its line or '
           f'the {NEAR} above. The phases "on a copy of the legacy run\'s workdir" restore the checkpoint '
           'the same driver wrote with the legacy sources on the old stack (`misses-before`). Dataset split '
           'sizes of the mock data: ' + (', '.join(f'{n}: {v}' for n, v in sizes.items()) or 'not recorded')
           + ' (1: an epoch ends at the first step, so the eval steps run).', '',
           '| example | phase | ' + ' | '.join(TITLES[n] for n in names) + ' |', '|---|---|' + '---|' * len(names)]
  for ex in examples:
    phases = []
    for name in names:
      for r in table.get((ex, name), []):
        if r['phase'] not in phases:
          phases.append(r['phase'])
    for ph in phases:
      cells = []
      for name in names:
        rec = next((r for r in table.get((ex, name), []) if r['phase'] == ph), None)
        cells.append(_cell(rec))
      lines.append(f'| {ex} | {ph} | ' + ' | '.join(cells) + ' |')
  unflagged = [(ex, name, r) for (ex, name), recs in table.items() if name != 'misses-before'
               for r in recs if not r['ok'] and r.get('flagged') is False and not r.get('kept_legacy')]
  lines += ['', '### Unflagged misses', '']
  seen = set()
  for ex, name, r in unflagged:
    key = (r.get('where'), r.get('error'))
    if key in seen:
      continue
    seen.add(key)
    lines.append(f"- `{r['where']}` `{r['text']}`: {r['error']} ({ex}, {name}, phase: {r['phase']})")
  if not unflagged:
    lines.append('none')
  if stamps:
    lines += ['', '### When each driver ran', '']
    lines += [f'- {ex} / {name}: {when}' for (ex, name), when in stamps.items()]
  extra = [(ex, name, r) for (ex, name), recs in table.items() for r in recs
           if any(k.endswith(('_vs_saved', '_vs_legacy')) for k in r)]  # the restore comparisons
  if extra:
    lines += ['', '### Restore checks', '']
    for ex, name, r in extra:
      checks = {k: v for k, v in r.items() if k.endswith(('_vs_saved', '_vs_legacy'))}
      lines.append(f'- {ex} / {name} / {r["phase"]}: {json.dumps(checks)}')
  return lines + ['']


def _cell(rec) -> str:
  if rec is None:
    return '—'
  if rec['ok']:
    return 'ok'
  where = rec.get('where')
  mark = '' if where is None else (' (flagged)' if rec.get('flagged') else
                                    ' (in a file the codemod kept legacy, flagged there)' if rec.get('kept_legacy')
                                    else ' **(unflagged)**')
  err = re.sub(r'\s+', ' ', rec.get('error', ''))[:160].replace('|', '\\|')
  return f"{err}{' at `' + where + '`' if where else ''}{mark}"
