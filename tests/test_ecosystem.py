"""bench/ecosystem.py: the classification of legacy files after a run, and the harness.

Hand-written before/after pairs pin each outcome; one end-to-end run of ``main`` over a
synthetic three-file repository in a temporary cache runs the real codemod twice.
"""
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))
import ecosystem as eco  # noqa: E402

BEFORE = '''\
from flax import optim


def train(params, grads, state):
  opt = optim.Adam(learning_rate=1e-3).create(params)
  opt = opt.apply_gradient(grads)
  return opt.target, state.optimizer.target
'''

CONVERTED = '''\
import optax
from flax.training import train_state


def train(params, grads, state):
  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3))
  opt = opt.apply_gradients(grads=grads)
  return opt.params, state.optimizer.params
'''


def outcome(after, before=BEFORE, error=None, rows=(), path='m.py'):
  return eco.classify(pathlib.Path(path), before, after, error, list(rows))


def test_converted_file_without_todo_or_residual():
  res = outcome(CONVERTED)
  assert (res.outcome, res.todos, res.residual) == ('converted', 0, [])


def test_converted_file_with_a_todo():
  after = CONVERTED.replace(
      '  return opt.params', '  # TODO(optim-migrate): OM100: check this\n  return opt.params')
  res = outcome(after)
  assert (res.outcome, res.todos, res.residual) == ('converted_todo', 1, [])


def test_struct_field_target_left_unflagged_is_a_residual():
  after = CONVERTED.replace('state.optimizer.params', 'state.optimizer.target')
  res = outcome(after)
  assert res.outcome == 'residual'
  assert res.residual == [['8', 'target', 'return opt.params, state.optimizer.target']]


def test_todo_above_a_multiline_statement_flags_its_later_lines():
  after = CONVERTED.replace(
      '  return opt.params, state.optimizer.params',
      '  # TODO(optim-migrate): OM100: `state.optimizer` may be a flax.optim Optimizer\n'
      '  # (second comment line)\n'
      '  return (opt.params,\n'
      '          state.optimizer.target)')
  assert outcome(after).outcome == 'converted_todo'


def test_todo_too_far_above_does_not_flag():
  after = CONVERTED.replace(
      '  return opt.params, state.optimizer.params',
      '  # TODO(optim-migrate): OM100: about something else\n  a = 1\n  b = 2\n  c = 3\n'
      '  d = 4\n  return opt.params, state.optimizer.target')
  res = outcome(after)
  assert res.outcome == 'residual' and [r[1] for r in res.residual] == ['target']


@pytest.mark.parametrize('line, kind', [
    ('  x = opt.apply_gradient(grads)', 'apply_gradient'),
    ('  x = state.optimizer.state.step', 'state.step'),
    ('  x = opt_state.param_states', 'param_states'),
    ('  x = state.optimizer.optimizer_def', 'optimizer_def'),
    ('  x = optim.Momentum(0.1)', 'optim.Momentum'),
    ('  x = optimizer_def.create(params)', 'def.create'),
    ('  x = opt.replicate()', 'replicate'),
    # l2p's libml/utils.py: a TrainState's replace has no `target` (it fails there)
    ('  x = state.optimizer.replace(target=params)', 'replace(target=)'),
])
def test_each_legacy_reference_kind(line, kind):
  after = CONVERTED.replace('  return opt.params', f'{line}\n  return opt.params')
  res = outcome(after)
  assert res.outcome == 'residual', res
  assert [r[1] for r in res.residual] == [kind]


def test_non_optimizer_target_is_not_a_reference():
  after = CONVERTED.replace('  return opt.params', '  y = batch.target + options.target\n'
                            '  return opt.params')
  assert outcome(after).outcome == 'converted'


def test_file_still_importing_flax_optim_is_kept():
  kept = BEFORE.replace('  opt = opt.apply', '  # TODO(optim-migrate): OM103: state surgery '
                        '(this file keeps its legacy optimizer code)\n  opt = opt.apply')
  rows = [{'rule': 'OM103', 'applied': False,
           'message': 'state surgery (this file keeps its legacy optimizer code)'},
          {'rule': 'OM001', 'applied': True, 'message': 'fixed'}]
  res = outcome(kept, rows=rows)
  assert (res.outcome, res.todos) == ('kept', 1)
  assert res.blocking == [['OM103', 'state surgery (this file keeps its legacy optimizer code)']]
  assert outcome(BEFORE).outcome == 'kept_silent'  # untouched, no TODO at all


