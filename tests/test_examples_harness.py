"""The pure logic of bench/examples.py (no TF, no example sources): patch selection, patch
logs, pytest JUnit parsing and the summary table."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))

from examples_harness import patches, results  # noqa: E402


def _bench_examples():
  """bench/examples.py, loaded by path: the name ``examples`` is also the project's own
  ``examples/`` package (the demo's programs), which a test process may import first."""
  import importlib.util
  name = 'bench_examples_under_test'
  if name not in sys.modules:
    path = pathlib.Path(__file__).resolve().parents[1] / 'bench' / 'examples.py'
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def test_after_allows_only_patches_no_om2xx_rule_can_remove():
  assert patches.allowed('after') == ['old_stack_checkpoints', 'optim_dynamic_scale', 'lstmcell', 'mask', 'hashable_arrays', 'tf_options_threading']
  assert patches.allowed('before-unpatched') == []
  every = patches.allowed('before')
  assert every == list(patches.PATCHES) and 'tree_multimap' in every
  assert patches.allowed('zero-edit') == every
  with pytest.raises(KeyError, match="unknown variant 'afterr'; known: before-unpatched, before"):
    patches.allowed('afterr')


def test_read_log_groups_events_and_names_bad_lines(tmp_path):
  log = tmp_path / 'p.jsonl'
  assert patches.read_log(log) == {}
  log.write_text('\n'.join(json.dumps(r) for r in [
      {'patch': 'mask', 'event': 'installed'}, {'patch': 'mask', 'event': 'used'},
      {'patch': 'tree_map', 'event': 'installed'}]) + '\n\n')
  assert patches.read_log(log) == {'mask': {'installed', 'used'}, 'tree_map': {'installed'}}
  log.write_text('{"patch": "mask", "event": "used"}\nnot json\n')
  with pytest.raises(ValueError, match=r'p\.jsonl:2: not a patch log record'):
    patches.read_log(log)
  log.write_text('{"patch": "nope", "event": "used"}\n')
  with pytest.raises(ValueError, match=r"p\.jsonl:1: unknown patch 'nope'"):
    patches.read_log(log)


def _junit_of(tmp_path, files):
  """Run a real pytest on ``files`` with the harness's JUnit options; return the parsed results."""
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  junit = tmp_path / 'junit.xml'
  subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                  '--continue-on-collection-errors', '-o',
                  'junit_family=xunit1', f'--junitxml={junit}', '.'], cwd=tmp_path,
                 capture_output=True, text=True, check=False)
  return results.parse_junit(junit)


def test_parse_junit_of_a_real_pytest_run(tmp_path):
  got = _junit_of(tmp_path, {
      'a_test.py': ('import unittest\n'
                    'class T(unittest.TestCase):\n'
                    '  def test_ok(self): pass\n'
                    '  def test_bad(self):\n'
                    '    raise AttributeError("TrainState has no attribute target")\n'),
      'b_test.py': 'import jax_that_is_not_there\n'})
  by = {t.name: t for t in got}
  assert by['a_test.py::T::test_ok'].outcome == 'passed'
  bad = by['a_test.py::T::test_bad']
  assert (bad.outcome, bad.first_line) == ('failed', 'AttributeError: TrainState has no attribute target')
  coll = [t for t in got if results.is_collection_error(t)]
  assert len(coll) == 1 and results.file_of(coll[0]) == 'b_test'
  assert coll[0].first_line == "ModuleNotFoundError: No module named 'jax_that_is_not_there'"


def test_parse_junit_names_a_bad_file(tmp_path):
  bad = tmp_path / 'junit.xml'
  bad.write_text('<testsuite><testcase')
  with pytest.raises(ValueError, match='junit.xml: not JUnit XML'):
    results.parse_junit(bad)


def _t(name, outcome='passed', first=''):
  return results.TestResult(name, outcome, first)


