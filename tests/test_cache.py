"""The ``rewrite`` result cache (codemod.cache): same output as ``--no-cache``, invalidated by
what a result depends on, and never fatal."""
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys

import pytest

from codemod import cache as cache_lib, cli, engine, runner
from codemod.rules import Options

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / 'tests' / 'fixtures' / 'codemod'
FLOW = ROOT / 'tests' / 'fixtures' / 'flow' / 'converted' / 'before'
#: A fixture subset (every 4th: a cold run of all 73 takes a minute on a loaded machine).
CASES = sorted(FIXTURES.iterdir())[::4]


def _tree(root: pathlib.Path) -> pathlib.Path:
  for case in CASES:
    shutil.copy(case / 'before.py', root / f'{case.name}.py')
  shutil.copytree(FLOW, root / 'flow')
  return root


def _rewrite(capsys, *args) -> tuple:
  """``(exit status, stdout, stderr, report rows)`` of ``rewrite --check`` in process."""
  report = pathlib.Path.cwd() / 'report.json'  # each test runs in its tmp_path
  status = cli.main(['rewrite', '--check', '--diff', '--jobs', '1', '--report', str(report),
                     *args])
  out = capsys.readouterr()
  return status, out.out, out.err, json.loads(report.read_text())


def _count_rewrites(monkeypatch) -> list:
  calls = []
  real = engine.rewrite_file

  def counted(path, *a, **k):
    calls.append(pathlib.Path(path).name)
    return real(path, *a, **k)
  monkeypatch.setattr(engine, 'rewrite_file', counted)
  return calls


def _entries(kind: str = 'result') -> list[pathlib.Path]:
  """The cache's entries: file results, or (``kind='scan'``) the pre-pass's scans."""
  return sorted(p for p in pathlib.Path(os.environ['OPTIM_MIGRATE_CACHE_DIR']).rglob('*')
                if p.is_file() and p.parent.name != 'v1' and len(p.name) == 64
                and (p.parent.parent.name == 'scan') == (kind == 'scan'))


def _count_scans(monkeypatch) -> list:
  """The files the cross-module pre-pass plans (``codemod.flow._scan_file``), by name."""
  from codemod import flow
  calls = []
  real = flow._scan_file

  def counted(source, *a, **k):
    calls.append(source.path.name)
    return real(source, *a, **k)
  monkeypatch.setattr(flow, '_scan_file', counted)
  return calls


def test_cached_runs_give_the_no_cache_output_and_findings(tmp_path, capsys, monkeypatch):
  tree = _tree(tmp_path)
  monkeypatch.chdir(tmp_path)
  uncached = _rewrite(capsys, '--no-cache', '.')
  assert _entries() == []  # --no-cache writes nothing
  calls = _count_rewrites(monkeypatch)
  scans = _count_scans(monkeypatch)
  cold = _rewrite(capsys, '.')
  n_parsed, n_scanned = len(calls), len(scans)
  warm = _rewrite(capsys, '.')
  assert uncached[0] == 1 and uncached[1].count('would rewrite') >= 10
  assert cold == uncached and warm == uncached
  assert n_parsed >= 15 and len(calls) == n_parsed  # the warm run rewrote no file
  # nor did its pre-pass plan one: each scan was stored (once per flow it was planned with)
  assert n_scanned >= 5 and len(scans) == n_scanned
  assert n_scanned >= len(_entries('scan')) >= len({*scans})
  assert len(_entries()) == n_parsed
  assert not [p for p in tree.rglob('.*.tmp')] and not list(_entries()[0].parent.glob('.*'))


def test_a_content_change_an_option_change_and_a_tool_change_miss(tmp_path, capsys, monkeypatch):
  legacy = tmp_path / 'train.py'
  legacy.write_text('from flax import optim\n\n\ndef make(p):\n'
                    '  return optim.Adam(learning_rate=0.1).create(p)\n')
  monkeypatch.chdir(tmp_path)
  calls = _count_rewrites(monkeypatch)
  first = _rewrite(capsys, 'train.py')
  _rewrite(capsys, 'train.py')
  assert len(calls) == 1 and 'optax.adam(learning_rate=0.1,' in first[1]
  # content
  legacy.write_text(legacy.read_text().replace('0.1', '0.2'))
  second = _rewrite(capsys, 'train.py')
  assert len(calls) == 2 and 'optax.adam(learning_rate=0.2,' in second[1]
  # an option
  ignored = _rewrite(capsys, '--ignore', 'OM001', 'train.py')
  assert len(calls) == 3 and ignored != second
  assert _rewrite(capsys, '--ignore', 'OM001', 'train.py') == ignored and len(calls) == 3
  # the tool: another version, or an edited source file of it
  monkeypatch.setattr(cache_lib, 'tool_fingerprint', lambda: 'another version')
  assert _rewrite(capsys, 'train.py') == second and len(calls) == 4


