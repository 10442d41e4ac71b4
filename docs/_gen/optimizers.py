"""``docs/optimizers/``: one page per legacy def of the migration table, and an index.

Everything on a page comes from ``optim_compat.spec`` (``SPECS``, ``STOCK_ALTERNATIVES``),
``optim_compat.state_map`` and ``equivalence_tests.cases`` (the recorded hyper-parameter
sets): the same data the shim, the codemod and the tests use. ``help(optim_compat.Adam)``
is built from the same entries (``optim_compat.base.def_docstring``). No jax import.
"""
from __future__ import annotations

import pathlib
import re

from _gen import write

_CALLED = re.compile(r'([A-Za-z_][\w.]*)\(')


def page_name(name: str) -> str:
  return name.lower()


_CODE_SPAN = re.compile(r'(`+)(.+?)\1')


def md(text) -> str:
  """Plain table text as Markdown: ``*``, ``<``, ``[`` and ``\\`` escaped outside code spans
  (the table writes ``lr*wd*p`` and ``<path>`` as prose)."""
  out, pos = [], 0
  text = str(text)
  for m in _CODE_SPAN.finditer(text):
    out.append(re.sub(r'([\\*<\[_])', r'\\\1', text[pos:m.start()]))
    out.append(m.group(0))
    pos = m.end()
  out.append(re.sub(r'([\\*<\[_])', r'\\\1', text[pos:]))
  return ''.join(out)


def cell(text) -> str:
  return md(text).replace('|', '\\|').replace('\n', ' ')


def code_cell(text) -> str:
  """Text that goes inside a code span in a table cell: only ``|`` needs escaping."""
  return str(text).replace('|', '\\|').replace('\n', ' ')


def sentences(text: str) -> list[str]:
  """The table's long statements, cut into sentences for a bullet list."""
  parts = re.split(r'(?<!e\.g)(?<!i\.e)\.\s+(?=\S)', text.strip().rstrip('.'))
  return [p.strip() for p in parts if p.strip()]


def ulp_text(bound) -> str:
  if bound is None:
    return 'not measured'
  if bound == 0:
    return 'bitwise'
  if bound == float('inf'):
    return 'unbounded'
  return f'≤ {bound:g} ulp'


def signature(entry) -> str:
  args = [f'{h.name}={h.default!r}' for h in entry.hyper_params]
  args += [f'{k}={v!r}' for k, v in entry.extra_args]
  return f'flax.optim.{entry.name}({", ".join(args)})'


def _sample(default):
  """A non-default value that may change the emitted form (the table branches on these)."""
  if isinstance(default, bool):
    return repr(not default)
  if default is None:
    return '0.1'
  if isinstance(default, (int, float)) and default == 0:
    return '1e-4'
  return None


def emitted_forms(entry) -> list[tuple[str, str]]:
  """``[(when, source)]``: the default form, then each argument that changes the chain."""
  base = entry.emit({'learning_rate': 'lr'})
  forms = [('default arguments', base)]
  shape = set(_CALLED.findall(base))
  for h in entry.hyper_params:
    if h.name == 'learning_rate':
      continue
    value = _sample(h.default)
    if value is None:
      continue
    source = entry.emit({'learning_rate': 'lr', h.name: value})
    if set(_CALLED.findall(source)) != shape:
      forms.append((f'`{h.name}={value}`', source))
  forms.append(('a learning rate passed at apply time (`apply_gradient(g, learning_rate=lr)`, '
                'rule OM002)', entry.emit({'learning_rate': 'lr'}, learning_rate_injected=True)))
  return forms


def _recorded_cases(name: str):
  try:
    from equivalence_tests import cases
  except ImportError:  # an install without the tests package
    return [], None
  rows = [c for c in cases.CASES if c[1] == name]
  return rows, getattr(cases, 'GOLDEN_BOUNDS', None)


def _measured_on(spec_lib, entry) -> str:
  for where in (getattr(entry, 'measured_on', None), getattr(spec_lib, 'MEASURED_ON', None)):
    if where:
      return str(where)
  return ''


