"""``optim-migrate check`` and ``optim-migrate record``.

    optim-migrate check --legacy "Adam(learning_rate=1e-3, weight_decay=1e-4)" \\
        --tx "optax.adamw(1e-3, weight_decay=1e-4)" --params model:params \\
        [--devices 1,2,4,8] [--mode pmap] [--steps 20] [--max-ulp N] [--grads mixed]
    optim-migrate check                      # every [[tool.optim-migrate.check]] entry
    optim-migrate record --legacy "Adam(...)" --params shapes.json -o traj.npz   # old stack
    optim-migrate check --against traj.npz --tx "optax.adamw(...)"               # new stack

Exit status: 0 all checks pass, 1 a check differs (its table is printed),
2 bad input (the message names it). ``--output-format concise|json`` prints one line / one
JSON object per comparison instead of the tables (``codemod.output_formats``, docs/ci.md);
``github`` and ``sarif`` are not offered (argparse refuses them, exit 2): a comparison has no
file and line. ``--legacy`` and ``--tx`` (and those keys of a pyproject entry) are Python
expressions, evaluated in this process as a test runs its code, and ``--params module:attr``
imports that module: like a test suite, they run whatever code they hold, so give them only
text you would run. ``--legacy`` is evaluated with the names
of real ``flax.optim`` where it exists (Flax <= 0.5.3), else of
``optim_compat`` (``record`` then notes on stderr that it records the shim);
``--tx`` with ``optax``, ``jax``, ``jnp``, ``np`` and ``optim_compat``.

``--grads`` (default ``mixed``): the gradient draws both sides get, for ``check`` and
``record`` alike. ``mixed`` puts a third of each leaf's elements in the regime where an
epsilon's placement or size decides the update (``random`` alone can pass a wrong
epsilon). ``check --against`` uses the draws the file was recorded with (files from
before ``record --grads`` recorded ``random``).

``--params``: ``module:attribute`` (an importable pytree, or a function
returning one; the current directory is importable), ``file.npz`` (keys
``a/b/c`` become nested dicts) or ``shapes.json`` (nested objects whose
leaves are ``{"shape": [..], "dtype": "float32"}``; values drawn from
``--seed``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import sys
import tempfile
import zipfile

EXIT_OK, EXIT_DIFFERS, EXIT_BAD_INPUT = 0, 1, 2

#: The named gradient draws (``equivalence_tests.checker``: ``MIXED_SCALES``, ``TINY_SCALE``).
GRADS = ('mixed', 'random', 'tiny')
#: The draws ``check``, ``record``, pyproject entries, ``equivalence_tests.check`` and the
#: pytest plugin use when none is named: one run whose leaves cycle through the scales 1,
#: 2**-24 and 2**-50 element by element (so epsilon mistakes show, see the README).
DEFAULT_GRADS = 'mixed'


class BadInput(ValueError):
  """Input the user has to fix; printed without a traceback (exit status 2)."""


def register(subparsers) -> None:
  p = subparsers.add_parser('check', help='prove a migrated Optax tx matches a legacy def',
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
  _common(p)
  p.add_argument('--tx', help='Optax expression (Python, evaluated: run only your own), e.g. '
                 '"optax.adamw(1e-3, weight_decay=1e-4)"')
  p.add_argument('--against', metavar='TRAJ.npz', help='a trajectory file from `record`')
  p.add_argument('--max-ulp', type=float, default=None,
                 help='the largest difference that passes, in ulp (finite, >= 0; default: per '
                      'def, 4 x its measured bound and at least 4: Adam 24, RMSProp 12, ...)')
  p.add_argument('--config', default='pyproject.toml',
                 help='read [[tool.optim-migrate.check]] entries from this file when '
                      '--tx is not given (default: ./pyproject.toml)')
  from codemod.output_formats import CHECK_FORMATS
  p.add_argument('--output-format', choices=CHECK_FORMATS, default='full',
                 help='full (default: the tables), concise (one line per comparison) or json '
                      '(one object per comparison), on stdout (rewrite\'s github and sarif need '
                      'a file and line, which a numeric comparison has not)')
  p.set_defaults(func=cmd_check)
  p = subparsers.add_parser('record', help='record a legacy def\'s trajectory (run it in '
                                           'the old stack)')
  _common(p)
  p.add_argument('-o', '--output', required=True, metavar='TRAJ.npz')
  p.set_defaults(func=cmd_record)


#: What ``--devices``, ``--mode``, ``--steps``, ``--seed`` and ``--grads`` are when not given
#: (their parser default is None, so ``check --against`` can tell a given one from a default).
RUN_DEFAULTS = {'devices': '1', 'mode': 'pmap', 'steps': 20, 'seed': 0, 'grads': DEFAULT_GRADS}
#: The draws of a trajectory file recorded before ``record`` had ``--grads`` (no
#: ``grads`` in its metadata): it recorded the random draws.
RECORDED_GRADS_BEFORE = 'random'


def _common(p) -> None:
  p.add_argument('--legacy', help='legacy def expression (Python, evaluated: run only your own), '
                 'e.g. "Adam(learning_rate=1e-3)"')
  p.add_argument('--params', help='module:attribute | file.npz | shapes.json')
  p.add_argument('--devices', default=None, help='comma-separated device counts (default 1)')
  p.add_argument('--mode', default=None, choices=('single', 'pmap', 'sharded'),
                 help='default pmap')
  p.add_argument('--steps', type=int, default=None, help='default 20')
  p.add_argument('--seed', type=int, default=None, help='default 0')
  p.add_argument('--grads', choices=GRADS, default=None,
                 help=f'gradients both sides get (default {DEFAULT_GRADS}): mixed: the random '
                      'draws with each leaf\'s elements cycling through the scales 1, 2**-24 '
                      'and 2**-50 (so a wrong epsilon shows; float16 leaves keep 1); random: '
                      'the draws alone (may pass a wrong epsilon); tiny: the draws times 2**-24')


def _given(args) -> dict:
  """The run options the user gave on the command line (``RUN_DEFAULTS`` keys)."""
  return {k: getattr(args, k) for k in RUN_DEFAULTS if getattr(args, k) is not None}


def _with_defaults(args):
  """``args`` with ``RUN_DEFAULTS`` filled in where an option was not given."""
  for k, v in RUN_DEFAULTS.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  return args


def run_option_problem(key: str, value, steps=None):
  """Why ``value`` is no good for the run option ``key`` (``steps``, ``seed``,
  ``max-ulp``), or None. ``steps`` bounds the seed (its gradient draws are 32-bit seeded)."""
  if key == 'steps' and value < 1:
    return 'must be >= 1'
  if key == 'seed':
    from equivalence_tests import core
    steps = steps if steps is not None and steps >= 1 else RUN_DEFAULTS['steps']
    top = core.max_seed(steps)
    if not 0 <= value <= top:
      return (f'must be between 0 and {top} (with {steps} steps: the gradient draws seed a '
              '32-bit random state from it)')
  if key == 'max-ulp' and not (math.isfinite(value) and value >= 0):
    return 'must be a finite number >= 0'
  return None


def check_run_options(steps, seed, max_ulp=None) -> None:
  """``--steps``, ``--seed`` and ``--max-ulp`` (None: not checked) as given.

  Raises:
    BadInput: one is out of range (names the option as typed).
  """
  for key, value in (('steps', steps), ('seed', seed), ('max-ulp', max_ulp)):
    if value is not None:
      problem = run_option_problem(key, value, steps)
      if problem:
        shown = f'{value:g}' if isinstance(value, float) else value
        raise BadInput(f'--{key} {shown}: {problem}')


# ---------------------------------------------------------------------------
# inputs


def legacy_module():
  """The module ``--legacy`` is evaluated in: real ``flax.optim`` if it exists, else the shim."""
  import flax
  mod = getattr(flax, 'optim', None)  # after optim_compat.install() it is the shim already
  if mod is None:
    import optim_compat as mod
  return mod


def legacy_is_shim() -> bool:
  """Whether ``--legacy`` defs come from ``optim_compat`` (no real ``flax.optim`` here)."""
  import optim_compat
  return legacy_module() is optim_compat


def legacy_namespace() -> dict:
  """Names for ``--legacy``: real ``flax.optim`` if it exists, else the shim."""
  mod = legacy_module()
  return {name: getattr(mod, name) for name in dir(mod) if not name.startswith('__')}


def evaluate(expr: str, what: str, namespace: dict):
  try:
    return eval(expr, dict(namespace))  # noqa: S307 - the user's own expression
  except Exception as e:  # noqa: BLE001
    raise BadInput(f'--{what} {expr!r} does not evaluate: {type(e).__name__}: {e}') from None


def legacy_def(expr: str):
  """The optimizer def ``--legacy`` evaluates to (an instance, e.g. ``Adam(learning_rate=1e-3)``).

  Raises:
    BadInput: the expression does not evaluate, names a def class without calling it, or
      is not an optimizer def.
  """
  from equivalence_tests import checker
  legacy = evaluate(expr, 'legacy', legacy_namespace())
  if isinstance(legacy, type) and hasattr(legacy, 'create'):
    raise BadInput(f'--legacy {expr!r} is the class {legacy.__name__}, not an optimizer def: '
                   f'call it with its hyper-parameters, e.g. "{legacy.__name__}(learning_rate=1e-3)"')
  if not hasattr(legacy, 'create'):
    raise BadInput(f'--legacy {expr!r} is {checker.a_type(legacy)}, not an optimizer def '
                   '(e.g. "Adam(learning_rate=1e-3)")')
  return legacy


def tx_namespace() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import optim_compat
  return {'optax': optax, 'jax': jax, 'jnp': jnp, 'np': np, 'optim_compat': optim_compat}


def tx_def(expr: str, params, seed: int = 0):
  """What ``--tx`` evaluates to: an Optax transformation or a callable ``params -> TrainState``.

  ``params`` (a pytree, ``ShapeDtypeStruct`` leaves drawn from ``seed``) is what a
  callable is tried on.

  Raises:
    BadInput: the expression does not evaluate, or is neither (``None``, ``optax.adam``
      not called, a callable that raises or returns no ``TrainState``); the message
      names the expression.
  """
  from equivalence_tests import checker
  tx = evaluate(expr, 'tx', tx_namespace())
  try:
    checker.validate_tx(tx, checker.materialize(params, seed), what=f'--tx {expr!r}')
  except (TypeError, ValueError) as e:
    raise BadInput(str(e)) from None
  return tx


def load_params(spec: str):
  """The params pytree named by ``--params`` (see the module docstring).

  Raises:
    BadInput: the file or attribute does not exist or cannot be read, or importing the
      module or calling the function named raised.
  """
  import jax
  import numpy as np
  if not spec:
    raise BadInput('--params is required')
  path = pathlib.Path(spec)
  if (spec.endswith('.npz') or spec.endswith('.json')) and path.exists() and not path.is_file():
    raise BadInput(f'--params {spec}: not a regular file')  # a FIFO would block forever
  if spec.endswith('.npz'):
    if path.is_file() and not zipfile.is_zipfile(path):
      raise BadInput(f'--params {spec}: not an .npz archive (numpy.savez writes one)')
    tree: dict = {}
    try:
      data = np.load(path)
      for key in data.files:
        parts = key.split('/')
        if '' in parts:
          raise BadInput(f'--params {spec}: key {key!r} has an empty part (keys are a/b/c)')
        node = tree
        for i, k in enumerate(parts[:-1]):
          node = node.setdefault(k, {})
          if not isinstance(node, dict):
            raise BadInput(f'--params {spec}: keys {"/".join(parts[:i + 1])!r} and {key!r} '
                           'clash: one is a leaf, the other goes below it')
        if parts[-1] in node:
          raise BadInput(f'--params {spec}: keys {key!r} and {key + "/..."!r} clash: one is a '
                         'leaf, the other goes below it')
        node[parts[-1]] = data[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
      raise BadInput(f'--params {spec}: cannot read: {e}') from None
    return tree
  if spec.endswith('.json'):
    try:
      raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
      raise BadInput(f'--params {spec}: cannot read: {e}') from None

    def build(node, where):
      if isinstance(node, dict) and 'shape' in node:
        shape = node['shape']
        if (not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
          raise BadInput(f'--params {spec}: {where or "/"}: shape {shape!r} is not a list of '
                         'non-negative integers')
        try:
          return jax.ShapeDtypeStruct(tuple(node['shape']), np.dtype(node.get('dtype', 'float32')))
        except (TypeError, ValueError) as e:
          raise BadInput(f'--params {spec}: {where or "/"}: {e}') from None
      if isinstance(node, dict):
        return {k: build(v, f'{where}/{k}') for k, v in node.items()}
      raise BadInput(f'--params {spec}: {where or "/"} is neither an object of leaves nor '
                     '{"shape": [...], "dtype": "..."}')
    return build(raw, '')
  module, _, attr = spec.partition(':')
  if not attr:
    raise BadInput(f'--params {spec!r}: expected module:attribute, file.npz or shapes.json')
  sys.path.insert(0, str(pathlib.Path.cwd()))
  try:
    value = importlib.import_module(module)
    for name in attr.split('.'):
      value = getattr(value, name)
  except (ImportError, AttributeError) as e:
    raise BadInput(f'--params {spec}: {e}') from None
  except Exception as e:  # noqa: BLE001 - the user's module failed as it was imported
    raise BadInput(f'--params {spec}: importing {module} raised {type(e).__name__}: {e}') from None
  if callable(value):
    try:
      value = value()
    except Exception as e:  # noqa: BLE001 - the user's function failed: bad input, not a difference
      raise BadInput(f'--params {spec}: calling it raised {type(e).__name__}: {e}') from None
  if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
    from equivalence_tests import checker
    raise BadInput(f'--params {spec} is {checker.a_type(value)} ({value!r:.40}), not a pytree '
                   'of float arrays: name a dict of arrays, or a function returning one')
  return value


def parse_devices(text, what: str | None = None) -> list[int]:
  """``--devices`` (``"1,2,4"``, spaces allowed after commas, or a list) as counts.

  ``what`` starts the message (default ``--devices 'TEXT'``; a pyproject entry names
  its file, entry and key).

  Raises:
    BadInput: an empty entry (``1,,2``), a non-integer, or a count < 1.
  """
  what = f'--devices {text!r}' if what is None else what
  if isinstance(text, (list, tuple)):
    items = list(text)
  else:
    items = str(text).split(',')
    if not all(t.strip() for t in items):
      raise BadInput(f'{what}: empty entry; expected comma-separated integers, e.g. 1,2,4,8')
  try:
    devices = [int(t) for t in items]
  except ValueError:
    raise BadInput(f'{what}: expected comma-separated integers') from None
  if not devices or min(devices) < 1:
    raise BadInput(f'{what}: counts must be >= 1')
  return devices


# ---------------------------------------------------------------------------
# trajectory files


def save_trajectory(path: pathlib.Path, results: dict, params, meta: dict) -> None:
  """Write ``record``'s file: the initial params, every run's trajectory, ``meta``."""
  import numpy as np
  from equivalence_tests import checker
  arrays, index = {}, {'params': {}, 'runs': {}}
  for key, value in checker.flat(params).items():
    index['params'][key] = name = f'a{len(arrays)}'
    arrays[name] = value
  for (mode, n), r in results.items():
    run = index['runs'].setdefault(f'{mode}/{n}', {'replicas': r['replicas']['legacy'],
                                                   'steps': {}})
    for step, leaves in r['legacy'].items():
      for key, value in leaves.items():
        run['steps'].setdefault(str(step), {})[key] = name = f'a{len(arrays)}'
        arrays[name] = value
  index['tree'] = _nested_names(params, index['params'])
  index['dtypes'] = checker.dtype_names(params)
  index['meta'] = meta
  arrays['index'] = np.frombuffer(json.dumps(index).encode(), np.uint8)
  # a fresh temporary sibling (a fixed name would replace, then delete, a file so named)
  fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp.npz', dir=path.parent)
  tmp = pathlib.Path(tmp)
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez_compressed(f, **arrays)
    umask = os.umask(0)  # mkstemp makes it 0600; a trajectory gets the usual mode
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    tmp.replace(path)
  finally:
    tmp.unlink(missing_ok=True)


def _nested_names(params, names):
  """The params tree as nested dicts of array names, or ``None`` if not all dicts."""
  import jax

  def walk(node, prefix):
    if isinstance(node, dict) or hasattr(node, 'unfreeze'):
      return {k: walk(v, prefix + [jax.tree_util.DictKey(k)]) for k, v in node.items()}
    key = jax.tree_util.keystr(tuple(prefix))
    if key not in names:
      raise KeyError(key)
    return names[key]
  try:
    return walk(params, [])
  except KeyError:
    return None


def load_trajectory(path: str):
  """``(index, arrays)`` of a ``record`` file.

  Raises:
    BadInput: missing, truncated or not a trajectory file.
  """
  import numpy as np
  if pathlib.Path(path).is_file() and not zipfile.is_zipfile(path):
    raise BadInput(f'--against {path}: not a readable trajectory file (not a complete .npz '
                   'archive; `optim-migrate record` writes one)')
  try:
    data = np.load(path)
    index = json.loads(bytes(data['index']).decode())
    arrays = {k: data[k] for k in data.files if k != 'index'}
  except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise BadInput(f'--against {path}: not a readable trajectory file ({e})') from None
  return index, arrays


# ---------------------------------------------------------------------------
# commands


def _entry_max_ulp(value):
  """An entry's (or the command line's) ``max-ulp`` as a float; None: the def's default."""
  return None if value is None else float(value)


