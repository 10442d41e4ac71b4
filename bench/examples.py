"""Acceptance suite: the flax v0.3.0 linen examples, BEFORE / AFTER / ZERO-EDIT (outside CI).

    python bench/examples.py [--source DIR] [--cache DIR] [--examples mnist,wmt] [--variants before,after]
                             [--timeout 900] [--misses] [--same-numbers 300] [--write-results]

Takes google/flax at tag v0.3.0 (commit ``d59410b5…``), ``linen_examples/``: from ``--source DIR`` (a flax
checkout or its ``linen_examples``), else from ``<cache>/flax-v0.3.0``, else by cloning where the network allows.
The sources are never copied into this repository. It builds two virtualenvs under ``<cache>/examples-venvs``
(``old``: jax 0.4.13 / flax 0.5.3 with the real flax.optim; ``modern``: today's jax / flax / optax and this
project's dependencies; both with TensorFlow, tensorflow-datasets, clu, ml_collections, sentencepiece, ...;
a venv built from another checkout of this project is reused: the modern runs and the rewrite import the
project from the checkout running this script, on their PYTHONPATH), then for each
example runs its own tests (pytest, in the example's directory, as upstream CI did, one example at a time, each
under ``--timeout`` seconds) in four variants:

- ``before``: old stack, the sources unmodified;
- ``after``: modern stack, after one ``optim-migrate rewrite --write``, with only the harness patches no OM2xx
  rule could make unnecessary;
- ``after+om2xx-patches``: the same with every harness patch (until the OM2xx rules land);
- ``zero-edit``: modern stack, sources unmodified, ``optim_compat.install()`` first, every harness patch.

Harness patches (``bench/examples_harness/patches.py``) restore jax-0.2 / flax-0.3 APIs a stack lacks, from a
``sitecustomize`` on the run's PYTHONPATH; the example files are never edited. Each run logs the patches it
reached, and the table lists them. Dataset access is offline: ``tfds.testing.mock_data`` with dataset metadata
generated locally into ``<run>/.tfds/metadata`` (where the tests look for it).

``--misses`` runs each migrated example's train and eval step once (tiny configs) and lists every exception
raised on a line with no ``# TODO(optim-migrate)`` near it. ``--same-numbers N`` trains mnist, seq2seq, wmt and
pixelcnn for N steps on both stacks (legacy code on the old stack, migrated code on the modern one) from the
same initial parameters and batches, and compares loss curves and final params in ulps of each leaf's largest
magnitude. ``--write-results`` writes bench/examples_results.md.

Exit status: 0 when every example's AFTER equals its BEFORE, 1 otherwise, 2 on bad arguments or a failed setup.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from examples_harness import patches as patches_lib  # noqa: E402
from examples_harness import results as results_lib  # noqa: E402
from examples_harness import stacks  # noqa: E402

COMMIT = 'd59410b58933f7f821ce0449401d6f2d7e2043ff'
UPSTREAM = 'https://github.com/google/flax.git'
EXAMPLES = ('seq2seq', 'mnist', 'pixelcnn', 'imagenet', 'wmt', 'nlp_seq', 'ppo', 'vae')
SITE = HERE / 'examples_harness' / 'site'
#: EXAMPLES_* variables of the caller's environment that reach the runs (the others are the harness's own)
PASS_THROUGH = ('EXAMPLES_TFDS_SPLIT_SIZE',)


def log(msg: str) -> None:
  print(f'[examples] {msg}', file=sys.stderr, flush=True)


def find_sources(source: str | None, cache: pathlib.Path) -> pathlib.Path:
  """Return the ``linen_examples`` directory to use.

  Raises:
    SystemExit(2): ``--source`` has no linen_examples, or no source is cached and cloning failed.
  """
  if source:
    src = pathlib.Path(source).resolve()
    for cand in (src / 'linen_examples', src):
      if (cand / 'mnist' / 'train.py').exists():
        head = _git_head(cand)
        if head and head != COMMIT:
          log(f'warning: {cand} is at commit {head}, not v0.3.0 ({COMMIT})')
        return cand
    raise SystemExit(f'--source {src}: no linen_examples/ (with mnist/train.py) in it')
  cached = cache / 'flax-v0.3.0' / 'linen_examples'
  if (cached / 'mnist' / 'train.py').exists():
    return cached
  log(f'no cached sources in {cached.parent}; cloning {UPSTREAM} at {COMMIT}')
  tmp = cache / 'flax-v0.3.0.clone'
  shutil.rmtree(tmp, ignore_errors=True)
  cmds = [['git', 'clone', '--quiet', '--no-checkout', '--filter=blob:none', UPSTREAM, str(tmp)],
          ['git', '-C', str(tmp), 'checkout', '--quiet', COMMIT, '--', 'linen_examples']]
  for cmd in cmds:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise SystemExit(f'cloning the examples failed ({" ".join(cmd)}): {proc.stderr.strip()}\n'
                       f'give a local copy with --source DIR (a flax checkout at {COMMIT})')
  cached.parent.mkdir(parents=True, exist_ok=True)
  shutil.move(str(tmp / 'linen_examples'), str(cached))
  shutil.rmtree(tmp, ignore_errors=True)
  return cached


def _git_head(path: pathlib.Path) -> str | None:
  proc = subprocess.run(['git', '-C', str(path), 'rev-parse', 'HEAD'], capture_output=True, text=True)
  return proc.stdout.strip() if proc.returncode == 0 else None


def run_env(variant: str, patch_log: pathlib.Path, selected: list[str] | None = None) -> dict[str, str]:
  spec = patches_lib.VARIANTS[variant]
  env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'VIRTUAL_ENV', 'EXAMPLES_'))
         or k in PASS_THROUGH}
  names = selected if selected is not None else patches_lib.allowed(variant)
  env.update(PYTHONPATH=os.pathsep.join([str(SITE), *stacks.project_path(spec['stack'])]),
             EXAMPLES_PATCHES=','.join(names),
             EXAMPLES_PATCH_LOG=str(patch_log), JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='',
             TF_CPP_MIN_LOG_LEVEL='2', PYTHONHASHSEED='0', PYTHONDONTWRITEBYTECODE='1')
  if spec['zero_edit']:
    env['EXAMPLES_ZERO_EDIT'] = '1'
  return env


def prepare_tree(variant: str, src: pathlib.Path, runs: pathlib.Path, pythons: dict,
                 name: str | None = None) -> pathlib.Path:
  """Copy the examples to ``runs/<name or variant>/linen_examples``, rewrite them if the variant says
  so, and generate the tfds metadata with the variant's stack. Returns the run root."""
  spec = patches_lib.VARIANTS[variant]
  root = runs / (name or variant)
  shutil.rmtree(root, ignore_errors=True)
  root.mkdir(parents=True)
  shutil.copytree(src, root / 'linen_examples')
  if spec['rewrite']:
    # this checkout's codemod (stacks.project_path), whichever checkout the venv was built from
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'VIRTUAL_ENV'))}
    env['PYTHONPATH'] = os.pathsep.join(stacks.project_path('modern'))
    proc = subprocess.run([*stacks.nice(), str(pythons['modern']), '-m', 'codemod.cli', 'rewrite', '--write',
                           '--jobs', '1', '--report', str(root / 'rewrite-report.json'), 'linen_examples'],
                          cwd=root, capture_output=True, text=True, env=env)
    (root / 'rewrite.log').write_text(proc.stdout + proc.stderr)
    (root / 'codemod-at').write_text(stacks.codemod_at())   # the codemod this tree was rewritten with
    if proc.returncode not in (0, 1):
      raise SystemExit(f'optim-migrate rewrite failed (exit {proc.returncode}); see {root / "rewrite.log"}')
  py = pythons[spec['stack']]
  (root / 'tfds-split-size').write_text(os.environ.get('EXAMPLES_TFDS_SPLIT_SIZE', 'published'))
  proc = subprocess.run([*stacks.nice(), str(py), str(HERE / 'examples_harness' / 'tfds_meta.py'),
                         str(root / '.tfds' / 'metadata')],
                        capture_output=True, text=True, env=run_env(variant, root / 'meta-patches.jsonl', []))
  if proc.returncode != 0:
    raise SystemExit(f'generating tfds metadata failed ({variant}):\n{proc.stderr[-3000:]}')
  return root