def optimizer_page(entry) -> str:
  from optim_compat import spec as spec_lib
  from optim_compat import state_map
  stock = spec_lib.STOCK_ALTERNATIVES.get(entry.name)
  forms = emitted_forms(entry)
  faithful = any('optim_compat' in source for _, source in forms[:-1])
  out = [f'# {entry.name}', '',
         f'`{signature(entry)}`, in `flax/optim/{entry.module_name}.py` of flax 0.5.3.', '',
         '| at a glance | |', '|---|---|',
         f'| the codemod emits | `{code_cell(forms[0][1])}` |',
         f'| emitted vs real flax.optim, float32 | {ulp_text(entry.stock_max_ulp)} |']
  if entry.stock_max_ulp_low_precision is not None:
    out.append(f'| emitted vs real flax.optim, bfloat16 | '
               f'{ulp_text(entry.stock_max_ulp_low_precision)} (bfloat16 ulps) |')
  if entry.diverges_on:
    out.append(f'| differs by more than rounding on | '
               f'{", ".join(f"`{c}`" for c in entry.diverges_on)} (see below) |')
  out.append(f'| stock Optax alternative | '
             f'{"`--prefer-stock-optax`, " + ulp_text(stock.max_ulp) if stock else "none"} |')
  out += ['', '## Hyper-parameters', '',
          '| name | default | meaning |', '|---|---|---|']
  for h in entry.hyper_params:
    meaning = h.describe()
    if h.static and 'Python' not in meaning:
      meaning += ' (a Python value: the legacy rule branches on it, a traced one raises)'
    out.append(f'| `{h.name}` | `{h.default!r}` | {cell(meaning)} |')
  for k, v in entry.extra_args:
    out.append(f'| `{k}` | `{v!r}` | constructor argument kept as an attribute, not a '
               'hyper-parameter |')
  out += ['', 'Legacy code may override any hyper-parameter per call '
          '(`apply_gradient(g, learning_rate=...)`); the codemod converts a per-call '
          '`learning_rate` (rule OM002) and flags the others (OM102).'
          + (' A hyper-parameter the legacy rule branches on must be a Python value: a traced '
             'one raised `ConcretizationTypeError` in legacy flax.optim, and the shim raises it '
             'too, naming the hyper-parameter.' if any(h.static for h in entry.hyper_params)
             else ''), '']
  fields = ', '.join(f'`{f}`' for f in entry.state_fields) or '`()`, saved as `{}`'
  out += ['## State and checkpoints', '',
          f'Per-parameter state (checkpoint keys under `state/param_states/<path>/`): {fields}. '
          'The global state is the int32 `step`.', '']
  try:
    mapping = state_map.sources(entry.name)
  except KeyError:
    mapping = None
  if mapping:
    out += ['Where the emitted Optax state holds them (`optim_compat/state_map.py`; a leading '
            '`-` is the negated legacy value):', '',
            '| Optax state | field | legacy field |', '|---|---|---|']
    for cls, fields_map in mapping.items():
      if not fields_map:
        out.append(f'| `{cls}` | | (no fields: tells two defs apart) |')
      for field, legacy in fields_map.items():
        out.append(f'| `{cls}` | `{field}` | `{legacy}` |')
    out += ['', 'Every Optax `count` and `TrainState.step` take the legacy `step`.', '']
  elif mapping is not None:
    out += ['The emitted transformation keeps the legacy per-parameter states themselves '
            '(`optim_compat.transforms.LegacyRuleState`), so a checkpoint converts field for '
            'field; every `count` and `TrainState.step` take the legacy `step`.'
            if faithful else
            'The emitted Optax state has no per-parameter fields; `TrainState.step` takes the '
            'legacy `step`.', '']
  out += ['`optim_compat.checkpoint.restore_legacy(ckpt_dir, state)` restores a legacy '
          'checkpoint of this def into the migrated `TrainState`; see [Checkpoints]'
          '(../checkpoints.md).', '']
  out += ['## Legacy update', '',
          'Per parameter leaf `p` with gradient `g` and pre-increment step `t` (0-based), as '
          'flax.optim 0.5.3 computes it:', '', '```text',
          *[part.strip() for part in entry.equation.split('; ')], '```', '']
  out += ['## What the codemod emits', '']
  for when, source in forms:
    out += [f'With {when}:', '', '```python', source, '```', '']
  if faithful:
    out += ['`optim_compat.transforms.*` is the faithful transformation of this project (the '
            'legacy rule, in the legacy operation order): it is emitted where stock Optax '
            'differs intrinsically, and the rewritten file imports `optim_compat`.', '']
  out += ['## Measured distance', '',
          'The emitted chain, run on the modern stack, against golden trajectories recorded '
          'from real flax.optim 0.5.3 on the old stack (jax 0.4.13, flax 0.5.3): 20 jitted '
          "steps, in ulps of each leaf's largest magnitude. "
          f'Bound: **{ulp_text(entry.stock_max_ulp)}** in float32'
          + (f', **{ulp_text(entry.stock_max_ulp_low_precision)}** (bfloat16 ulps) in bfloat16'
             if entry.stock_max_ulp_low_precision is not None else '') + '.', '',
          'Where: `tests/test_golden.py` asserts this bound on every run of the test suite, on '
          'the CPU that runs it.'
          + (f' Measured on: {_measured_on(spec_lib, entry)}.' if _measured_on(spec_lib, entry)
             else ' The table does not record the CPU it was first measured on.'), '',
          'Differences, from the table:', '',
          *[f'- {md(part)}.' for part in sentences(entry.differences)], '']
  rows, bounds = _recorded_cases(entry.name)
  if rows:
    head = '| case | arguments |'
    rule = '|---|---|'
    if bounds:
      head += ' emitted vs golden, any CPU |'
      rule += '---|'
    out += ['Recorded cases (`equivalence_tests/cases.py`, golden files '
            '`equivalence_tests/golden/<case>.npz`):', '', head, rule]
    for case_id, _, kwargs in rows:
      args = ', '.join(f'{k}={v!r}' for k, v in kwargs.items())
      row = f'| `{case_id}` | `{code_cell(args)}` |'
      if bounds:
        b = bounds.get(case_id)
        emitted = getattr(b, 'emitted', None) if b is not None else None
        row += f' {ulp_text(emitted) if b is not None and emitted is not None else "—"} |'
      out.append(row)
    out.append('')
  out += ['## Stock Optax alternative', '']
  if stock:
    out += ['`optim-migrate rewrite --prefer-stock-optax` emits this instead, and each '
            "rewrite's report entry states the difference:", '', '```python',
            stock.emit(entry, {'learning_rate': 'lr'}), '```', '',
            f'Measured against real flax.optim 0.5.3 (worst recorded case, 20 steps; '
            f'`tests/test_codemod.py` re-measures it): {md(stock.measured)}.', '']
  elif not faithful:
    out += ['None needed: the codemod already emits stock Optax.', '']
  else:
    out += ['None in the table.', '']
  out += ['## On the shim', '', '```python', 'import optim_compat',
          f'opt = optim_compat.{entry.name}(learning_rate=1e-3).create(params)   # the legacy API',
          f'tx = optim_compat.to_optax(optim_compat.{entry.name}(learning_rate=1e-3))  '
          '# legacy numbers, for TrainState',
          f'tx = optim_compat.transforms.{entry.name.lower()}(learning_rate=1e-3)  # the same',
          '```', '',
          f'`help(optim_compat.{entry.name})` prints this table entry.', '']
  return '\n'.join(out)


