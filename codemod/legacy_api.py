"""The legacy ``flax.optim`` API as data: what each member becomes, and the words that find it.

Beside ``optim_compat/spec.py`` (the optimizer defs and their Optax forms), this
is the migration knowledge the codemod's rules read: the members of a legacy
``Optimizer`` and of a def, the legacy names with a modern home (annotations,
``DynamicScale``, ``ModelParamTraversal``), the checkpoint readers that restore
one, and the submodules. The text prefilters (which files are parsed, which
statements are analysed, which masked notebook lines and which importers hold
legacy code) are derived from these tables, so a new member is one row.
"""
from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple, Optional

LEGACY = 'flax.optim'
#: Legacy submodules (``flax.optim.<module>.<Name>``), flax.optim 0.5.3.
SUBMODULES = frozenset({'base', 'adabelief', 'adadelta', 'adafactor', 'adagrad', 'adam', 'lamb',
                        'lars', 'momentum', 'rmsprop', 'sgd', 'weight_norm', 'dynamic_scale'})
#: Legacy defs the codemod converts: the migration table plus the wrappers.
MULTI, WEIGHT_NORM, TRAVERSAL = 'MultiOptimizer', 'WeightNorm', 'ModelParamTraversal'
#: ``DEF_NAMES``: the migration table's defs (``optim_compat.spec.SPECS``) and those two; made at
#: first use (:func:`__getattr__`), since the table imports NumPy and the text prefilters here
#: need none of it.
#: The label of the leaves no group of a MultiOptimizer / ``focus=`` selects.
FROZEN = 'frozen'


@dataclasses.dataclass(frozen=True)
class Member:
  """A member of a legacy ``flax.optim.Optimizer``.

  Attributes:
    path: the attribute path on the optimizer (``('state', 'step')``).
    rule: the rule that converts its uses (or, without ``train_state``, flags them
      where no method rule converts the call).
    train_state: the ``TrainState`` member it becomes, when it is a plain rename
      (``.target`` -> ``.params``); None: no attribute counterpart.
    fixed: the report text of the rename (``train_state`` set).
    telltale: only legacy code spells it (``.target``, ``.state.step``): a file holding it
      may still use legacy optimizers.
  """
  path: tuple[str, ...]
  rule: str
  train_state: Optional[str] = None
  fixed: str = ''
  telltale: bool = False

  @property
  def name(self) -> str:
    return self.path[-1]


OPTIMIZER_MEMBERS = (
    Member(('target',), 'OM003', 'params', '.target -> .params', telltale=True),
    Member(('state', 'step'), 'OM004', 'step',
           '.state.step -> .step (TrainState.create starts it as the Python int 0, legacy as an '
           'int32 array, and it stays an int outside jit: a learning rate computed from it there '
           'is float64 math (legacy: float32), measured 1 ulp on the params; a jitted step '
           'returns an array)', telltale=True),
    Member(('apply_gradient',), 'OM002', telltale=True),
    Member(('optimize',), 'OM011', telltale=True),
    Member(('compute_gradient',), 'OM011'),
    Member(('compute_gradients',), 'OM011'),
    Member(('replicate',), 'OM009'),
    Member(('unreplicate',), 'OM010'),
    Member(('optimizer_def',), 'OM012'),
    Member(('state',), 'OM103'),
    Member(('state_dict',), 'OM116'),
    Member(('restore_state',), 'OM116'),
)
#: Optimizer members renamed on a TrainState: path -> member.
RENAMES = {m.path: m for m in OPTIMIZER_MEMBERS if m.train_state is not None}
#: Optimizer attributes a TrainState does not have -> the rule that flags a use no rule
#: converts (``opt.state`` is state surgery, OM103; the others have no equivalent, OM116).
LEGACY_ONLY_ATTRS = {m.name: 'OM103' if m.rule == 'OM103' else 'OM116'
                     for m in OPTIMIZER_MEMBERS if m.train_state is None and len(m.path) == 1
                     and m.name != 'apply_gradient'}
#: What a flax.optim Optimizer or a TrainState answers (its members, fields and methods): a
#: name read for anything else (``ex.inputs``, ``batch.source``) holds neither.
OPTIMIZER_OR_STATE_ATTRS = frozenset({
    *(m.path[0] for m in OPTIMIZER_MEMBERS), 'optimizer_def', 'state', 'target', 'replace',
    'params', 'step', 'opt_state', 'tx', 'apply_fn', 'apply_gradients', 'create'})