def _run_check(legacy_expr, tx_expr, params_spec, devices, mode, steps, seed, max_ulp,
               label='', grads=DEFAULT_GRADS, rows=None, name='') -> int:
  """One comparison; its report printed, or (``rows``, a list) appended as a
  ``codemod.output_formats.check_row``. Returns the exit status."""
  from equivalence_tests import checker
  if not legacy_expr or not tx_expr:
    raise BadInput('check needs --legacy and --tx (or --against with --tx, or '
                   '[[tool.optim-migrate.check]] entries)')
  legacy = legacy_def(legacy_expr)
  params = load_params(params_spec)
  tx = tx_def(tx_expr, params, seed)
  try:
    report = checker.check(legacy, tx, params, steps=steps, devices=parse_devices(devices),
                           mode=mode, seed=seed, max_ulp=max_ulp, grads=grads)
  except (ValueError, TypeError) as e:
    raise BadInput(str(e)) from None
  if rows is None:
    print(f'{label}{report}')
  else:
    from codemod.output_formats import check_row
    rows.append(check_row(name, legacy_expr, tx_expr, report))
  return EXIT_OK if report.ok else EXIT_DIFFERS


def _check_against(args, rows=None) -> int:
  import jax
  import numpy as np
  from equivalence_tests import checker
  if not args.tx:
    raise BadInput('--against needs --tx')
  index, arrays = load_trajectory(args.against)
  meta = index['meta']
  grads = meta.get('grads', RECORDED_GRADS_BEFORE)
  if grads not in GRADS:
    raise BadInput(f'--against {args.against}: recorded with unknown gradient draws {grads!r} '
                   f'(this version knows {", ".join(GRADS)}; a newer record wrote it?)')
  runs = _recorded_runs(args, index, meta)
  if index['tree'] is not None and not args.params:
    params = jax.tree_util.tree_map(lambda name: arrays[name], index['tree'])
  else:
    params = checker.materialize(load_params(args.params), meta['seed'])
    got = sorted(checker.flat(params))
    if got != sorted(index['params']):
      raise BadInput(f'--params leaves {got} differ from the recorded ones '
                     f'{sorted(index["params"])}')
  tx = tx_def(args.tx, params)
  results = {}
  for run_key, run in runs.items():
    mode, n = run_key.split('/')
    try:
      mine = checker.collect(None, tx, params, grads=grads, steps=meta['steps'],
                             seed=meta['seed'], mode=mode, devices=[int(n)])
    except (ValueError, TypeError) as e:
      raise BadInput(str(e)) from None
    mine = mine[(mode, int(n))]
    legacy = {int(step): {k: arrays[name] for k, name in leaves.items()}
              for step, leaves in run['steps'].items()}
    for step, leaves in legacy.items():  # a tampered or mismatched file: bad input, not a diff
      for k, value in leaves.items():
        if k in mine['tx'].get(step, {}) and np.shape(value) != np.shape(mine['tx'][step][k]):
          raise BadInput(f'--against {args.against}: step {step} leaf {k} has shape '
                         f'{np.shape(value)}, the params {np.shape(mine["tx"][step][k])}')
    results[(mode, int(n))] = {'legacy': legacy, 'tx': mine['tx'],
                               'replicas': {'legacy': run['replicas'],
                                            'tx': mine['replicas']['tx']}}
  max_ulp = args.max_ulp
  if max_ulp is None:  # the recorded def's default bound, as check() gives it
    max_ulp = checker.default_max_ulp(_literal_def(str(meta['legacy'])))
  report = checker.report(results, index['dtypes'], meta['steps'], max_ulp, grads=grads,
                          notes=checker.grads_notes(grads, params))
  if rows is not None:
    from codemod.output_formats import check_row
    rows.append(check_row(args.against, meta['legacy'], args.tx, report))
    return EXIT_OK if report.ok else EXIT_DIFFERS
  print(f'against {args.against} (recorded with {meta["legacy"]} on jax {meta["jax"]}, '
        f'flax {meta["flax"]}):\n{report}')
  return EXIT_OK if report.ok else EXIT_DIFFERS


