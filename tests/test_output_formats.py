"""``rewrite --output-format full|concise|json|github|sarif``, ``--statistics``,
``--show-fixes`` (codemod/output_formats.py) on the codemod's fixtures, and ``check
--output-format``.

Every format is checked against the ``--report`` file the same run writes: the json output
is that file's text, concise has one line per report row with the row's fields, github one
workflow command per row (strict syntax; levels from the row's safety and applied flag),
SARIF validates against the official SARIF 2.1.0 schema (tests/schemas/, see SOURCE.md
there) and has one result per finding row, and the statistics count the report's rules.
"""
import collections
import contextlib
import io
import json
import os
import pathlib
import re

import jsonschema
import pytest

from codemod import cli, output_formats
from codemod.output_formats import Entry
from codemod.rules import RULES

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / 'tests' / 'fixtures'
SCHEMA = json.loads((ROOT / 'tests' / 'schemas' / 'sarif-schema-2.1.0.json').read_text())
#: Every fixture tree the codemod's tests use (before/after pairs, notebooks, cross-module).
ALL = ['tests/fixtures/codemod', 'tests/fixtures/notebooks', 'tests/fixtures/flow']
#: A small set with every kind of entry: safe fixes applied, an unsafe fix left undone
#: (OM009), blocking manual items (OM100), notebooks (a blocked one), TODOs of earlier runs.
SOME = ['tests/fixtures/codemod/om007_annotations/before.py',
        'tests/fixtures/codemod/om009_replicate_needs_unsafe/before.py',
        'tests/fixtures/codemod/om100_module_as_value/before.py',
        'tests/fixtures/codemod/om013_checkpoint_unconvertible/before.py',
        'tests/fixtures/notebooks', 'tests/fixtures/flow/flagged/after/kept_caller.py']

CONCISE = re.compile(r'^(?P<where>.+?):(?P<line>\d+):(?P<col>\d+): (?P<rule>OM\d{3}) '
                     r'\[(?P<kind>fixed|safe|unsafe|manual)\] (?P<message>.+)$')
#: A workflow command (docs.github.com, "Workflow commands for GitHub Actions"): property
#: values with `%`, CR, LF, `:` and `,` escaped, the message with `%`, CR, LF escaped.
_PROP = r'(?:[^,:%\r\n]|%25|%0D|%0A|%3A|%2C)+'
GITHUB = re.compile(rf'^::(?P<level>error|warning|notice) file=(?P<file>{_PROP})'
                    rf'(?:,line=(?P<line>[1-9]\d*),col=(?P<col>[1-9]\d*))?'
                    rf',title=(?P<title>{_PROP})::(?P<message>(?:[^%\r\n]|%25|%0D|%0A)*)$')


def unescape(text: str) -> str:
  return (text.replace('%0D', '\r').replace('%0A', '\n').replace('%3A', ':')
          .replace('%2C', ',').replace('%25', '%'))


def run(*argv, cwd=ROOT):
  """``optim-migrate *argv`` in-process from ``cwd``: (status, stdout, stderr)."""
  out, err = io.StringIO(), io.StringIO()
  old = os.getcwd()
  os.chdir(cwd)
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      status = cli.main(list(argv))
  finally:
    os.chdir(old)
  return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope='module')
def broken(tmp_path_factory):
  """A file that does not parse (a file error: an entry without a rule), outside ROOT."""
  path = tmp_path_factory.mktemp('broken') / 'broken.py'
  path.write_text('from flax import optim\ndef f(:\n')
  return str(path)


@pytest.fixture(scope='module')
def all_cache(tmp_path_factory):
  """The result cache of :func:`everything`'s run (a later run over the same trees reads it)."""
  return str(tmp_path_factory.mktemp('all-cache'))


