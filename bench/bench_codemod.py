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
"""
from __future__ import annotations

import os
import pathlib
import random
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


def _run_timed(cmd, cwd) -> tuple[float, float, int]:
  """``(seconds, peak RSS MiB, exit status)`` of one subprocess."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  _, status, usage = os.wait4(proc.pid, 0)
  seconds = time.perf_counter() - t0
  stderr = proc.stderr.read().decode(errors='replace')
  proc.stderr.close()
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode not in (0, 1):
    raise RuntimeError(f'{" ".join(map(str, cmd))} failed ({proc.returncode}): {stderr[-2000:]}')
  return seconds, usage.ru_maxrss / 1024, proc.returncode


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
  analysis needs (scope, qualified names, positions) on the part of each module it
  analyses (``codemod.facts.setaside``): the work no rewrite of this design can skip."""
  import libcst as cst
  from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider
  from codemod.facts.setaside import reduce
  sources = [p.read_text() for p in paths]
  t0 = time.process_time()
  for source in sources:
    reduced, _ = reduce(cst.parse_module(source))
    wrapper = cst.MetadataWrapper(reduced, unsafe_skip_copy=True)
    wrapper.resolve_many((ScopeProvider, QualifiedNameProvider, PositionProvider))
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
    ours_cmd = [sys.executable, '-m', 'codemod.cli', 'rewrite', '--check', str(tree)]
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
                          str(kinds['plain'][0])], tmp)[0]
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
  return out


if __name__ == '__main__':
  for name, value, details in run('--quick' in sys.argv):
    print(f'{name}: {value:.4g} ({details})')