def _recorded_runs(args, index, meta) -> dict:
  """The recorded runs ``check --against`` compares: all of them, or those of the device
  counts ``--devices`` names. ``--mode``, ``--steps``, ``--seed`` and ``--grads`` are the
  recording's (a file without ``grads`` recorded the random draws).

  Raises:
    BadInput: ``--devices`` names a count the file was not recorded on, or ``--mode``,
      ``--steps``, ``--seed``, ``--grads`` or ``--legacy`` is given and differs from the
      recorded one
      (``--legacy``: another def or other hyper-parameters; ``Adam(1e-3)`` and
      ``Adam(learning_rate=0.001)`` are the same).
  """
  runs = index['runs']
  recorded = sorted({int(key.split('/')[1]) for key in runs})
  given = _given(args)
  recorded_with = {'mode': meta['mode'], 'steps': meta['steps'], 'seed': meta['seed'],
                   'grads': meta.get('grads', RECORDED_GRADS_BEFORE)}
  for key, value in recorded_with.items():
    if key in given and given[key] != value:
      raise BadInput(f'--{key} {given[key]} does not apply with --against: {args.against} was '
                     f'recorded with --{key} {value} (record again to check another)')
  if args.legacy is not None and not _same_legacy(args.legacy, meta.get('legacy')):
    raise BadInput(f'--legacy {args.legacy!r} does not apply with --against: {args.against} was '
                   f'recorded with --legacy {meta.get("legacy")!r} (record again to check '
                   'another)')
  if 'devices' not in given:
    return runs
  wanted = parse_devices(given['devices'])
  missing = [n for n in wanted if n not in recorded]
  if missing:
    raise BadInput(f'--devices {given["devices"]} does not apply with --against: {args.against} '
                   f'was recorded on device counts {recorded} only (--devices may pick among '
                   f'those; record again with --devices to check others)')
  return {key: run for key, run in runs.items() if int(key.split('/')[1]) in wanted}