@pytest.fixture(scope='module')
def everything(tmp_path_factory, all_cache):
  """``rewrite --check --output-format concise --report`` over every fixture tree, with a
  cache of its own (``all_cache``): ``(status, stdout, stderr, report rows)``."""
  report = tmp_path_factory.mktemp('all') / 'report.json'
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('OPTIM_MIGRATE_CACHE_DIR', all_cache)
    status, out, err = run('rewrite', '--check', '--jobs', '1', '--output-format', 'concise',
                           '--report', str(report), *ALL)
  return status, out, err, json.loads(report.read_text())


def fmt_run(tmp_path, fmt, *extra, paths=SOME):
  report = tmp_path / f'{fmt}.json'
  status, out, err = run('rewrite', '--check', '--jobs', '1', '--output-format', fmt,
                         '--report', str(report), *extra, *paths)
  return status, out, err, report


def test_json_is_the_report_file(tmp_path, broken):
  status, out, err, report = fmt_run(tmp_path, 'json', paths=[*SOME, broken, 'no/such.py'])
  assert status == 2, err
  assert out == report.read_text()
  rows = json.loads(out)
  assert {r['safety'] for r in rows} == {'safe', 'unsafe', 'manual', None}
  assert any(r['file'].endswith('blocked.ipynb:cell3') for r in rows)
  assert rows[-1] == {'file': 'no/such.py', 'line': None, 'column': None, 'rule': None,
                      'safety': None, 'message': 'no/such.py: no such file or directory',
                      'applied': False, 'blocks': False}
  for row in rows:
    assert list(row) == ['file', 'line', 'column', 'rule', 'safety', 'message', 'applied',
                         'blocks']
    assert row['rule'] is None or row['safety'] == RULES[row['rule']].safety
  # json carries the findings: the full output's stderr lines are not printed
  assert not any(CONCISE.match(line) for line in err.splitlines())
  assert 'no such file' not in err


def test_concise_one_line_per_finding(tmp_path, broken):
  status, out, err, report = fmt_run(tmp_path, 'concise', paths=[*SOME, broken])
  rows = json.loads(report.read_text())
  assert status == 2  # a file did not parse: as in full mode
  lines = out.splitlines()
  assert len(lines) == len(rows) > 20
  want, got = collections.Counter(), collections.Counter()
  for row in rows:
    want[row['message'] if row['rule'] is None else (
        row['file'], row['line'], row['column'], row['rule'],
        'fixed' if row['applied'] else 'unsafe' if row['safety'] == 'unsafe' else 'manual',
        output_formats.short_message(row['message']))] += 1
  last = None
  for line in lines:
    if line.startswith(broken):
      got[line] += 1
      continue
    m = CONCISE.match(line)
    assert m, line
    got[(m['where'], int(m['line']), int(m['col']), m['rule'], m['kind'], m['message'])] += 1
    here = (m['where'], int(m['line']), int(m['col']))
    if last and last[0] == here[0]:
      assert last[1:] <= here[1:], f'not in file order: {last} then {here}'
    last = here
  assert got == want
  assert any(row['rule'] is None and row['message'].startswith(broken) for row in rows)
  assert re.match(r'9 file\(s\) scanned: .*, 1 failed', err.splitlines()[-1])  # still on stderr


def test_short_message():
  short = output_formats.short_message
  assert short('x -> y (a note)') == 'x -> y (a note)'  # short enough: unchanged
  long_note = 'optax.adam(...) (measured <= 6 ulp: ' + 'rounding (m_hat/d) ' * 40 + ')'
  assert short(long_note) == 'optax.adam(...) (...)'
  words = 'word ' * 100
  assert short(words.strip()).endswith(' ...') and len(short(words.strip())) <= 204
  assert len(short(words.strip(), 30)) <= 34


