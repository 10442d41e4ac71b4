"""Plan: from a module's facts (and the options, and the other modules' flow) to decisions.

Per module, the verdict (``verdict``): convert, keep the legacy code (the
findings that force it have ``blocks`` set), leave untouched (a fix it needs is
not selected), or nothing proven. Per site (``sites``): which fix, or which
flag and TODO. Nothing is rewritten here; ``codemod.rewrite`` applies the plan.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from codemod.failures import failure
from codemod.findings import Finding
from codemod.plan import sites, verdict
from codemod.rules import crossmodule, fallback
from codemod.plan.queries import Queries

#: Fixes that change optimizer code (OM005 imports and OM006 DynamicScale paths do not).
CONVERSIONS = frozenset({'OM001', 'OM002', 'OM003', 'OM004', 'OM007', 'OM008', 'OM009', 'OM010',
                         'OM011', 'OM012', 'OM013', 'OM015', 'OM016', 'OM017',
                         'OM018'})


@dataclasses.dataclass
class Summary:
  """What the module offers other modules (``codemod.flow``): each module-level function
  that returns an optimizer (``factories``), returns one in a tuple / list / dict
  (``bundles``) or takes one (``steps``: its optimizer parameters), and whether this run
  makes them TrainStates."""
  factories: dict
  steps: dict
  bundles: dict
  inject_lr: bool
  #: module-level class -> (its fields annotated ``Optimizer``, converted)
  fields: dict = dataclasses.field(default_factory=dict)
  #: module-level function returning a legacy def -> converted (its callers `.create` it)
  def_factories: dict = dataclasses.field(default_factory=dict)
  #: those returning a MultiOptimizer (or a subclass: one set of hyper-parameters per group)
  group_def_factories: tuple = ()
  defs: bool = False  # the module builds legacy defs (its Layout is offered to the others)
  #: qualified name of a def factory the run converts -> (this module's ``.create`` s of it
  #: convert, this module passes a learning rate at apply time) (codemod.flow.DefUse)
  def_uses: dict = dataclasses.field(default_factory=dict)
  #: qualified name of another module's factory the run converts -> (this module converts,
  #: this module passes a learning rate at apply time to what it returns) (codemod.flow)
  factory_uses: dict = dataclasses.field(default_factory=dict)
  #: qualified name of such a factory -> why this module does not take its TrainState: it
  #: hands it to a step function that keeps its legacy code (codemod.flow holds the factory)
  factory_steps: dict = dataclasses.field(default_factory=dict)
  #: module-level function every return of which builds a class with optimizer fields
  #: (``return TrainState(step=0, optimizer=opt)``) -> converted (codemod.flow.ContainerFactory)
  container_factories: dict = dataclasses.field(default_factory=dict)
  #: module-level function or ``Class.method`` whose parameter only ``.create`` s the def it
  #: is given -> ((its position, its name), converted) (codemod.flow.DefSink)
  def_sinks: dict = dataclasses.field(default_factory=dict)
  #: module-level classes subclassing a flax.optim def (on the shim wherever they are)
  user_defs: tuple = ()
  #: another module's function (qualified, as imported) -> (((class, its optimizer fields),
  #: ...), mixed) whose instances this module hands it: its own by name, another module's
  #: qualified; mixed: some call passes something else there (codemod.flow.Handoff)
  handoffs: dict = dataclasses.field(default_factory=dict)
  #: another module's class with optimizer fields whose fields this module reads
  #: (qualified) -> this module converts (codemod.flow.Fields.held)
  field_uses: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Plan:
  """The decisions for one module.

  Attributes:
    verdict: ``'convert'``, ``'keep-legacy'`` (a blocking finding), ``'unproven'`` (no
      flax.optim, no converted factory of another module: nothing converts) or
      ``'untouched'`` (a fix it needs is not selected: the file is left as it is).
    findings: the report entries, in the order of their sites in the file (OM005, the
      imports, is added once the rewrite has run).
    fixes: ``id(node)`` -> :class:`codemod.plan.sites.Fix`.
    todos: ``id(statement)`` -> the TODO lines it gets.
    marks: ids of the nodes on the way to a fix or a TODO (the rewrite enters only those).
    fallback: the file keeps flax.optim code and gets ``optim_compat.install()``
      (``codemod.rules.fallback``, OM014).
  """
  queries: Queries
  verdict: str = 'convert'
  findings: list = dataclasses.field(default_factory=list)
  fixes: dict = dataclasses.field(default_factory=dict)
  todos: dict = dataclasses.field(default_factory=dict)
  marks: set = dataclasses.field(default_factory=set)
  first_statement: object = None
  header_comments: set = dataclasses.field(default_factory=set)
  summary: Optional[Summary] = None
  fallback: bool = False  # optim_compat.install() goes before the first flax.optim use (OM014)

  @property
  def converts(self) -> bool:
    return self.verdict == 'convert'

  @property
  def changes(self) -> bool:
    """The rewrite changes the file (a fix, a TODO, an earlier run's stale TODO dropped)."""
    return self.verdict != 'untouched' and bool(self.fixes or self.todos or self.marks
                                                or self.fallback)

  @property
  def drops_imports(self) -> bool:
    """The rewrite drops flax.optim module imports nothing uses (reported as OM005)."""
    from codemod.rules.imports import dead_imports
    return self.converts and dead_imports(self.queries)

  @property
  def blocking(self) -> list[Finding]:
    """The findings that keep the file on its legacy code."""
    return [f for f in self.findings if f.blocks]


def make_plan(analysis, options) -> Plan:
  """The plan of one analysed module (``codemod.facts.analyze``) under ``options``."""
  q = Queries(analysis, options)
  try:
    verdict.prepare(q)
    verdict.decide(q)
  except Exception as e:  # noqa: BLE001 - named with the family that raised
    raise failure(e, None, analysis.names, 'plan') from e
  plan = Plan(q, verdict='keep-legacy' if q.blocked else 'unproven' if q.unproven else 'convert')
  plan.first_statement = fallback.first_statement(analysis.module.body)
  plan.header_comments = {ll.comment.value for ll in analysis.module.header if ll.comment}
  analysis.module.visit(sites.SitePlanner(q, plan))
  converts = q.converts
  f = analysis.facts
  to_legacy_steps = crossmodule.factories_to_legacy_steps(q)
  plan.summary = Summary(
      factories=dict.fromkeys(sorted(f.module_factories - set(f.steps)), converts),
      steps={name: (params, converts) for name, params in sorted(f.steps.items())},
      bundles=dict.fromkeys(sorted(f.bundle_factories & {fn.name.value for fn in f.top_functions}
                                   - set(f.steps)), converts),
      inject_lr=q.inject_lr,
      fields={cls: (fields, converts) for cls, fields in sorted(f.declared_fields.items())},
      def_factories=dict.fromkeys(sorted(f.def_factories), converts),
      group_def_factories=tuple(sorted(f.group_def_factories)),
      defs=bool(f.def_calls),
      def_uses={name: (converts and name not in f.def_misused, q.inject_lr)
                for name in sorted(f.def_uses)},
      factory_uses={name: (converts and name not in to_legacy_steps, given)
                    for name, given in crossmodule.factory_lr(q).items()},
      factory_steps=to_legacy_steps,
      container_factories=dict.fromkeys(sorted(f.container_makers), converts),
      def_sinks={name: (parameter, converts) for name, parameter in sorted(f.def_sinks.items())},
      user_defs=_user_defs(analysis),
      handoffs=crossmodule.container_handoffs(q),
      field_uses=dict.fromkeys(crossmodule.field_uses(q), converts))
  _unselected(plan, options)
  if plan.verdict != 'untouched' and (shim := fallback.plan(q)) is not None:
    plan.findings.append(shim)  # the file keeps flax.optim code: it runs on the shim
    plan.fallback = True
  return plan


def _user_defs(analysis) -> tuple:
  """The module-level classes that subclass ``OptimizerDef`` or a def of the migration table
  (``codemod.flow.UserDef``)."""
  from optim_compat import spec as spec_lib
  n, f = analysis.names, analysis.facts
  bases = {'OptimizerDef', *spec_lib.SPECS}
  return tuple(sorted(node.name.value for node in analysis.module.body
                      if isinstance(node, cst.ClassDef) and any(node is c for c in f.subclasses)
                      and any(n.symbol(b.value) in bases for b in node.bases)))


def _unselected(plan: Plan, options) -> None:
  """A fix the file needs that is not selected: the file is left untouched (a partial
  migration would not run), with one OM106 item naming the fixes."""
  fixes = [f for f in plan.findings if f.fixed]
  unselected = [f for f in fixes if not options.enabled(f.rule)]
  rules = {f.rule for f in unselected}
  if not options.enabled('OM005') and any(f.rule in CONVERSIONS for f in fixes):
    rules.add('OM005')  # the converted code needs its imports
  if not rules:
    return
  first = unselected[0] if unselected else fixes[0]
  plan.verdict = 'untouched'
  plan.fixes, plan.todos, plan.marks = {}, {}, set()
  plan.findings = [Finding(first.line, first.col, 'OM106',
                           f'this file needs fixes {", ".join(sorted(rules))}, which are not '
                           'selected: left unchanged (a partial migration would not run)', False,
                           blocks=True, data={'rules': sorted(rules)})
                   ] if options.enabled('OM106') else []
  plan.summary = Summary(dict.fromkeys(plan.summary.factories, False),
                         {name: (params, False) for name, (params, _) in plan.summary.steps.items()},
                         dict.fromkeys(plan.summary.bundles, False), plan.summary.inject_lr,
                         {cls: (fields, False) for cls, (fields, _) in plan.summary.fields.items()},
                         dict.fromkeys(plan.summary.def_factories, False),
                         def_uses={k: (False, i) for k, (_, i) in plan.summary.def_uses.items()},
                         factory_uses={k: (False, i)
                                       for k, (_, i) in plan.summary.factory_uses.items()},
                         container_factories=dict.fromkeys(plan.summary.container_factories,
                                                           False),
                         def_sinks={k: (parameter, False)
                                    for k, (parameter, _) in plan.summary.def_sinks.items()},
                         user_defs=plan.summary.user_defs, handoffs=plan.summary.handoffs,
                         field_uses=dict.fromkeys(plan.summary.field_uses, False))