def _literal_def(expr: str):
  """The def ``expr`` builds when it is a call of a ``--legacy`` name with literal arguments
  only (so a file's recorded expression is never evaluated as code), else None."""
  import warnings
  from optim_compat import def_text
  try:
    call = def_text.parse_call(expr)
    if call.dotted or call.name is None:
      return None
    args, kwargs = call.literals()
  except (ValueError, TypeError, MemoryError, RecursionError):  # (DefTextError is one)
    return None
  cls = legacy_namespace().get(call.name)
  if not (isinstance(cls, type) and hasattr(cls, 'create')):
    return None
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      return cls(*args, **kwargs)
  except Exception:  # noqa: BLE001 - not a def it can build: compared as text instead
    return None


def _same_legacy(given: str, recorded) -> bool:
  """Whether ``--legacy`` ``given`` is the def a trajectory was recorded with: the same
  expression, or the same def class with equal hyper-parameters.

  Raises:
    BadInput: ``given`` differs in text and does not evaluate to a def.
  """
  import ast
  if not isinstance(recorded, str):
    return False
  try:
    if ast.dump(ast.parse(given.strip(), mode='eval')) == ast.dump(
        ast.parse(recorded.strip(), mode='eval')):
      return True
  except SyntaxError:
    pass
  mine, theirs = legacy_def(given), _literal_def(recorded)
  if theirs is None or type(mine).__name__ != type(theirs).__name__:
    return False
  a, b = getattr(mine, 'hyper_params', None), getattr(theirs, 'hyper_params', None)
  try:
    return bool(a == b)
  except Exception:  # noqa: BLE001 - e.g. array-valued: fall back to their text
    return repr(a) == repr(b)


