"""The docs site (docs/): it builds with warnings as errors, every rule id and every table
optimizer gets a page, and ``optim-migrate rule <id>`` prints exactly its page's text."""
import contextlib
import dataclasses
import io
import pathlib
import re
import subprocess
import sys

import pytest

from codemod import cli, rule_docs
from codemod.rules import RULES
from optim_compat import spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
sys.path.insert(0, str(DOCS))
from _gen import optimizers as gen_optimizers  # noqa: E402
from _gen import rules as gen_rules  # noqa: E402
from _gen import write as gen_write  # noqa: E402

#: The README's command, with the output and the doctrees outside the tree.
BUILD = [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html']


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  out = tmp_path_factory.mktemp('html')
  proc = subprocess.run([*BUILD, '-d', str(out / '.doctrees'), str(DOCS), str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f'docs build failed:\n{proc.stdout}\n{proc.stderr}'
  assert 'WARNING' not in proc.stderr, proc.stderr
  return out


def run_cli(argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    status = cli.main(argv)
  return status, out.getvalue(), err.getvalue()


def test_every_rule_id_has_a_page(site):
  missing = [i for i in RULES if not (site / 'rules' / f'{i}.html').is_file()]
  assert not missing, f'rule ids without a docs page: {missing}'
  index = (site / 'rules' / 'index.html').read_text()
  assert all(f'{i}.html' in index for i in RULES)
  assert 'unsafe' in (site / 'rules' / 'OM009.html').read_text()


def test_every_table_optimizer_has_a_page(site):
  missing = [n for n in spec.SPECS if not (site / 'optimizers' / f'{n.lower()}.html').is_file()]
  assert not missing, f'optimizers without a docs page: {missing}'
  for name, entry in spec.SPECS.items():
    page = (DOCS / 'optimizers' / f'{name.lower()}.md').read_text()
    assert entry.emit({'learning_rate': 'lr'}) in page, name
    for sentence in gen_optimizers.sentences(entry.differences):
      assert gen_optimizers.md(sentence) in page, (name, sentence)
    for h in entry.hyper_params:
      assert f'| `{h.name}` | `{h.default!r}` |' in page, (name, h.name)


def test_optimizer_pages_state_the_measured_figures(site):
  adam = (DOCS / 'optimizers' / 'adam.md').read_text()
  assert '≤ 6 ulp' in adam and '≤ 17 ulp' in adam and 'adam_bf16_default_beta2' in adam
  assert 'optax.adamw(learning_rate=lr' in adam  # the weight-decay form, found by the generator
  adagrad = (DOCS / 'optimizers' / 'adagrad.md').read_text()
  assert gen_optimizers.md(spec.STOCK_ALTERNATIVES['Adagrad'].measured) in adagrad
  assert 'optax.adagrad(learning_rate=lr, initial_accumulator_value=0.0' in adagrad
  sgd = (DOCS / 'optimizers' / 'gradientdescent.md').read_text()
  assert 'None needed: the codemod already emits stock Optax.' in sgd
  assert '**bitwise**' in sgd


def test_rule_command_prints_the_page_text(site):
  for rule_id in RULES:
    status, out, _ = run_cli(['rule', rule_id.lower()])
    assert status == 0, rule_id
    assert out == (DOCS / 'rules' / f'{rule_id}.md').read_text() + '\n', rule_id


def test_rule_command_from_the_installed_entry_point():
  proc = subprocess.run([sys.executable, '-m', 'codemod.cli', 'rule', 'OM009'], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith('# OM009\n\n**unsafe**')
  assert '--unsafe-fixes' in proc.stdout


def test_rule_command_unknown_id_exits_2():
  status, out, err = run_cli(['rule', 'OM999'])
  assert status == 2 and out == ''
  assert err == ("rule: unknown rule id 'OM999'; did you mean OM209, OM119 or OM109? "
                 '`optim-migrate rule` lists every rule\n'), err  # (not all 65 ids: helper-32)


def test_rule_command_lists_every_rule():
  status, out, _ = run_cli(['rule'])
  assert status == 0
  assert [line.split()[0] for line in out.splitlines()] == list(RULES)
  status, out, _ = run_cli(['rule', '--all'])
  assert status == 0
  assert [m for m in re.findall(r'^# (OM\d+)$', out, re.M)] == list(RULES)


def test_fixture_example_shows_the_sites_of_the_rule():
  ex = rule_docs.fixture_example('OM007')
  assert ex.source == 'tests/fixtures/codemod/om007_annotations'
  assert 'def step(opt: optim.Optimizer, grads)' in ex.before
  assert 'def step(opt: train_state.TrainState, grads)' in ex.after
  # no fixture named after OM010: taken from one whose findings report it
  ex = rule_docs.fixture_example('OM010')
  assert '.unreplicate()' in ex.before and 'jax_utils.unreplicate(' in ex.after
  # options.json of the fixture are named
  assert rule_docs.fixture_example('OM009').options == '--unsafe-fixes'


def test_excerpt_never_cuts_a_string_literal():
  lines = ['"""A docstring', 'over lines."""', 'x = 1', 'y = """a', 'b"""', 'z = 2']
  assert rule_docs._trim(lines, 1, 6) == lines[2:]  # starts after the docstring
  assert rule_docs._trim(lines, 2, 4) == ['x = 1']  # stops before the open string
  assert rule_docs._trim(lines, 0, 3) == lines[:3]


@dataclasses.dataclass(frozen=True)
class RicherRule:
  """A rule table row with the fields another part of the project is adding."""
  id: str
  safety: str
  summary: str
  why: str = ''
  example: tuple = ()
  fix: str = ''


def test_rule_text_uses_the_table_fields_when_present(monkeypatch, tmp_path):
  monkeypatch.setitem(RULES, 'OM177', RicherRule(
      'OM177', 'manual', 'a made-up rule', why='Because legacy did X.',
      example=('old_call(x)\n', 'new_call(x)\n'), fix='Call new_call.'))
  text = rule_docs.rule_text('om177', fixtures=tmp_path)
  assert text.startswith('# OM177\n\n**manual** · flax.optim uses flagged for a human (OM1xx)')
  assert '## Why\n\nBecause legacy did X.' in text
  assert 'From the rule catalog:' in text
  assert '```python\nold_call(x)\n```' in text and '```python\nnew_call(x)\n```' in text
  assert '## How to fix by hand\n\nCall new_call.' in text
  # and the generator gives the new id a page, as it does every id of the table
  gen_rules.generate(tmp_path)
  assert (tmp_path / 'rules' / 'OM177.md').read_text() == text
  assert '[OM177](OM177.md)' in (tmp_path / 'rules' / 'index.md').read_text()


def test_rule_text_without_fields_or_fixture_falls_back(monkeypatch, tmp_path):
  monkeypatch.setitem(RULES, 'OM299', RicherRule('OM299', 'safe', 'a made-up fix'))
  text = rule_docs.rule_text('OM299', fixtures=tmp_path)
  assert '## Example' not in text and '## Why' not in text
  assert 'removed JAX / Flax APIs (OM2xx)' in text
  assert rule_docs.FIX_FALLBACK['safe'] in text


def test_generated_pages_drop_what_the_table_no_longer_has(tmp_path):
  folder = tmp_path / 'rules'
  gen_write.sync(folder, {'OM001.md': 'a', 'OM002.md': 'b'})
  assert gen_write.sync(folder, {'OM001.md': 'a'}) == []  # unchanged: not rewritten
  assert sorted(p.name for p in folder.glob('*.md')) == ['OM001.md']


def test_optimizer_generator_covers_every_spec(tmp_path):
  gen_optimizers.generate(tmp_path)
  pages = {p.stem for p in (tmp_path / 'optimizers').glob('*.md')}
  assert pages == {n.lower() for n in spec.SPECS} | {'index'}


def test_config_page_names_every_key():
  from codemod import runner
  from equivalence_tests import cli as check_cli
  page = (DOCS / 'config.md').read_text()
  for key in sorted(runner.CONFIG_KEYS) + sorted(check_cli.ENTRY_KEYS):
    assert f'| `{key}` |' in page, f'config key {key} is not documented in docs/config.md'


def test_cli_page_names_every_command():
  from _gen import cli as gen_cli
  page = (DOCS / 'cli.md').read_text()
  for name in gen_cli.commands():
    assert f'| `{name}' in page, f'command {name} is not in docs/cli.md'
