"""Same numbers (FLIP 1009 step 3): legacy example on the old stack vs the migrated one on the modern stack.

Three runs per example, each ``trainer.py`` in its own tree: ``legacy`` (sources unmodified, old
stack: it writes the initial params), ``zero-edit`` (sources unmodified, modern stack through
``optim_compat.install()``) and ``migrated`` (after ``rewrite --write`` and the fixes each flagged
line's TODO states, modern stack, only the harness patches no OM2xx rule could remove). All three
start from the legacy run's initial params and see the same batches. Loss curves and final params are compared in ulps of each leaf's largest
magnitude (``equivalence_tests.core.ulp_distance``; a loss curve as one leaf).
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess

from examples_harness import stacks
import sys

import numpy as np

EXAMPLES = ('mnist', 'seq2seq', 'wmt', 'pixelcnn')
#: (name, variant, apply the flagged lines' fixes): ``migrated`` is the AFTER variant (only the harness
#: patches no OM2xx rule could remove: the OM2xx rules migrate the rest)
RUNS = (('legacy', 'before', False), ('zero-edit', 'zero-edit', False), ('migrated', 'after', True))


def compare(actual: dict, expected: dict) -> dict:
  """Loss and final-param differences of ``actual`` against ``expected`` (both trainer.py outputs).

  Returns {'loss_ulp', 'loss_max_abs', 'loss_max_rel', 'params_ulp', 'worst_leaf', 'params_max_rel'
  (max |diff| / max |leaf| over leaves), 'leaves', 'bitwise', 'first_diff_step' (1-based index of
  the first loss that differs; None when the curves are equal), 'loss_ulp_first10' (the curves'
  ulp distance over their first 10 steps: how far apart they start, before chaotic growth)}.

  Raises:
    KeyError: the two runs have different leaves (names the first).
  """
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from equivalence_tests.core import ulp_distance
  la, le = np.asarray(actual['loss'], np.float64), np.asarray(expected['loss'], np.float64)
  if la.shape != le.shape:
    raise ValueError(f'loss curves of different lengths: {la.shape} vs {le.shape}')
  loss_ulp = ulp_distance(la.astype(np.float32), le.astype(np.float32))
  diff = np.abs(la - le)
  keys = [k for k in expected if k != 'loss']
  missing = [k for k in keys if k not in actual] + [k for k in actual if k != 'loss' and k not in expected]
  if missing:
    raise KeyError(f'leaf {missing[0]!r} is in one run only')
  worst, where, rel = 0.0, None, 0.0
  for k in keys:
    d = ulp_distance(actual[k], expected[k])
    if where is None or d > worst:
      worst, where = d, k
    scale = float(np.max(np.abs(expected[k]))) if np.size(expected[k]) else 0.0
    if scale > 0:
      rel = max(rel, float(np.max(np.abs(np.asarray(actual[k], np.float64) - expected[k]))) / scale)
  bitwise = all(np.array_equal(actual[k], expected[k]) for k in keys) and np.array_equal(la, le)
  differ = np.flatnonzero(la != le)
  first = int(differ[0]) + 1 if differ.size else None
  first10 = ulp_distance(la[:10].astype(np.float32), le[:10].astype(np.float32)) if la.size else 0.0
  return dict(loss_ulp=loss_ulp, loss_max_abs=float(diff.max()) if diff.size else 0.0,
              loss_max_rel=float((diff / np.maximum(np.abs(le), 1e-30)).max()) if diff.size else 0.0,
              params_ulp=worst, worst_leaf=where, params_max_rel=rel, leaves=len(keys), bitwise=bitwise,
              first_diff_step=first, loss_ulp_first10=first10)


def run(steps, src, runs_dir, pythons, run_env, prepare_tree, log, examples=EXAMPLES,
        only=None) -> list[str]:
  """Train the examples on the RUNS named in ``only`` (default: all three) and return the section.

  A run not in ``only`` keeps the output an earlier invocation left (its tree is not rebuilt);
  without ``legacy`` the initial params the last legacy run wrote are reused, and an example
  that has none reads 'not run'.

  Raises:
    SystemExit: ``only`` names an unknown run.
  """
  examples = [e for e in EXAMPLES if e in examples]
  names = [n for n, _, _ in RUNS] if only is None else list(only)
  bad = [n for n in names if n not in {r[0] for r in RUNS}]
  if bad:
    raise SystemExit(f'--same-runs: unknown run {bad[0]!r} (known: {", ".join(r[0] for r in RUNS)})')
  from examples_harness import misses
  trees = {}
  for name, variant, fix in RUNS:
    if name not in names:
      continue
    # the outputs of the examples not trained now survive the tree's rebuild
    kept = {f.name: f.read_bytes() for f in sorted((runs_dir / f'same-{name}').glob('*-*.*'))
            if f.suffix in ('.npz', '.measured') and f.name.split('-', 1)[0] not in examples}
    dest = prepare_tree(variant, src, runs_dir, pythons, name=f'same-{name}')
    for fname, data in kept.items():
      (dest / fname).write_bytes(data)
    if fix:
      for path in sorted((dest / 'linen_examples').rglob('*.py')):
        text, n = misses.fix_flagged(path.read_text())
        if n:
          path.write_text(text)
    trees[name] = (dest, variant)
  trainer = pathlib.Path(__file__).resolve().parent / 'trainer.py'
  out: dict = {}
  for ex in examples:
    params_file = runs_dir / f'same-{ex}-init.npz'
    for name, _, _ in RUNS:   # the earlier outputs of the runs not rerun
      res = runs_dir / f'same-{name}' / f'{ex}-{steps}.npz'
      if name not in names and res.exists():
        out[(ex, name)] = dict(np.load(res))
    if 'legacy' in names:
      params_file.unlink(missing_ok=True)
    elif not params_file.exists():
      for name in names:
        out[(ex, name)] = f'not run: no initial params ({params_file.name}; run legacy first)'
      continue
    for name, variant, _ in RUNS:
      if name not in names:
        continue
      tree = trees[name][0]
      work = tree / 'work' / ex
      shutil.rmtree(work, ignore_errors=True)
      work.mkdir(parents=True)
      res = tree / f'{ex}-{steps}.npz'
      res.unlink(missing_ok=True)
      stack = 'old' if variant == 'before' else 'modern'
      proc = subprocess.run([*stacks.nice(), 'timeout', '1800', str(pythons[stack]), str(trainer), ex,
                             str(steps), str(params_file), str(res), str(work)],
                            cwd=tree / 'linen_examples' / ex, capture_output=True, text=True,
                            env=run_env(variant, tree / f'{ex}-patches.jsonl'))
      (tree / f'{ex}-train.log').write_text(proc.stdout + proc.stderr)
      (tree / f'{ex}-{steps}.measured').write_text(stacks.measured(tree))
      if proc.returncode != 0 or not res.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ['']
        out[(ex, name)] = f'failed (exit {proc.returncode}): {tail[0][:200]}'
      else:
        out[(ex, name)] = dict(np.load(res))
      log(f'same numbers: {ex} / {name}: {"ok" if isinstance(out[(ex, name)], dict) else out[(ex, name)]}')
  return markdown(out, steps, examples, stamps_of(runs_dir, steps, examples))


def report(steps, runs_dir, examples=EXAMPLES) -> list[str]:
  """The section from the outputs an earlier run left in ``runs_dir`` (a missing one reads 'not run')."""
  out = {}
  for ex in [e for e in EXAMPLES if e in examples]:
    for name, _, _ in RUNS:
      res = runs_dir / f'same-{name}' / f'{ex}-{steps}.npz'
      if res.exists():
        out[(ex, name)] = dict(np.load(res))
  examples = [e for e in EXAMPLES if e in examples]
  return markdown(out, steps, examples, stamps_of(runs_dir, steps, examples))


def stamps_of(runs_dir, steps, examples) -> dict:
  """{(example, run): when it trained (stacks.measured)} for the runs that left a stamp."""
  out = {}
  for ex in examples:
    for name, _, _ in RUNS:
      f = runs_dir / f'same-{name}' / f'{ex}-{steps}.measured'
      if f.exists():
        out[(ex, name)] = f.read_text().strip()
  return out


def _fmt(c) -> str:
  if isinstance(c, str):
    return c
  if c['bitwise']:
    return 'bitwise'
  start = ('' if c.get('first_diff_step') is None else
           f"; losses equal to step {c['first_diff_step'] - 1}, {c['loss_ulp_first10']:.3g} ulp over steps 1-10")
  return (f"loss {c['loss_ulp']:.3g} ulp (max rel {c['loss_max_rel']:.2g}{start}); "
          f"params {c['params_ulp']:.3g} ulp (worst `{c['worst_leaf']}`; max rel {c['params_max_rel']:.2g})")


def markdown(out, steps, examples=EXAMPLES, stamps=None) -> list[str]:
  """The section; ``stamps``: {(example, run): when it trained}, listed under the table."""
  lines = ['## Same numbers', '',
           f'{steps} train steps from the same initial params on the same batches (dropout off). Ulps of each '
           "leaf's largest magnitude (final params; the loss curve as one leaf, float32).", '',
           '| example | final loss (legacy, old stack) | migrated (modern) vs legacy (old) | zero-edit (modern) vs legacy (old) | migrated vs zero-edit (both modern) |',
           '|---|---|---|---|---|']
  for ex in examples:
    leg, zer, mig = (out.get((ex, n)) for n in ('legacy', 'zero-edit', 'migrated'))
    cells = []
    for a, b in ((mig, leg), (zer, leg), (mig, zer)):
      if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        cells.append(a if isinstance(a, str) else b if isinstance(b, str) else 'not run')
      else:
        try:
          cells.append(_fmt(compare(a, b)))
        except (KeyError, ValueError) as e:
          cells.append(f'not comparable: {e}')
    first = f"{leg['loss'][-1]:.5g} (step 1: {leg['loss'][0]:.5g})" if isinstance(leg, dict) else '—'
    lines.append(f'| {ex} | {first} | ' + ' | '.join(cells) + ' |')
  if stamps:
    lines += ['', 'When each run trained (runs without a date here were measured by an earlier session):', '']
    lines += [f'- {ex} / {name}: {when}' for (ex, name), when in stamps.items()]
  return lines + ['']