#: ``[[tool.optim-migrate.check]]`` keys: what each value must be, as a predicate and in words.
ENTRY_KEYS = {
    'name': (lambda v: isinstance(v, str), 'a string'),
    'legacy': (lambda v: isinstance(v, str), 'a string (a legacy def expression)'),
    'tx': (lambda v: isinstance(v, str), 'a string (an Optax expression)'),
    'params': (lambda v: isinstance(v, str), 'a string (module:attribute, file.npz or '
                                             'shapes.json)'),
    'devices': (lambda v: isinstance(v, str) or _is_int(v)
                or (isinstance(v, list) and all(_is_int(x) for x in v)),
                'a string ("1,2,4"), an integer or an array of integers'),
    'mode': (lambda v: v in ('single', 'pmap', 'sharded'), 'one of "single", "pmap", "sharded"'),
    'steps': (lambda v: _is_int(v), 'an integer'),
    'seed': (lambda v: _is_int(v), 'an integer'),
    'max-ulp': (lambda v: _is_int(v) or isinstance(v, float), 'a number'),
    'grads': (lambda v: v in GRADS, 'one of ' + ', '.join(f'"{g}"' for g in GRADS)),
}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _config_entries(path: str) -> list[dict]:
  """The ``[[tool.optim-migrate.check]]`` entries of the TOML file ``path``, checked.

  Raises:
    BadInput: the file is missing, unreadable or not TOML; ``tool``, ``tool.optim-migrate``
      or an entry is not a table; there are no entries; an entry has an unknown key, a
      value of the wrong type or out of range (``devices = "x"``, ``steps = 0``, a seed
      outside 0..max, a negative or non-finite ``max-ulp``); the message names the file,
      the entry (its index, and its name if it has one) and the key.
  """
  from codemod.config import ConfigError, read_table
  file = pathlib.Path(path)
  if not file.is_file():
    raise BadInput(f'no --legacy/--tx given and no {path} with [[tool.optim-migrate.check]]')
  try:
    table = read_table(path) or {}
  except ConfigError as e:
    raise BadInput(str(e)) from None
  entries = table.get('check', [])
  if isinstance(entries, dict):
    entries = [entries]
  if not isinstance(entries, list):
    raise BadInput(f'{path}: tool.optim-migrate.check must be an array of tables '
                   f'([[tool.optim-migrate.check]]), got {entries!r}')
  if not entries:
    raise BadInput(f'{path} has no [[tool.optim-migrate.check]] entries')
  for i, entry in enumerate(entries):
    where = f'{path}: [[tool.optim-migrate.check]] entry {i}'
    if not isinstance(entry, dict):
      raise BadInput(f'{where}: must be a table, got {entry!r}')
    if isinstance(entry.get('name'), str):
      where += f' ({entry["name"]!r})'
    unknown = set(entry) - set(ENTRY_KEYS)
    if unknown:
      raise BadInput(f'{where}: unknown key(s) {sorted(unknown)}; valid: {sorted(ENTRY_KEYS)}')
    for key, value in entry.items():
      ok, expected = ENTRY_KEYS[key]
      if not ok(value):
        raise BadInput(f'{where}: {key} must be {expected}, got {value!r}')
    if 'devices' in entry:
      parse_devices(entry['devices'], f'{where}: devices = {entry["devices"]!r}')
    steps = entry.get('steps', RUN_DEFAULTS['steps'])
    for key in ('steps', 'seed', 'max-ulp'):
      if key in entry:
        problem = run_option_problem(key, entry[key], steps)
        if problem:
          raise BadInput(f'{where}: {key} = {entry[key]!r}: {problem}')
  return entries


