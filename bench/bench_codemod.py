"""``codemod_vs_libcst_noop``: whole-tree rewrite time vs a LibCST no-op codemod.

A tree of generated Python files is written to a temporary directory: 10% are
legacy ``flax.optim`` programs (the bodies of this repository's codemod
fixtures that import flax, and ``examples/legacy/train_digits.py``), 5% are
look-alikes that mention the prefilter's markers without using flax.optim
(``torch.optim``, ``scipy.optimize``, another library's ``.target``), 85% are
ordinary modules; every file is padded with ordinary functions and classes so
files have 60–300 lines.

Contenders, each a fresh subprocess, alternated round by round:

- ours: ``python -m codemod.cli rewrite --check TREE`` (writes nothing; lists the
  files that would change and the manual items);
- reference: ``python -m libcst.tool codemod --no-format noop.NOOPCommand TREE``
  (LibCST's own no-op command; it parses and re-emits every file, with its
  default process pool of one job per core).

- parse floor: a fresh interpreter that walks the tree, applies the text
  prefilter and only LibCST-parses the files that pass (no analysis, no output).

Reported: median of per-round wall-time ratios ours / reference (and parse
floor / reference), with how many
of the tree's legacy files the text prefilter passes (all must) and how many
look-alikes it parses, and the floor this design cannot go below: our CLI's
start-up (a run on one file the prefilter skips) plus LibCST's parse and the
scope, qualified-name and position metadata of the legacy files (of the part the
analysis sees) alone, spread
over the worker processes. Also the
rewrite throughput in files/s on the legacy files alone (in process,
``engine.rewrite_file``, no writes), the peak resident memory of our whole-tree
subprocess (``ru_maxrss`` from ``os.wait4``, MiB) and the peak of Python
allocations during an in-process whole-tree rewrite (``tracemalloc``, MiB).
The full run also times one pathological file: 20,000 statements on one line.

Large files (``codemod_large_file_*``): one generated legacy module of 0.5, 1, 2 and 5 MB
(``--quick``: 0.02 and 0.04 MB), made of realistic training functions with distinct names
(:func:`large_legacy_module`: an optimizer factory, a jitted step with
``apply_gradient`` and a loop reading ``.target`` / ``.state.step`` per block), each
checked by a fresh ``rewrite --check --no-cache FILE`` subprocess, beside two floors on the
same file (fresh subprocesses too): LibCST's parse alone, and the parse plus the scope,
qualified-name and position metadata the analysis resolves: wall time, CPU time and peak
RSS per size, and the growth exponent ``b`` of ``cost ~ size**b`` fitted over the sizes
(1.0 is linear; the cost is CPU time less that of a tiny file, and peak RSS less that
run's).

Real tree (``codemod_ecosystem_*``, not with ``--quick``): the ecosystem set of
``bench/ecosystem_repos.toml`` merged into one tree, cold and warm (cached) ``rewrite
--check`` against LibCST's no-op codemod, pre-commit on one changed file, and how many
files each prefilter token passes (:func:`run_ecosystem`).
"""
from __future__ import annotations

import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

from common import fmt_range, ratios, summary

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKERS_FREE_CHECK = ('optim', 'apply_gradient', '.target')

LOOKALIKES = [
    '''import torch


def fit(model, loader, lr=0.01):
  """Plain PyTorch training loop."""
  opt = torch.optim.SGD(model.parameters(), lr=lr)
  for batch in loader:
    opt.zero_grad()
    loss = model(batch.inputs).sub(batch.target).pow(2).mean()
    loss.backward()
    opt.step()
  return model
''',
    '''import numpy as np
from scipy import optimize


def fit_curve(xs, ys):
  """Least squares fit of a line with scipy.optimize."""
  def residual(theta):
    return theta[0] * xs + theta[1] - ys
  return optimize.least_squares(residual, np.zeros(2)).x
''',
]