def has_tests(exdir: pathlib.Path) -> bool:
  return any(exdir.glob('*_test.py')) or any(exdir.glob('test_*.py'))


def run_tests(example: str, variant: str, root: pathlib.Path, pythons: dict,
              timeout: int) -> results_lib.RunResult:
  exdir = root / 'linen_examples' / example
  out = root / 'results' / example
  shutil.rmtree(out, ignore_errors=True)
  out.mkdir(parents=True)
  if not has_tests(exdir):
    return results_lib.RunResult(example, variant, [], status='no-tests', measured=stamp(root))
  patch_log = out / 'patches.jsonl'
  junit = out / 'junit.xml'
  py = pythons[patches_lib.VARIANTS[variant]['stack']]
  cmd = [*stacks.nice(), 'timeout', '--kill-after=30', str(timeout), str(py), '-m', 'pytest', '-q',
         '-p', 'no:cacheprovider', '--continue-on-collection-errors', '-o', 'junit_family=xunit1',
         f'--junitxml={junit}', '.']
  t0 = time.time()
  proc = subprocess.run(cmd, cwd=exdir, capture_output=True, text=True, env=run_env(variant, patch_log))
  (out / 'pytest.log').write_text(proc.stdout + proc.stderr)
  status = 'ok'
  if proc.returncode in (124, 137):
    status = 'timeout'
  tests = results_lib.parse_junit(junit) if junit.exists() else []
  if not tests and status == 'ok':
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ['']
    status = f'crashed: exit {proc.returncode}: {tail[0][:200]}'
  used = sorted(n for n, ev in patches_lib.read_log(patch_log).items() if 'used' in ev)
  log(f'{example} / {variant}: {sum(t.outcome == "passed" for t in tests)}/{len(tests)} passed '
      f'({time.time() - t0:.0f} s){" " + status if status != "ok" else ""}')
  return results_lib.RunResult(example, variant, tests, status=status, patches_used=used,
                               measured=stamp(root), seconds=round(time.time() - t0, 1))