def test_concise_is_in_file_order_and_short(tmp_path):
  """Entries of one file by line and column (the rules run by family, not in line order),
  and OM001's kilobyte numerics note folded to ``(...)`` (the report keeps it)."""
  src = tmp_path / 'order.py'
  src.write_text('from flax import optim\n\n'
                 'def make(params):\n'
                 '  return optim.Adam(1e-3, beta1=0.8).create(params)\n\n'
                 'def step(opt, g):\n'
                 '  return opt.apply_gradient(g)\n')
  report = tmp_path / 'r.json'
  status, out, err = run('rewrite', '--output-format', 'concise', '--report', str(report),
                         str(src))
  assert status == 1, err
  places = [tuple(int(x) for x in CONCISE.match(line).group('line', 'col'))
            for line in out.splitlines()]
  assert places == sorted(places) and len(places) >= 3
  assert max(len(line) for line in out.splitlines()) < 400
  rows = json.loads(report.read_text())
  assert max(len(r['message']) for r in rows) > 1000  # the report keeps the whole note


def test_statistics_print_no_diff(tmp_path):
  src = tmp_path / 'one.py'
  src.write_text('from flax import optim\nopt = optim.Adam(1e-3).create({})\n')
  status, out, err = run('rewrite', '--statistics', str(src))
  assert status == 1
  assert '--- a/' not in out and '+++ b/' not in out
  assert re.search(r'^2\tOM001\t\[safe\]', out, re.M), out  # the def and its .create
  status, out, err = run('rewrite', '--statistics', '--diff', str(src))
  assert '+++ b/' in out  # asked for


def test_no_summary_when_nothing_was_scanned(tmp_path):
  status, out, err = run('rewrite', str(tmp_path / 'nope.py'))
  assert status == 2 and out == ''
  assert err == f'{tmp_path / "nope.py"}: no such file or directory\n'
  bad = tmp_path / 'bad.py'
  bad.write_text('from flax import optim\ndef f(:\n')
  status, out, err = run('rewrite', str(bad), str(tmp_path / 'nope.py'))
  assert status == 2 and err.splitlines()[1].startswith(f'{bad}:2:'), err
  assert err.splitlines()[-1].startswith('1 file(s) scanned: ') and '2 failed' in err


def test_concise_line_count_on_every_fixture(everything):
  status, out, err, rows = everything
  assert status == 1, err
  assert len(rows) > 500  # 630 when written: 73 fixture pairs, 3 notebooks, 2 flow trees
  lines = out.splitlines()
  assert len(lines) == len(rows)
  got = collections.Counter()
  for line in lines:
    m = CONCISE.match(line)
    assert m, line
    got[m['where'], m['rule']] += 1
  assert got == collections.Counter((row['file'], row['rule']) for row in rows)


def test_github_workflow_commands(tmp_path, broken):
  status, out, err, report = fmt_run(tmp_path, 'github', paths=[*SOME, broken])
  rows = json.loads(report.read_text())
  assert status == 2
  lines = out.splitlines()
  assert len(lines) == len(rows)
  levels = collections.Counter()
  for line, row in zip(lines, rows):
    m = GITHUB.match(line)
    assert m, line
    levels[m['level']] += 1
    if row['rule'] is None:
      assert (m['level'], unescape(m['file'])) == ('error', broken)
      assert unescape(m['title']) == 'optim-migrate: error'
      continue
    assert unescape(m['title']) == row['rule']
    file, _, cell = row['file'].partition('.ipynb:')
    if cell:  # a notebook: the file, no line; the message starts with cell:line:col
      assert unescape(m['file']) == file + '.ipynb' and m['line'] is None
      assert unescape(m['message']) == f"{cell}:{row['line']}:{row['column']}: {row['message']}"
    else:
      assert (unescape(m['file']), int(m['line']), int(m['col'])) == (
          row['file'], row['line'], row['column'])
      assert unescape(m['message']) == row['message']
    if row['applied']:
      assert m['level'] == ('notice' if row['safety'] == 'safe' else 'warning')
    else:
      assert m['level'] == ('error' if row['safety'] == 'unsafe' or row['blocks']
                            else 'warning'), line
  assert set(levels) == {'error', 'warning', 'notice'}, levels