def _filler(rng: random.Random, tag: str, n_blocks: int) -> str:
  """Ordinary code without any prefilter marker: functions, classes, constants."""
  parts = []
  for b in range(n_blocks):
    kind = rng.randrange(3)
    name = f'{tag}_{b}'
    if kind == 0:
      parts.append(f'''

def accumulate_{name}(values, scale={rng.randint(1, 9)}.5):
  """Running totals of ``values`` times ``scale``."""
  total = 0.0
  out = []
  for v in values:
    total += v * scale
    if total > {rng.randint(100, 999)}:
      total = total % {rng.randint(7, 97)}
    out.append(total)
  return out
''')
    elif kind == 1:
      parts.append(f'''

class Record{name.title().replace('_', '')}:
  """A small record with a name and a size."""

  def __init__(self, name, size={rng.randint(0, 64)}):
    self.name = name
    self.size = size

  def describe(self):
    return f'{{self.name}}: {{self.size}} items'

  def grow(self, by=1):
    self.size += by
    return self
''')
    else:
      parts.append(f'''

TABLE_{name.upper()} = {{
    'alpha': {rng.random():.6f},
    'beta': [{', '.join(str(rng.randint(0, 99)) for _ in range(6))}],
    'gamma': ('a', 'b', 'c'),
}}


def lookup_{name}(key, default=None):
  return TABLE_{name.upper()}.get(key, default)
''')
  return ''.join(parts)


def legacy_pool() -> list[str]:
  """Sources that use flax.optim: codemod fixtures importing flax, and the example."""
  pool = [p.read_text() for p in sorted((ROOT / 'tests' / 'fixtures' / 'codemod').glob('*/before.py'))
          if 'flax' in p.read_text()]
  pool.append((ROOT / 'examples' / 'legacy' / 'train_digits.py').read_text())
  return pool


def make_tree(root: pathlib.Path, n_files: int, seed: int = 0) -> dict[str, list[pathlib.Path]]:
  """Write the tree; ``{'legacy': [...], 'lookalike': [...], 'plain': [...]}``."""
  rng = random.Random(seed)
  legacy = legacy_pool()
  out = {'legacy': [], 'lookalike': [], 'plain': []}
  for i in range(n_files):
    kind = 'legacy' if i % 10 == 0 else ('lookalike' if i % 20 == 5 else 'plain')
    head = {'legacy': lambda: rng.choice(legacy), 'lookalike': lambda: rng.choice(LOOKALIKES),
            'plain': lambda: '"""Utility module."""\nimport math\n'}[kind]()
    body = _filler(rng, f'm{i}', rng.randint(4, 20))
    assert not any(m in body for m in MARKERS_FREE_CHECK)
    path = root / f'pkg{i % 17}' / f'sub{i % 5}' / f'mod_{i}.py'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head.rstrip('\n') + '\n' + body)
    out[kind].append(path)
  return out


_LARGE_HEAD = '''"""Generated legacy training module (bench_codemod.large_legacy_module)."""
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import optim


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


model = MLP()
'''
_LARGE_DEFS = ('optim.Adam(learning_rate=lr, beta1=0.9, beta2=0.999)',
               'optim.Momentum(learning_rate=lr, beta=0.9, nesterov=True)',
               'optim.GradientDescent(learning_rate=lr)')
_LARGE_BLOCK = '''

def create_optimizer_{i}(params, lr={lr}):
  """Optimizer of experiment {i}."""
  optimizer_def = {definition}
  return optimizer_def.create(params)


@jax.jit
def train_step_{i}(optimizer, batch):
  """One step of experiment {i}."""

  def loss_fn(params):
    logits = model.apply({{'params': params}}, batch['x'])
    return jnp.mean((logits - batch['y']) ** 2)

  loss, grads = jax.value_and_grad(loss_fn)(optimizer.target)
  optimizer = optimizer.apply_gradient(grads)
  return optimizer, loss


def train_{i}(params, batches):
  optimizer = create_optimizer_{i}(params)
  for batch in batches:
    optimizer, loss = train_step_{i}(optimizer, batch)
  return optimizer.target, optimizer.state.step
'''