def stamp(root: pathlib.Path) -> str:
  """When, under what load and against which codemod a run in ``root`` was measured (stacks.measured)."""
  return stacks.measured(root)


def merge_runs(path: pathlib.Path, new: list[results_lib.RunResult]) -> list[results_lib.RunResult]:
  """Replace the (example, variant) entries of the runs saved at ``path`` with ``new``; save; return all."""
  old = []
  if path.exists():
    for d in json.loads(path.read_text()):
      d['tests'] = [results_lib.TestResult(**t) for t in d['tests']]
      old.append(results_lib.RunResult(**d))
  keys = {(r.example, r.variant) for r in new}
  runs = [r for r in old if (r.example, r.variant) not in keys] + new
  order = {v: i for i, v in enumerate(patches_lib.VARIANTS)}
  runs.sort(key=lambda r: (EXAMPLES.index(r.example), order[r.variant]))
  path.write_text(json.dumps([r.__dict__ | {'tests': [t.__dict__ for t in r.tests]} for r in runs], indent=1))
  return runs


def tests_section(runs: list[results_lib.RunResult]) -> str:
  variants = [v for v in patches_lib.VARIANTS if any(r.variant == v for r in runs)]
  examples = [e for e in EXAMPLES if any(r.example == e for r in runs)]
  return '\n'.join(['## Tests per example (passed / tests)', '',
                    results_lib.table(runs, variants, examples), '',
                    '## Failures (first error line)', '', results_lib.failures(runs) or 'none', '',
                    '## Harness patches', '', patch_table(runs, variants), '',
                    '### When each cell was measured', '', results_lib.provenance(runs), ''])