def test_table_counts_tests_of_a_module_that_failed_collection_from_another_variant():
  before = results.RunResult('pixelcnn', 'before', [
      _t('model_test.py::M::test_a'), _t('model_test.py::M::test_b'),
      _t('train_test.py::T::test_train', 'failed', 'AttributeError: x')])
  after = results.RunResult('pixelcnn', 'after', [
      _t('model_test', 'error', "AttributeError: module 'jax' has no attribute 'tree_map'"),
      _t('train_test.py::T::test_train')])
  never = results.RunResult('ppo', 'after', [_t('ppo_lib_test', 'error', 'ImportError: gym')])
  assert results.expected_counts([before, after, never]) == {'pixelcnn': 3, 'ppo': 1}
  text = results.table([before, after, never, results.RunResult('vae', 'after', [], status='no-tests')],
                       ['before', 'after'], ['pixelcnn', 'ppo', 'vae'])
  assert text.splitlines() == [
      '| example | before | after |', '|---|---|---|',
      '| pixelcnn | 2/3 | 1/3 |', '| ppo | not run | 0/1 |', '| vae | not run | 0/0 (no-tests) |']
  fails = results.failures([before, after])
  assert "- **pixelcnn / after**\n  - `model_test`: error: `AttributeError: module 'jax' has no attribute 'tree_map'`" in fails


def test_fix_flagged_applies_what_the_todo_says_to_the_code_line_under_it():
  from examples_harness import misses
  src = ('  # TODO(optim-migrate): OM100: if `optimizer` is a flax.optim Optimizer, `.state.step` is `.step` on a TrainState\n'
         '  step_offset = int(optimizer.state.step)\n'
         '    # TODO(optim-migrate): OM100: if `optimizer` is a flax.optim Optimizer, `.target` is `.params` on a TrainState\n'
         '    # another comment\n'
         '    aux, grad = grad_fn(optimizer.target)\n'
         '  params = state.optimizer.target\n'
         '  # TODO(optim-migrate): OM102: learning_rate at apply time ...\n'
         '  optimizer = optimizer.apply_gradient(grad, learning_rate=lr)\n')
  out, n = misses.fix_flagged(src)
  assert n == 2
  assert out.splitlines()[1] == '  step_offset = int(optimizer.step)'
  assert out.splitlines()[4] == '    aux, grad = grad_fn(optimizer.params)'
  assert out.splitlines()[5] == '  params = state.optimizer.target'      # no TODO above it: left alone
  assert out.splitlines()[7].endswith('apply_gradient(grad, learning_rate=lr)')
  lines = out.splitlines()
  assert misses.is_flagged(lines, 5) and misses.is_flagged(lines, 2)
  assert not misses.is_flagged(lines, 6, near=0) and misses.is_flagged(lines, 6, near=4)
  assert not misses.is_flagged(['x = 1'] * 10 + ['  # TODO(optim-migrate): a'] + ['y'] * 5, 16)


def test_same_numbers_compare_in_ulps_of_each_leafs_largest_magnitude():
  import numpy as np
  from examples_harness import same_numbers
  base = {'loss': np.array([2.0, 1.0]), 'params/a': np.array([1.0, 0.5], np.float32),
          'params/b': np.array([8.0], np.float32)}
  assert same_numbers.compare(dict(base), base)['bitwise']
  moved = dict(base, **{'params/b': np.array([8.0 + 3 * np.spacing(np.float32(8.0))], np.float32)})
  got = same_numbers.compare(moved, base)
  assert (got['params_ulp'], got['worst_leaf'], got['loss_ulp'], got['bitwise']) == (3.0, 'params/b', 0.0, False)
  assert got['first_diff_step'] is None
  curve = np.array([2.0, 1.5, 1.0, 0.75], np.float32)
  later = dict(base, loss=curve.copy(), **{'params/b': moved['params/b']})
  later['loss'][2] += 5 * np.spacing(np.float32(2.0))   # 5 ulp of the curve's largest magnitude, at step 3
  got = same_numbers.compare(later, dict(base, loss=curve))
  assert (got['first_diff_step'], got['loss_ulp'], got['loss_ulp_first10']) == (3, 5.0, 5.0)
  assert 'losses equal to step 2, 5 ulp over steps 1-10' in same_numbers._fmt(got)
  with pytest.raises(KeyError, match="'params/b' is in one run only"):
    same_numbers.compare({'loss': base['loss'], 'params/a': base['params/a']}, base)