#: The fields of a legacy ``flax.optim.Optimizer`` (a ``flax.struct`` dataclass).
OPTIMIZER_FIELDS = frozenset({'optimizer_def', 'state', 'target'})
# the legacy state classes, and the shim's (state surgery in a file converted through the
# legacy view, OM017: `optim.OptimizerState(step, ps)`, `optim.adam._AdamParamState(m, v)`)
STATE_CLASSES = {'OptimizerState': 'optim_compat.OptimizerState',
                 **{f'_{name}ParamState': f'optim_compat.{module}._{name}ParamState'
                    for module, name in (('adam', 'Adam'), ('momentum', 'Momentum'),
                                         ('adabelief', 'AdaBelief'), ('adadelta', 'Adadelta'),
                                         ('adafactor', 'Adafactor'), ('adagrad', 'Adagrad'),
                                         ('lamb', 'LAMB'), ('lars', 'LARS'),
                                         ('rmsprop', 'RMSProp'))}}
# receivers that hold a configuration, not a train state: `config.optimizer == 'sgd'`,
# `FLAGS.optimizer`, `self.hparams.optimizer` name a setting (matched on the receiver's last
# name, lower-cased; a field so read is no sign of a container)
CONFIG_RECEIVER = re.compile(
    r'(?:^|_)(?:config|configs|cfg|conf|flags|args|hparams|hps|hp|opts|options|settings)$')
#: Optimizer attributes that fail on a ``TrainState`` (flagged where a converted
#: factory's value may reach a file that keeps its legacy code).
FLOW_FAILING_ATTRS = frozenset({'target', 'apply_gradient', *LEGACY_ONLY_ATTRS})
#: Def attributes (other than ``create``) that an Optax transformation does not have.
DEF_ONLY_ATTRS = frozenset({'hyper_params', 'init_state', 'apply_gradient', 'update_hyper_params',
                            'init_param_state', 'apply_param_gradient', 'state_dict',
                            'restore_state'})
#: Array attributes a legacy ``.state.step`` had and a fresh ``TrainState.step`` (an int) lacks.
ARRAY_ONLY_ATTRS = frozenset({'astype', 'dtype', 'shape', 'ndim', 'item', 'block_until_ready',
                              'tolist', 'copy', 'size', 'addressable_shards', 'sharding',
                              'devices'})

#: Legacy names replaced in type annotations (OM007): name -> (emitted, (module, object)).
ANNOTATIONS = {'Optimizer': ('train_state.TrainState', ('flax.training', 'train_state')),
               'OptimizerDef': ('optax.GradientTransformation', ('optax', None)),
               # (a def too: `-> optim.MultiOptimizer` on scenic's get_backbone_multioptimizer)
               'MultiOptimizer': ('optax.GradientTransformation', ('optax', None))}
#: Legacy names that have a module of their own on Flax >= 0.6 (OM006).
DYNAMIC_SCALE = frozenset({'DynamicScale', 'dynamic_scale'})
#: Checkpoint readers whose target may be a legacy optimizer (OM013): qname -> target arg
#: (position, keyword).
RESTORES = {'flax.training.checkpoints.restore_checkpoint': (1, 'target'),
            'flax.serialization.from_state_dict': (0, 'target'),
            'flax.serialization.from_bytes': (0, 'target')}
#: Readers returning a checkpoint's raw state dict (no target): ``restore_checkpoint(d)`` /
#: ``(d, target=None)``, ``msgpack_restore(b)``. A flax.optim Optimizer's dict has the keys
#: :data:`CHECKPOINT_LEGACY_KEYS`; a TrainState's has ``step``, ``params``, ``opt_state``.
RAW_RESTORES = frozenset({'flax.training.checkpoints.restore_checkpoint',
                          'flax.serialization.msgpack_restore'})