def test_github_escaping():
  message = 'rate 5% of lr,\nthen: stop\r'
  entry = Entry('dir,a:b/100%.py', 3, 7, 'OM117', message, blocks=True)
  line = output_formats.github_line(entry)
  assert line == ('::error file=dir%2Ca%3Ab/100%25.py,line=3,col=7,title=OM117'
                  '::rate 5%25 of lr,%0Athen: stop%0D')
  m = GITHUB.match(line)
  assert m and unescape(m['message']) == message and unescape(m['file']) == entry.path
  assert output_formats.escape_property('a%:,\r\n') == 'a%25%3A%2C%0D%0A'
  # an unescaped `,` or `:` in a property, or a raw newline, does not pass the regex
  assert not GITHUB.match('::warning file=a,b.py,line=1,col=1,title=OM117::m')
  assert not GITHUB.match('::warning file=a.py,line=1,col=1,title=OM1:17::m')
  assert not GITHUB.match('::warning file=a.py,line=1,col=1,title=OM117::m\nx')
  # levels: applied safe fix -> notice, blocking / unsafe left undone -> error, else warning
  assert output_formats.github_line(Entry('a.py', 1, 1, 'OM001', 'm', True)).startswith('::notice')
  assert output_formats.github_line(Entry('a.py', 1, 1, 'OM009', 'm')).startswith('::error')
  assert output_formats.github_line(Entry('a.py', 1, 1, 'OM009', 'm', True)).startswith('::warning')
  assert output_formats.github_line(Entry('a.py', 1, 1, 'OM117', 'm', blocks=True)).startswith('::error')
  assert output_formats.github_line(Entry('a.py', 1, 1, 'OM122', 'm')).startswith('::warning')


def test_sarif_validates_against_the_2_1_0_schema(tmp_path, broken):
  status, out, err, report = fmt_run(tmp_path, 'sarif', paths=[*SOME, broken])
  rows = json.loads(report.read_text())
  assert status == 2
  log = json.loads(out)
  validator = jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
  errors = sorted(validator.iter_errors(log), key=str)
  assert not errors, errors[:3]
  run_ = log['runs'][0]
  rules = run_['tool']['driver']['rules']
  assert [r['id'] for r in rules] == list(RULES)
  for r in rules:
    assert r['shortDescription']['text'] == RULES[r['id']].summary
    assert r['fullDescription']['text'] and r['help']['markdown'].startswith(f"# {r['id']}")
  findings = [r for r in rows if r['rule']]
  assert len(run_['results']) == len(findings)
  for result, row in zip(run_['results'], findings):
    assert result['ruleId'] == row['rule'] and rules[result['ruleIndex']]['id'] == row['rule']
    assert result['message']['text'] == row['message']
    loc = result['locations'][0]
    artifact = loc['physicalLocation']['artifactLocation']
    assert artifact['uriBaseId'] == '%SRCROOT%' and not artifact['uri'].startswith('/')
    if '.ipynb:cell' in row['file']:
      nb, cell = row['file'].split(':')
      assert artifact['uri'] == nb and 'region' not in loc['physicalLocation']
      assert loc['logicalLocations'][0]['name'] == cell
      assert (result['properties']['cellLine'], result['properties']['cellColumn']) == (
          row['line'], row['column'])
    else:
      assert artifact['uri'] == row['file']
      assert loc['physicalLocation']['region'] == {'startLine': row['line'],
                                                   'startColumn': row['column']}
    assert result['level'] == {'error': 'error', 'warning': 'warning', 'notice': 'note'}[
        Entry(row['file'], row['line'], row['column'], row['rule'], row['message'],
              row['applied'], row['blocks']).level]
    assert result['properties'] == {**result['properties'], 'safety': row['safety'],
                                    'applied': row['applied'], 'blocks': row['blocks']}
  assert run_['originalUriBaseIds']['%SRCROOT%']['uri'] == ROOT.as_uri() + '/'
  # the file error: a notification with the file's absolute URI (it is outside the root)
  invocation = run_['invocations'][0]
  assert invocation['executionSuccessful'] is False
  (note,) = invocation['toolExecutionNotifications']
  assert note['level'] == 'error'
  assert note['locations'][0]['physicalLocation']['artifactLocation']['uri'] == \
      pathlib.Path(broken).as_uri()