def cmd_check(args) -> int:
  """``check``: the comparisons printed in ``--output-format`` (``full``: the tables).
  Returns the exit status (the worst of the comparisons'; 2 bad input)."""
  from codemod import output_formats
  fmt = getattr(args, 'output_format', 'full')
  if fmt not in output_formats.CHECK_FORMATS:
    print(f'optim-migrate check: --output-format {fmt}: check compares numbers on pytree '
          'leaves, with no file and line for a GitHub annotation or a SARIF result; use '
          f'--output-format json (the structured form) or concise', file=sys.stderr)
    return EXIT_BAD_INPUT
  rows = None if fmt == 'full' else []
  try:
    status = _check(args, rows)
  except BadInput as e:
    print(f'optim-migrate check: {e}', file=sys.stderr)
    return EXIT_BAD_INPUT
  if rows is not None:
    sys.stdout.write(output_formats.render_check(fmt, rows))
  return status


def _check(args, rows) -> int:
  """``check``'s comparisons (``rows``: see :func:`_run_check`). Raises BadInput."""
  check_run_options(args.steps, args.seed, args.max_ulp)
  if args.against:
    return _check_against(args, rows)
  # what the command line gives applies to the entries that do not set it themselves
  given = _given(args)
  _with_defaults(args)
  check_run_options(args.steps, args.seed)  # the seed's bound depends on the steps
  # the rows of a structured format (``full`` prints as it goes, as it always did)
  out = lambda name: {} if rows is None else {'rows': rows, 'name': name}
  if args.tx or args.legacy:
    return _run_check(args.legacy, args.tx, args.params, args.devices, args.mode,
                      args.steps, args.seed, args.max_ulp, grads=args.grads, **out(''))
  status = EXIT_OK
  for i, e in enumerate(_config_entries(args.config)):
    run = {**RUN_DEFAULTS, **given, **{k: e[k] for k in RUN_DEFAULTS if k in e}}
    label = f'[{e.get("name", i)}] '
    try:
      check_run_options(run['steps'], run['seed'])
    except BadInput as err:
      raise BadInput(f'{args.config}: [[tool.optim-migrate.check]] entry {label.strip()}: '
                     f'{err}') from None
    status = max(status, _run_check(
        e.get('legacy'), e.get('tx'), e.get('params'), run['devices'], run['mode'],
        run['steps'], run['seed'], _entry_max_ulp(e.get('max-ulp', args.max_ulp)), label=label,
        grads=run['grads'], **out(str(e.get('name', i)))))
  return status