#: Top-level keys of a flax.optim Optimizer's state dict (``raw['target']``,
#: ``raw['state']['step']``): read on a raw restore, OM121 where the run saves TrainStates.
CHECKPOINT_LEGACY_KEYS = frozenset({'target', 'state'})
#: Checkpoint writers: ``{qualified name: (position, keyword) of the directory argument}``.
#: Flax >= 0.7 writes with orbax, which rejects a relative directory.
SAVES = {'flax.training.checkpoints.save_checkpoint': (0, 'ckpt_dir'),
         'flax.training.checkpoints.save_checkpoint_multiprocess': (0, 'ckpt_dir')}
#: ``flax.jax_utils`` functions whose result is the optimizer they are given.
REPLICATE_FNS = frozenset({'flax.jax_utils.replicate', 'flax.jax_utils.unreplicate'})
class Wrapper(NamedTuple):
  """A function wrapper whose result is called with the wrapped function's arguments."""
  returns_result: bool  # calling it returns what the function returns (jit: yes; make_jaxpr: no)
  methods: tuple[str, ...] = ()  # methods of the wrapped function taking the same arguments


#: Wrappers whose result takes the wrapped function's arguments unchanged (``p_step =
#: jax.pmap(step)``; called as ``W(step, ...)``, or configured first as ``W(**kw)(step)`` and
#: ``@W(**kw)``). alpa's ``parallelize`` (``parax`` until 2021) is how alpa's tests and
#: benchmarks call the flax.optim steps they were written with (``.get_executable(opt, b)``
#: compiles for those arguments); ``jax._src.api`` is where alpa imported ``make_jaxpr`` from.
WRAPPERS = {'jax.jit': Wrapper(True, ('lower',)), 'jax.pmap': Wrapper(True, ('lower',)),
            'jax.checkpoint': Wrapper(True), 'jax.remat': Wrapper(True),
            'jax.make_jaxpr': Wrapper(False), 'jax._src.api.make_jaxpr': Wrapper(False),
            'alpa.parallelize': Wrapper(True, ('get_executable',)),
            'parax.parallelize': Wrapper(True, ('get_executable',))}
CALL_WRAPPERS = frozenset(WRAPPERS)
# wrappers a def's bound `create` is handed to, then called with the target (scenic's
# `jax.jit(get_optimizer(config).create, backend='cpu')(params)`: the state made on the CPU)
CREATE_WRAPPERS = frozenset({'jax.jit'})
#: Calls that return one bare array (``jnp.zeros(3)``, ``np.ones(...)``, ``jax.random.normal(...)``):
#: by qualified-name prefix, less the exceptions. An optimizer on such a target cannot become a
#: TrainState: Flax's ``TrainState.apply_gradients`` tests ``'overwrite_with_gradient' in
#: grads``, a TypeError on a jax.Array (measured on flax 0.12.8), so the file stays on the shim.
ARRAY_CALL_PREFIXES = ('jax.numpy.', 'numpy.', 'jax.random.')
NOT_ARRAY_CALLS = frozenset({'numpy.load', 'jax.numpy.load', 'numpy.savez', 'jax.random.split',
                             'jax.random.PRNGKey', 'jax.random.key', 'numpy.random.default_rng',
                             'numpy.random.RandomState', 'numpy.random.seed'})
#: Serializers that pickle what they are given (a TrainState's Optax closures do not pickle).
PICKLERS = frozenset({'pickle.dump', 'pickle.dumps', 'joblib.dump'})
#: Reflection on an optimizer's fields by name (flagged on converted optimizers), and pickling.
#: ``isinstance`` / ``issubclass``: a class tuple naming both a flax.optim Optimizer and the
#: TrainState (OM015).
TYPE_TESTS = frozenset({'builtins.isinstance', 'builtins.issubclass'})
TRAIN_STATE_CLASSES = frozenset({'flax.training.train_state.TrainState'})
#: Flax's ``freeze``: ``opt.replace(target=flax.core.freeze(p))`` keeps the kind the
#: TrainState's params have once converted (codemod.rules.attributes, OM003)
FREEZE_FUNCTIONS = frozenset({'flax.core.freeze', 'flax.core.frozen_dict.freeze'})
REFLECTION_FNS = frozenset({'builtins.getattr', 'builtins.hasattr', 'builtins.setattr',
                            'builtins.delattr', 'dataclasses.replace',
                            'flax.serialization.to_state_dict', *PICKLERS})
#: Members only a flax.optim Optimizer has, read on a pickle-loaded name (OM018 / OM121).
PICKLED_MEMBER_READS = frozenset({'target', 'state', 'apply_gradient', 'optimizer_def',
                                  'state_dict', 'restore_state', 'compute_gradient'})