def test_run_env_passes_the_split_size_through_and_drops_other_examples_variables(monkeypatch, tmp_path):
  examples = _bench_examples()
  monkeypatch.setenv('EXAMPLES_TFDS_SPLIT_SIZE', '1')
  monkeypatch.setenv('EXAMPLES_PATCHES', 'mask')          # the caller's own: must not leak into a run
  monkeypatch.setenv('PYTHONPATH', '/elsewhere')
  env = examples.run_env('after', tmp_path / 'log.jsonl')
  assert env['EXAMPLES_TFDS_SPLIT_SIZE'] == '1'
  assert env['EXAMPLES_PATCHES'] == ','.join(patches.allowed('after'))
  # a modern run imports this checkout's project ahead of what the venv has installed
  assert env['PYTHONPATH'].split(os.pathsep) == [str(examples.SITE), str(examples.REPO)]
  assert 'EXAMPLES_ZERO_EDIT' not in env
  old = examples.run_env('before', tmp_path / 'l', [])
  assert old['EXAMPLES_PATCHES'] == '' and old['PYTHONPATH'] == str(examples.SITE)


def test_a_modern_venv_built_from_another_checkout_is_reused_not_rebuilt(tmp_path, monkeypatch):
  """The cached modern venv had `-e /work/wt/<other checkout>` in its marker: ensure() compared
  the whole pin list and would rebuild (pip) it for every other checkout, and its runs measured
  the codemod of the checkout it was built from. Now the marker is compared without the
  editable project, and the runs put this checkout on the PYTHONPATH."""
  from examples_harness import stacks
  venv = tmp_path / 'modern'
  (venv / 'bin').mkdir(parents=True)
  (venv / 'bin' / 'python').write_text('')
  built_elsewhere = [*stacks.MODERN_EXTRAS, '-e', '/somewhere/else/flax-optim-migrate']
  (venv / 'examples-pins.json').write_text(json.dumps(built_elsewhere))

  def no_pip(*a, **k):
    raise AssertionError(f'ensure() ran {a[0]}')
  monkeypatch.setattr(stacks.subprocess, 'run', no_pip)
  assert stacks.ensure('modern', venv) == venv / 'bin' / 'python'
  assert stacks.marker_pins(built_elsewhere) == list(stacks.MODERN_EXTRAS)
  assert stacks.project_path('modern') == [str(stacks.REPO)] and stacks.project_path('old') == []
  (venv / 'examples-pins.json').write_text(json.dumps([*stacks.MODERN_EXTRAS[:-1], '-e', '/x']))
  with pytest.raises(AssertionError, match='ensure\\(\\) ran'):   # a different pin list still rebuilds
    stacks.ensure('modern', venv, log=lambda m: None)


def test_provenance_groups_cells_by_when_they_were_measured():
  a = results.RunResult('mnist', 'after', [], measured='2026-12-03 01:00, codemod at abc1234', seconds=61.4)
  b = results.RunResult('wmt', 'after', [], measured='2026-12-03 01:00, codemod at abc1234')
  old = results.RunResult('ppo', 'before', [])
  assert results.provenance([old, a, b]).splitlines() == [
      '- not recorded (an earlier session): ppo / before',
      '- 2026-12-03 01:00, codemod at abc1234: mnist / after (61 s), wmt / after']


def test_classify_blames_the_named_line_when_the_exception_is_raised_outside_the_example(tmp_path):
  from examples_harness import misses
  (tmp_path / 'linen_examples' / 'ppo').mkdir(parents=True)
  (tmp_path / 'linen_examples' / 'ppo' / 'models.py').write_text(
      'def create_optimizer(params, learning_rate):\n'
      '  optimizer_def = optax.adam(learning_rate=learning_rate)\n')
  rec = {'phase': 'p', 'ok': False, 'error': "KeyError: no 'learning_rate'", 'frames': [],
         'blame': 'ppo/models.py:2', 'blame_text': 'optimizer_def = optax.adam(learning_rate=learning_rate)'}
  got = misses.classify([rec, {'phase': 'q', 'ok': True}], tmp_path)
  assert (got[0]['where'], got[0]['flagged'], got[0]['kept_legacy']) == ('ppo/models.py:2', False, False)
  assert got[0]['text'].startswith('optimizer_def = optax.adam(') and 'where' not in got[1]
  section = '\n'.join(misses.markdown({('ppo', 'misses-after-fixed'): got}, ['ppo'], 0, ['misses-after-fixed'],
                                      {'misses-after-fixed': '1'}))
  assert "- `ppo/models.py:2` `optimizer_def = optax.adam(" in section
  assert 'misses-after-fixed: 1 (1: an epoch ends' in section


