"""The rule catalog, the README tables generated from it, and rule isolation."""
import pathlib

import pytest

from codemod import engine, runner
from codemod.rules import RULES, Options, tables
from codemod_helpers import kept_lines

ROOT = pathlib.Path(__file__).resolve().parents[1]
CATALOG = [r for r in RULES.values() if r.kind in ('fix', 'manual')]



def _options(rule) -> Options:
  raw = dict(rule.options)
  for key in ('select', 'ignore'):
    if key in raw:
      raw[key] = tuple(raw[key])
  return Options(**raw)


@pytest.mark.parametrize('rule', [r for r in CATALOG if r.before], ids=lambda r: r.id)
def test_each_catalog_example_is_what_the_codemod_does(rule):
  """The example's `before`, rewritten, is its `after`, and the rule is reported (a catalog
  example that drifted from the code fails here)."""
  result = engine.rewrite_source(rule.before, f'{rule.id}.py', _options(rule))
  assert result.error is None
  assert result.new == rule.after
  assert rule.id in {f.rule for f in result.findings}
  assert engine.rewrite_source(result.new, 'again.py', _options(rule)).new == result.new


def test_every_rule_has_summary_why_and_family_and_most_have_an_example():
  for rule in CATALOG:
    assert rule.summary and rule.why and rule.family, rule.id
    assert pathlib.Path(ROOT / rule.module).exists(), rule.id
  # every rule with a single-module example has one; the cross-module and notebook ones
  # are shown by their fixtures (tests/fixtures/flow, tests/fixtures/notebooks)
  assert sorted(r.id for r in CATALOG if not r.before) == [
      'OM100', 'OM107', 'OM123', 'OM124', 'OM125']


def test_rule_tables_are_generated_from_the_catalog():
  """`python -m codemod.rules.tables` writes docs/codemod.md's tables; a catalog change
  without it fails here."""
  text = (ROOT / 'docs' / 'codemod.md').read_text(encoding='utf-8')
  assert tables.render(text) == text, 'run: python -m codemod.rules.tables'
  for rule in CATALOG:
    assert f'| `{rule.id}` | {rule.safety} |' in text, rule.id
  assert tables.main(['--check']) == 0
  drifted = text.replace('| `OM117` | manual |', '| `OM117` | safe |')
  assert tables.render(drifted) == text  # the generator puts it back


def test_a_page_without_the_markers_is_refused():
  with pytest.raises(ValueError, match='rule-table:fix'):
    tables.render('# Codemod\n')


def test_the_old_catch_all_id_still_selects_and_reports_earlier_todos():
  """OM100 TODOs written by earlier versions are still reported until deleted, and OM1 still
  selects every manual rule."""
  source = 'x = 1\n# TODO(optim-migrate): OM100: something an earlier version said\ny = 2\n'
  result = engine.rewrite_source(source, 'old.py')
  assert [(f.rule, f.fixed) for f in result.manual] == [('OM100', False)]
  assert engine.rewrite_source(source, 'old.py', Options(ignore=('OM1',))).manual == []
  assert all(Options(select=('OM1',)).enabled(i) for i in RULES if i.startswith('OM1'))


def test_blocking_findings_say_so_in_their_fields():
  """The keep-legacy decision reads `blocks`; the message ends with the note people read."""
  kept = engine.rewrite_source(RULES['OM118'].before, 'k.py')
  assert [(f.rule, f.blocks) for f in kept.manual] == [('OM118', True)]
  assert kept.manual[0].message.endswith('(this file keeps its legacy optimizer code)')
  assert not kept.manual[0].reason.endswith(')')
  converted = engine.rewrite_source(RULES['OM117'].before, 'c.py')
  assert [(f.rule, f.blocks) for f in converted.manual] == [('OM117', False)]
  assert converted.manual[0].reason is None and 'TrainState.create' in converted.new


def test_ignoring_a_blocking_rule_still_keeps_the_file_legacy():
  """Found while splitting OM100: with `--ignore OM1` a file whose blocking item was found
  after a conversion (a method used as a value) was converted (a half-migrated file that
  crashes); the item now leaves the output, and the file keeps its legacy code."""
  source = ('import jax\nfrom flax import optim\n'
            'opt = optim.GradientDescent(learning_rate=0.1).create(params)\n'
            'step = jax.jit(opt.apply_gradient)\nopt = step(params)\nprint(opt.target)\n')
  for options in (Options(), Options(ignore=('OM1',)), Options(ignore=('OM116',))):
    result = engine.rewrite_source(source, 'm.py', options)
    assert kept_lines(result.new) == source, options
    assert [f.rule for f in result.findings if f.fixed] == ['OM014'], options


def _failing(*a, **k):
  raise ZeroDivisionError('a bug in the rule')


@pytest.mark.parametrize('family, function, where', [
    ('attributes', 'apply_rename', '6:10'),     # a fix: `opt.target`
    ('methods', 'method_problem', None),         # a check the verdict asks every file
    ('defs', 'apply_def', '5:9'),                # the def's rewrite
])
def test_a_failing_rule_is_named_with_its_site_and_the_file_left_as_it_is(
    monkeypatch, tmp_path, family, function, where):
  """Issue 15, item 3: a crash in one rule family reports the file with the family and
  where (file:line:col), writes nothing to it, and the other files are rewritten."""
  import importlib
  module = importlib.import_module(f'codemod.rules.{family}')
  monkeypatch.setattr(module, function, _failing)
  source = ('from flax import optim\n\n\ndef params_of(params):\n'
            '  opt = optim.GradientDescent(learning_rate=0.1).create(params)\n'
            '  return opt.target\n')
  if function == 'method_problem':
    source = source.replace('.create(params)', '.create(params).replicate()')
  result = engine.rewrite_source(source, 'broken.py')
  assert result.new is None and result.findings == []
  assert result.error.startswith('broken.py:' + (where or ''))
  assert f'rule family {family} failed: ZeroDivisionError: a bug in the rule' in result.error
  assert result.error.endswith('; file left as is')
  broken, other = tmp_path / 'broken.py', tmp_path / 'other.py'
  broken.write_text(source)
  other.write_text(RULES['OM006'].before)
  results = runner.run_files([broken, other], Options(), 1)
  assert results[0].error and not results[0].changed
  assert results[1].error is None and results[1].new == RULES['OM006'].after
  assert broken.read_text() == source