def patch_table(runs: list[results_lib.RunResult], variants: list[str]) -> str:
  rows = ['| patch | restores | harness stand-in | an OM2xx rule could remove it | used by (example: variants) |',
          '|---|---|---|---|---|']
  for name, p in patches_lib.PATCHES.items():
    users: dict[str, list[str]] = {}
    for r in runs:
      if name in r.patches_used:
        users.setdefault(r.example, []).append(r.variant)
    used = '; '.join(f'{ex}: {", ".join(v)}' for ex, v in users.items()) or '—'
    how = p.how + ('' if p.faithful else ' **(not faithful)**')
    rows.append(f'| `{name}` | {p.restores} | {how} | {"yes" if p.om2xx else "no"} | {used} |')
  return '\n'.join(rows)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--source', help='a flax checkout at v0.3.0, or its linen_examples directory')
  ap.add_argument('--cache', default=os.environ.get('OPTIM_MIGRATE_EXAMPLES_CACHE',
                                                    str(pathlib.Path.home() / '.cache' / 'optim-migrate-examples')))
  ap.add_argument('--examples', default=','.join(EXAMPLES))
  ap.add_argument('--variants', default=','.join(patches_lib.VARIANTS))
  ap.add_argument('--timeout', type=int, default=900, help='seconds per example and variant')
  ap.add_argument('--misses', action='store_true', help='run each migrated train / eval step once')
  ap.add_argument('--misses-trees', default='misses-after-fixed',
                  help='comma-separated: misses-before (old stack control), misses-after, misses-after-fixed')
  ap.add_argument('--misses-reuse', action='store_true',
                  help='with --misses: keep a misses tree that exists (its sources and other examples\' results)')
  ap.add_argument('--same-numbers', type=int, default=0, metavar='STEPS')
  ap.add_argument('--same-runs', default='legacy,zero-edit,migrated',
                  help='with --same-numbers: the runs to (re)do; the others keep their earlier outputs')
  ap.add_argument('--tree-suffix', default='', help='name the run trees <variant><suffix> (parallel invocations)')
  ap.add_argument('--report-only', action='store_true',
                  help='with --misses / --same-numbers: rebuild their sections from the outputs in the cache, run nothing')
  ap.add_argument('--no-tests', action='store_true', help='skip the test runs (with --misses / --same-numbers)')
  ap.add_argument('--write-results', action='store_true', help='write bench/examples_results.md')
  args = ap.parse_args(argv)
  examples = [e for e in args.examples.split(',') if e]
  variants = [v for v in args.variants.split(',') if v]
  bad = [e for e in examples if e not in EXAMPLES] + [v for v in variants if v not in patches_lib.VARIANTS]
  if bad:
    ap.error(f'unknown example or variant: {", ".join(bad)} (examples: {", ".join(EXAMPLES)}; '
             f'variants: {", ".join(patches_lib.VARIANTS)})')
  cache = pathlib.Path(args.cache).resolve()
  try:
    src = find_sources(args.source, cache)
    need = {patches_lib.VARIANTS[v]['stack'] for v in variants} | ({'old', 'modern'} if (
        args.misses or args.same_numbers) else set())
    pythons = {s: stacks.ensure(s, cache / 'examples-venvs' / s, log=log) for s in sorted(need)}
    pythons.setdefault('modern', stacks.python(cache / 'examples-venvs' / 'modern'))
  except (SystemExit, RuntimeError) as e:
    print(e, file=sys.stderr)
    return 2
  runs_dir = cache / 'examples-runs'
  runs: list[results_lib.RunResult] = []
  roots = {}
  for v in ([] if args.no_tests else variants):
    roots[v] = prepare_tree(v, src, runs_dir, pythons, name=v + args.tree_suffix)
    for ex in examples:
      runs.append(run_tests(ex, v, roots[v], pythons, args.timeout))
  if runs:
    runs = merge_runs(runs_dir / 'runs.json', runs)
    (runs_dir / 'section-tests.md').write_text(tests_section(runs))
  if args.misses and args.report_only:
    from examples_harness import misses
    (runs_dir / 'section-misses.md').write_text(
        '\n'.join(misses.report(examples, runs_dir, args.misses_trees.split(','))))
  elif args.misses:
    from examples_harness import misses
    (runs_dir / 'section-misses.md').write_text(
        '\n'.join(misses.run(examples, src, runs_dir, pythons, run_env, prepare_tree, log,
                              trees=args.misses_trees.split(','), reuse=args.misses_reuse)))
  if args.same_numbers and args.report_only:
    from examples_harness import same_numbers
    (runs_dir / 'section-same-numbers.md').write_text(
        '\n'.join(same_numbers.report(args.same_numbers, runs_dir, examples)))
  elif args.same_numbers:
    from examples_harness import same_numbers
    (runs_dir / 'section-same-numbers.md').write_text(
        '\n'.join(same_numbers.run(args.same_numbers, src, runs_dir, pythons, run_env, prepare_tree, log,
                                    examples=examples, only=[n for n in args.same_runs.split(',') if n])))
  parts = [runs_dir / f'section-{n}.md' for n in ('tests', 'misses', 'same-numbers')]
  text = '\n'.join(p.read_text() for p in parts if p.exists())
  print(text)
  if args.write_results:
    out = HERE / 'examples_results.md'
    notes = kept_notes(out.read_text() if out.exists() else '')
    out.write_text(_results_header(src) + (notes + '\n\n' if notes else '') + text + '\n')
  by = {(r.example, r.variant): r for r in runs}
  same = [ex for ex in examples if (ex, 'before') in by and (ex, 'after') in by
          and [t.outcome for t in by[(ex, 'before')].tests] == [t.outcome for t in by[(ex, 'after')].tests]]
  return 0 if runs and len(same) == len(examples) else 1