def large_legacy_module(n_bytes: int) -> str:
  """A legacy flax.optim module of at least ``n_bytes`` bytes (UTF-8, ASCII only): imports,
  a Linen model, then blocks of three functions per experiment ``i`` (factory, jitted
  step, loop) with distinct names, cycling Adam / Momentum / GradientDescent; all of it
  converts (no manual item)."""
  parts, size, i = [_LARGE_HEAD], len(_LARGE_HEAD), 0
  while size < n_bytes:
    block = _LARGE_BLOCK.format(i=i, lr=f'{0.001 * (1 + i % 7):.4f}',
                                definition=_LARGE_DEFS[i % 3])
    parts.append(block)
    size += len(block)
    i += 1
  return ''.join(parts)


def _growth(sizes, costs) -> float:
  """Least-squares slope of log(cost) on log(size): ``b`` of ``cost ~ size**b``."""
  import math
  xs = [math.log(s) for s in sizes]
  ys = [math.log(max(c, 1e-6)) for c in costs]
  mx, my = statistics.fmean(xs), statistics.fmean(ys)
  return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
          / sum((x - mx) ** 2 for x in xs))


#: The floors of one large file (a fresh interpreter, ``sys.argv[1]`` the file): LibCST's
#: parse alone (``parse``), and the parse plus the metadata the analysis resolves on it
#: (``metadata``: scope, qualified names, positions; what ``codemod.facts.analyze`` asks for).
LARGE_FLOOR = """
import gc, sys
import libcst
from codemod.names import METADATA
gc.disable()  # as rewrite runs a file (runner.gc_paused)
tree = libcst.parse_module(open(sys.argv[1], encoding='utf-8').read())
if sys.argv[2] == 'metadata':
  libcst.MetadataWrapper(tree, unsafe_skip_copy=True).resolve_many(METADATA)
"""


def run_large(quick: bool, sizes_mb=None) -> list[tuple[str, float, str]]:
  """The ``codemod_large_file_*`` rows (module docstring): per size, ``rewrite --check FILE``
  against LibCST's parse alone and parse + metadata of the same file, each a fresh
  subprocess, run one after the other (interleaved per size)."""
  sizes_mb = sizes_mb or ((0.02, 0.04) if quick else (0.5, 1, 2, 5))
  names = ('ours',) if quick else ('ours', 'parse', 'metadata')  # --quick: no floors
  usage = {n: [] for n in names}  # (wall, cpu, rss) per size
  out = []
  with tempfile.TemporaryDirectory(prefix='bench-codemod-large-') as tmp:
    tiny = pathlib.Path(tmp) / 'tiny.py'
    tiny.write_text(large_legacy_module(1))
    commands = {'ours': [sys.executable, '-m', 'codemod.cli', 'rewrite', '--check', '--no-cache'],
                'parse': [sys.executable, '-c', LARGE_FLOOR],
                'metadata': [sys.executable, '-c', LARGE_FLOOR]}
    extra = {'ours': [], 'parse': ['parse'], 'metadata': ['metadata']}
    base = {n: _run_usage([*commands[n], str(tiny), *extra[n]], tmp) for n in names}
    for k, mb in enumerate(sizes_mb):
      path = pathlib.Path(tmp) / f'legacy_{mb}mb.py'
      text = large_legacy_module(int(mb * 2**20))
      path.write_text(text)
      order = names[k % len(names):] + names[:k % len(names)]  # no contender always first
      got = {n: _run_usage([*commands[n], str(path), *extra[n]], tmp) for n in order}
      path.unlink()
      for n in names:
        usage[n].append(got[n][:3])
      nan = (float('nan'),) * 4
      (w, c, r, status), (pw, pc, pr, _), (mw, mc, mr, _) = (got.get(n, nan) for n in
                                                               ('ours', 'parse', 'metadata'))
      floors = ('LibCST floors: not run with --quick' if quick else
                f'LibCST floors on the same file: parse alone {pw:.1f} s wall / {pc:.1f} CPU s / '
                f'{pr:.0f} MiB; parse + scope, qualified-name and position metadata {mw:.1f} s / '
                f'{mc:.1f} CPU s / {mr:.0f} MiB; ours / (parse + metadata) CPU '
                f'{c / max(mc, 1e-9):.2f}')
      out.append((f'codemod_large_file_s[{mb}MB]', w,
                  f'seconds (wall), `optim-migrate rewrite --check --no-cache` on one generated '
                  f'legacy module of {len(text) / 2**20:.2f} MiB, {text.count(chr(10))} lines, '
                  f'fresh subprocess; {c:.1f} CPU s, peak RSS {r:.0f} MiB, exit status {status}. '
                  f'{floors}; load average {os.getloadavg()[0]:.1f}'))
      out.append((f'codemod_large_file_peak_rss_mib[{mb}MB]', r,
                  f'MiB, peak RSS of that run' + ('' if quick else
                  f'; LibCST parse alone {pr:.0f} MiB, parse + metadata {mr:.0f} MiB') +
                  f' (a fresh interpreter on a tiny file: ours {base["ours"][2]:.0f} MiB)'))
  sizes = ', '.join(map(str, sizes_mb))
  for n, label in (('ours', 'rewrite --check'), ('parse', 'LibCST parse alone'),
                   ('metadata', 'LibCST parse + metadata'))[:len(names)]:
    cpu = [max(c - base[n][1], 1e-3) for _, c, _ in usage[n]]
    rss = [max(r - base[n][2], 1.0) for _, _, r in usage[n]]
    suffix = '' if n == 'ours' else f'_{n}'
    out.append((f'codemod_large_file_time_growth{suffix}', _growth(sizes_mb, cpu),
                f'exponent b of {label} (CPU seconds - a tiny file\'s) ~ size**b over {sizes} MB '
                f'(1.0 = linear; CPU time, not wall, so that other load skews it less); CPU s per '
                'MB at each size: ' + ', '.join(f'{x / mb:.1f}' for x, mb in zip(cpu, sizes_mb))))
    out.append((f'codemod_large_file_memory_growth{suffix}', _growth(sizes_mb, rss),
                f'exponent b of {label} (peak RSS - a tiny file\'s) ~ size**b over {sizes} MB; '
                'MiB per MB at each size: ' + ', '.join(f'{x / mb:.0f}'
                                                      for x, mb in zip(rss, sizes_mb))))
  return out


