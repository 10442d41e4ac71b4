"""Cross-module optimizer flows: the repository-level pre-pass of ``rewrite``.

A file that never imports ``flax.optim`` may still hold a legacy optimizer: one
made by a function of another module (``opt = create_optimizer(p)`` after
``from pkg.opt import create_optimizer``). Before the per-file rewrites,
:func:`build_factories` finds, over all the files of the run, the module-level
functions whose returned optimizer the codemod converts to a ``TrainState``
(by rewriting their file exactly as the run will), keyed by qualified name
``<module dotted name>.<function>``; a module's dotted name is its path
relative to the tree root (the directory given, raised past parent packages
that have an ``__init__.py``). Each file's rewrite then gets a :class:`Flow`:
names proven (LibCST ``QualifiedNameProvider``) to be bound to such a call get
the conversions of the defining file; the rest stays flagged, naming the
factory the file uses.

The pre-pass is cheap: only files that could define a factory (they reference
``flax.optim``, define a function and call ``create``) and whose module's last
name appears in an import line of another file are parsed; for stdin (``-``)
there is no tree and no flow.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Iterable, Mapping, Optional

import libcst as cst
from libcst.metadata import QualifiedNameProvider

#: A line that imports something (``import a.b``, ``from .a import b``).
_IMPORT_LINE = re.compile(r'^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import\b)[^\n]*', re.M)
_WORD = re.compile(r'\w+')
_TOP_DEF = re.compile(r'^(?:async[ \t]+)?def[ \t]+\w+', re.M)


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
  """
  qualified: str
  path: str
  converted: bool
  inject_lr: Optional[bool]
  why: str = ''
  bundle: bool = False


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
  """
  qualified: str
  path: str
  params: tuple[tuple[Optional[int], str], ...]
  converted: bool
  why: str = ''


@dataclasses.dataclass(frozen=True)
class Flow:
  """What one file's rewrite knows of the tree: the factories, the step functions and its
  own module name."""
  factories: Mapping[str, Factory]
  module: Optional[str] = None
  is_package: bool = False  # the file is a package's ``__init__.py``
  steps: Mapping[str, Step] = dataclasses.field(default_factory=dict)

  def resolve(self, qname: str) -> Optional[Factory]:
    """The factory ``qname`` names (absolute, or relative to this file's package)."""
    return self.factories.get(self._absolute(qname) or '')

  def resolve_step(self, qname: str) -> Optional[Step]:
    """The step function ``qname`` names (absolute, or relative to this file's package)."""
    return self.steps.get(self._absolute(qname) or '')

  def _absolute(self, qname: str) -> Optional[str]:
    return absolute_name(qname, self.module, self.is_package)

  def mentioned(self, text: str) -> bool:
    """Could ``text`` call a factory or step function (its function and its module's last
    name appear)? A cheap prefilter, before any parse."""
    return any(f.function in text and f.qualified.rsplit('.', 2)[-2] in text
               for f in [*self.factories.values(), *self.steps.values()])


def absolute_name(qname: str, module: Optional[str], is_package: bool) -> Optional[str]:
  """``qname`` made absolute: a relative one (``.opt.f``, ``..m``) is resolved against the
  module it is written in (``module``; ``is_package``: that module is a package's
  ``__init__``); None when it climbs above the tree or there is no module."""
  if not qname.startswith('.'):
    return qname
  if module is None:
    return None
  dots = len(qname) - len(qname.lstrip('.'))
  package = module.split('.') if is_package else module.split('.')[:-1]
  if dots - 1 > len(package):
    return None
  return '.'.join(filter(None, [*package[:len(package) - (dots - 1)], qname[dots:]]))


def package_root(root: pathlib.Path) -> pathlib.Path:
  """``root`` (absolute) raised past the packages it lies in (an ``__init__.py``), as
  Python's import path would be."""
  root = root.absolute()
  while (root / '__init__.py').exists() and root.parent != root:
    root = root.parent
  return root


def module_names(path: pathlib.Path, roots: Iterable[pathlib.Path]) -> list[tuple[str, bool]]:
  """``[(dotted name, is_package)]`` of ``path`` relative to each root it lies under.

  A root that is itself inside a package (it has an ``__init__.py``) is raised
  to the package's parent, as Python's import path would be.
  """
  out = []
  absolute = path.absolute()
  for root in map(package_root, roots):
    try:
      rel = absolute.relative_to(root)
    except ValueError:
      continue
    parts = list(rel.with_suffix('').parts)
    is_package = parts[-1] == '__init__'
    if is_package:
      parts = parts[:-1]
    if parts and all(p.isidentifier() for p in parts):
      name = '.'.join(parts)
      if (name, is_package) not in out:
        out.append((name, is_package))
  return out


def roots_of(paths: Iterable[str]) -> dict[str, list[pathlib.Path]]:
  """``{path given: [roots]}``: a directory is its own root; a file's roots are the
  working directory when the file lies under it (so ``rewrite models/opt.py train.py``,
  as pre-commit runs it from the repository root, names modules as ``rewrite .``
  does, namespace packages included), then the file's own directory."""
  out = {}
  cwd = pathlib.Path.cwd()
  for p in map(pathlib.Path, paths):
    if p.is_dir():
      out[str(p)] = [p]
      continue
    roots = [p.parent]
    if cwd in p.absolute().parents and p.absolute().parent != cwd:
      roots.insert(0, cwd)
    out[str(p)] = roots
  return out


_FROM = re.compile(r'^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([^#\n]*)', re.M)
_IMPORT = re.compile(r'^[ \t]*import[ \t]+([^#\n;]*)', re.M)


def imported_modules(text: str, module: Optional[str], is_package: bool) -> set[str]:
  """Dotted names of the modules ``text`` may import (``from a.b import c`` gives ``a.b``
  and ``a.b.c``; relative imports resolved against ``module``). From the first line of each
  import statement: a cheap over- and under-approximation, used only to find modules outside
  the run that an importer in it names."""
  found = set()
  for dots, name, names in _FROM.findall(text):
    name = absolute_name(dots + name, module, is_package)
    if not name:
      continue
    found.add(name)
    for imported in names.split(','):
      word = imported.strip().split(' ')[0].rstrip(')\\')
      if word.isidentifier():
        found.add(f'{name}.{word}')
  for names in _IMPORT.findall(text):
    for imported in names.split(','):
      word = imported.strip().split(' ')[0]
      if word and all(part.isidentifier() for part in word.split('.')):
        found.add(word)
  return found


def read_texts(files) -> dict[pathlib.Path, str]:
  """Each readable file's text (latin-1: any bytes; only words are looked for), by path.
  An unreadable one is left out: the per-file run reports it."""
  texts = {}
  for path, _, _ in files:
    try:
      texts[path] = path.read_bytes().decode('latin-1')
    except OSError:
      continue
  return texts


def outside_modules(files: list[tuple[pathlib.Path, list[tuple[str, bool]], str]],
                    roots: Iterable[pathlib.Path], texts: Mapping[pathlib.Path, str],
                    ) -> list[tuple[pathlib.Path, list, str]]:
  """Modules the run's files import that lie under one of ``roots`` but are not in the
  run (``rewrite train.py`` alone, or pre-commit's changed files): ``(path, module names,
  path shown)``, to be read by the pre-pass (never written), so that a module migrated
  or kept legacy earlier still tells its importers what its functions return and take.
  ``texts``: the files' texts (:func:`read_texts`)."""
  roots = list(dict.fromkeys(map(package_root, roots)))
  inside = set()
  for path, _, _ in files:
    try:
      inside.add(path.resolve())
    except OSError:
      continue
  wanted = set()
  for path, names, _ in files:
    if path.suffix != '.py' or path not in texts:
      continue
    module, is_package = names[0] if names else (None, False)
    wanted |= imported_modules(texts[path], module, is_package)
  out = []
  for name in sorted(wanted):
    parts = name.split('.')
    for root in roots:
      for candidate in (root.joinpath(*parts).with_suffix('.py'),
                        root.joinpath(*parts, '__init__.py')):
        try:
          if not candidate.is_file() or candidate.resolve() in inside:
            continue
        except OSError:
          continue
        inside.add(candidate.resolve())
        out.append((candidate, [(name, candidate.name == '__init__.py')],
                    candidate.relative_to(root).as_posix()))
  return out


def _could_take(text: str) -> bool:
  """A module-level function that may take a legacy optimizer (``opt.apply_gradient``,
  ``opt.target``, an ``optim.Optimizer`` annotation: the codemod's words)."""
  from codemod import engine
  return _TOP_DEF.search(text) is not None and engine.may_need_rewrite(text)


def _could_define(text: str) -> bool:
  """A legacy factory (the codemod's words) or an already migrated one (``TrainState``)."""
  from codemod import engine
  return ('create' in text and 'return' in text and _TOP_DEF.search(text) is not None
          and ('TrainState' in text or engine.may_need_rewrite(text)))


TRAIN_STATE_CREATE = 'flax.training.train_state.TrainState.create'
INJECT = 'optax.inject_hyperparams'


class _MigratedFactories(cst.CSTVisitor):
  """Module-level functions that return ``TrainState.create(...)`` (directly, or a local
  name only ever assigned one): a module migrated before this run, so that its users still
  convert, and a second run over a tree gives what the first wrote."""

  METADATA_DEPENDENCIES = (QualifiedNameProvider,)

  def __init__(self):
    super().__init__()
    self.found: dict[str, Optional[bool]] = {}  # function -> inject_lr
    self._depth = 0                             # functions and classes entered
    self._function = None
    self._assigned: dict[str, list] = {}        # local name -> values assigned
    self._returns: list = []

  def _qnames(self, node) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

  def _creates(self, node) -> bool:
    return isinstance(node, cst.Call) and TRAIN_STATE_CREATE in self._qnames(node.func)

  def visit_ClassDef(self, node) -> None:
    self._depth += 1

  def leave_ClassDef(self, node) -> None:
    self._depth -= 1

  def visit_FunctionDef(self, node) -> None:
    if self._depth == 0:
      self._function, self._assigned, self._returns = node, {}, []
    self._depth += 1

  def visit_Assign(self, node) -> None:
    if self._depth == 1:
      for t in node.targets:
        if isinstance(t.target, cst.Name):
          self._assigned.setdefault(t.target.value, []).append(node.value)

  def visit_Return(self, node) -> None:
    if self._depth == 1 and node.value is not None:
      self._returns.append(node.value)

  def leave_FunctionDef(self, node) -> None:
    self._depth -= 1
    if self._depth or not self._returns:
      return
    creates = []
    for value in self._returns:
      if isinstance(value, cst.Name) and self._assigned.get(value.value):
        values = self._assigned[value.value]
      else:
        values = [value]
      if not all(self._creates(v) for v in values):
        return
      creates.extend(values)
    self.found[node.name.value] = self._inject(creates)

  def _inject(self, calls) -> Optional[bool]:
    verdicts = set()
    for call in calls:
      tx = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == 'tx'),
                None)
      if not isinstance(tx, cst.Call):
        return None  # built elsewhere: cannot tell
      finder = _Finder(self, INJECT)
      tx.visit(finder)
      verdicts.add(finder.found)
    return verdicts.pop() if len(verdicts) == 1 else None