#: Deserializers of what :data:`PICKLERS` wrote (``state = pickle.load(f)``: OM018).
PICKLE_LOADERS = frozenset({'pickle.load', 'pickle.loads', 'joblib.load'})
#: Calls whose result is their argument, as pickled (``pickle.dump(unreplicate(opt), f)``).
PICKLE_PASSTHROUGH = frozenset({'flax.jax_utils.unreplicate', 'jax.device_get'})
#: Calls that only read their argument: ``opt.state...`` passed to one (``jax.tree_util.
#: tree_leaves(opt.state.param_states)``) becomes a read of the legacy view (OM017); the view
#: is a fresh tree, so a read that may mutate it (or a name bound to it) keeps OM103.
#: Table defs whose legacy per-parameter state is laid out by their hyper-parameters
#: (Adafactor: ``v_row`` / ``v_col`` or ``v`` by ``factored`` and ``min_dim_size_to_factor``,
#: ``m`` only with ``beta1``): the legacy view's def (OM017) needs their literal arguments;
#: any other def's view takes the def with no arguments when its own are not literals.
LAYOUT_BY_HYPER_PARAMS = frozenset({'Adafactor'})
STATE_READERS = frozenset({
    'jax.tree_util.tree_leaves', 'jax.tree_leaves', 'jax.tree_util.tree_flatten',
    'jax.tree_flatten', 'jax.tree_util.tree_structure', 'jax.tree_structure',
    'jax.tree_util.tree_map', 'jax.tree_map', 'jax.device_get', 'numpy.asarray', 'numpy.array',
    'jax.numpy.asarray', 'jax.numpy.array', 'builtins.print', 'builtins.len', 'builtins.repr',
    'builtins.str', 'builtins.float', 'builtins.int', 'flax.traverse_util.flatten_dict',
    'flax.serialization.to_state_dict'})
#: Module names the rewrite may import and use.
EMITTED_NAMES = frozenset({'optax', 'train_state', 'optim_compat', 'jax_utils', 'traverse_util',
                           'flax_train_state'})
#: The name ``flax.training.train_state`` is imported as where ``train_state`` is bound to
#: something else in the module (a variable, a parameter, another library's module).
TRAIN_STATE_ALIAS = 'flax_train_state'
#: The module each of :data:`EMITTED_NAMES` stands for: an import binding the name to any
#: other module (`from t5x import train_state`) is a conflict like an assignment.
EMITTED_MODULES = {'optax': 'optax', 'train_state': 'flax.training.train_state',
                   'optim_compat': 'optim_compat', 'jax_utils': 'flax.jax_utils',
                   'traverse_util': 'flax.traverse_util',
                   'flax_train_state': 'flax.training.train_state'}
#: The modern module whose ``TrainState.create`` a migrated factory returns.
TRAIN_STATE_CREATE = 'flax.training.train_state.TrainState.create'
INJECT = 'optax.inject_hyperparams'
#: Pre-Linen models (OM105).
NN_PREFIX = 'flax.nn'


def legacy_symbol(qname: str) -> Optional[str]:
  """``'Adam'`` for ``flax.optim.Adam`` or ``flax.optim.adam.Adam``; a submodule
  name for ``flax.optim.adam``; None for anything else."""
  if not qname.startswith(LEGACY + '.'):
    return None
  parts = qname[len(LEGACY) + 1:].split('.')
  if len(parts) == 1:
    return parts[0]
  if len(parts) == 2 and parts[0] in SUBMODULES:
    return parts[1]
  return None


# -- the prefilter vocabulary, derived from the tables above ---------------------------------
#: Member spellings only legacy code has.
TELLTALES = tuple(dict.fromkeys(
    '.' + '.'.join(m.path) + ('(' if m.name == 'optimize' else '') for m in OPTIMIZER_MEMBERS
    if m.telltale))