#: The prefilter tokens counted on the real tree (``codemod_ecosystem_prefilter_files``).
PREFILTER_TOKENS = {
    'substring optim': lambda t: 'optim' in t,
    'flax.optim': lambda t: re.search(r'\bflax\s*\.\s*optim\b', t) is not None,
    'from flax import ... optim': lambda t: re.search(
        r'\bfrom\s+flax\s+import\s+(?:\([^)]*|(?:[^\n\\]|\\\n|\\)*)\boptim\b', t) is not None,
    'import flax.optim': lambda t: re.search(r'\bimport\s+flax\.optim\b', t) is not None,
    '.apply_gradient(': lambda t: '.apply_gradient(' in t,
    'words flax and optim (the old prefilter)': lambda t: (
        re.search(r'\bflax\b', t) is not None and re.search(r'\boptim\b', t) is not None),
}


def prefilter_counts(files) -> list[tuple[str, int]]:
  """How many of ``files`` each token of :data:`PREFILTER_TOKENS`, the flax.optim prefilter
  (``legacy_api.may_need_rewrite``), the OM2xx one and the whole per-file test pass."""
  from codemod import engine, legacy_api
  from codemod.modern import rewrite as om2xx
  texts = [f.read_bytes().decode('latin-1') for f in files]
  tests = dict(PREFILTER_TOKENS)
  tests['may_need_rewrite (flax.optim pass)'] = legacy_api.may_need_rewrite
  tests['OM2xx word groups'] = om2xx.may_apply
  tests['parsed at all (engine.wanted or a TODO)'] = lambda t: (engine.wanted(t)
                                                               or engine.has_todos(t))
  return [(name, sum(bool(test(t)) for t in texts)) for name, test in tests.items()]