def test_restored_legacy_checkpoint_comparison_counts_the_state_leaves_it_finds():
  import numpy as np
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench' / 'examples_harness'))
  import drivers
  w, m, v = np.arange(3.0), np.full(3, 0.25), np.full(3, 0.5)
  legacy = {'target': {'dense': {'w': w}},
            'state': {'step': 7, 'param_states': {'dense': {'w': {'grad_ema': m, 'grad_sq_ema': v}}}}}
  take = lambda c: c['state']['param_states']   # noqa: E731
  same = {'params': {'dense': {'w': w.copy()}}, 'step': 7, 'opt_state': ({'mu': m.copy(), 'nu': v.copy()}, ()),
          'legacy_param_states': take}
  params_of, step_of = drivers.LEGACY_LAYOUT['wmt']
  assert drivers._compare_restored(same, legacy, params_of, step_of) == {
      'params': 'equal', 'step': 'restored 7, checkpoint 7',
      'optimizer_state': '2 of 2 legacy per-parameter state leaves found in the restored state'}
  fresh = dict(same, params={'dense': {'w': w + 1}}, step=0, opt_state=({'mu': 0 * m, 'nu': v.copy()}, ()))
  assert drivers._compare_restored(fresh, legacy, params_of, step_of) == {
      'params': '1 of 1 leaves differ', 'step': 'restored 0, checkpoint 7',
      'optimizer_state': '1 of 2 legacy per-parameter state leaves found in the restored state'}


def test_same_numbers_reruns_only_the_named_runs_and_keeps_the_others_outputs(tmp_path, monkeypatch):
  """--same-runs migrated: the legacy tree (its outputs, the initial params) is not rebuilt, the
  migrated run trains from the legacy initial params, and the table compares it with the kept
  legacy output; an unknown run name is refused."""
  import numpy as np
  from examples_harness import same_numbers
  runs = tmp_path / 'runs'
  legacy = {'loss': np.array([2.0, 1.0], np.float32), 'params/w': np.array([1.0, 2.0], np.float32)}
  (runs / 'same-legacy').mkdir(parents=True)
  np.savez(runs / 'same-legacy' / 'mnist-3.npz', **legacy)
  np.savez(runs / 'same-mnist-init.npz', w=np.zeros(2))
  prepared, trained = [], []

  def prepare_tree(variant, src, runs_dir, pythons, name):
    prepared.append((name, variant))
    import shutil
    shutil.rmtree(runs_dir / name, ignore_errors=True)     # as examples.prepare_tree does
    (runs_dir / name / 'linen_examples' / 'mnist').mkdir(parents=True)
    return runs_dir / name

  real_run = subprocess.run

  def fake_run(cmd, **kw):
    if cmd[0] == 'git':
      return real_run(cmd, **kw)
    ex, steps, params, res = cmd[cmd.index(str(pathlib.Path(same_numbers.__file__).parent / 'trainer.py')) + 1:][:4]
    trained.append((ex, pathlib.Path(params).name, pathlib.Path(res).parent.name))
    np.savez(res, loss=legacy['loss'], **{'params/w': legacy['params/w'] + np.float32(1)})
    return subprocess.CompletedProcess(cmd, 0, '', '')
  monkeypatch.setattr(same_numbers.subprocess, 'run', fake_run)
  lines = same_numbers.run(3, None, runs, {'old': 'py-old', 'modern': 'py-new'},
                           lambda variant, log: {}, prepare_tree, lambda m: None, examples=['mnist'],
                           only=['migrated'])
  assert prepared == [('same-migrated', 'after')]
  # a rebuilt tree keeps the outputs of the examples not trained in this invocation
  np.savez(runs / 'same-migrated' / 'seq2seq-3.npz', **legacy)
  same_numbers.run(3, None, runs, {'old': 'py-old', 'modern': 'py-new'}, lambda variant, log: {},
                   prepare_tree, lambda m: None, examples=['mnist'], only=['migrated'])
  assert (runs / 'same-migrated' / 'seq2seq-3.npz').exists()
  assert (runs / 'same-migrated' / 'mnist-3.npz').exists()
  trained[:] = trained[:1]
  assert trained == [('mnist', 'same-mnist-init.npz', 'same-migrated')]
  assert (runs / 'same-legacy' / 'mnist-3.npz').exists() and (runs / 'same-mnist-init.npz').exists()
  row = next(ln for ln in lines if ln.startswith('| mnist |'))
  assert row.startswith('| mnist | 1 (step 1: 2) | loss 0 ulp') and 'params 4.19e+06 ulp' in row
  assert row.endswith('| not run | not run |'), row
  stamp = next(ln for ln in lines if ln.startswith('- mnist / migrated: '))
  assert ' load ' in stamp and '(1 / 15 min), codemod at ' in stamp, stamp
  assert not any(ln.startswith('- mnist / legacy: ') for ln in lines)   # kept output, no stamp left
  with pytest.raises(SystemExit, match="--same-runs: unknown run 'migratd'"):
    same_numbers.run(3, None, runs, {}, None, prepare_tree, None, examples=['mnist'], only=['migratd'])