#: Words a top-level statement needs for any rule to see it (statements without one, nor a
#: name such a statement binds, are set aside before the analysis: ``codemod.facts.setaside``).
WORDS = frozenset({
    'optim', 'create', 'nn', *(part for m in OPTIMIZER_MEMBERS for part in m.path),
    *DEF_ONLY_ATTRS, *ANNOTATIONS, *DYNAMIC_SCALE, TRAVERSAL, 'OptimizerState',
    *(qname.rsplit('.', 1)[1] for qname in RESTORES),
    *(qname.rsplit('.', 1)[1] for qname in PICKLE_LOADERS)})  # (`x = pickle.load(f)`: OM018)
WORDS_RE = re.compile(r'\b(' + '|'.join(sorted(WORDS)) + r')\b')
#: Spellings that reference flax.optim (the file prefilter, :func:`may_need_rewrite`):
#: ``flax.optim`` (``import flax.optim``, ``from flax.optim[.adam] import``, ``flax.optim.X``,
#: a ``"flax.optim"`` string of a dynamic import), ``from flax import ... optim`` (also in
#: parentheses or over a backslash), ``getattr(flax, "optim")``, ``from flax import *``.
_REFERENCE = re.compile(
    r'\bflax\s*\.\s*optim\b'
    r'|\bfrom\s+flax\s+import\s+(?:\([^)]*?|(?:[^\n\\]|\\\r?\n|\\)*?)\boptim\b'
    r'|\bflax\s*,\s*[\'"]optim[\'"]'
    r'|\bfrom\s+flax\s+import\s+\*')
#: ``import flax as fx`` (then ``fx.optim``).
_FLAX_ALIAS = re.compile(r'\bimport\s+flax\s+as\s+(\w+)')
#: The rules that need no flax.optim reference: the flag on ``.apply_gradient`` uses, and
#: OM122's on ``.create(...)`` of a name that looks like an optimizer def (``optimizer_def``,
#: ``optim_def``, ``opt_def``: :data:`DEF_LOOKING`, also read by the analyzer).
_APPLY_GRADIENT = re.compile(r'\.\s*apply_gradient\b')
#: ... and OM122's on an Optimizer member read on a value named like an optimizer
#: (``train_state.optimizer.target``, ``opt.state.step``: :data:`OPTIMIZER_NAMED`) in a file
#: that never imports flax.optim.
_NAMED_MEMBER = re.compile(
    r'opt\w*\s*\.\s*(?:target|optimizer_def|state\s*\.\s*(?:step|param_states))\b'
    r'|opt\w*\s*\.\s*replace\s*\(\s*(?:target|state|optimizer_def)\s*=', re.I)
#: ... and on a raw checkpoint restore read with flax.optim's keys (``raw['target']``, OM121).
_LEGACY_KEY_READ = re.compile(
    r'''\[\s*['"](?:KEYS)['"]\s*\]|\.get\(\s*['"](?:KEYS)['"]'''.replace(
        'KEYS', '|'.join(sorted(CHECKPOINT_LEGACY_KEYS))))
#: ... and on ``get_optimizer(config).create(p)`` (a call named like a def's maker).
_CALL_CREATE = re.compile(r'\)\s*\.\s*create\s*\(')
OPTIM_WORD = re.compile(r'optim', re.I)  # (also the analyzer's def-maker call names)
#: The last name of a value that reads like an optimizer: ``optimizer``, ``opt``, ``_optimizer``,
#: ``opt_repl``, ``generator_optimizer``, ``optimizers``.
OPTIMIZER_NAMED = re.compile(r'(?:^|_)(?:opt|optim|optimizer)(?:s|_[a-z0-9]+)?$', re.I)
#: The Optimizer members flagged on such a value, and what a TrainState has instead.
NAMED_MEMBERS = {'target': '`.params`', 'state.step': '`.step`',
                 'state.param_states': '`.opt_state` (Optax state, another layout)',
                 'optimizer_def': '`.tx` (an Optax transformation)',
                 'replace(target=...)': '`.replace(params=...)` (`state=` has no counterpart)'}
DEF_LOOKING = re.compile(r'\w*opt\w*_def')