class _Finder(cst.CSTVisitor):
  def __init__(self, owner, qname):
    super().__init__()
    self.owner, self.qname, self.found = owner, qname, False

  def visit_Call(self, node) -> None:
    if self.qname in self.owner._qnames(node.func):
      self.found = True


def migrated_factories(source: str) -> dict[str, Optional[bool]]:
  """``{function: inject_lr}`` of a module's functions that already return a TrainState."""
  if TRAIN_STATE_CREATE.rsplit('.', 2)[1] not in source:
    return {}
  visitor = _MigratedFactories()
  cst.MetadataWrapper(cst.parse_module(source)).visit(visitor)
  return visitor.found


#: Pre-pass rounds: a creator that itself uses another module's factory is rewritten again
#: with what the previous round found, until nothing changes.
MAX_ROUNDS = 3


def build_flows(files: list[tuple[pathlib.Path, list[tuple[str, bool]], str]], options,
                outside: Iterable[pathlib.Path] = (), texts: Optional[Mapping] = None,
                ) -> tuple[dict[str, Factory], dict[str, Step]]:
  """The factories and step functions of the tree, each ``{qualified name: ...}``.

  ``files``: each ``.py`` file of the run with its module names
  (:func:`module_names`) and the path messages name it by. A file is parsed
  only when it could define a factory or take an optimizer as a parameter, and
  some file's import lines mention its module's last name. It is rewritten as
  the run will rewrite it: with the flow of the others when it calls one of them
  (rounds to a fixed point; a file still changing after :data:`MAX_ROUNDS`
  counts as kept legacy). ``outside``: those of ``files`` the run reads but does not
  rewrite (:func:`outside_modules`): their legacy functions stay legacy. ``texts``: the
  texts already read (:func:`read_texts`), by path; the others are read here.
  """
  outside = set(outside)
  texts = {**(texts or {}),
           **read_texts([f for f in files if texts is None or f[0] not in texts])}
  imported = set()
  for text in texts.values():
    if 'import' in text:
      for line in _IMPORT_LINE.findall(text):
        imported.update(_WORD.findall(line))
  creators = [(path, names, shown) for path, names, shown in files
              if texts.get(path) is not None and names
              and (_could_define(texts[path]) or _could_take(texts[path]))
              and any(name.rsplit('.', 1)[-1] in imported for name, _ in names)]
  found = {str(path): _scan(path, names, shown, options, None, path in outside)
           for path, names, shown in creators}
  unsettled: set[str] = set()
  for _ in range(MAX_ROUNDS - 1):
    factories, steps = _merge(found)
    if not factories and not steps:
      return {}, {}
    unsettled = set()
    for path, names, shown in creators:
      others = Flow({q: f for q, f in factories.items() if f.path != shown},
                    steps={q: f for q, f in steps.items() if f.path != shown})
      if others.mentioned(texts[path]):
        new = _scan(path, names, shown, options,
                    Flow(factories, names[0][0], names[0][1], steps), path in outside)
        if new != found[str(path)]:
          found[str(path)] = new
          unsettled.add(str(path))
    if not unsettled:
      return factories, steps
  for key in unsettled:  # still changing: never prove anything from them
    why = 'it depends on other modules in a way the pre-pass did not settle'
    found[key] = tuple([dataclasses.replace(f, converted=False, why=why) for f in part]
                       for part in found[key])
  return _merge(found)