def run_ecosystem(quick: bool) -> list[tuple[str, float, str]]:
  """The real-tree rows (issue 20): the ecosystem set (``bench/ecosystem_repos.toml``, from
  its cache, see ``bench/ecosystem.py``) merged into one tree. Per round, interleaved (the
  order alternates): ``rewrite --check TREE`` with an empty cache (cold), the same again on
  the unchanged tree (warm: every entry is there), LibCST's no-op codemod on the tree; then
  pre-commit on one changed file: a legacy file of one repository gets a new comment line
  and ``rewrite --check FILE`` runs from that repository's root (as the hook does), wall
  time from process start. No rows with ``--quick`` (minutes of work even on two
  repositories), nor when the ecosystem cache is absent (a line on stderr says so).
  ``BENCH_ECOSYSTEM_ROUNDS``: rounds (default 2)."""
  if quick:
    return []
  rounds = int(os.environ.get('BENCH_ECOSYSTEM_ROUNDS', '2'))
  with tempfile.TemporaryDirectory(prefix='bench-codemod-eco-') as tmp:
    tree = pathlib.Path(tmp) / 'tree'
    cmd = [sys.executable, str(ROOT / 'bench' / 'ecosystem.py'), '--merge-tree', str(tree)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      print(f'bench_codemod: no ecosystem rows: {proc.stderr.strip()[-500:]}', file=sys.stderr)
      return []
    from codemod import engine, runner
    files = runner.iter_python_files([str(tree)])
    counts = prefilter_counts(files)
    n_lines = sum(len(f.read_bytes().splitlines()) for f in files)
    legacy = [f for f in files if f.suffix == '.py' and engine.may_need_rewrite(f.read_text(
        encoding='utf-8', errors='replace'))]
    # the changed file: a legacy one in the repository with the most files
    by_repo = {}
    for f in files:
      by_repo.setdefault(f.relative_to(tree).parts[0], []).append(f)
    repo = max((r for r in by_repo if any(f in legacy for f in by_repo[r])),
               key=lambda r: len(by_repo[r]))
    changed = next(f for f in by_repo[repo] if f in legacy)
    texts = {f: f.read_bytes().decode('latin-1') for f in files if f.suffix == '.py'}
    wanted = [f for f, t in texts.items() if engine.wanted(t) or engine.has_todos(t)]
    floor_cpu = _parse_and_scope_cpu(wanted)
    plain = next(f for f in files if f.suffix == '.py' and f not in wanted)
    startup = _run_usage([sys.executable, '-m', 'codemod.cli', 'rewrite', '--check',
                          '--no-cache', str(plain)], tmp, ok=(0, 1, 2))[0]
    jobs = os.cpu_count() or 1
    floor = startup + floor_cpu / jobs
    ours = [sys.executable, '-m', 'codemod.cli', 'rewrite', '--check', str(tree)]
    noop = [sys.executable, '-m', 'libcst.tool', 'codemod', '--no-format', '--hide-progress',
            'noop.NOOPCommand', str(tree)]
    times = {'cold': [], 'warm': [], 'noop': [], 'precommit': []}
    cpu = {k: [] for k in times}
    saved = os.environ.get('OPTIM_MIGRATE_CACHE_DIR')
    try:
      for r in range(rounds):
        cache_dir = pathlib.Path(tmp) / f'cache{r}'
        os.environ['OPTIM_MIGRATE_CACHE_DIR'] = str(cache_dir)
        steps = [('cold', ours), ('warm', ours), ('noop', noop)]
        if r % 2:
          steps = [steps[2], *steps[:2]]
        for name, command in steps:
          wall, c, _, _ = _run_usage(command, tmp, ok=(0, 1, 2))
          times[name].append(wall)
          cpu[name].append(c)
        original = changed.read_bytes()
        changed.write_bytes(original + b'\n# a change\n')
        try:
          wall, c, _, _ = _run_usage([sys.executable, '-m', 'codemod.cli', 'rewrite', '--check',
                                      str(changed.relative_to(tree / repo))], tree / repo,
                                     ok=(0, 1, 2))
        finally:
          changed.write_bytes(original)
        times['precommit'].append(wall)
        cpu['precommit'].append(c)
    finally:
      if saved is None:
        os.environ.pop('OPTIM_MIGRATE_CACHE_DIR', None)
      else:
        os.environ['OPTIM_MIGRATE_CACHE_DIR'] = saved
  where = (f'the ecosystem set merged into one tree ({len(by_repo)} repositories, {len(files)} '
           f'files, {n_lines} lines, {len(legacy)} pass the flax.optim prefilter)')
  load = f'load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores'
  med = lambda k: statistics.median(times[k])
  cold, warm = ratios(times['cold'], times['noop']), ratios(times['warm'], times['noop'])
  out = [
      ('codemod_ecosystem_cold_vs_libcst_noop', summary(cold)[0],
       f'`rewrite --check TREE` with an empty cache / `libcst.tool codemod noop.NOOPCommand '
       f'TREE` wall time, {where}; {fmt_range(cold)} rounds; ours {med("cold"):.1f} s '
       f'({statistics.median(cpu["cold"]):.1f} CPU s), no-op {med("noop"):.1f} s '
       f'({statistics.median(cpu["noop"]):.1f} CPU s); goal <= 0.25; {load}'),
      ('codemod_ecosystem_warm_vs_libcst_noop', summary(warm)[0],
       f'the same, second run on the unchanged tree (every result from the cache) / the no-op '
       f'codemod; {fmt_range(warm)} rounds; ours {med("warm"):.2f} s '
       f'({statistics.median(cpu["warm"]):.2f} CPU s); goal <= 0.03; {load}'),
      ('codemod_ecosystem_precommit_one_file_s', med('precommit'),
       f'seconds, wall from process start: `rewrite --check {changed.relative_to(tree / repo)}` '
       f'from the root of {repo} ({len(by_repo[repo])} files; that file just changed, the '
       f'cache warm from the tree runs), as the pre-commit hook runs; '
       f'{fmt_range(times["precommit"])}; {statistics.median(cpu["precommit"]):.2f} CPU s; '
       f'goal <= 1.5 s; {load}'),
  ]
  out.append(('codemod_ecosystem_floor_vs_libcst_noop', floor / med('noop'),
               f'what this design cannot go below on the tree, over the no-op codemod\'s median '
               f'wall time: start-up {startup:.2f} s (a run on one file the prefilter skips) + '
               f'LibCST parse and scope analysis of the {len(wanted)} files the run parses, '
               f'{floor_cpu:.1f} CPU s / {jobs} cores = {floor:.1f} s; the cold goal (0.25) is '
               f'below it'))
  parsed = dict(counts)['may_need_rewrite (flax.optim pass)']
  out.append(('codemod_ecosystem_prefilter_files', float(parsed),
              f'files of the {len(files)} of the merged ecosystem tree that the flax.optim '
              'pass parses (legacy_api.may_need_rewrite); what each test passes: '
              + '; '.join(f'{name}: {n}' for name, n in counts)))
  return out


def _run_timed(cmd, cwd) -> tuple[float, float, int]:
  """``(seconds, peak RSS MiB, exit status)`` of one subprocess."""
  seconds, _, rss, status = _run_usage(cmd, cwd)
  return seconds, rss, status


def _run_usage(cmd, cwd, ok=(0, 1)) -> tuple[float, float, float, int]:
  """``(wall seconds, CPU seconds (user + system), peak RSS MiB, exit status)`` of one
  subprocess (``os.wait4``'s usage of that child).

  Raises:
    RuntimeError: the exit status is not in ``ok`` (its stderr's tail in the message).
  """
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  # stderr goes to a file, not a pipe: waiting on a child whose report fills a pipe's 64 KiB
  # buffer (a tree with many TODOs) would hang both
  with tempfile.TemporaryFile() as err:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err.seek(0)
    stderr = err.read().decode(errors='replace')
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode not in ok:
    raise RuntimeError(f'{" ".join(map(str, cmd))} failed ({proc.returncode}): {stderr[-2000:]}')
  return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


#: The parse floor: what any rewrite of this design pays on the tree before analysing
#: anything. A fresh interpreter walks the tree as ``rewrite`` does, applies the text
#: prefilter, and LibCST-parses the files that pass in a pool of one process per core.
PARSE_ONLY = '''
import concurrent.futures, os, pathlib, sys
import libcst
from codemod import engine, runner
def parse(path):
  libcst.parse_module(engine.read_source(pathlib.Path(path))[0])
if __name__ == '__main__':
  files = runner.iter_python_files(sys.argv[1:])
  todo = [str(f) for f in files if engine.wanted(f.read_bytes().decode('latin-1'))]
  with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 1) as pool:
    list(pool.map(parse, todo, chunksize=4))
'''


def _noop_one(source: str) -> str:
  import libcst as cst
  from libcst.codemod import CodemodContext
  from libcst.codemod.commands.noop import NOOPCommand
  return NOOPCommand(CodemodContext()).transform_module(cst.parse_module(source)).code


def _parse_and_metadata_cpu(paths) -> float:
  """CPU seconds to parse ``paths`` with LibCST and resolve the metadata the codemod's
  analysis needs (``codemod.names.METADATA``: scope and positions) on the part of each
  module it analyses (``codemod.facts.setaside``): the work no rewrite of this design can
  skip."""
  import libcst as cst
  from codemod.facts.setaside import reduce
  from codemod.names import METADATA
  sources = [p.read_text() for p in paths]
  t0 = time.process_time()
  for source in sources:
    reduced, _ = reduce(cst.parse_module(source))
    cst.MetadataWrapper(reduced, unsafe_skip_copy=True).resolve_many(METADATA)
  return time.process_time() - t0


def _parse_and_scope_cpu(paths) -> float:
  """CPU seconds to LibCST-parse ``paths`` and resolve ``ScopeProvider`` over each whole
  module, once: what each file the run parses costs before either pass (flax.optim,
  OM2xx) does anything of its own (each resolves scopes; a file both change pays twice)."""
  import libcst as cst
  from libcst.metadata import ScopeProvider
  sources = [p.read_bytes().decode('utf-8', errors='replace') for p in paths]
  t0 = time.process_time()
  for source in sources:
    try:
      module = cst.parse_module(source)
    except cst.ParserSyntaxError:
      continue
    cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
  return time.process_time() - t0


def run(quick: bool) -> list[tuple[str, float, str]]:
  from codemod import engine
  n_files, rounds = (20, 1) if quick else (1000, 2)
  n_traced = 0 if quick else 10
  out = []
  with tempfile.TemporaryDirectory(prefix='bench-codemod-') as tmp:
    tree = pathlib.Path(tmp) / 'tree'
    kinds = make_tree(tree, n_files)
    n_lines = sum(len(p.read_text().splitlines()) for ps in kinds.values() for p in ps)
    ours_cmd = [sys.executable, '-m', 'codemod.cli', 'rewrite', '--check', '--no-cache',
                str(tree)]
    noop_cmd = [sys.executable, '-m', 'libcst.tool', 'codemod', '--no-format',
                '--hide-progress', 'noop.NOOPCommand', str(tree)]
    parse_cmd = [sys.executable, '-c', PARSE_ONLY, str(tree)]
    ours_s, noop_s, parse_s, ours_rss = [], [], [], []
    for r in range(rounds):
      order = ('ours', 'noop', 'parse') if r % 2 == 0 else ('parse', 'noop', 'ours')
      for who in order:
        if who == 'ours':
          s, rss, status = _run_timed(ours_cmd, tmp)
          ours_s.append(s)
          ours_rss.append(rss)
        elif who == 'noop':
          noop_s.append(_run_timed(noop_cmd, tmp)[0])
        else:
          parse_s.append(_run_timed(parse_cmd, tmp)[0])
    rs = ratios(ours_s, noop_s)
    ps = ratios(parse_s, noop_s)
    passed = {k: sum(engine.may_need_rewrite(p.read_text()) for p in ps) for k, ps in kinds.items()}
    startup = _run_timed([sys.executable, '-m', 'codemod.cli', 'rewrite', '--check',
                          '--no-cache', str(kinds['plain'][0])], tmp)[0]
    floor_cpu = _parse_and_metadata_cpu(kinds['legacy'])
    jobs = os.cpu_count() or 1
    floor = startup + floor_cpu / jobs
    out.append(('codemod_vs_libcst_noop', summary(rs)[0],
                f'whole-tree `optim-migrate rewrite --check` / `libcst.tool codemod '
                f'noop.NOOPCommand` (-j {jobs}) wall time, subprocesses; {fmt_range(rs)} rounds; '
                f'{n_files} files ({len(kinds["legacy"])} flax.optim, {len(kinds["lookalike"])} '
                f'look-alikes), {n_lines} lines; ours {statistics.median(ours_s):.2f} s, '
                f'noop {statistics.median(noop_s):.2f} s; ours exit status {status}; prefilter '
                f'passed {passed["legacy"]}/{len(kinds["legacy"])} legacy, '
                f'{passed["lookalike"]}/{len(kinds["lookalike"])} look-alike, '
                f'{passed["plain"]}/{len(kinds["plain"])} plain files; floor: start-up '
                f'{startup:.2f} s + LibCST parse and analysis metadata of the legacy files '
                f'{floor_cpu:.2f} s CPU / {jobs} = {floor:.2f} s, ratio '
                f'{floor / statistics.median(noop_s):.3f}'))

    out.append(('codemod_parse_floor_vs_libcst_noop', summary(ps)[0],
                f'a fresh interpreter that walks the tree, applies the prefilter and only '
                f'LibCST-parses the {passed["legacy"] + passed["lookalike"]} files that pass '
                f'(one process per core) / the no-op codemod, interleaved with the rows above; '
                f'{fmt_range(ps)} rounds; {statistics.median(parse_s):.2f} s: what a LibCST '
                f'rewrite with this prefilter pays before any analysis'))

    legacy = kinds['legacy']
    t0 = time.perf_counter()
    results = [engine.rewrite_file(p) for p in legacy]
    seconds = time.perf_counter() - t0
    n_changed = sum(r.changed for r in results)
    n_err = sum(r.error is not None for r in results)
    legacy_lines = sum(len(p.read_text().splitlines()) for p in legacy)
    out.append(('codemod_legacy_files_per_s', len(legacy) / seconds,
                f'files/s, in-process engine.rewrite_file on the {len(legacy)} flax.optim files '
                f'({legacy_lines} lines, no writes), one pass of {seconds:.1f} s; {n_changed} '
                f'changed, {sum(len(r.manual) for r in results)} manual items, {n_err} errors'))

    # files are processed one at a time, so the traced peak is the largest file's;
    # a sample of the biggest parsed files bounds it (tracemalloc slows Python ~2x)
    parsed = sorted(kinds['legacy'] + kinds['lookalike'], key=lambda p: -p.stat().st_size)
    traced = 'not traced in --quick'
    if n_traced:
      tracemalloc.start()
      for p in parsed[:n_traced]:
        engine.rewrite_file(p)
      traced = f'{tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB'
      tracemalloc.stop()
    out.append(('codemod_peak_memory_mib', statistics.median(ours_rss),
                f'MiB, peak RSS of the whole-tree rewrite subprocess ({fmt_range(ours_rss, 1)}); '
                f'peak traced Python allocations in process while rewriting the {n_traced} largest '
                f'parsed files: {traced}'))

  if not quick:
    line = 'from flax import optim; ' + '; '.join(f'v{i} = {i}' for i in range(20000)) + '\n'
    t0 = time.perf_counter()
    res = engine.rewrite_source(line, 'one_line.py')
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    _noop_one(line)
    noop = time.perf_counter() - t0
    out.append(('codemod_one_line_20k_statements_s', ours,
                f'seconds, rewrite_source on one line of 20,000 statements (importing flax.optim); '
                f'in-process LibCST no-op on the same text {noop:.2f} s (ratio {ours / noop:.1f}); '
                f'error={res.error is not None}; known slow, single measurement'))
  if quick:
    out = [(n, v, d + '; --quick: 20-file tree, 1 round') for n, v, d in out]
  return out + run_large(quick) + run_ecosystem(quick)


if __name__ == '__main__':
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