def test_the_fingerprint_follows_the_version_and_the_tools_files(monkeypatch, tmp_path):
  from importlib import metadata
  before = cache_lib.tool_fingerprint()
  assert cache_lib.tool_fingerprint() == before
  real = metadata.version
  monkeypatch.setattr(metadata, 'version',
                      lambda name: '9.9' if name == 'flax-optim-migrate' else real(name))
  assert cache_lib.tool_fingerprint() != before
  monkeypatch.undo()
  spec = ROOT / 'optim_compat' / 'spec.py'
  st = spec.stat()
  try:
    os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert cache_lib.tool_fingerprint() != before
  finally:
    os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert cache_lib.tool_fingerprint() == before


FACTORY = ('from flax import optim\n\n\ndef create_optimizer(params, lr):\n'
           '  return optim.{}(learning_rate=lr).create(params)\n')
USER = ('import jax\nfrom pkg.opt import create_optimizer\n\n\ndef train(params, grads):\n'
        '  opt = create_optimizer(params, 0.1)\n  opt = opt.apply_gradient(grads)\n'
        '  return opt.target\n')


def test_a_changed_imported_factory_module_invalidates_its_importer(tmp_path, capsys,
                                                                   monkeypatch):
  """The importer's bytes are the same; what it gets from the factory's module (converted or
  kept legacy) changed, so its entry misses and its result follows."""
  (tmp_path / 'pkg').mkdir()
  (tmp_path / 'pkg' / '__init__.py').write_text('')
  (tmp_path / 'pkg' / 'opt.py').write_text(FACTORY.format('Adam'))
  (tmp_path / 'train.py').write_text(USER)
  monkeypatch.chdir(tmp_path)
  calls = _count_rewrites(monkeypatch)
  converted = _rewrite(capsys, '.')
  assert converted == _rewrite(capsys, '.') and sorted(calls) == ['opt.py', 'train.py']
  assert '+  return opt.params' in converted[1]
  # a factory the codemod keeps legacy: the importer stays legacy too
  # (state surgery the codemod cannot convert: OM116 keeps that file legacy)
  (tmp_path / 'pkg' / 'opt.py').write_text(
      FACTORY.format('Adam').replace('  return optim.Adam(learning_rate=lr).create(params)\n',
                                     '  opt = optim.Adam(learning_rate=lr).create(params)\n'
                                     '  return opt.restore_state(opt.state_dict())\n'))
  calls.clear()
  scans = _count_scans(monkeypatch)
  changed = _rewrite(capsys, '.')
  assert sorted(calls) == ['opt.py', 'train.py'] and 'opt.py' in scans  # (its scan missed)
  assert changed == _rewrite(capsys, '--no-cache', '.')
  assert changed != converted


def test_a_changed_container_module_invalidates_a_reader_that_names_no_class(tmp_path, capsys,
                                                                           monkeypatch):
  """helper.py names neither the container's class nor its module; it only reads
  `state.optimizer.target` and is flagged with the class the field is named like (OM122:
  "which this run makes a TrainState" / "which keeps its legacy optimizer code"). When the
  container's module changes from converted to kept legacy, the reader's entry misses."""
  container = ('import flax\nfrom flax import optim\n\n\n@flax.struct.dataclass\nclass State:\n'
               '  optimizer: optim.Optimizer\n\n\ndef make(p):\n'
               '  opt = optim.Momentum(0.1).create(p)\n  return State(optimizer={})\n')
  (tmp_path / 'train.py').write_text(container.format('opt'))
  (tmp_path / 'helper.py').write_text('def get_params(state):\n  return state.optimizer.target\n')
  monkeypatch.chdir(tmp_path)
  calls = _count_rewrites(monkeypatch)
  first = _rewrite(capsys, '.')
  assert 'which this run makes a TrainState' in first[2], first[2]
  (tmp_path / 'train.py').write_text(container.format('opt.restore_state(opt.state_dict())'))
  calls.clear()
  second = _rewrite(capsys, '.')
  assert sorted(calls) == ['helper.py', 'train.py']
  assert second == _rewrite(capsys, '--no-cache', '.')
  assert 'which this run makes a TrainState' not in second[2], second[2]