def _trajectory_problem(path: pathlib.Path):
  """Why ``path`` is not a trajectory file ``record`` wrote, or None (standard library only:
  this runs in the old stack; reads the zip directory and the ``index`` array only)."""
  if not zipfile.is_zipfile(path):
    return 'not an .npz archive'
  try:
    with zipfile.ZipFile(path) as z:
      raw = z.read('index.npy')
    # numpy's .npy: magic, version, little-endian header length (2 bytes in 1.0, 4 after)
    if raw[:6] != b'\x93NUMPY':
      return 'its index is not a numpy array'
    size = 2 if raw[6] == 1 else 4
    data = raw[8 + size + int.from_bytes(raw[8:8 + size], 'little'):]
    index = json.loads(data.decode())
  except KeyError:
    return 'an archive without record\'s index'
  except (OSError, ValueError, IndexError, zipfile.BadZipFile, RuntimeError) as e:
    return f'its index is unreadable: {e}'
  if not (isinstance(index, dict) and isinstance(index.get('meta'), dict)
          and 'legacy' in index['meta'] and isinstance(index.get('runs'), dict)):
    return 'an archive without record\'s metadata'
  return None


def check_output(path: str, params: str | None = None) -> pathlib.Path:
  """``record``'s ``-o``, checked before anything is computed (standard library only: this
  runs in the old stack). Nothing is created.

  An existing file is replaced only if it is a trajectory ``record`` wrote (an
  ``.npz`` with its index and metadata), and never when it is the ``--params`` file
  (also through another path or a symlink).

  Raises:
    BadInput: its directory does not exist, is not a directory or is not writable, the
      path is a directory, the ``--params`` file, or an existing file that is no
      trajectory (``victim.py``) (names the path).
  """
  out = pathlib.Path(path)
  parent = out.parent
  if out.is_dir():
    raise BadInput(f'-o {path}: cannot write there: it is a directory')
  if not parent.is_dir():
    what = 'is not a directory' if parent.exists() else 'does not exist'
    raise BadInput(f'-o {path}: cannot write there: its directory {parent} {what}')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise BadInput(f'-o {path}: cannot write there: its directory {parent} is not writable')
  if params and out.exists() and pathlib.Path(params).exists():
    try:
      same = os.path.samefile(out, params)
    except OSError:
      same = False
    if same:
      raise BadInput(f'-o {path}: is the --params file {params}; record never replaces its '
                     'input (write the trajectory to another file, e.g. traj.npz)')
  if out.is_symlink() and not out.exists():
    raise BadInput(f'-o {path}: a symlink to a missing file; not replaced (remove it or pick '
                   'another name)')
  if out.exists():
    problem = _trajectory_problem(out) if out.is_file() else 'not a regular file'
    if problem:
      raise BadInput(f'-o {path}: exists and is not a trajectory written by record ({problem}); '
                     'not replaced (remove it or pick another name)')
  return out