def test_sarif_schema_rejects_a_broken_log(tmp_path):
  """The validation above can fail: a result without its message does not validate."""
  log = output_formats.sarif_log([Entry('a.py', 1, 1, 'OM117', 'm')], tmp_path)
  validator = jsonschema.Draft4Validator(SCHEMA)
  assert validator.is_valid(log)
  del log['runs'][0]['results'][0]['message']
  assert not validator.is_valid(log)
  log = output_formats.sarif_log([Entry('a.py', 1, 1, 'OM117', 'm')], tmp_path)
  log['runs'][0]['results'][0]['locations'][0]['physicalLocation']['region']['startLine'] = 0
  assert not validator.is_valid(log)


def test_sarif_help_uri_from_the_docs_url(tmp_path, monkeypatch):
  monkeypatch.setenv(output_formats.DOCS_URL_ENV, 'https://example.org/optim-migrate/')
  log = output_formats.sarif_log([Entry('sub dir/a.py', 2, 5, 'OM117', 'm')], tmp_path)
  assert jsonschema.Draft4Validator(SCHEMA).is_valid(log)
  rules = log['runs'][0]['tool']['driver']['rules']
  assert rules[0]['helpUri'] == f'https://example.org/optim-migrate/rules/{rules[0]["id"]}.html'
  uri = log['runs'][0]['results'][0]['locations'][0]['physicalLocation']['artifactLocation']
  assert uri == {'uri': 'sub%20dir/a.py', 'uriBaseId': '%SRCROOT%'}
  monkeypatch.delenv(output_formats.DOCS_URL_ENV)
  log = output_formats.sarif_log([], tmp_path)
  assert all('helpUri' not in r for r in log['runs'][0]['tool']['driver']['rules'])


def test_statistics_count_the_report(everything, all_cache, monkeypatch):
  """(Run warm, on ``everything``'s cache: the counts of cached results are the cold run's.)"""
  status, _, _, rows = everything
  counts = collections.Counter(r['rule'] for r in rows if r['rule'])
  monkeypatch.setenv('OPTIM_MIGRATE_CACHE_DIR', all_cache)
  status2, out, err = run('rewrite', '--check', '--jobs', '1', '--statistics',
                          '--output-format', 'concise', *ALL)
  assert status2 == status
  got = [line.split('\t') for line in out.splitlines()]
  assert {rule: int(n) for n, rule, _, _ in got} == dict(counts)
  # most frequent first, ties by rule id (as ruff sorts them)
  assert [rule for _, rule, _, _ in got] == sorted(counts, key=lambda r: (-counts[r], r))
  for n, rule, safety, summary in got:
    assert (safety, summary) == (f'[{RULES[rule].safety}]', RULES[rule].summary)
  assert not any(CONCISE.match(line) for line in out.splitlines())  # instead of the findings


def test_statistics_json(tmp_path):
  status, out, err, report = fmt_run(tmp_path, 'json', '--statistics')
  rows = json.loads(report.read_text())
  stats = json.loads(out)
  counts = collections.Counter(r['rule'] for r in rows if r['rule'])
  applied = collections.Counter(r['rule'] for r in rows if r['rule'] and r['applied'])
  assert {s['rule']: (s['count'], s['applied']) for s in stats} == {
      r: (n, applied[r]) for r, n in counts.items()}