def test_file_kept_legacy_behind_the_shim_fallback_runs():
  """A kept file with the codemod's OM014 lines runs on flax >= 0.6 (counted runnable);
  the same file without them does not."""
  kept = BEFORE.replace('  opt = opt.apply', '  # TODO(optim-migrate): OM103: state surgery '
                        '(this file keeps its legacy optimizer code)\n  opt = opt.apply')
  first = next(i for i, line in enumerate(kept.splitlines(keepends=True))
               if 'flax' in line and 'import' in line)
  lines = kept.splitlines(keepends=True)
  fallback = ''.join(lines[:first] + ['import optim_compat\n', 'optim_compat.install()  # '
                     'optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n']
                     + lines[first:])
  assert outcome(fallback).outcome == 'fallback'
  assert outcome(kept).outcome == 'kept'
  assert 'fallback' in eco.RUNNABLE and 'kept' not in eco.RUNNABLE
  assert 'residual' not in eco.RUNNABLE  # an unflagged legacy reference is not proof it runs


def test_shim_and_to_optax():
  shim = 'import optim_compat\n\n\nclass D(optim_compat.OptimizerDef):\n  pass\n'
  assert outcome(shim, before='from flax.optim import OptimizerDef\n\n\n'
                 'class D(OptimizerDef):\n  pass\n').outcome == 'shim'
  assert outcome('import optim_compat as optim\nx = optim.Adam(1e-3)\n').outcome == 'shim'
  wrapped = CONVERTED.replace('tx=optax.adam(1e-3)',
                              'tx=optim_compat.to_optax(optim_compat.WeightNorm(beta=0.9))')
  wrapped = 'import optim_compat\n' + wrapped
  assert outcome(wrapped).outcome == 'converted'  # a def wrapped for TrainState is converted
  viewed = wrapped + ('\nleaves = jax.tree_util.tree_leaves(optim_compat.legacy_state('
                      'opt, optim_compat.Adam(1e-3)).param_states)\n')
  assert outcome(viewed).outcome == 'converted'  # the legacy view's layout def (OM017) too
  logged = wrapped + ('\nlogged = optim_compat.legacy_state_dict(opt, optim_compat.Adam())\n')
  assert outcome(logged).outcome == 'converted'  # (its state_dict form)
  outside = wrapped + '\nlayout = optim_compat.Adam(1e-3)\n'
  assert outcome(outside).outcome == 'shim'  # (the same def outside that call)


def test_crash_and_unparsed_input():
  res = outcome(BEFORE, error='m.py: codemod failed: CSTValidationError: bad comment')
  assert (res.outcome, res.error) == ('crash', 'm.py: codemod failed: CSTValidationError: '
                                                'bad comment')
  py2 = 'from flax import optim\nprint "hi"\n'
  assert eco.is_legacy(pathlib.Path('m.py'), py2)
  assert outcome(py2, before=py2, error='m.py:2:7: cannot parse').outcome == 'unparsed_input'


@pytest.mark.parametrize('text, legacy', [
    ('import torch\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n', False),
    ('def f(batch):\n  return batch.target\n', False),
    ('def f(state):\n  return state.optimizer.target\n', True),
    ('def f(opt, g):\n  return opt.apply_gradient(g)\n', True),
    # the user's own `Model.apply_gradient(loss_fn)`: an Optimizer takes gradients, not a function
    ('def f(model, b):\n  def loss_fn(p):\n    return p * b\n  return model.apply_gradient(loss_fn)\n',
     False),
    ('def f(m):\n  return m.temp.apply_gradient(lambda t: t * 2)\n', False),
    ('def f(m, loss_fn):\n  return m.apply_gradient(loss_fn)\n', True),
    ('import flax.optim as fo\n', True),
    ('import flax\nx = flax.optim.Adam(1e-3)\n', True),
    ('# from flax import optim\ns = "opt.apply_gradient(g)"\n', False),
])
def test_is_legacy(text, legacy):
  assert eco.is_legacy(pathlib.Path('m.py'), text) is legacy