def cmd_record(args) -> int:
  import flax
  import jax
  from equivalence_tests import checker
  _with_defaults(args)
  try:
    out = check_output(args.output, args.params)
    check_run_options(args.steps, args.seed)
    if not args.legacy:
      raise BadInput('record needs --legacy')
    legacy = legacy_def(args.legacy)
    params = load_params(args.params)
    devices = parse_devices(args.devices)
    if legacy_is_shim():  # a trajectory of the shim proves nothing about the old code
      print(f'optim-migrate record: note: flax.optim is not importable here (flax '
            f'{flax.__version__}): recording optim_compat\'s {type(legacy).__name__} (the shim), '
            'not real flax.optim; run record in the old stack (jax 0.4.13, flax 0.5.3) to prove '
            'against what you ran before', file=sys.stderr)
    try:
      params = checker.materialize(params, args.seed)
      results = checker.collect(legacy, None, params, grads=args.grads, steps=args.steps,
                                seed=args.seed, mode=args.mode, devices=devices)
    except (ValueError, TypeError) as e:
      raise BadInput(str(e)) from None
  except BadInput as e:
    print(f'optim-migrate record: {e}', file=sys.stderr)
    return EXIT_BAD_INPUT
  meta = {'legacy': args.legacy, 'steps': args.steps, 'seed': args.seed, 'mode': args.mode,
          'grads': args.grads, 'devices': devices, 'jax': jax.__version__,
          'flax': flax.__version__}
  try:
    save_trajectory(out, results, params, meta)
  except OSError as e:
    print(f'optim-migrate record: cannot write {out}: {e}', file=sys.stderr)
    return EXIT_BAD_INPUT
  print(f'wrote {out}: {args.legacy}, {args.steps} steps, {args.grads} gradients, {args.mode} '
        f'on {devices} device(s), jax {jax.__version__}, flax {flax.__version__}')
  return EXIT_OK