def test_show_fixes_lists_the_applied_fixes_per_file(tmp_path):
  src = tmp_path / 'tree'
  src.mkdir()
  for name in ('om007_annotations', 'om009_replicate_needs_unsafe'):
    (src / f'{name}.py').write_text((FIXTURES / 'codemod' / name / 'before.py').read_text())
  report = tmp_path / 'r.json'
  status, out, err = run('rewrite', '--check', '--show-fixes', '--report', str(report), 'tree',
                         cwd=tmp_path)
  rows = json.loads(report.read_text())
  fixed = collections.defaultdict(collections.Counter)
  for r in rows:
    if r['applied']:
      fixed[r['file']][r['rule']] += 1
  expected = [f'Would fix {sum(rows_["applied"] for rows_ in rows)} finding(s) in '
              f'{len(fixed)} file(s):']
  for file, counts in fixed.items():
    expected.append(f'- {file}:')
    expected += [f'    {n} x {rule} ({RULES[rule].summary})' for rule, n in sorted(counts.items())]
    notes = [f"      line {r['line']}: {output_formats.numeric_note(output_formats.entry_of_row(r))}"
             for r in rows if r['file'] == file and r['applied'] and r['message'].startswith(
                 'flax.optim.')]
    if notes:
      expected += ['    numerics (the whole note: --output-format json or --report):', *notes]
  assert sum(len(e) for e in expected if 'line ' in e) > 0  # a def was converted
  text = err[err.index('Would fix'):].splitlines()
  assert text[:len(expected)] == expected
  assert len(fixed) == 2 and status == 1
  status, out, err = run('rewrite', '--write', '--show-fixes', 'tree', cwd=tmp_path)
  assert status == 1 and expected[0].replace('Would fix', 'Fixed') in err


def test_show_fixes_names_each_defs_distance_from_legacy(tmp_path):
  """(helper-39: the numerics note of a converted def showed only in json and the report)"""
  from optim_compat import spec
  for name in ('bare_flax_import', 'prefer_stock_optax'):
    (tmp_path / f'{name}.py').write_text((FIXTURES / 'codemod' / name / 'before.py').read_text())
  status, out, err = run('rewrite', '--check', '--show-fixes', 'bare_flax_import.py', cwd=tmp_path)
  ulp = spec.SPECS['Adam'].stock_max_ulp
  assert status == 1 and ulp > 0 and err.splitlines()[-3:-1] == [
      '    numerics (the whole note: --output-format json or --report):',
      f'      line 6: Adam: measured <= {ulp} ulp from legacy'], err
  status, out, err = run('rewrite', '--check', '--show-fixes', '--prefer-stock-optax',
                         'prefer_stock_optax.py', cwd=tmp_path)
  assert '      line 5: Adagrad: stock Optax, preferred: measured intrinsic\n' in err, err
  status, out, err = run('rewrite', '--check', '--show-fixes', 'prefer_stock_optax.py',
                         cwd=tmp_path)
  assert '      line 5: Adagrad: bitwise equal to legacy\n' in err, err


def test_exit_codes_do_not_depend_on_the_format(tmp_path, broken):
  cases = {'changes': SOME[:1], 'clean': ['tests/fixtures/codemod/om007_annotations/after.py'],
           'error': [broken], 'missing': ['no/such/file.py']}
  for what, paths in cases.items():
    statuses = {fmt: run('rewrite', '--check', '--jobs', '1', '--output-format', fmt, *paths)[0]
                for fmt in output_formats.FORMATS}
    assert len(set(statuses.values())) == 1, (what, statuses)
    assert statuses['full'] == {'changes': 1, 'clean': 0, 'error': 2, 'missing': 2}[what]


def test_full_is_todays_output():
  paths = ['tests/fixtures/codemod/om100_module_as_value/before.py']
  default = run('rewrite', '--check', *paths)
  assert run('rewrite', '--check', '--output-format', 'full', *paths) == default
  status, out, err = default
  assert out == f'would rewrite {paths[0]}\n'
  assert any(CONCISE.match(line) for line in err.splitlines())  # open findings on stderr


