"""Cross-module optimizer flows: the repository-level pre-pass of ``rewrite``.

A file that never imports ``flax.optim`` may still hold a legacy optimizer: one
made by a function of another module (``opt = create_optimizer(p)`` after
``from pkg.opt import create_optimizer``). Before the per-file rewrites,
:func:`build_flows` finds, over all the files of the run, the module-level
functions whose returned optimizer the codemod converts to a ``TrainState``
(from the facts and the plan of their file: nothing is rewritten here), and
those that take one (step functions), keyed by qualified name
``<module dotted name>.<function>`` (``codemod.modules``). Each file's rewrite
then gets a :class:`Flow`: names proven (LibCST ``QualifiedNameProvider``) to be
bound to such a call get the conversions of the defining file; the rest stays
flagged, naming the factory the file uses.

A factory converts only when every file using what it returns converts too (else
its file keeps its legacy code with them, on the shim: no ``TrainState`` reaches
flax.optim code), and builds its defs with ``optax.inject_hyperparams`` when one
of them passes a learning rate at apply time; the users are planned for that.

The pre-pass is cheap: only files that could define a factory or take an
optimizer (they reference ``flax.optim``, define a function) and whose module's
last name appears in an import line of another file, and the files calling a
factory they convert, are parsed, once; the main pass rewrites them from that
parse. For stdin (``-``) there is no tree and no flow.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import pathlib
import re
from typing import Iterable, Mapping, Optional

from codemod import deep, findings, legacy_api
from codemod.modules import (absolute_name, import_lines, imported_modules,  # noqa: F401
                             module_names, reexports, outside_modules, package_root, roots_of)
from codemod.sources import SourceFile

#: A line that imports something (``import a.b``, ``from .a import b``).
_IMPORT_LINE = re.compile(r'^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import\b)[^\n]*', re.M)
_WORD = re.compile(r'\w+')
_TOP_DEF = re.compile(r'^(?:async[ \t]+)?def[ \t]+(\w+)', re.M)  # (group 1: its name)


class _ModuleFunction:
  """A module-level function of the tree, named ``qualified`` and defined in ``path``."""
  qualified: str
  path: str

  @property
  def function(self) -> str:
    return self.qualified.rsplit('.', 1)[1]

  @property
  def where(self) -> str:
    """``pkg/opt.py:create_optimizer``: the defining file and the function, for messages."""
    return f'{self.path}:{self.function}'


@dataclasses.dataclass(frozen=True)
class Factory(_ModuleFunction):
  """A module-level function of the tree that returns a legacy optimizer.

  Attributes:
    qualified: ``'pkg.opt.create_optimizer'``.
    path: the defining file, as the run names it.
    converted: its file's rewrite returns a ``TrainState`` from it, or it
      already does (a module migrated earlier); False: that file keeps its
      legacy optimizer code, for ``why``.
    inject_lr: the transformation is built with ``optax.inject_hyperparams``
      (that file passes ``learning_rate`` at apply time), so a learning rate
      can be set in ``opt_state``; None: cannot tell (a migrated module whose
      ``tx`` is not written in the call).
    why: the first manual item of the defining file when not converted.
    bundle: it returns its optimizer inside a tuple, list or dict (``return opt, lr``):
      what a call gives is no optimizer itself, its items may be.
    held: set by the pre-pass (:func:`build_flows`) when a file using what it returns keeps
      its legacy code: the file naming it and why (``'train.py, which keeps its legacy
      code (OM119: ...)'``); its own file then keeps its legacy code too (OM123).
    inject_required: set by the pre-pass when a file using what it returns passes a
      learning rate at apply time: its file builds its defs with ``inject_hyperparams``.
    migrated: it already returns a ``TrainState`` (migrated before this run): never held.
  """
  qualified: str
  path: str
  converted: bool
  inject_lr: Optional[bool]
  why: str = ''
  bundle: bool = False
  held: str = ''
  inject_required: bool = False
  migrated: bool = False


@dataclasses.dataclass(frozen=True)
class _Entry(_ModuleFunction):
  """What the factories table holds beside factories: a function of the tree, whether the
  run converts its file and why not (the attributes :class:`ContainerFactory` documents)."""
  qualified: str
  path: str
  converted: bool
  why: str = ''
  bundle: bool = False      # (read beside factories: never a bundle)
  inject_lr: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class Fields(_Entry):
  """A module-level class of the tree (a ``struct.dataclass``, ``NamedTuple``, ...) with fields
  annotated ``flax.optim.Optimizer``: its instances hold optimizers, wherever they are read
  (``state.optimizer.target`` in another module). Kept in the factories table (so that the
  runner passes it on unchanged) but never a factory: :meth:`Flow.resolve` skips it.

  Attributes:
    qualified: ``'pkg.model_utils.TrainState'``.
    path: the defining file, as the run names it.
    fields: the annotated field names (``('optimizer',)``).
    converted: its file's rewrite annotates them ``train_state.TrainState`` (and makes the
      optimizers stored there TrainStates); False: that file keeps its legacy code.
    why: the first manual item of the defining file when not converted.
    held: set by the pre-pass (:func:`build_flows`) when a file reading those fields keeps its
      legacy code: the file and why; the class's module then keeps its legacy code (OM123),
      and so does a module storing an optimizer in the class, so that what the fields hold
      stays a flax.optim Optimizer (on the shim) for that reader.
  """
  fields: tuple[str, ...] = ()
  held: str = ''


@dataclasses.dataclass(frozen=True)
class ContainerFactory(_Entry):
  """A module-level function of the tree every ``return`` of which builds a class with
  optimizer fields (``return TrainState(step=0, optimizer=opt)``, Flax v0.3 imagenet's
  ``create_train_state``): what a call gives holds optimizers in those fields (another
  module's ``restore_checkpoint(workdir, state)`` restores a legacy checkpoint into one).
  Kept in the factories table but never a factory (:meth:`Flow.resolve` skips it).

  Attributes:
    qualified: ``'pkg.train.create_train_state'``.
    path: the defining file, as the run names it.
    converted: its file's rewrite makes those optimizers TrainStates.
    why: the first manual item of the defining file when not converted.
  """


@dataclasses.dataclass(frozen=True)
class DefFactory(_Entry):
  """A module-level function of the tree that returns a legacy optimizer *def*
  (``def get_optimizer(config): return optim.Adam(...)``): its callers ``.create`` the
  optimizer. Kept in the factories table, never a factory (:meth:`Flow.resolve` skips it).

  Attributes:
    qualified: ``'pkg.losses.get_optimizer'``.
    path: the defining file, as the run names it.
    converted: its file's rewrite returns an Optax transformation from it (only when
      ``allowed``; else a def handed to other code keeps its file legacy, OM114).
    why: the first manual item of the defining file when not converted.
    inject_lr: its transformations are built with ``optax.inject_hyperparams``.
    allowed: the pre-pass lets it convert: every file of the run that names it ``.create`` s
      what it returns (directly, or through a name read only so) and converts
      (:func:`build_flows`).
    inject_required: a caller sets the learning rate at apply time, so its file injects it.
    upstream: another package's (:data:`codemod.legacy_api.UPSTREAM_DEF_FACTORIES`): ``path``
      names the release that returns Optax, ``why`` what its transformations are.
  """
  allowed: bool = False
  inject_required: bool = False
  upstream: bool = False  # another package's, from the table (path: its release; why: a note)
  method: str = ''  # a method of a module-level class (``qualified`` ends in ``Class.method``)
  # not allowed, its file kept on the shim (OM014), so it returns shim defs: the callers that
  # `.create` what it returns convert around `optim_compat.to_optax(<call>)` (scenic's
  # get_optimizer, which DETR's MultiOptimizer subclass keeps a def factory)
  shimmed: bool = False
  groups: bool = False  # it returns a MultiOptimizer (to_optax cannot inject its rate)


@dataclasses.dataclass(frozen=True)
class DefSink(DefFactory):
  """A module-level function, or a method of a module-level class, whose parameter
  receives a legacy def and only ``.create`` s it (jax-rl's ``Model.with_optimizer(self,
  optim_def)``, called as ``actor.with_optimizer(flax.optim.Adam(learning_rate=lr))`` in
  three learner modules). Kept in the factories table, never a factory nor a def factory.

  Attributes:
    qualified: ``'jax_rl.networks.common.Model.with_optimizer'``.
    path: the defining file, as the run names it.
    converted: its file's rewrite converts (with the sink allowed, the ``.create`` on the
      parameter becomes ``TrainState.create(..., tx=<parameter>)``).
    parameter: ``(position, name)``: its position among the arguments a call passes (after
      ``self`` for a method), and its name.
    allowed: the pre-pass lets it convert: every file of the run that may call it passes a
      table def there, built in place, and converts (:func:`build_flows`); the callers then
      pass the def's Optax transformation.
    method: the method's name when it is a method (``'with_optimizer'``), else ``''``.
  """
  parameter: tuple = (0, '')


@dataclasses.dataclass(frozen=True)
class UserDef(_Entry):
  """A module-level class of the tree that subclasses a flax.optim def (``class
  RMSPropTensorflow(OptimizerDef)``): it runs on the shim wherever it is defined (``OM104``),
  so another module's ``RMSPropTensorflow(...)`` is a def whose TrainState takes
  ``optim_compat.to_optax(...)``. Kept in the factories table, never a factory.

  Attributes:
    qualified: ``'jeffnet.linen.optim.rmsprop_tensorflow.RMSPropTensorflow'``.
    path: the defining file, as the run names it.
  """


@dataclasses.dataclass(frozen=True)
class Handoff(_Entry):
  """A class with optimizer fields whose instances a module hands to a function of another
  module (l2p's ``train_continual.py`` calls ``utils.state_with_new_param(state, p)``;
  ``utils.py`` reads ``state.optimizer.target`` and never names the class): in the receiving
  module ``<anything>.<field>`` holds that class's optimizer, as in a module that imports the
  class's (:meth:`Flow.handoffs_to`; the class's own :class:`Fields` entry says whether the
  run converts it). Kept in the factories table, never a factory.

  Attributes:
    qualified: a key, ``'<receiver>@<cls>'``.
    path: the handing module's file, as the run names it.
    receiver: the function handed an instance, as the handing module imports it
      (``'libml.utils.state_with_new_param'``).
    cls: the class, qualified (``'train_continual.TrainState'``).
    fields: its optimizer fields (``('optimizer',)``).
    sibling: the module the receiver is, were it a sibling of the handing module (a script
      run from its directory imports its neighbours by their bare names), or ``''``.
    mixed: the handing module also calls the receiver with something else in that argument
      (a namedtuple standing in for the container): the receiving module then registers no
      hand-off at all (its field reads stay flagged).
  """
  receiver: str = ''
  cls: str = ''
  fields: tuple[str, ...] = ()
  sibling: str = ''
  mixed: bool = False


@dataclasses.dataclass(frozen=True)
class DefUse:
  """One file's use of a :class:`DefFactory` the pre-pass let convert, or of a converted
  :class:`Factory` (never in the tables).

  Attributes:
    qualified: the (def) factory's qualified name.
    path: the using file, as the run names it.
    converted: every use there is a ``.create`` that the file's rewrite converts (a def
      factory), or the file converts (a factory).
    inject: that file passes a learning rate at apply time (to what a factory returns).
    why: the first manual item of that file when not converted.
    where: ``path:line`` of that item (``path`` when there is none).
  """
  qualified: str
  path: str
  converted: bool
  inject: bool = False
  why: str = ''
  where: str = ''


@dataclasses.dataclass(frozen=True)
class Layout(_ModuleFunction):
  """The optimizer-state layout a converted module's defs get (``<module>.__layout__`` in the
  factories table, never a factory): whether its transformations are built with
  ``optax.inject_hyperparams``. A module that hands its own optimizer to a function of that
  module (``train.restore_checkpoint(workdir, optimizer)``) builds its defs the same way, so
  that the checkpoints they exchange have one layout (pixelcnn: ``train.py`` injected and
  ``sample.py`` did not, so sample.py restored train.py's Adam state silently zeroed).
  A module with no defs that sets learning rates at apply time has one too (its callers
  inject: hypernerf's ``training.train_step``), and an injecting module adds one per class
  with optimizer fields it hands on (``<class>.__layout__``): every module storing its
  optimizers in that class injects (nerfies' ``eval.py`` restores what ``train.py`` saved).

  Attributes:
    qualified: ``'pkg.train.__layout__'`` (or ``'pkg.state.TrainState.__layout__'``).
    path: the module's file, as the run names it.
    inject_lr: its defs are built with ``inject_hyperparams``.
  """
  qualified: str
  path: str
  inject_lr: bool
  converted: bool = True
  why: str = ''
  bundle: bool = False


#: The key suffix of :class:`Layout` entries.
LAYOUT = '__layout__'


@dataclasses.dataclass(frozen=True)
class Step(_ModuleFunction):
  """A module-level function of the tree that takes legacy optimizers as arguments
  (a train step: ``def train_step(opt, batch): ... opt.apply_gradient(g)``).

  Attributes:
    qualified: ``'pkg.steps.train_step'``.
    path: the defining file, as the run names it.
    params: ``(position, name)`` of each parameter its file treats as an optimizer
      (position among the positional parameters, or None for keyword-only ones).
    converted: its file's rewrite makes those parameters ``TrainState`` s; False:
      that file keeps its legacy optimizer code, for ``why``.
    why: the first manual item of the defining file when not converted.
    restores: a checkpoint helper of a module with no flax.optim code
      (:func:`restore_helpers`): the reader it passes those parameters to as the
      target (``'restore_checkpoint'``), which loads a legacy checkpoint only into a
      flax.optim Optimizer (into a TrainState: ``ValueError: Missing field step``).
  """
  qualified: str
  path: str
  params: tuple[tuple[Optional[int], str], ...]
  converted: bool
  why: str = ''
  restores: str = ''


@dataclasses.dataclass(frozen=True)
class Flow:
  """What one file's rewrite knows of the tree: the factories, the step functions and its
  own module name."""
  factories: Mapping[str, Factory]
  module: Optional[str] = None
  is_package: bool = False  # the file is a package's ``__init__.py``
  steps: Mapping[str, Step] = dataclasses.field(default_factory=dict)
  #: ``<module>.<Class>`` of classes a class of another module subclasses where that module
  #: sets a learning rate at apply time (:func:`injecting_subclasses`): the optimizers the
  #: base class creates are stepped with one there, so its module injects its rate
  inject_classes: frozenset = frozenset()

  def resolve(self, qname: str) -> Optional[Factory]:
    """The factory ``qname`` names (absolute, or relative to this file's package)."""
    found = self._find(self.factories, qname)
    return None if isinstance(found, (Fields, ContainerFactory, DefFactory, Layout,
                                      UserDef, Handoff)) else found

  def resolve_user_def(self, qname: str) -> Optional[UserDef]:
    """The user OptimizerDef subclass ``qname`` names (:class:`UserDef`), if any."""
    found = self._find(self.factories, qname)
    return found if isinstance(found, UserDef) else None

  @functools.cached_property
  def user_def_names(self) -> frozenset:
    """The class names of the :class:`UserDef` entries (a cheap test before resolving)."""
    return frozenset(f.function for f in self.factories.values() if isinstance(f, UserDef))

  def layout(self, module_qname: str) -> Optional[Layout]:
    """The :class:`Layout` of the module ``module_qname`` names, if the run converts it."""
    found = self._find(self.factories, f'{module_qname}.{LAYOUT}')
    return found if isinstance(found, Layout) else None

  def resolve_def(self, qname: str) -> Optional[DefFactory]:
    """The function returning a legacy def ``qname`` names (:class:`DefFactory`), if any."""
    found = self._find(self.factories, qname)
    return found if isinstance(found, DefFactory) and not isinstance(found, DefSink) else None

  def def_methods(self, name: str) -> list:
    """The def factory methods called ``name`` (:class:`DefFactory` with ``method``: the
    ``create_optimizer_def`` of each of meliad's optimizer configs), which a call by that
    name may reach whatever its receiver."""
    return [f for f in self._def_methods if f.method == name]

  @functools.cached_property
  def _def_methods(self) -> list:
    return sorted({f.qualified: f for f in self.factories.values()
                   if type(f) is DefFactory and f.method}.values(), key=lambda f: f.qualified)

  def resolve_sink(self, qname: str) -> Optional[DefSink]:
    """The def sink function ``qname`` names (:class:`DefSink`), if any."""
    found = self._find(self.factories, qname)
    return found if isinstance(found, DefSink) else None

  def sink_method(self, name: str) -> Optional[DefSink]:
    """The one def sink method called ``name`` in the tree (``with_optimizer``), else None
    (none, or several: a call by that name cannot tell which)."""
    found = {f.qualified: f for f in self._sinks if f.method == name}
    return next(iter(found.values())) if len(found) == 1 else None

  @functools.cached_property
  def _sinks(self) -> list:
    return [f for f in self.factories.values() if isinstance(f, DefSink)]

  def resolve_fields(self, qname: str) -> Optional[Fields]:
    """The class with optimizer fields ``qname`` names (:class:`Fields`), if any."""
    found = self._find(self.factories, qname)
    return found if isinstance(found, Fields) else None

  def resolve_container_factory(self, qname: str) -> Optional[ContainerFactory]:
    """The function ``qname`` names when it returns a class with optimizer fields."""
    found = self._find(self.factories, qname)
    return found if isinstance(found, ContainerFactory) else None

  def documented_fields(self, dotted: str) -> Optional[Fields]:
    """The one class with optimizer fields that a type named in a docstring
    (``model_utils.TrainState``: not imported by the file, so by its trailing names) can
    be: the :class:`Fields` whose qualified name is ``dotted`` or ends in ``.<dotted>``;
    None when none or several are."""
    found = [f for f in self.factories.values() if isinstance(f, Fields)
             and (f.qualified == dotted or f.qualified.endswith(f'.{dotted}'))]
    return found[0] if len(found) == 1 else None

  def handoffs_to(self) -> list[Handoff]:
    """The :class:`Handoff` s whose receiving function is of this file's module."""
    if not self.module:
      return []
    return [f for f in self.factories.values() if isinstance(f, Handoff)
            and self.module in (f.receiver.rsplit('.', 1)[0], f.sibling)]

  def fields_of_module(self, qname: str) -> list[Fields]:
    """The classes with optimizer fields (:class:`Fields`) the module ``qname`` (absolute,
    or relative to this file's package) declares."""
    return self._find(self._fields_by_module, qname) or []

  @functools.cached_property
  def _fields_by_module(self) -> dict:
    found: dict = {}
    for f in self.factories.values():
      if isinstance(f, Fields) and f not in found.setdefault(f.qualified.rsplit('.', 1)[0], []):
        found[f.qualified.rsplit('.', 1)[0]].append(f)
    return found

  @functools.cached_property
  def tree_fields(self) -> dict:
    """``{field: Fields}`` of every class with optimizer fields in the tree (the first
    class declaring each field name, converted ones first)."""
    found: dict = {}
    for f in sorted((f for f in self.factories.values() if isinstance(f, Fields)),
                    key=lambda f: (not f.converted, f.qualified)):
      for field in f.fields:
        found.setdefault(field, f)
    return found

  @property
  def field_classes(self) -> frozenset:
    """The last names of the :class:`Fields` classes (a cheap test before resolving names)."""
    return frozenset(f.function for f in self.factories.values() if isinstance(f, Fields))

  def resolve_step(self, qname: str) -> Optional[Step]:
    """The step function ``qname`` names (absolute, or relative to this file's package)."""
    return self._find(self.steps, qname)

  def _absolute(self, qname: str) -> Optional[str]:
    return absolute_name(qname, self.module, self.is_package)

  def _find(self, table: Mapping, qname: str):
    """``table``'s entry for ``qname``: by its absolute name, else as a sibling of this file
    (``models.create_optimizer`` written in ``ppo/ppo_lib.py`` is ``ppo.models.create_optimizer``:
    a script run from its directory imports the modules beside it by their bare names, as
    Flax's own examples do)."""
    name = self._absolute(qname)
    if name is None:
      return None
    if name in table:
      return table[name]
    if qname.startswith('.') or not self.module or '.' not in self.module:
      return None
    directory = self.module if self.is_package else self.module.rsplit('.', 1)[0]
    return table.get(f'{directory}.{qname}')

  def mentioned(self, text: str, reads: bool = False) -> bool:
    """Could ``text`` call a factory or step function (its function and its module's last
    name appear), or read a field of a class with optimizer fields (its module's last name
    and ``.<field>.`` appear, or ``.<field>.target`` / ``.<field>.state.step`` anywhere, or
    with ``reads`` ``.<field>`` at all)? A cheap prefilter, before any parse."""
    return any(key.rsplit('.', 1)[-1] in text and key.rsplit('.', 2)[-2] in text
               for key in [*self.factories, *self.steps]) or any(
        # a class with optimizer fields: its module imported, one of its fields read
        f.qualified.rsplit('.', 2)[-2] in text and any(f'.{field}.' in text for field in f.fields)
        for f in self.factories.values() if isinstance(f, Fields)) or any(
        # a field of such a class read as a flax.optim Optimizer, wherever the class is
        f'.{field}.{member}' in text for field in self.tree_fields
        for member in ('target', 'state.step')) or (
        # (the pre-pass: read at all, by a module that may keep its legacy code and so hold it)
        reads and any(f'.{field}' in text for field in self.tree_fields))


def _could_take(text: str) -> bool:
  """A module-level function that may take a legacy optimizer (``opt.apply_gradient``,
  ``opt.target``, an ``optim.Optimizer`` annotation: the codemod's words)."""
  return _TOP_DEF.search(text) is not None and legacy_api.may_need_rewrite(text)


def _could_define(text: str) -> bool:
  """A legacy factory or def factory (the codemod's words) or an already migrated one
  (``TrainState``), or a class with fields annotated ``Optimizer``."""
  return (('return' in text and _TOP_DEF.search(text) is not None
           and (('create' in text and 'TrainState' in text) or legacy_api.may_need_rewrite(text)))
          or (_field_class(text) and legacy_api.may_need_rewrite(text))
          or _migrated_field_class(text)
          or (_user_def_class().search(text) is not None and legacy_api.may_need_rewrite(text))
          # a method returning a def (meliad's `AdamConfig.create_optimizer_def`)
          or (_returned_def().search(text) is not None and legacy_api.may_need_rewrite(text)))


@functools.lru_cache(maxsize=1)
def _user_def_class() -> re.Pattern:
  """``class X(OptimizerDef)``, ``class X(optim.Adam)``: a user def (:class:`UserDef`)."""
  names = '|'.join(sorted({'OptimizerDef', *legacy_api.DEF_NAMES}))
  return re.compile(rf'^class[ \t]+\w+[ \t]*\([^)]*\b(?:{names})\b', re.M)


_CLASS_LINE = re.compile(r'^class[ \t]+\w+', re.M)
_OPTIMIZER_FIELD = re.compile(r'^[ \t]+\w+[ \t]*:[^\n=]*Optimizer\b', re.M)
_TRAIN_STATE_FIELD = re.compile(r'^[ \t]+\w+[ \t]*:[^\n=]*\bTrainState\b', re.M)


def _after_a_class(text: str, word: str, field: re.Pattern) -> bool:
  """``class X...`` and, on a later line, an indented field annotated with ``word`` (a cheap
  prefilter, linear in the text: one search for the first class line, one for the field
  after it; a lazy ``class[\\s\\S]*?field`` pattern was quadratic in a file of many classes)."""
  if word not in text:
    return False
  first = _CLASS_LINE.search(text)
  return first is not None and field.search(text, first.end()) is not None


def _field_class(text: str) -> bool:
  """A class with a field annotated ``...Optimizer`` may be declared in ``text``."""
  return _after_a_class(text, 'Optimizer', _OPTIMIZER_FIELD)


def _migrated_field_class(text: str) -> bool:
  """The same with a field annotated ``...TrainState`` (a container migrated before this run)."""
  return _after_a_class(text, 'TrainState', _TRAIN_STATE_FIELD)


def upstream_def_factories(texts: Iterable[str]) -> dict[str, DefFactory]:
  """:data:`codemod.legacy_api.UPSTREAM_DEF_FACTORIES` whose package some text of the run
  imports (``from dopamine.jax.agents.dqn import dqn_agent``), as converted def factories: a
  file outside their package ``.create`` s an Optax transformation from them today."""
  wanted = {q.split('.', 1)[0]: q for q in legacy_api.UPSTREAM_DEF_FACTORIES}
  found = {}
  for text in texts:
    if 'import' not in text:
      continue
    words = set(_WORD.findall(' '.join(_IMPORT_LINE.findall(import_lines(text)))))
    for package in wanted.keys() & words:
      for q, (release, note) in legacy_api.UPSTREAM_DEF_FACTORIES.items():
        if q.startswith(package + '.'):
          found[q] = DefFactory(q, release, converted=True, why=note, allowed=True,
                                inject_lr=False, upstream=True)
  return found


_CLASS_BASES = re.compile(r'^class[ \t]+\w+[ \t]*\(([^)]*)\)[ \t]*:', re.M)
_APPLY_LR = re.compile(r'\.apply_gradient\((?:[^()]|\([^()]*\))*\blearning_rate[ \t]*=')


def injecting_subclasses(files, texts: Mapping) -> frozenset:
  """``<module>.<Class>`` of each class of the tree that a class of another module
  subclasses, where that other module passes ``learning_rate=`` to an ``apply_gradient``
  (a fine-tuner's own schedule on the optimizer its base trainer creates). A cheap textual
  scan: a base named ``C`` or ``mod.C`` is the class ``C`` of each module that defines one
  and whose last name the subclass's module imports (an over-match only injects a rate no
  one sets, which changes no update)."""
  defining: dict = {}
  for path, names, _ in files:
    text = texts.get(path)
    if text is None or 'class' not in text:
      continue
    for cls in re.findall(r'^class[ \t]+(\w+)', text, re.M):
      defining.setdefault(cls, []).extend((path, name) for name, _ in names)
  found = set()
  for path, names, _ in files:
    text = texts.get(path)
    if text is None or 'apply_gradient' not in text or not _APPLY_LR.search(text):
      continue
    imported = set(_WORD.findall(' '.join(_IMPORT_LINE.findall(import_lines(text)))))
    for bases in _CLASS_BASES.findall(text):
      for base in bases.split(','):
        dotted = base.strip()
        if '=' in dotted or not re.fullmatch(r'[\w.]+', dotted):
          continue  # (metaclass=..., a call)
        cls = dotted.rsplit('.', 1)[-1]
        for other, name in defining.get(cls, ()):
          if other != path and name.rsplit('.', 1)[-1] in imported:
            found.add(f'{name}.{cls}')
  return frozenset(found)


#: Pre-pass rounds: a creator that itself uses another module's factory is planned again
#: with what the previous round found, until nothing changes.
MAX_ROUNDS = 5


def build_flows(files: list[tuple[pathlib.Path, list[tuple[str, bool]], str]], options,
                outside: Iterable[pathlib.Path] = (),
                sources: Optional[Mapping[pathlib.Path, SourceFile]] = None,
                inject_classes: frozenset = frozenset(),
                ) -> tuple[dict[str, Factory], dict[str, Step]]:
  """The factories and step functions of the tree, each ``{qualified name: ...}``.

  ``files``: each ``.py`` file of the run with its module names
  (:func:`codemod.modules.module_names`) and the path messages name it by. A file is
  parsed only when it could define a factory or take an optimizer as a parameter, and
  some file's import lines mention its module's last name; it is planned as the run will
  rewrite it, with the flow of the others when it calls one of them (rounds to a fixed
  point; a file still changing after :data:`MAX_ROUNDS` counts as kept legacy). ``outside``:
  those of ``files`` the run reads but does not rewrite
  (:func:`codemod.modules.outside_modules`): their legacy functions stay legacy.
  ``sources``: the run's :class:`codemod.sources.SourceFile` by path (read once; the
  others are read here and added). ``inject_classes``: :func:`injecting_subclasses`, given
  to every file's planning (:attr:`Flow.inject_classes`).
  """
  outside = set(outside)
  sources = {} if sources is None else sources
  texts = {}
  for path, _, _ in files:
    source = sources.setdefault(path, SourceFile(path))
    try:
      texts[path] = source.words()
    except OSError:
      continue  # the per-file run reports it
  imported = set()
  for text in texts.values():
    if 'import' in text:
      for line in _IMPORT_LINE.findall(import_lines(text)):  # (a one-line pattern)
        imported.update(_WORD.findall(line))
  # the last names of modules declaring a class with optimizer fields: a file importing one
  # of them may read its fields (an evaluation script no module imports), and holds the
  # class when it keeps its legacy code (or the codemod fails on it)
  containers = {name.rsplit('.', 1)[-1] for path, names, _ in files
                if texts.get(path) is not None and _field_class(texts[path])
                for name, _ in names}
  creators = [(path, names, shown) for path, names, shown in files
              if texts.get(path) is not None and names
              and (_could_define(texts[path]) or _could_take(texts[path]))
              and (any(name.rsplit('.', 1)[-1] in imported for name, _ in names)
                   or (containers and _imports_any(texts[path], containers))
                   # a container class: a module handed its instances reads its fields
                   # without importing it (`state.optimizer.target` in a helper)
                   or (_field_class(texts[path])
                       and legacy_api.may_need_rewrite(texts[path]))
                   # a def factory its own module calls (`def create_optimizer(): return
                   # optim.Adam(...)`, then `create_optimizer().create(p)` in a method)
                   or _calls_own_function(texts[path])
                   # or that no file of the run imports (helper-34's D2: an uncalled
                   # get_backbone_multioptimizer kept its module legacy, and the factory
                   # it calls, and every module with it): converted as an imported one is
                   or _returns_def(texts[path]))]
  # names a package's __init__.py imports from its modules, which importers take from it
  aliases = {alias: target for path, names, _ in files if texts.get(path) is not None
             for module, is_package in names if is_package
             for alias, target in reexports(texts[path], module, is_package).items()}
  helpers = restore_helpers(files, texts, imported)
  settle = functools.partial(_settle, texts=texts, sources=sources, options=options,
                             outside=outside, aliases=aliases, inject_classes=inject_classes,
                             helpers=helpers)
  factories, steps, found = settle(creators)
  factories, steps, found, scanned = _decide_def_factories(
      factories, steps, found, creators, settle, texts, files, outside,
      shim=getattr(options, 'shim_fallback', True))
  factories, steps, found = _decide_fields(factories, steps, found, scanned, settle, texts)
  factories, steps = _decide_factories(factories, steps, found, scanned, settle, texts, files,
                                       sources, options, outside, inject_classes)
  return _handoffs_elsewhere(factories, steps, scanned, texts, files, sources, options,
                             outside, inject_classes), steps


#: ``{last name: (position, keyword) of the target}`` of the checkpoint readers taking one.
_READERS = {qname.rsplit('.', 1)[1]: where for qname, where in legacy_api.RESTORES.items()}


def restore_helpers(files, texts: Mapping, imported: set) -> dict[str, Step]:
  """The checkpoint helpers of the tree: module-level functions of files that do not
  reference flax.optim (:func:`codemod.legacy_api.references_flax_optim`; they may read
  ``optimizer.state.step``, helper-29's D1) that pass a parameter of theirs as the
  target of a checkpoint reader (``def restore_or_init(workdir, optimizer): return
  checkpoints.restore_checkpoint(workdir, optimizer)``), in a module some import line of the
  tree names. Each is a :class:`Step` kept as it is (``converted`` False, ``restores`` the
  reader): a caller converting the optimizer it passes would hand the reader a TrainState,
  into which a checkpoint its legacy code wrote does not load, so that caller keeps its
  legacy code, on the shim (OM124; helper-27's D2). Read with :mod:`ast` (no LibCST parse);
  a file that does not parse is skipped (its own run reports it)."""
  found = {}
  for path, names, shown in files:
    text = texts.get(path)
    if (text is None or not names or _TOP_DEF.search(text) is None
        or not any(word in text for word in _READERS) or legacy_api.references_flax_optim(text)
        or not any(name.rsplit('.', 1)[-1] in imported for name, _ in names)):
      continue
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
      continue
    for function in tree.body:
      if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
          found_params := _restored_params(function)):
        reader = found_params[0][2]
        params = tuple((position, name) for position, name, _ in found_params)
        why = f'it restores a checkpoint into `{params[0][1]}` with {reader}'
        for name, _ in names:
          found[f'{name}.{function.name}'] = Step(f'{name}.{function.name}', shown, params,
                                                  False, why, restores=reader)
  return found


def _restored_params(function) -> list[tuple[Optional[int], str, str]]:
  """``(position, name, reader)`` of each parameter of ``function`` it passes, by its name, as
  the target of a checkpoint reader (:data:`_READERS`)."""
  positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
  names = {*positional, *(a.arg for a in function.args.kwonlyargs)}
  found = []
  for node in ast.walk(function):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    reader = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
    if reader not in _READERS:
      continue
    index, keyword = _READERS[reader]
    given = [k.value for k in node.keywords if k.arg == keyword] or (
        [node.args[index]] if len(node.args) > index else [])
    if given and isinstance(given[0], ast.Name) and given[0].id in names and \
        given[0].id not in [name for _, name, _ in found]:
      name = given[0].id
      found.append((positional.index(name) if name in positional else None, name, reader))
  return found


def _handoffs_elsewhere(factories, steps, scanned, texts, files, sources, options, outside,
                        inject_classes):
  """The :class:`Handoff` s of the files the pre-pass did not plan that build instances of a
  class with optimizer fields (calling its class or a :class:`ContainerFactory` by name) and
  may hand them to another module's function (``state = create_train_state(...)`` then
  ``helpers.param_norm(state)`` in a ``train.py`` that never imports flax.optim): planned once
  with the tables as they are, their hand-offs added."""
  makers = {f.function for f in factories.values()
            if isinstance(f, (Fields, ContainerFactory))}
  if not makers:
    return factories
  found = dict(factories)
  for path, names, shown in files:
    text = texts.get(path)
    if (text is None or (path, names, shown) in scanned or path in outside
        or 'import' not in text or not any(_calls(text, f'.{name}') for name in makers)):
      continue
    flow = Flow(factories, *(names[0] if names else (None, False)), steps, inject_classes)
    for entry in _scan(sources[path], names, shown, options, flow)[0]:
      if isinstance(entry, Handoff):
        found.setdefault(entry.qualified, entry)
  return found


def _decide_fields(factories, steps, found, scanned, settle, texts):
  """Classes with optimizer fields whose fields a file that keeps its legacy code reads
  (hypernerf's ``training.py`` steps ``state.optimizer`` with flax.optim state surgery, while
  ``train.py`` would store a TrainState there; a file the codemod fails on, which stays as
  it is): held (:attr:`Fields.held`), decided again until nothing changes.
  ``(factories, steps, found)``."""
  held: dict[tuple[str, str], str] = {}
  for _ in range(MAX_ROUNDS):
    converted = {q: f for q, f in factories.items() if isinstance(f, Fields) and f.converted}
    new_held = {}
    for key, (_, _, file_uses) in found.items():
      for use in _expand_kept(file_uses, texts.get(pathlib.Path(key)), converted, _reads_field):
        entry = converted.get(use.qualified)
        if entry is not None and not use.converted and use.path != entry.path:
          new_held.setdefault((entry.path, entry.function),
                              f'{use.where or use.path}, which keeps its legacy code '
                              f'({use.why})')
    new_held = {k: v for k, v in new_held.items() if k not in held}
    if not new_held:
      break
    held.update(new_held)
    seed = {q: dataclasses.replace(f, held=held[(f.path, f.function)])
            if isinstance(f, Fields) and (f.path, f.function) in held else f
            for q, f in factories.items()}
    factories, steps, found = settle(scanned, seed=seed)
  return factories, steps, found


def _decide_def_factories(factories, steps, found, creators, settle, texts, files, outside,
                          shim=True):
  """Def factories (``def get_optimizer(cfg): return optim.Adam(...)``): convert those whose
  every caller in the run ``.create`` s what they return and converts, one decision per
  factory for the whole run. With ``shim`` (the shim fallback, OM014), one that cannot is
  :attr:`DefFactory.shimmed`: its file keeps its legacy code on the shim, and the callers
  that ``.create`` what it returns convert around ``optim_compat.to_optax(<call>)``.
  ``(factories, steps, found, scanned)``: the tables, each scanned file's :func:`_scan` and
  the files scanned."""
  candidates = {f.qualified: False for f in factories.values() if isinstance(f, DefFactory)}
  if not candidates:  # (qualified name -> its file must inject the rate)
    return factories, steps, found, creators
  shimmed: set = set()  # failed, left to the shim: their callers see them as user defs
  called = [(path, names, shown) for path, names, shown in files
            if texts.get(path) is not None and (path, names, shown) not in creators
            and any(_calls(texts[path], q) for q in candidates)]

  def seeded():
    return {key: dataclasses.replace(f, allowed=True, inject_required=candidates[f.qualified])
            if isinstance(f, DefFactory) and f.qualified in candidates else
            dataclasses.replace(f, shimmed=True) if isinstance(f, DefFactory)
            and f.qualified in shimmed else f for key, f in factories.items()}

  for _ in range(MAX_ROUNDS):
    tried, tried_steps, tried_found = settle(creators + called, seed=seeded())
    failing, inject = _def_verdicts(candidates, tried, tried_found, texts, files, outside)
    if not failing and not inject:
      return tried, tried_steps, tried_found, creators + called
    for q in failing:
      del candidates[q]
      if shim and _can_shim(factories.get(q)):
        shimmed.add(q)  # (one that used it may convert next round, around to_optax)
    candidates.update(dict.fromkeys(inject, True))
    if not candidates:
      break
  if not shimmed:  # none converts: each keeps its file legacy (OM114)
    return factories, steps, found, creators
  candidates.clear()  # (rounds spent, or none left: only the shimmed ones change)
  tried, tried_steps, tried_found = settle(creators + called, seed=seeded())
  return tried, tried_steps, tried_found, creators + called


def _can_shim(entry) -> bool:
  """``entry`` (a def factory the run does not convert) may be left to the shim: a module
  level function of a file of the run that the codemod plans (not a method called by name,
  another package's, or a parameter sink)."""
  return (type(entry) is DefFactory and not entry.method and not entry.upstream
          and entry.why != _SCAN_FAILED)


def _decide_factories(factories, steps, found, scanned, settle, texts, files, sources, options,
                      outside, inject_classes=frozenset()):
  """Factories the run converts (``create_optimizer(p)`` returning a TrainState) whose users
  in other files cannot take one: a user that keeps its legacy code holds the factory legacy
  too (:attr:`Factory.held`: both then run on the shim, no TrainState reaches flax.optim
  code), and a user passing a learning rate at apply time makes it inject its rate
  (:attr:`Factory.inject_required`), decided again until nothing changes."""
  # one decision per factory, whatever name a user calls it by (a module is named from each
  # root above it: `ppo.models` and `models`): keyed by (defining file, function)
  held: dict[tuple[str, str], str] = {}
  inject: set[tuple[str, str]] = set()
  for _ in range(2 * len(factories) + 1):  # (each round holds or injects one more, at least)
    converted = {q: f for q, f in factories.items()
                 if isinstance(f, Factory) and f.converted and not f.migrated}
    if not converted:
      break
    uses: dict[tuple[str, str], list[DefUse]] = {}

    def add(use):
      if use.qualified in converted:
        entry = converted[use.qualified]
        uses.setdefault((entry.path, entry.function), []).append(use)
    for key, (_, _, file_uses) in found.items():
      for use in _expand_kept(file_uses, texts.get(pathlib.Path(key)), converted, _calls):
        add(use)
    for path, names, shown in files:  # the users no pre-pass scan saw
      if texts.get(path) is None or (path, names, shown) in scanned or not any(
          _calls(texts[path], q) for q in converted):
        continue
      flow = Flow(factories, *(names[0] if names else (None, False)), steps, inject_classes)
      if flow.mentioned(texts[path]):
        for use in _scan(sources[path], names, shown, options, flow, path in outside)[2]:
          if use.qualified:
            add(use)
          else:  # a notebook that cannot be planned: a legacy user of each factory it calls
            for q in converted:
              if _calls(texts[path], q):
                add(dataclasses.replace(use, qualified=q))
    new_held, new_inject = {}, set()
    for entry in converted.values():
      key = (entry.path, entry.function)
      for use in uses.get(key, []):
        if use.inject and not entry.inject_lr and key not in inject:
          new_inject.add(key)
        elif not use.converted and key not in new_inject:
          new_held.setdefault(key, f'{use.where or use.path}, which keeps its legacy code '
                                   f'({use.why})')
    new_held = {key: why for key, why in new_held.items() if key not in new_inject}
    if not new_held and not new_inject:
      break
    held.update(new_held)
    inject |= new_inject
    seed = {q: dataclasses.replace(f, held=held.get((f.path, f.function), ''),
                                   inject_required=(f.path, f.function) in inject)
            if isinstance(f, Factory) and (f.path, f.function) in held.keys() | inject else f
            for q, f in factories.items()}
    factories, steps, found = settle(scanned, seed=seed)
  return factories, steps


def _imports_any(text: str, modules: set) -> bool:
  """``text``'s import lines name one of ``modules`` (last names)."""
  return 'import' in text and any(
      word in modules for line in _IMPORT_LINE.findall(import_lines(text))
      for word in _WORD.findall(line))


def _expand_kept(uses, text, entries, names) -> list:
  """``uses`` with a file's "kept as it is" use (qualified ``''``: the codemod fails on it)
  made one legacy use of each of ``entries`` (``{qualified: entry}``) that ``names(text,
  qualified)`` finds in its text."""
  found = []
  for use in uses:
    if use.qualified or text is None:
      found.append(use)
    else:
      found.extend(dataclasses.replace(use, qualified=q) for q, entry in entries.items()
                   if names(text, q, entry))
  return found


def reads_field(text: str, fields) -> bool:
  """``text`` reads one of ``fields`` as an attribute (``<x>.optimizer``; a cheap test)."""
  return any(re.search(rf'\.[ \t]*{re.escape(field)}\b', text) for field in fields)


def _reads_field(text: str, qualified: str, entry) -> bool:
  return reads_field(text, entry.fields)


@functools.lru_cache(maxsize=1)
def _returned_def() -> re.Pattern:
  """``return optim.Adam(``, ``return Momentum(``: a function returning a legacy def."""
  names = '|'.join(sorted(legacy_api.DEF_NAMES))
  return re.compile(rf'\breturn[ \t(]+(?:[\w.]+\.)?(?:{names})[ \t]*\(')


def _returns_def(text: str) -> bool:
  """A module-level function of ``text`` returns a legacy def built in its ``return``
  (``return optim.MultiOptimizer(...)``; not ``return optim.Adam(lr).create(p)``, an
  optimizer). Read with :mod:`ast` only where :func:`_returned_def` finds the words."""
  if _returned_def().search(text) is None or not legacy_api.may_need_rewrite(text):
    return False
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return False  # (its own run reports it)
  names = legacy_api.def_names()
  return any(isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and (
      getattr(node.value.func, 'attr', None) or getattr(node.value.func, 'id', None)) in names
      for function in tree.body if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
      for node in ast.walk(function))


def _calls_own_function(text: str) -> bool:
  """``text`` is legacy code with a function that returns a legacy def, which it calls by
  name and ``.create``s (a cheap test, on the text: the def factory is found by the parse)."""
  return ('.create(' in text and _returned_def().search(text) is not None
          and legacy_api.may_need_rewrite(text)
          and any(_calls(text, f'.{name}') for name in set(_TOP_DEF.findall(text))))


def _calls(text: str, qualified: str, entry=None) -> bool:
  """``text`` may call the function ``qualified`` names: its last name then ``(``, not after
  ``def`` (``agent_lib.create_optimizer(...)`` on a module handed in as a parameter counts:
  a cheap, conservative test)."""
  function = qualified.rsplit('.', 1)[1]
  return re.search(rf'(?<!def )\b{re.escape(function)}\s*\(', text) is not None


def _def_verdicts(candidates, factories, found, texts, files, outside) -> tuple[set, set]:
  """Which candidate def factories must stay legacy (``failing``: the defining file does not
  convert, or a file that may call one does not ``.create`` and convert all it gets, or lies
  outside the run) and which must be tried again injecting their learning rate."""
  failing, inject = set(), set()
  uses: dict = {}
  for key, (_, _, file_uses) in found.items():
    for use in file_uses:
      uses.setdefault(use.qualified, {})[key] = use
  for q, required in candidates.items():
    entry = factories.get(q)
    if isinstance(entry, DefSink):
      # its file converts and sets no learning rate at apply time on what it creates (the
      # callers' transformations would have to inject it), and every file that may call it
      # hands it a table def and converts
      # (a method is called by its name alone: no other file may define one so named)
      if not entry.converted or entry.inject_lr or any(
          not use.converted for use in uses.get(q, {}).values()) or any(
          path in outside or str(path) not in uses.get(q, {})
          for path, _, shown in files if shown != entry.path and texts.get(path) is not None
          and _calls(texts[path], q)) or (
              entry.method and _defined_elsewhere(entry.method, {entry.path}, texts, files)):
        failing.add(q)
      continue
    if isinstance(entry, DefFactory) and not entry.converted and not required and any(
        use.inject for use in uses.get(q, {}).values()):
      inject.add(q)  # (a def without a learning rate converts once its file injects one)
      continue
    if not isinstance(entry, DefFactory) or not entry.converted:
      failing.add(q)
      continue
    if entry.method and _defined_elsewhere(  # (called by name: no other file may define a
        # method so named that is not one of them)
        entry.method, {f.path for f in factories.values()
                       if type(f) is DefFactory and f.method == entry.method}, texts, files):
      failing.add(q)
      continue
    for path, _, shown in files:
      if shown == entry.path or texts.get(path) is None or not _calls(texts[path], q):
        continue
      use = uses.get(q, {}).get(str(path))
      if path in outside or use is None:
        failing.add(q)
    for use in uses.get(q, {}).values():
      if not use.converted and not (use.inject and not entry.inject_lr):
        failing.add(q)
      elif use.inject and not entry.inject_lr:
        (failing if required else inject).add(q)
  return failing, inject - failing


def _defined_elsewhere(method: str, paths: set, texts, files) -> bool:
  """A file of the run other than ``paths`` (as the run names them) defines a function or
  method called ``method`` (a call by that name may reach it)."""
  pattern = re.compile(rf'\bdef[ \t]+{re.escape(method)}\b')
  return any(pattern.search(texts[path]) is not None for path, _, shown in files
             if shown not in paths and texts.get(path) is not None)


def _settle(creators, texts, sources, options, outside, aliases, seed=None,
            inject_classes=frozenset(), helpers=None):
  """The pre-pass over ``creators`` to a fixed point: ``(factories, steps, found)`` (``found``:
  each file's :func:`_scan`). ``seed``: the table the first scan of each file is given
  (else none). ``helpers``: :func:`restore_helpers`, steps of files no scan plans."""
  merge = functools.partial(_merge, aliases=aliases, helpers=helpers)
  found = {str(path): _scan(sources[path], names, shown, options,
                            Flow(seed if seed is not None else {},
                                 *(names[0] if names else (None, False)),
                                 inject_classes=inject_classes)
                            if seed is not None or inject_classes else None,
                            path in outside)
           for path, names, shown in creators}
  unsettled: set[str] = set()
  for _ in range(MAX_ROUNDS - 1):
    factories, steps = merge(found)
    if not factories and not steps:
      return {}, {}, found
    unsettled = set()
    for path, names, shown in creators:
      others = Flow({q: f for q, f in factories.items() if f.path != shown},
                    steps={q: f for q, f in steps.items() if f.path != shown})
      if others.mentioned(texts[path], reads=True):
        new = _scan(sources[path], names, shown, options,
                    Flow(factories, *(names[0] if names else (None, False)), steps,
                         inject_classes),
                    path in outside)
        if new != found[str(path)]:
          found[str(path)] = new
          unsettled.add(str(path))
    if not unsettled:
      return factories, steps, found
  for key in unsettled:  # still changing: never prove anything from them
    why = 'it depends on other modules in a way the pre-pass did not settle'
    found[key] = tuple([dataclasses.replace(f, converted=False, why=why) for f in part]
                       for part in found[key])
  return (*merge(found), found)


def _merge(found: dict, aliases: Mapping[str, str], helpers: Optional[Mapping[str, Step]] = None,
           ) -> tuple[dict[str, Factory], dict[str, Step]]:
  """The tables by qualified name, plus each re-exported name (``aliases``, from
  :func:`codemod.modules.reexports`, followed through packages) of an entry; ``helpers``
  (:func:`restore_helpers`) among the steps."""
  factories = {f.qualified: f for factories, _, _ in found.values() for f in factories}
  steps = {**(helpers or {}), **{f.qualified: f for _, steps, _ in found.values() for f in steps}}
  for table in (factories, steps):
    for _ in range(4):  # pkg -> pkg.sub -> pkg.sub.module: a few hops
      new = {alias: table[target] for alias, target in aliases.items()
             if alias not in table and target in table}
      if not new:
        break
      table.update(new)
  return factories, steps


#: Why a notebook calling a factory is taken for a user that keeps its legacy code.
_SCAN_FAILED = 'the codemod fails on it and leaves it as it is; its error is in the report'
_NOTEBOOK_KEPT = ('its cells cannot be planned (IPython syntax, a magic or shell line, that may '
                  'use flax.optim or an optimizer, or code that does not parse), so the rewrite '
                  'leaves them as they are')

#: Why a legacy module the run reads but does not rewrite keeps its legacy code.
NOT_IN_RUN = 'it is not among the files this run rewrites'


def _why(source: SourceFile, plan, options, todos: bool = True) -> str:
  """The first manual item of a file's report: its plan's, else (``todos``) an earlier run's
  TODO."""
  first = next((f for f in plan.findings if not f.fixed), None)
  if first is not None:
    return first.why
  for _, _, rule, message in (findings.todo_comments(source.text) if todos else ()):
    if not options.enabled(rule) or (plan.converts and findings.stale_todo(
        findings.todo_text(rule, message))):
      continue  # ignored, or a stale "keeps its legacy code" TODO this run drops
    return f'{rule}: still to do, from an earlier run: {findings.without_note(message)}'
  return 'see its report'


def _first_blocking(plan, outside):
  """The file's own first reason to keep its legacy code (not what a held entry of the flow
  meets there, OM123), or None (none, or a file outside the run)."""
  return None if outside else next(
      (f for f in plan.findings if f.blocks and f.rule != 'OM123'), None)


def _uses(plan, shown, changes, outside, why) -> list[DefUse]:
  """One file's uses of (def) factories, from its plan. Why a user keeps its legacy code: its
  own first reason, not what the factory's TrainState meets there (OM123, which holding the
  factory removes). The user is named by its file alone: a line number would move with the
  TODO lines a run adds above it, and the next run would write its flags again."""
  first = _first_blocking(plan, outside)
  where = shown
  use_why = why if first is None else first.why
  summary = plan.summary
  # (a def factory's user converts only with changes: its `.create`s are rewritten; a
  # factory's user may have nothing to rewrite, `main.py` calling `train_and_evaluate(cfg)`)
  kept = [(q, ok and changes, inject) for q, (ok, inject) in summary.def_uses.items()] + [
      (q, ok and not outside, inject) for q, (ok, inject) in summary.factory_uses.items()]
  return [DefUse(q, shown, ok, inject,
                 '' if ok else summary.factory_steps.get(q, use_why), where=where)
          for q, ok, inject in kept]


def _field_uses(plan, shown, outside, why) -> list[DefUse]:
  """One file's reads of the fields of other modules' classes with optimizer fields
  (:attr:`codemod.plan.Summary.field_uses`), as uses: not converted where the file keeps its
  legacy code (or lies outside the run), so that :func:`_decide_fields` holds the class."""
  first = _first_blocking(plan, outside)
  return [DefUse(q, shown, ok and not outside, why='' if ok and not outside else
                 (first.why if first is not None else why), where=shown)
          for q, ok in plan.summary.field_uses.items()]


def _scan(source: SourceFile, names, shown, options, flow_file, outside=False,
          ) -> tuple[list[Factory], list[Step], list[DefUse]]:
  """The factories and step functions one file defines, as the run's rewrite makes them:
  from the file's plan, nothing rewritten (``outside``: a file the run does not rewrite,
  whose legacy code therefore stays). Code nested deeper than the recursion limit is
  scanned on a deep stack (:mod:`codemod.deep`). Read from and stored in the run's cache
  (:func:`scan_cache`) when it has one: a run over an unchanged tree parses no file here."""
  store, key = _SCAN_STORE[0], None
  if store is not None:
    try:
      key = store.scan_key(source.data, names, shown, outside, flow_file, source.words())
    except OSError:  # (the per-file run reports it)
      key = None
    if key is not None and (found := store.get_scan(key)) is not None:
      return found
  try:
    found = deep.retry_deep(lambda: _scan_file(source, names, shown, options, flow_file, outside))
  except RecursionError:  # (even the deep stack overflows: the per-file run reports it)
    return [], [], [DefUse('', shown, False, why=_SCAN_FAILED, where=shown)]
  if key is not None and not any(use.why == _SCAN_FAILED for use in found[2]):
    store.put_scan(key, found)
  return found


#: The result cache (:class:`codemod.cache.Cache`) the pre-pass's scans use, or None.
_SCAN_STORE: list = [None]


@contextlib.contextmanager
def scan_cache(store):
  """Within it, :func:`_scan` reads and stores scans in ``store`` (a
  :class:`codemod.cache.Cache`; None: no cache, e.g. ``--no-cache``)."""
  previous = _SCAN_STORE[0]
  _SCAN_STORE[0] = store
  try:
    yield
  finally:
    _SCAN_STORE[0] = previous


def _scan_file(source: SourceFile, names, shown, options, flow_file, outside=False,
               ) -> tuple[list[Factory], list[Step], list[DefUse]]:
  from codemod import engine
  from codemod.facts.migrated import migrated_factories, migrated_field_classes
  notebook = source.path.suffix == '.ipynb'  # (it defines nothing others import: uses only)
  try:
    planned = (engine.plan_notebook if notebook else engine.plan_file)(source, options, flow_file)
  except Exception:  # noqa: BLE001 - a failing rule: the per-file run reports it
    # the file stays as it is: a legacy user of whatever it calls or reads (_expand_kept)
    return [], [], [DefUse('', shown, False, why=_SCAN_FAILED, where=shown)]
  if planned is None:  # (a notebook that cannot be planned: it stays as it is, a legacy user)
    return [], [], [DefUse('', shown, False, why=_NOTEBOOK_KEPT)] if notebook else []
  _, plan = planned
  changes = plan.changes and not outside  # read, never written: what it holds is what stays
  if notebook:
    return [], [], _uses(plan, shown, changes, outside,  # (its text is JSON: no TODO read)
                         _why(source, plan, options, todos=False))
  why = NOT_IN_RUN if outside else _why(source, plan, options)
  summary = plan.summary
  found = {}
  if summary.factories:  # legacy: what this run's rewrite of the file makes of them
    for function, converted in summary.factories.items():
      converted = converted and changes
      found[function] = (converted, summary.inject_lr, '' if converted else why)
  else:  # already migrated: functions returning TrainState.create(...)
    found = {function: (True, inject, '')
             for function, inject in migrated_factories(source.module, source.analysed_text).items()}
  own = {} if flow_file is None else flow_file.factories
  migrated = not summary.factories

  def decided(key: str) -> dict:  # what the pre-pass decided of one of them, kept
    entry = own.get(key)
    return {'held': entry.held, 'inject_required': entry.inject_required} if (
        isinstance(entry, Factory)) else {}
  bundles = [Factory(f'{name}.{function}', shown, converted and changes, None,
                     '' if converted and changes else why, bundle=True,
                     **decided(f'{name}.{function}'))
             for function, converted in summary.bundles.items() for name, _ in names]
  steps = []
  for function, (params, converted) in summary.steps.items():
    converted = converted and changes
    steps.extend(Step(f'{name}.{function}', shown, params, converted, '' if converted else why)
                 for name, _ in names)
  classes = [Fields(f'{name}.{cls}', shown, converted and changes,
                   '' if converted and changes else why, fields=tuple(fields),
                   held=getattr(own.get(f'{name}.{cls}'), 'held', ''))
             for cls, (fields, converted) in summary.fields.items() for name, _ in names]
  classes += [Fields(f'{name}.{cls}', shown, True, fields=tuple(fields))  # migrated before this run
              for cls, fields in migrated_field_classes(source.module, source.analysed_text).items()
              if cls not in summary.fields for name, _ in names]
  classes += [ContainerFactory(f'{name}.{function}', shown, converted and changes,
                               '' if converted and changes else why)
              for function, converted in summary.container_factories.items()
              for name, _ in names]
  def_factories = [DefFactory(f'{name}.{function}', shown, converted and changes,
                               '' if converted and changes else why, inject_lr=summary.inject_lr,
                               allowed=getattr(own.get(f'{name}.{function}'), 'allowed', False),
                               inject_required=getattr(own.get(f'{name}.{function}'),
                                                       'inject_required', False),
                               shimmed=getattr(own.get(f'{name}.{function}'), 'shimmed', False),
                               groups=function in summary.group_def_factories,
                               method=function.rsplit('.', 1)[1] if '.' in function else '')
                    for function, converted in summary.def_factories.items()
                    for name, _ in names]
  def_factories += [DefSink(f'{name}.{function}', shown, converted and changes,
                            '' if converted and changes else why, inject_lr=summary.inject_lr,
                            allowed=getattr(own.get(f'{name}.{function}'), 'allowed', False),
                            parameter=parameter,
                            method=function.rsplit('.', 1)[1] if '.' in function else '')
                    for function, (parameter, converted) in summary.def_sinks.items()
                    for name, _ in names]
  classes += [UserDef(f'{name}.{cls}', shown, True) for cls in summary.user_defs
              for name, _ in names]
  classes += [Handoff(f'{receiver}@{qualified}', shown, True, receiver=receiver,
                      cls=qualified, fields=fields, mixed=mixed,
                      sibling=f'{name.rsplit(".", 1)[0]}.{receiver.rsplit(".", 1)[0]}'
                      if '.' in name and not written.startswith('.') else '')
              for written, (handed, mixed) in summary.handoffs.items() for cls, fields in handed
              for name, is_package in names
              if (receiver := absolute_name(written, name, is_package)) is not None
              for qualified in [cls if '.' in cls else f'{name}.{cls}']]
  uses = _uses(plan, shown, changes, outside, why)
  uses += _field_uses(plan, shown, outside, why)
  layouts = ([Layout(f'{name}.{LAYOUT}', shown, bool(summary.inject_lr)) for name, _ in names]
             if (summary.defs or summary.inject_lr) and changes and plan.converts else [])
  # (a module with no defs that sets rates at apply time on optimizers handed to it: those
  # who hand them theirs inject, hypernerf's training.train_step)
  if summary.inject_lr and changes and plan.converts:
    # (and the container classes it hands on: every module storing its optimizers in one
    # injects, so that the checkpoints of the class have one layout: nerfies' eval.py
    # restores what train.py saved)
    layouts += [Layout(f'{qualified}.{LAYOUT}', shown, True)
                for handed, _ in summary.handoffs.values() for cls, _ in handed
                for name, _ in names for qualified in [cls if '.' in cls else f'{name}.{cls}']]
  return ([Factory(f'{name}.{function}', shown, converted, inject, why, migrated=migrated,
                   **decided(f'{name}.{function}'))
           for function, (converted, inject, why) in found.items() for name, _ in names]
          + bundles + classes + def_factories + layouts, steps, uses)
