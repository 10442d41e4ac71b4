"""What the analysis of one module finds: plain data, read by the plan and the cross-module flow.

Bindings are ``(id(scope), name)`` pairs (``codemod.names.Names.binding``);
nodes are those of the analysed (possibly reduced) module, keyed by ``id``
where a set is enough.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from codemod.legacy_api import DYNAMIC_SCALE


def _field(kind=dict):
  return dataclasses.field(default_factory=kind)


@dataclasses.dataclass
class Facts:
  """One module's facts. Filled by :class:`codemod.facts.analyzer.Analyzer`."""
  #: ``codemod.flow.Flow``: the factories and step functions of other modules, or None.
  flow: object = None

  # -- flax.optim in the module --------------------------------------------------------
  uses_legacy: bool = False           # the module references flax.optim at all
  legacy_imports: list = _field(list)  # import statements of flax.optim
  star_imports: list = _field(list)   # `from flax.optim import *`: its names cannot be resolved
  refs: dict = _field()               # id(outermost legacy reference) -> legacy symbol
  ref_nodes: dict = _field()          # id -> that node
  in_annotation: set = _field(set)    # ids of references inside annotations
  in_subclass: set = _field(set)      # ids of references inside a user OptimizerDef subclass
  nn_refs: set = _field(set)          # ids of pre-Linen flax.nn references
  #: id(the class tuple of `isinstance(x, (optim.Optimizer, TrainState))`) -> ids of its
  #: legacy members; and those ids (code taking both: OM015 drops the legacy class)
  dual_tuples: dict = _field()
  #: ids of `<x>.state` attributes whose chain (`.param_states['head']`, ...) is only read
  #: by a call of api.STATE_READERS (OM017: the legacy view)
  state_reads: set = _field(set)
  state_writes: dict = _field(dict)   # id -> `opt.replace(state=...)` (state surgery)
  dual_members: set = _field(set)
  #: id(`if isinstance(x, optim.Optimizer): ... else: ...`) -> that If (OM015 keeps the else)
  legacy_branches: dict = _field()
  module_refs: list = _field(list)    # uses of the flax.optim module object itself
  dynamic_imports: dict = _field()    # id(node) -> what it does without flax.optim
  subclasses: list = _field(list)     # user OptimizerDef subclasses (ClassDef)
  subclass_names: set = _field(set)
  defines_apply_gradient: bool = False  # the module has its own `def apply_gradient`
  #: names the rewrite would emit (`optax`, `train_state`, ...) bound here to something else
  bound_names: set = _field(set)

  # -- defs and optimizers -----------------------------------------------------------------
  def_vars: dict = _field()           # binding -> the def call it holds (None: unknown kind)
  def_calls: list = _field(list)      # legacy def calls, in order
  #: id(`<mapping>.get(key, <def>)` assigned to a name) -> that default def (OM016)
  def_defaults: dict = _field()
  def_default_calls: dict = _field()  # ... and id(that def) -> the `.get(...)` call
  wn_inner: set = _field(set)         # ids of def calls wrapped by WeightNorm(...)
  create_calls: list = _field(list)   # `<def>.create(...)`
  #: id of `o.optimizer_def` -> the call `o.optimizer_def.create(...)`: a fresh optimizer from
  #: `o`'s def (the reset idiom): converted where `o` is proven one (OM001), else OM116
  def_resets: dict = _field(dict)
  stored: set = _field(set)           # ids of the targets of `=`, augmented `=` and `del`
  #: `<cls>.create(..., params=..., tx=...)`: a flax TrainState (or subclass) this file makes
  train_state_creates: list = _field(list)
  array_vars: dict = _field()         # binding -> every `=` gives it a bare array (`w = jnp.zeros(3)`)
  #: id(`<def>.create(...)` assigned by `=`) -> where it is stored: ('name', binding) or
  #: ('chain', 'self.alpha_optimizer') per target (codemod.rules.defs.array_create)
  create_keys: dict = _field()
  traversal_vars: dict = _field()     # binding -> ModelParamTraversal call
  opt_vars: set = _field(set)         # bindings holding optimizers
  #: id(docstring string node) -> {the flax.optim type it documents a parameter as: the
  #: modern type}, for functions whose docstring types a parameter `flax.optim.Optimizer`
  doc_types: dict = _field()
  rebound: set = _field(set)          # bindings also assigned something else
  #: bindings also assigned `pickle.load(...)`, each use of which is `.target`, `.state.step`
  #: or a pickling: a TrainState this file pickled (OM018), not a rebinding
  pickle_loaded: set = _field(set)
  #: binding -> its `pickle.load(...)` call, for a name also read with an Optimizer member but
  #: used otherwise too (stepped, handed on): flagged where this file's pickles are TrainStates
  pickle_unsure: dict = _field()
  #: what each pickle.dump / dumps / joblib.dump call pickles (its first argument, through
  #: unreplicate / device_get), collected once the file binds a name to pickle.load(...)
  pickled: list = _field(list)
  params: set = _field(set)           # bindings of function parameters
  loop_vars: set = _field(set)        # bindings of loop and comprehension targets
  made_here_params: set = _field(set)  # parameters only ever given this file's optimizers
  escaping: dict = _field()           # id -> def handed to other code (returned, passed, class attr)
  mixed_defs: dict = _field()         # id(def call) -> name that then holds its optimizer
  def_var_others: dict = _field()     # def binding -> a value not a def it is assigned too
  mixed_user_bindings: set = _field(set)  # def bindings assigned a user def and a table def
  #: ids of `WeightNorm(<the name itself>)` calls of a def binding assigned table defs and
  #: such a wrap (`d = Adam(lr)`, then in a branch `d = WeightNorm(d)`): each def converts to
  #: its Optax form and the wrap to `optim_compat.transforms.weight_norm(d)`
  wn_rebinds: set = _field(set)
  user_def_wraps: set = _field(set)   # ids of those user def calls (wrapped in to_optax)
  shimmed_def_calls: list = _field(list)  # calls of def factories the run leaves on the shim
  attr_chains: set = _field(set)      # `self.optimizer`-like chains holding optimizers
  attr_other: set = _field(set)       # chains also assigned something else
  attr_flow: dict = _field()          # chain -> converted flow.Factory assigned to it
  annotated_fields: set = _field(set)  # class fields annotated `flax.optim.Optimizer`
  declared_fields: dict = _field()     # module-level class -> its fields annotated so (flow)
  container_makers: set = _field(set)  # module-level functions every return of which makes one
  container_classes: set = _field(set)  # module-level classes with such fields (before the visit)
  container_vars: set = _field(set)   # bindings assigned an instance of one (`TrainState(opt)`)
  container_values: set = _field(set)  # ids of those constructions (holding, not being, one)
  container_params: set = _field(set)  # parameters annotated with one (`tstate: TrainState`)
  top_returns: dict = _field()        # module-level function -> the values its returns give
  assignments: list = _field(list)    # (targets, value) of every `=` statement
  assigned: dict = _field()           # id(a plain-name target) -> its (targets, value)

  # -- uses of optimizers and defs ----------------------------------------------------------
  apply_calls: list = _field(list)    # `.apply_gradient(...)` calls (outside user defs)
  optimize_calls: list = _field(list)  # `opt, loss = opt.optimize(f)` calls
  optimize_assigns: set = _field(set)  # ids of those assignments
  grad_assigns: set = _field(set)     # ids of `a, b = opt.compute_gradient(f)`
  method_calls: dict = _field()       # id(call) -> `.replicate()` / `.unreplicate()` call
  restores: list = _field(list)       # checkpoint restore calls (legacy_api.RESTORES, RAW_RESTORES)
  #: binding, or id(call), -> ``(read, key as written)`` of each ``x['target']`` /
  #: ``x['state']`` / ``x.get('target')`` of it (legacy_api.CHECKPOINT_LEGACY_KEYS): a raw
  #: restore read with the legacy keys (OM121)
  legacy_key_reads: dict = _field()
  saves: list = _field(list)          # checkpoint save calls (legacy_api.SAVES)
  legacy_attrs: list = _field(list)   # opt.optimizer_def, opt.state, opt.replicate...
  member_attrs: list = _field(list)   # every `.apply_gradient`, `.target` and `.state`
  handled: set = _field(set)          # ids of legacy_attrs a rule converts
  step_array_uses: set = _field(set)  # ids of `.state.step` nodes used as an array
  hp_reads: dict = _field()           # id(attr) -> (receiver, name, via_optimizer)
  #: id(`opt.optimizer_def.hyper_params` assigned to a name or unpacked into names) ->
  #: its statement line, when that line could be dropped (one statement, no comment, not
  #: alone in its block), else None (OM012: read only for per-group learning rates)
  hp_assigns: dict = _field()
  def_attrs: list = _field(list)      # attributes of a name that only a def has
  call_funcs: set = _field(set)       # ids of every call's func node
  double_starred: set = _field(set)   # ids of names given as `**name` to a call
  calls_by_func: dict = _field()      # id(call.func) -> call
  wrapped: list = _field(list)        # (assignment, call): `p_step = jax.pmap(step, ...)`
  #: built on first use, after the visit (codemod.facts.following)
  receiver_calls: Optional[dict] = None  # id(receiver) -> calls of a method on it
  wrapper_calls: Optional[dict] = None  # id(function given first) -> the wrapper call
  #: id(a nested function's name a module-level function returns, alone or wrapped:
  #: `return jax.pmap(update_fn)`) -> (that function's name, the wrapper's methods)
  closure_returns: Optional[dict] = None

  # -- functions ----------------------------------------------------------------------------
  functions: list = _field(list)      # functions outside classes (parameter following)
  top_functions: list = _field(list)  # module-level ones
  opt_factories: set = _field(set)    # functions returning a new optimizer
  bundle_positions: dict = _field()   # function -> tuple positions it returns an optimizer at
  module_factories: set = _field(set)  # module-level ones
  bundle_factories: set = _field(set)  # returning one inside a tuple / list / dict
  bundle_keys: dict = _field()        # function -> dict keys it returns an optimizer at
  def_factories: set = _field(set)    # module-level functions returning a legacy def
  group_def_factories: set = _field(set)  # ... returning a MultiOptimizer (or a subclass)
  def_sinks: dict = _field()          # function or Class.method -> (position, parameter) it .creates
  #: qualified names of other modules' (or this one's) def factories the run converts, whose
  #: transformation this module ``.create`` s (codemod.flow: the callers' verdicts)
  def_uses: dict = _field()           # qualified name -> flow.DefFactory
  def_var_factories: dict = _field()  # binding -> the converted flow.DefFactory it holds
  def_misused: set = _field(set)      # those of def_uses whose result is used other than `.create`d
  steps: dict = _field()              # module-level function -> its optimizer parameters

  # -- other modules (codemod.flow) -------------------------------------------------------
  flow_vars: dict = _field()          # binding -> flow.Factory whose result it holds
  flow_used: dict = _field()          # qualified name -> flow.Factory this file calls
  #: id(call) -> the held codemod.flow.Fields it constructs (`TrainState(optimizer=opt)` of a
  #: class another module's reader keeps legacy)
  held_containers: dict = _field()
  #: qualified name -> flow.Fields: another module's class with optimizer fields named here
  flow_classes: dict = _field()
  flow_fields: set = _field(set)      # the fields of those that their module converts
  field_aliases: set = _field(set)    # bindings assigned one of those fields (`o = s.optimizer`)
  legacy_fields: dict = _field()      # field -> the class (flow.Fields) its module keeps legacy
  flow_def_vars: dict = _field()      # binding -> flow.DefFactory whose def it holds
  flow_def_chains: dict = _field()    # chain -> flow.DefFactory whose def `.create`d it
  #: `.create(...)` calls on another module's def: (call, flow.DefFactory or None: a name
  #: like a def, `optimizer_def.create(p)`, that nothing here proves, flagged where the
  #: file never imports flax.optim)
  flow_def_creates: list = _field(list)

  @property
  def handles_optimizers(self) -> bool:
    """Anything here makes, takes or reads a flax.optim Optimizer or def (this module's
    legacy code, or another module's through the flow): False where flax.optim is used
    only for something else (``flax.optim.dynamic_scale`` beside an Optax ``TrainState``)."""
    return bool(self.def_calls or self.create_calls or self.apply_calls or self.optimize_calls
                or self.opt_vars or self.escaping or self.annotated_fields or self.flow_used
                or self.flow_def_creates or self.def_uses or self.flow_classes
                or self.flow_def_vars or self.subclasses or self.star_imports
                or any(sym.split('.', 1)[0] not in DYNAMIC_SCALE for sym in self.refs.values()))

  @property
  def only_imports(self) -> bool:  # (a star import's names are never seen as used)
    """flax.optim is imported and nothing in the module uses it: maybe a re-export
    (``from flax import optim`` in a package's ``__init__.py``)."""
    return bool(self.legacy_imports) and not self.star_imports and not (
        self.refs or self.module_refs or self.apply_calls or self.legacy_attrs or self.flow_used)


@dataclasses.dataclass
class Analysis:
  """A module ready for planning: the tree the facts are about, and how to read its names.

  Attributes:
    module: the tree analysed: the parsed module with the statements no rule can see set
      aside (``codemod.facts.setaside``); ``originals`` puts them back.
    full: the module as parsed.
    text: the source text ``full`` was parsed from.
    names: :class:`codemod.names.Names` over ``module``.
    facts: what :class:`codemod.facts.analyzer.Analyzer` found.
  """
  module: cst.Module
  full: cst.Module
  text: str
  names: object
  facts: Facts
  originals: dict
  flow: Optional[object] = None