def _merge(found: dict) -> tuple[dict[str, Factory], dict[str, Step]]:
  return ({f.qualified: f for factories, _ in found.values() for f in factories},
          {f.qualified: f for _, steps in found.values() for f in steps})


#: Why a legacy module the run reads but does not rewrite keeps its legacy code.
NOT_IN_RUN = 'it is not among the files this run rewrites'


def _scan(path, names, shown, options, flow_file, outside=False) -> tuple[list[Factory], list[Step]]:
  """The factories and step functions one file defines, as the run's rewrite makes them
  (``outside``: a file the run does not rewrite, whose legacy code therefore stays)."""
  from codemod import engine
  from codemod.transform import KEEPS_LEGACY
  result = engine.rewrite_file(path, options, flow_file)
  if result.error:
    return [], []
  if outside:  # read, never written: what it holds now is what its importers will meet
    result.new = result.original
  why = NOT_IN_RUN if outside else next((f'{f.rule}: {f.message}'.replace(' ' + KEEPS_LEGACY, '')
                                         for f in result.manual), 'see its report')
  found = {}
  if result.factories:  # legacy: what this run's rewrite of the file makes of them
    for function, converted in result.factories.items():
      converted = converted and result.changed
      found[function] = (converted, result.inject_lr, '' if converted else why)
  else:  # already migrated: functions returning TrainState.create(...)
    try:
      migrated = migrated_factories(result.original)
    except cst.ParserSyntaxError:
      migrated = {}
    found = {function: (True, inject, '') for function, inject in migrated.items()}
  bundles = [Factory(f'{name}.{function}', shown, converted and result.changed, None,
                     '' if converted and result.changed else why, bundle=True)
             for function, converted in result.bundles.items() for name, _ in names]
  steps = []
  for function, (params, converted) in result.steps.items():
    converted = converted and result.changed
    steps.extend(Step(f'{name}.{function}', shown, params, converted, '' if converted else why)
                 for name, _ in names)
  return ([Factory(f'{name}.{function}', shown, converted, inject, why)
           for function, (converted, inject, why) in found.items() for name, _ in names]
          + bundles, steps)