def test_bad_combinations_exit_2():
  for fmt in ('json', 'sarif'):
    status, out, err = run('rewrite', '--check', '--diff', '--output-format', fmt, SOME[0])
    assert (status, out) == (2, '') and '--diff' in err and fmt in err
  status, out, err = run('rewrite', '--output-format', 'concise', '-')
  assert (status, out) == (2, '') and 'stdin' in err
  # concise with --diff: the diff, then the findings
  status, out, _ = run('rewrite', '--check', '--diff', '--output-format', 'concise', SOME[0])
  lines = out.splitlines()
  assert status == 1 and lines[0].startswith('--- a/') and CONCISE.match(lines[-1])


# ---------------------------------------------------------------------------
# optim-migrate check


def test_check_refuses_github_and_sarif():
  for fmt in ('github', 'sarif'):
    with pytest.raises(SystemExit) as exit_:  # argparse: not one of the choices
      run('check', '--legacy', 'Adam(learning_rate=1e-3)', '--tx', 'optax.adam(1e-3)',
          '--params', 'x.json', '--output-format', fmt)
    assert exit_.value.code == 2


def test_check_json_and_concise(tmp_path):
  (tmp_path / 'shapes.json').write_text('{"w": {"shape": [4], "dtype": "float32"}}')
  (tmp_path / 'pyproject.toml').write_text(
      '[[tool.optim-migrate.check]]\nname = "same"\nlegacy = "Adam(learning_rate=1e-3)"\n'
      'tx = "optax.adam(1e-3)"\nparams = "shapes.json"\nsteps = 3\ndevices = "1"\n'
      '[[tool.optim-migrate.check]]\nname = "wrong eps"\nlegacy = "Adam(learning_rate=1e-3)"\n'
      'tx = "optax.adam(1e-3, eps=1e-3)"\nparams = "shapes.json"\nsteps = 3\ndevices = "1"\n')
  status, out, err = run('check', '--output-format', 'json', cwd=tmp_path)
  assert status == 1, err
  same, wrong = json.loads(out)
  assert (same['name'], same['ok'], wrong['name'], wrong['ok']) == ('same', True,
                                                                    'wrong eps', False)
  assert same['max_ulp'] <= same['bound'] == 24.0  # Adam's default bound (check's per-def default)
  assert wrong['max_ulp'] > 100 * wrong['bound']  # eps 1e-3 for 1e-8: far off
  assert wrong['worst']['leaf'] == "['w']" and wrong['per_leaf'] == {"['w']": wrong['max_ulp']}
  assert wrong['tx'] == 'optax.adam(1e-3, eps=1e-3)' and wrong['runs'] == ['pmapx1']
  status2, out, err = run('check', '--output-format', 'concise', cwd=tmp_path)
  assert status2 == status
  lines = out.splitlines()
  assert len(lines) == 2
  assert lines[0].startswith('same: OK max ') and lines[1].startswith('wrong eps: DIFFERS max ')
  assert "worst ['w']" in lines[1]


# ---------------------------------------------------------------------------
# docs/ci.md


def test_ci_page_documents_the_formats_and_the_schema():
  page = (ROOT / 'docs' / 'ci.md').read_text()
  for fmt in output_formats.FORMATS:
    assert f'| `{fmt}`' in page, fmt
  # the report schema table lists exactly the keys a row has, in order
  section = page[page.index('### The JSON report schema'):page.index('## `--statistics`')]
  keys = [k for line in section.splitlines() if line.startswith('| `')
          for k in re.findall(r'`(\w+)`', line.split('|')[1])]
  assert keys == list(Entry('a.py', 1, 1, 'OM117', 'm').row())
  workflow = page[page.index('```yaml\n# .github/workflows/'):]
  workflow = workflow[:workflow.index('```\n', 8)]
  assert '- run: optim-migrate rewrite --check --output-format github .' in workflow
  assert '- run: optim-migrate check\n' in workflow and 'on: pull_request' in workflow
  assert '[In CI](ci.md)' in (ROOT / 'docs' / 'index.md').read_text()