def test_a_corrupt_or_foreign_entry_is_a_miss_not_an_error(tmp_path, capsys, monkeypatch):
  (tmp_path / 'train.py').write_text(USER.replace('from pkg.opt import create_optimizer',
                                                  'from flax import optim') .replace(
      'create_optimizer(params, 0.1)', 'optim.Adam(0.1).create(params)'))
  monkeypatch.chdir(tmp_path)
  good = _rewrite(capsys, 'train.py')
  [entry] = _entries()
  marker = tmp_path / 'executed'

  class Evil:
    def __reduce__(self):
      return (pathlib.Path.touch, (marker,))
  for blob in (b'', b'not a pickle', entry.read_bytes()[:20],
               pickle.dumps((entry.name, Evil())), pickle.dumps(('another key', None))):
    entry.write_bytes(blob)
    assert _rewrite(capsys, 'train.py') == good
    assert not marker.exists()
  assert _rewrite(capsys, 'train.py') == good  # rewritten whole after the last miss


def test_an_unwritable_cache_directory_is_skipped(tmp_path, capsys, monkeypatch):
  (tmp_path / 'train.py').write_text('from flax import optim\nopt = optim.Adam(0.1).create(p)\n')
  blocker = tmp_path / 'file'
  blocker.write_text('')
  monkeypatch.setenv('OPTIM_MIGRATE_CACHE_DIR', str(blocker / 'cache'))  # under a file
  monkeypatch.chdir(tmp_path)
  status, out, err, _ = _rewrite(capsys, 'train.py')
  assert status == 1 and 'would rewrite train.py' in out and 'Traceback' not in err


def test_parallel_runs_share_the_cache(tmp_path):
  """Two CLI processes over the same tree at once: each prints the --no-cache output, and
  the entries left are whole (no temporary file)."""
  tree = tmp_path / 'tree'
  tree.mkdir()
  for case in CASES[:6]:
    shutil.copy(case / 'before.py', tree / f'{case.name}.py')
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}
  cmd = [sys.executable, '-m', 'codemod.cli', 'rewrite', '--check', '--jobs', '1', 'tree']
  want = subprocess.run([*cmd, '--no-cache'], capture_output=True, text=True, cwd=tmp_path,
                        env=env)
  procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env) for _ in range(2)]
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    assert (proc.returncode, out, err) == (want.returncode, want.stdout, want.stderr)
  cache_dir = pathlib.Path(os.environ['OPTIM_MIGRATE_CACHE_DIR'])
  assert not list(cache_dir.rglob('.*.tmp')) and len(_entries()) >= 4
  assert (cache_dir / '.gitignore').read_text().endswith('*\n')


def test_prefilter_verdicts_replace_the_word_scan_on_a_warm_run(tmp_path, capsys, monkeypatch):
  """A warm run takes each file's prefilter verdict from the cache (by its bytes' hash)
  instead of scanning it for the prefilters' words; a changed file is scanned again; a
  corrupt verdicts file is ignored (and rewritten). Output identical each time."""
  from codemod import prefilter
  tree = _tree(tmp_path)
  (tree / 'plain.py').write_text('import os\nprint(os.sep)\n')  # fails every prefilter
  monkeypatch.chdir(tmp_path)
  first = _rewrite(capsys, '.')
  stored = list(pathlib.Path(os.environ['OPTIM_MIGRATE_CACHE_DIR']).rglob('prefilter-*.json'))
  assert len(stored) == 1
  verdicts = json.loads(stored[0].read_text())
  # (one per distinct content; a file that names a flow factory is passed without one)
  assert 20 < len(verdicts) <= len(list(tree.rglob('*.py'))) and False in verdicts.values()
  scanned = []
  real = prefilter.wanted
  monkeypatch.setattr(prefilter, 'wanted', lambda text, flow=None: scanned.append(text) or real(
      text, flow))
  assert _rewrite(capsys, '.') == first and scanned == []
  (tree / 'plain.py').write_text('import os\nprint(os.sep)  # edited\n')
  assert _rewrite(capsys, '.') == first and scanned == ['import os\nprint(os.sep)  # edited\n']
  stored[0].write_text('{not json')
  scanned.clear()
  assert _rewrite(capsys, '.') == first and len(scanned) >= len(verdicts)
  assert len(json.loads(stored[0].read_text())) == len(verdicts)