#: Def factories of other packages that returned a flax.optim def and, in today's release,
#: return an Optax transformation (qualified name -> the release, said in the report): code
#: ``.create`` ing what they return converts to ``TrainState.create(..., tx=<it>)`` (a run
#: that includes the package's own source decides from that source instead).
#: dopamine: migrated in commit 810b72f (2021-09-07), released in dopamine-rl 4.0.0
#: (2021-09-23); ``create_optimizer('adam', ...)`` is ``optax.adam(lr, b1, b2, eps)`` there.
UPSTREAM_DEF_FACTORIES = {
    'dopamine.jax.agents.dqn.dqn_agent.create_optimizer': (
        'dopamine-rl >= 4.0.0',
        "its 'adam' is optax.adam (as this codemod converts Adam: ulps from flax.optim), its "
        "'rmsprop' is optax.rmsprop with eps inside the square root where flax.optim's RMSProp "
        "added it outside (a numeric difference of dopamine's own migration)"),
}
_DEF_LOOKING_CREATE = re.compile(r'\b\w*opt\w*_def\s*\.\s*create\s*\(')
_LEGACY_USE = re.compile(r'\boptim\b|' + '|'.join(
    re.escape(t) + ('' if t.endswith('(') else r'\b') for t in TELLTALES))


def may_need_rewrite(text: str) -> bool:
  """Cheap text prefilter, before any parse: False only for files the codemod leaves alone.

  Every rule needs ``flax.optim`` referenced in the file (:data:`_REFERENCE`: each import
  form, ``flax.optim.X``, the module name in a string, ``getattr(flax, 'optim')``, an alias
  of ``flax`` followed by ``.optim``; or the shim imported in its place by hand,
  ``codemod.shim_imports``) except the flags in files that never import it: on
  ``.apply_gradient``, on ``optimizer_def.create(...)`` and ``get_optimizer(c).create(...)``,
  and on ``.target`` / ``.state.step`` / ``.optimizer_def`` / ``.replace(target=...)`` of a
  value named like an optimizer, and on a raw checkpoint read with flax.optim's keys
  (``restore_checkpoint(d, None)['target']``). So ``torch.optim``, ``optimizer = optax.adam(...)``, a comment saying
  "optim" beside ``import flax``, or another library's ``.target`` alone do not cost a parse.
  """
  if 'apply_gradient' in text and _APPLY_GRADIENT.search(text) is not None:
    return True
  if '_def' in text and _DEF_LOOKING_CREATE.search(text) is not None:
    return True
  if 'opt' in text and _NAMED_MEMBER.search(text) is not None:
    return True
  if 'create' in text and _CALL_CREATE.search(text) is not None and OPTIM_WORD.search(text):
    return True
  if ('restore_checkpoint' in text or 'msgpack_restore' in text) and \
      _LEGACY_KEY_READ.search(text) is not None:
    return True
  from codemod import shim_imports
  return references_flax_optim(text) or shim_imports.may_hold(text)


def references_flax_optim(text: str) -> bool:
  """``text`` spells a reference to flax.optim (:data:`_REFERENCE`, or an alias of ``flax``
  followed by ``.optim``)."""
  if 'optim' not in text or 'flax' not in text:
    return False
  if _REFERENCE.search(text) is not None:
    return True
  return any(re.search(r'\b' + re.escape(alias) + r'\s*\.\s*optim\b', text)
             for alias in _FLAX_ALIAS.findall(text))


def is_def_class(symbol) -> bool:
  """``symbol`` (a legacy name) is a def class a user may subclass: ``OptimizerDef``, a table
  def, ``MultiOptimizer`` or ``WeightNorm`` (not ``Optimizer`` / ``OptimizerState``)."""
  return symbol == 'OptimizerDef' or symbol in def_names()


def mentions_legacy(text: str) -> bool:
  """``text`` (a line the codemod cannot parse, e.g. notebook magic) may use flax.optim."""
  return 'optim' in text or 'apply_gradient' in text or any(t in text for t in TELLTALES)


def has_legacy_use(text: str) -> bool:
  """``text`` spells a legacy optimizer use (the word ``optim`` or a tell-tale member): a
  module migrated earlier has none."""
  return _LEGACY_USE.search(text) is not None


def def_names() -> frozenset:
  """``DEF_NAMES``, made on first use (a global read inside this module does not reach the
  module ``__getattr__``)."""
  value = globals().get('DEF_NAMES')
  if value is None:
    from optim_compat import spec as spec_lib
    value = globals()['DEF_NAMES'] = frozenset(spec_lib.SPECS) | {MULTI, WEIGHT_NORM}
  return value


def __getattr__(name: str):
  if name == 'DEF_NAMES':
    return def_names()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