def test_write_reports_the_lines_of_the_file_as_written(tmp_path):
  """`--write`: every manual item's line is its line in the written file, the TODO the run
  wrote for it just above (a few lines up for a statement over several lines); notebooks in
  their cell's new source. (A notebook the run leaves unchanged keeps its lines.) `--check` on the same copy, before the write, names the lines of
  the file as it is (the TODO-free original)."""
  import shutil
  tree = tmp_path / 'tree'
  for case in ('om013_checkpoint_unconvertible', 'om100_module_as_value',
               'om2xx_frozendict_documented_no_flax_import'):
    (tree / case).mkdir(parents=True)
    shutil.copy(FIXTURES / 'codemod' / case / 'before.py', tree / case / 'm.py')
  shutil.copytree(FIXTURES / 'notebooks', tree / 'notebooks')
  cells = ['# a markdown title', 'import jax\nfrom flax import optim\n',
           'def make(params, lr):\n  opt_def = optim.Adam(learning_rate=lr)\n'
           '  return opt_def.create(params), opt_def.hyper_params.learning_rate\n']
  (tree / 'notebooks' / 'hyper.ipynb').write_text(json.dumps({
      'cells': [{'cell_type': 'markdown' if i == 0 else 'code', 'metadata': {},
                 'source': c.splitlines(keepends=True)} for i, c in enumerate(cells)],
      'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}, indent=1))
  originals = {p: p.read_text() for p in tree.rglob('*') if p.is_file()}
  checked, written = tmp_path / 'check.json', tmp_path / 'write.json'
  run('rewrite', '--check', '--jobs', '1', '--report', str(checked), str(tree))
  run('rewrite', '--write', '--jobs', '1', '--report', str(written), str(tree))
  before, after = json.loads(checked.read_text()), json.loads(written.read_text())
  assert [(r['file'], r['rule']) for r in before] == [(r['file'], r['rule']) for r in after]

  def lines(file: str, texts):
    path, _, cell = file.partition('.ipynb:cell')
    if not cell:
      return texts(pathlib.Path(path)).splitlines()
    src = json.loads(texts(pathlib.Path(path + '.ipynb')))['cells'][int(cell)]['source']
    return (''.join(src) if isinstance(src, list) else src).splitlines()

  def changed(file: str) -> bool:
    path = pathlib.Path(file.partition('.ipynb:cell')[0] + ('.ipynb' if '.ipynb:' in file else ''))
    return path.read_text() != originals[path]

  manual = [(b, a) for b, a in zip(before, after)
            if a['rule'] and not a['applied'] and changed(a['file'])]
  moved = 0
  for b, a in manual:
    new = lines(a['file'], lambda p: p.read_text())
    todo = f"# TODO(optim-migrate): {a['rule']}: {a['message']}"
    above = [line.strip() for line in new[max(a['line'] - 6, 0):a['line'] - 1]]
    assert todo in above, (a, new[a['line'] - 1])
    old = lines(b['file'], lambda p: originals[p])
    assert new[a['line'] - 1] == old[b['line'] - 1]  # the flagged line itself is kept
    moved += a['line'] != b['line']
  assert len(manual) >= 5 and moved >= 4
  assert any('.ipynb:cell' in a['file'] for _, a in manual)


def test_a_converted_line_under_its_new_todo_is_reported_at_the_code():
  """A site both rewritten and flagged (a converted call with a TODO above it): `--write`
  reports the call's line, not the TODO comment's, as for a kept line."""
  from codemod import findings
  before = 'a = 1\n    x = opt.apply_gradient(g)\nb = 2\n'
  after = ('a = 1\n    # TODO(optim-migrate): OM102: a note\n'
           '    x = opt.apply_gradients(grads=g)\nb = 2\n')
  where = findings.line_map(before, after)
  assert [where(1), where(2), where(3)] == [1, 3, 4]
  # a block rewritten to more lines than it had keeps the same offset among its code lines
  where = findings.line_map('a\nB\nC\nd\n', 'a\n# TODO(optim-migrate): OM101: x\nB1\nB2\nC1\nd\n')
  assert [where(2), where(3), where(4)] == [3, 4, 6]