def index_page(specs) -> str:
  from optim_compat import spec as spec_lib
  out = ['# Optimizers', '',
         'One page per legacy `flax.optim` def, generated from the migration table '
         '(`optim_compat/spec.py`): the shim runs its rule, the codemod emits its Optax source, '
         'the tests iterate it. Distances are against real flax.optim 0.5.3, 20 jitted steps, '
         "in ulps of each leaf's largest magnitude (float32 unless said).", '',
         '| legacy | the codemod emits | float32 | bfloat16 | `--prefer-stock-optax` |',
         '|---|---|---|---|---|']
  for name, entry in specs.items():
    source = entry.emit({'learning_rate': 'lr'})
    fn = _CALLED.findall(source)[0] if _CALLED.findall(source) else source
    stock = spec_lib.STOCK_ALTERNATIVES.get(name)
    low = ('not trained by legacy with the default `beta2`: see page' if entry.diverges_on
           else ulp_text(entry.stock_max_ulp_low_precision)
           if entry.stock_max_ulp_low_precision is not None else '—')
    out.append(f'| [{name}]({page_name(name)}.md) | `{fn}` | {ulp_text(entry.stock_max_ulp)} '
               f'| {low} | {ulp_text(stock.max_ulp) if stock else "—"} |')
  out += ['', '`WeightNorm`, `MultiOptimizer` (with `ModelParamTraversal`), `create(focus=)` '
          'and `DynamicScale` wrap or sit beside these defs: see [Wrappers](../wrappers.md). '
          'Low-precision params under Adam and AdaBelief, and what differs between the old and '
          'the new stack that is not the optimizer: [Numerics](../numerics.md).', '',
          '```{toctree}', ':hidden:', '', *[page_name(n) for n in specs], '```', '']
  return '\n'.join(out)


def generate(docs: pathlib.Path) -> list[str]:
  from optim_compat.spec import SPECS
  pages = {f'{page_name(name)}.md': optimizer_page(entry) for name, entry in SPECS.items()}
  pages['index.md'] = index_page(SPECS)
  return write.sync(docs / 'optimizers', pages)