def _notebook(cells):
  return json.dumps({'cells': [{'cell_type': t, 'source': s, 'metadata': {}} for t, s in cells],
                     'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5})


def test_notebook_cells_masked_and_classified():
  before = _notebook([('markdown', '# title'),
                      ('code', '%matplotlib inline\n!pip install flax\nfrom flax import optim'),
                      ('code', '%%bash\necho from flax import optim'),
                      ('code', 'opt = optim.Adam(1e-3).create(p)\nx = opt.target')])
  units = eco.code_units(pathlib.Path('n.ipynb'), before)
  assert [c for c, _ in units] == [1, 3]
  assert units[0][1] == 'pass\npass\nfrom flax import optim'
  after = _notebook([('markdown', '# title'),
                     ('code', '%matplotlib inline\n!pip install flax\nimport optax'),
                     ('code', '%%bash\necho from flax import optim'),
                     ('code', 'opt = make(p)\nx = opt.target')])
  res = outcome(after, before=before, path='n.ipynb')
  assert res.outcome == 'residual' and res.residual == [['cell3:2', 'target', 'x = opt.target']]


def _table(tmp_path, body):
  path = tmp_path / 'repos.toml'
  path.write_text(body)
  return path


def test_table_errors_name_the_row(tmp_path):
  ok = '[[repo]]\nrepo = "a/b"\ncommit = "%s"\nlegacy_files = 1\nwhy = "w"\n' % ('0' * 40)
  assert eco.load_table(_table(tmp_path, ok)) == [eco.Repo('a/b', '0' * 40, 1, 'w')]
  with pytest.raises(eco.EcosystemError, match=r'#1 \(a/b\): commit .*40 hex'):
    eco.load_table(_table(tmp_path, ok.replace('0' * 40, 'abc')))
  with pytest.raises(eco.EcosystemError, match=r'#2: a/b is listed twice'):
    eco.load_table(_table(tmp_path, ok + ok))
  with pytest.raises(eco.EcosystemError, match=r"#1: missing \['why'\]"):
    eco.load_table(_table(tmp_path, ok.replace('why = "w"\n', '')))
  repos = eco.load_table(_table(tmp_path, ok))
  assert eco.select(repos, 'b') == repos
  with pytest.raises(eco.EcosystemError, match="'c' names no repository .*a/b"):
    eco.select(repos, 'b,c')


def test_source_folder_must_hold_the_pinned_commit(tmp_path):
  repo = eco.Repo('o/n', '1' * 40, 0, '')
  with pytest.raises(eco.EcosystemError, match='no source tree .*o\\+n'):
    eco.source_of(repo, tmp_path / 'cache')
  (tmp_path / 'cache' / 'o+n').mkdir(parents=True)
  (tmp_path / 'cache' / 'o+n' / eco.COMMIT_FILE).write_text('2' * 40 + '\n')
  with pytest.raises(eco.EcosystemError, match=f'holds commit {"2" * 40}, the table pins'):
    eco.source_of(repo, tmp_path / 'cache')
  (tmp_path / 'local' / 'o+n').mkdir(parents=True)  # --source first; records no commit
  assert eco.source_of(repo, tmp_path / 'cache', tmp_path / 'local') == tmp_path / 'local' / 'o+n'


def test_diff_runs_and_results_markers(tmp_path):
  old = {'a/b': {'commit': 'c' * 40, 'second_run_changed': ['x.py'],
                 'files': {'x.py': {'outcome': 'kept', 'residual': []},
                           'y.py': {'outcome': 'residual', 'residual': [['1', 'target', 't']]}}},
         'gone/repo': {'commit': 'd' * 40, 'files': {}}}
  new = {'a/b': {'commit': 'c' * 40, 'second_run_changed': [],
                 'files': {'x.py': {'outcome': 'converted', 'residual': []},
                           'y.py': {'outcome': 'residual', 'residual': []}}}}
  assert eco.diff_runs(old, new) == ['a/b:x.py: kept -> converted',
                                     'a/b:y.py: residual 1 -> 0 site(s)',
                                     'a/b:x.py: now idempotent', 'gone/repo: not in this run']
  md = tmp_path / 'r.md'
  md.write_text(f'# head\n\n{eco.BEGIN}\nold\n{eco.END}\n\n## causes\nkept\n')
  eco.write_results(md, 'new table\n')
  assert md.read_text() == f'# head\n\n{eco.BEGIN}\nnew table\n{eco.END}\n\n## causes\nkept\n'


TOY = {
    'train.py': '''\
from flax import optim


def make(params):
  return optim.Adam(learning_rate=1e-3).create(params)


def step(opt, grads):
  return opt.apply_gradient(grads)
''',
    'surgery.py': '''\
import jax
from flax import optim


def run(params, grads):
  opt = optim.Momentum(learning_rate=0.1, beta=0.9).create(params)
  opt = opt.apply_gradient(grads)
  states = opt.state.param_states  # (bound to a name, then mutated: no legacy view)
  states['w'] = jax.tree_util.tree_map(lambda m: 0 * m, states['w'])
  return opt.target
''',
    'plain.py': 'import torch\n\n\ndef fit(m):\n  return torch.optim.SGD(m.parameters(), lr=0.1)\n',
}


def test_main_end_to_end(tmp_path, capsys):
  commit = 'a' * 40
  table = _table(tmp_path, f'[[repo]]\nrepo = "toy/proj"\ncommit = "{commit}"\n'
                           'legacy_files = 2\nwhy = "synthetic"\n')
  tree = tmp_path / 'cache' / 'toy+proj'
  tree.mkdir(parents=True)
  for name, text in TOY.items():
    (tree / name).write_text(text)
  (tree / eco.COMMIT_FILE).write_text(commit + '\n')
  record = tmp_path / 'last.json'
  record.write_text(json.dumps({'repos': {'toy/proj': {
      'commit': commit, 'files': {'train.py': {'outcome': 'kept', 'residual': []},
                                  'surgery.py': {'outcome': 'kept', 'residual': []}}}}}))
  md = tmp_path / 'results.md'
  status = eco.main(['--table', str(table), '--cache', str(tmp_path / 'cache'), '--json',
                     str(record), '--diff', '--results', str(md), '--jobs', '1', '--strict'])
  out = capsys.readouterr().out
  assert status == 1  # --strict: surgery.py keeps its legacy code (not 80% converted)
  assert 'toy/proj:train.py: kept -> converted' in out
  assert 'toy/proj:surgery.py: kept -> fallback' in out  # kept legacy, now on the shim
  files = json.loads(record.read_text())['repos']['toy/proj']['files']
  assert {k: v['outcome'] for k, v in files.items()} == {'train.py': 'converted',
                                                         'surgery.py': 'fallback'}
  assert files['surgery.py']['blocking'][0][0] == 'OM103'
  entry = json.loads(record.read_text())['repos']['toy/proj']
  assert (entry['files_changed'], entry['second_run_changed']) == (2, [])
  assert entry['python_files'] == 3 and entry['exit'] == [1, 1]
  total = [l for l in md.read_text().splitlines() if l.startswith('| **total (1)**')]
  assert total and total[0].split(' | ')[1:9] == ['2', '1', '0', '0', '0', '1', '0', '0']
  assert (tree / 'train.py').read_text() == TOY['train.py']  # the cache is never written


def test_create_on_a_def_factory_result_is_legacy():
  text = 'import losses\n\n\ndef init(config, p):\n  return losses.get_optimizer(config).create(p)\n'
  assert eco.is_legacy(pathlib.Path('run_lib.py'), text)
  modern = 'from flax.training import train_state\n\n\ndef init(tx, p):\n' \
           '  return train_state.TrainState.create(apply_fn=None, params=p, tx=tx)\n'
  assert not eco.is_legacy(pathlib.Path('run_lib.py'), modern)


def test_merge_tree_copies_sources_without_markers(tmp_path):
  table = _table(tmp_path, ''.join(
      f'[[repo]]\nrepo = "o/{n}"\ncommit = "{c * 40}"\nlegacy_files = 0\nwhy = ""\n'
      for n, c in (('a', 'a'), ('b', 'b'))))
  for n, c in (('a', 'a'), ('b', 'b')):
    (tmp_path / 'cache' / f'o+{n}' / 'pkg').mkdir(parents=True)
    (tmp_path / 'cache' / f'o+{n}' / 'pkg' / 'm.py').write_text(f'X = {n!r}\n')
    (tmp_path / 'cache' / f'o+{n}' / eco.COMMIT_FILE).write_text(c * 40)
  out = tmp_path / 'merged'
  args = ['--table', str(table), '--cache', str(tmp_path / 'cache'), '--merge-tree', str(out)]
  assert eco.main(args + ['--repos', 'a']) == 0
  assert sorted(p.relative_to(out).as_posix() for p in out.rglob('*') if p.is_file()) == \
      ['o+a/pkg/m.py']
  assert eco.main(args) == 2  # o+a is there already: refused, nothing copied
  assert not (out / 'o+b').exists()


def test_import_probe_statuses_and_counts(tmp_path):
  """``--import-probe``'s per-module status (here both "stacks" are this interpreter), and the
  counts: a module importing on the old stack only is a regression, listed in the details."""
  (tmp_path / 'pkg').mkdir()
  (tmp_path / 'pkg' / '__init__.py').write_text('')
  (tmp_path / 'pkg' / 'good.py').write_text('import json\nX = json.dumps(1)\n')
  (tmp_path / 'pkg' / 'needs.py').write_text('import no_such_dependency_xyz\n')
  (tmp_path / 'pkg' / 'broken.py').write_text('from json import no_such_name\n')
  (tmp_path / 'pkg' / 'uses_sibling.py').write_text('from pkg import good\nY = good.X\n')
  status = {n: eco.import_status(sys.executable, tmp_path, f'pkg/{n}.py')
            for n in ('good', 'needs', 'broken', 'uses_sibling')}
  assert status['good'] == 'ok' and status['uses_sibling'] == 'ok'
  assert status['needs'] == 'missing no_such_dependency_xyz'
  assert status['broken'].startswith("error ImportError: cannot import name 'no_such_name'")
  files = {f'pkg/{n}.py': eco.FileOutcome(f'pkg/{n}.py', 'converted').as_json()
           for n in ('good', 'needs', 'broken')}
  # the "original" tree: broken.py imports there, so its rewrite is a regression
  original = tmp_path / 'original'
  (original / 'pkg').mkdir(parents=True)
  for name in ('__init__', 'good', 'needs'):
    (original / 'pkg' / f'{name}.py').write_text((tmp_path / 'pkg' / f'{name}.py').read_text())
  (original / 'pkg' / 'broken.py').write_text('from json import dumps\n')
  eco.probe_imports(files, original, tmp_path, sys.executable, 2)
  assert files['pkg/broken.py']['imports'][0] == 'ok'
  entry = {'files': files, 'files_changed': 3, 'seconds': [1.0]}
  assert eco.tally(entry)['imports'] == {'probed': 3, 'old_ok': 2, 'new_ok': 1,
                                         'both_missing': 1, 'regressed': 1, 'fixed': 0}
  assert '`r:pkg/broken.py` imports on the old stack, not rewritten on the modern one: error ' \
      'ImportError' in eco.details({'r': entry})
  rendered = eco.render({'r': {**entry, 'commit': 'c' * 40}}, {})
  assert '| as rewritten, on the modern stack | 1 |' in rendered


def test_users_of_a_repositorys_own_optimizer_api_are_no_legacy_files(tmp_path):
  """t5x keeps a copy of flax.optim's Optimizer API in t5x/optimizers.py: a file importing it
  and never naming flax.optim (`self.hyper_params`, `.param_states` of its own classes) is no
  legacy file when the row names the module; the copy itself, importing flax.optim, is."""
  user = ('from t5x import optimizers\n\n\nclass Adafactor(optimizers.OptimizerDef):\n'
          '  def f(self):\n    return self.hyper_params.factored\n')
  fork = 'from flax import optim\n\n\nclass OptimizerDef:\n  hyper_params = None\n'
  mixed = 'from flax import optim\nfrom t5x import optimizers\nx = optimizers.sgd(0.1)\n' \
      'y = opt.param_states\n'
  path = tmp_path / 'a.py'
  assert eco.is_legacy(path, user) and not eco.is_legacy(path, user, ('t5x.optimizers',))
  assert eco.is_legacy(path, fork, ('t5x.optimizers',))
  assert eco.is_legacy(path, mixed, ('t5x.optimizers',))
  assert eco.is_legacy(path, user.replace('from t5x import optimizers',
                                          'import t5x.optimizers as optimizers'))
  assert not eco.is_legacy(path, user.replace('from t5x import optimizers',
                                              'import t5x.optimizers as optimizers'),
                           ('t5x.optimizers',))
  table = tmp_path / 't.toml'
  table.write_text('[[repo]]\nrepo = "a/b"\ncommit = "' + 'a' * 40 + '"\nlegacy_files = 1\n'
                   'why = "x"\nown_api = ["t5x.optimizers"]\n')
  assert eco.load_table(table)[0].own_api == ('t5x.optimizers',)
  table.write_text(table.read_text().replace('["t5x.optimizers"]', '"t5x.optimizers"'))
  with pytest.raises(eco.EcosystemError, match='own_api must be a list of module names'):
    eco.load_table(table)


def test_the_independent_table_loads_and_shares_no_repository_with_the_ecosystem_set():
  """bench/independent_repos.toml (the independent check: repositories kept out of the set
  the rules were written against) parses as the ecosystem table does, and no repository is in
  both."""
  independent = eco.load_table(ROOT / 'bench' / 'independent_repos.toml')
  assert len(independent) == 13
  assert all(r.legacy_files > 0 for r in independent)
  assert not {r.repo for r in independent} & {r.repo for r in eco.load_table()}