def test_misses_report_lists_when_each_driver_ran(tmp_path):
  from examples_harness import misses
  res = tmp_path / 'misses-after-fixed' / 'results'
  res.mkdir(parents=True)
  (res / 'mnist.json').write_text(json.dumps([{'phase': 'train_and_evaluate', 'ok': True}]))
  (res / 'mnist.measured').write_text('2026-12-02 02:10, load 9.1 / 8.0 (1 / 15 min), codemod at abc1234\n')
  (res / 'wmt.json').write_text(json.dumps([{'phase': 'p', 'ok': True}]))   # an earlier run: no stamp
  lines = misses.report(['mnist', 'wmt'], tmp_path)
  assert '| mnist | train_and_evaluate | ok |' in lines
  i = lines.index('### When each driver ran')
  assert lines[i + 2:i + 4] == ['- mnist / misses-after-fixed: 2026-12-02 02:10, load 9.1 / 8.0 (1 / 15 min), '
                                'codemod at abc1234', '']


def test_write_results_keeps_the_hand_written_notes_block():
  examples = _bench_examples()
  text = ('# title\n\nheader\n\n' + examples.NOTES_BEGIN + '\n## Why each AFTER failure\n- a\n'
          + examples.NOTES_END + '\n\n## Tests per example\n')
  assert examples.kept_notes(text) == examples.NOTES_BEGIN + '\n## Why each AFTER failure\n- a\n' + examples.NOTES_END
  assert examples.kept_notes('# no notes\n') == ''
  with pytest.raises(ValueError, match='has no'):
    examples.kept_notes(examples.NOTES_BEGIN + '\nunfinished')


def test_misses_reuse_keeps_an_existing_tree_and_the_other_examples_results(tmp_path, monkeypatch):
  from examples_harness import misses
  tree = tmp_path / 'misses-after-fixed'
  (tree / 'linen_examples' / 'mnist').mkdir(parents=True)
  (tree / 'results').mkdir()
  (tree / 'results' / 'seq2seq.json').write_text(json.dumps([{'phase': 'p', 'ok': True}]))
  ran = []
  monkeypatch.setattr(misses, '_driver', lambda ex, tree, py, env, legacy=None: ran.append(ex) or
                      [{'phase': 'train', 'ok': True}])

  def no_prepare(*a, **k):
    raise AssertionError('prepare_tree called')
  misses.run(['mnist'], None, tmp_path, {'modern': 'py'}, lambda v, log: {}, no_prepare, lambda m: None,
             trees=['misses-after-fixed'], reuse=True)
  assert ran == ['mnist'] and (tree / 'results' / 'seq2seq.json').exists()
  assert '| seq2seq | p | ok |' in misses.report(['mnist', 'seq2seq'], tmp_path)
  with pytest.raises(AssertionError, match='prepare_tree called'):
    misses.run(['mnist'], None, tmp_path, {'modern': 'py'}, lambda v, log: {}, no_prepare, lambda m: None,
               trees=['misses-after-fixed'], reuse=False)


def test_a_stamp_names_the_codemod_the_tree_was_rewritten_with(tmp_path):
  from examples_harness import stacks
  assert 'codemod at ' + stacks.codemod_at() in stacks.measured(tmp_path)
  (tmp_path / 'codemod-at').write_text('abc1234 (modified)\n')
  (tmp_path / 'tfds-split-size').write_text('1')
  got = stacks.measured(tmp_path)
  assert got.endswith(', codemod at abc1234 (modified), tfds splits of 1') and ' load ' in got, got