NOTES_BEGIN = '<!-- notes: written by hand, kept by --write-results -->'
NOTES_END = '<!-- /notes -->'


def kept_notes(text: str) -> str:
  """The hand-written block of a results file (from NOTES_BEGIN to NOTES_END, markers included),
  which --write-results carries over; '' when the file has none.

  Raises:
    ValueError: a NOTES_BEGIN marker without its NOTES_END (nothing would be kept safely).
  """
  i = text.find(NOTES_BEGIN)
  if i < 0:
    return ''
  j = text.find(NOTES_END, i)
  if j < 0:
    raise ValueError(f'bench/examples_results.md: {NOTES_BEGIN!r} has no {NOTES_END!r} after it')
  return text[i:j + len(NOTES_END)]


def _results_header(src: pathlib.Path) -> str:
  return (f'# flax v0.3.0 linen examples: BEFORE / AFTER / ZERO-EDIT\n\n'
          f'Written by `python bench/examples.py --write-results` ({time.strftime("%Y-%m-%d")}); sources: '
          f'google/flax `{COMMIT}` `linen_examples/` (not in this repository).\n\n'
          f'Stacks: old = {", ".join(stacks.pins("old"))}; modern = {", ".join(stacks.pins("modern")[:-2])}, '
          f'this project (editable).\n\n'
          'Variants: **before** = old stack, sources unmodified; **after** = modern stack after one '
          '`optim-migrate rewrite --write`, only the harness patches no OM2xx rule could remove; '
          '**after+om2xx-patches** = the same with every harness patch (measured before the OM2xx rules '
          'landed; what they hid); '
          '**zero-edit** = modern stack, sources unmodified, `optim_compat.install()` first, every harness patch. '
          'Each example\'s own tests run with pytest in its directory, one example at a time, '
          '`--continue-on-collection-errors` (so one module that fails to import does not hide the others\' tests; '
          'upstream CI stopped there) and without upstream\'s `filterwarnings = error` (today\'s stacks warn about '
          'many deprecations). A test module that fails to import counts as one failed item, out of the tests the '
          'module has where another variant collected it.\n\n')


if __name__ == '__main__':
  sys.exit(main())
