"""Name resolution over one parsed module, and the small CST helpers every stage uses.

:class:`Names` answers, for a node of the module, what LibCST's metadata says
(qualified names, scope bindings, positions) and what the codemod's facts say
about the names (a legacy def, a traversal, another module's factory). The
metadata is resolved once per module (``codemod.facts.analyze``); the analysis,
the plan and the rules all read it through here, never by text.
"""
from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst
from libcst.metadata import PositionProvider, ScopeProvider
from libcst.metadata.base_provider import LazyValue

from codemod import legacy_api as api

#: The metadata the analysis resolves. Qualified names are asked of a node's scope when a
#: rule asks (what LibCST's ``QualifiedNameProvider`` does lazily for every node, after a
#: traversal of its own that cost 8% of a real-tree run). Positions are resolved for the
#: whole (reduced) module: nearly all of its statements hold a finding (the OM2xx pass,
#: over whole modules, resolves them per statement: ``codemod.positions``).
METADATA = (ScopeProvider, PositionProvider)
_EMPTY = cst.Module(body=[])


def code(node) -> str:
  """The source text of ``node``."""
  return _EMPTY.code_for_node(node)


def dotted_name(node) -> str:
  """``'a.b.c'`` for a ``Name`` / ``Attribute`` chain (an import's module or name), else ''."""
  if isinstance(node, cst.Name):
    return node.value
  if isinstance(node, cst.Attribute):
    return f'{dotted_name(node.value)}.{node.attr.value}'
  return ''


class Names:
  """What a module's names refer to (``facts``: the module's :class:`codemod.facts.Facts`)."""

  def __init__(self, metadata, facts):
    self._qnames: dict = {}  # node -> its qualified names, once asked
    self._scopes = metadata[ScopeProvider]
    self._positions = metadata[PositionProvider]
    self.facts = facts

  # -- LibCST metadata ------------------------------------------------------------------
  def qnames(self, node) -> set[str]:
    """The qualified names of ``node`` (a node of the analysed module), as
    ``QualifiedNameProvider`` gives them: its scope's ``get_qualified_names_for``; empty
    for a node without a scope (one built by a rule)."""
    found = self._qnames.get(node)
    if found is None:
      scope = self.scope(node)
      found = {q.name for q in scope.get_qualified_names_for(node)} if scope else set()
      self._qnames[node] = found
    return set(found)

  def scope(self, node):
    found = self._scopes.get(node)
    return found() if isinstance(found, LazyValue) else found

  def position(self, node):
    found = self._positions.get(node)
    return found() if isinstance(found, LazyValue) else found

  def pos(self, node) -> tuple[int, int]:
    """``(line, column)``, 1-based, of ``node`` (``(0, 0)`` when unknown)."""
    pos = self.position(node)
    return (pos.start.line, pos.start.column + 1) if pos else (0, 0)

  def symbol(self, node) -> Optional[str]:
    """The legacy ``flax.optim`` name ``node`` refers to, if any."""
    found = sorted(filter(None, map(api.legacy_symbol, self.qnames(node))))
    return found[0] if found else None

  def legacy_def(self, call) -> Optional[str]:
    """The legacy def name if ``call`` is ``flax.optim.<Def>(...)`` (any import form)."""
    if not isinstance(call, cst.Call):
      return None
    name = self.symbol(call.func)
    return name if name in api.DEF_NAMES else None

  def binding(self, name: cst.Name):
    """``(scope, name)`` identifying the variable ``name`` refers to, or None."""
    scope = self.scope(name)
    if scope is None:
      return None
    assignments = list(scope[name.value])
    if not assignments:
      return None
    return (id(assignments[0].scope), name.value)

  def is_function(self, expr) -> bool:
    """``expr`` is a Python function: a ``lambda``, or a name every binding of which is a
    ``def`` (``def loss_fn(params): ...`` then ``model.apply_gradient(loss_fn)``)."""
    if isinstance(expr, cst.Lambda):
      return True
    scope = self.scope(expr) if isinstance(expr, cst.Name) else None
    if scope is None:
      return False
    assignments = list(scope[expr.value])
    return bool(assignments) and all(
        isinstance(getattr(a, 'node', None), cst.FunctionDef) for a in assignments)

  def assignment(self, name: cst.Name):
    """``(targets, value)`` of the ``=`` statement that is the only binding of ``name`` (the
    analysis' :attr:`codemod.facts.model.Facts.assigned`), else None (bound otherwise, more
    than once, or a builtin)."""
    scope = self.scope(name)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) != 1:
      return None
    return self.facts.assigned.get(id(getattr(assignments[0], 'node', None)))

  def keyword_dict(self, name) -> Optional[list[tuple[str, cst.BaseExpression]]]:
    """``[(key, value)]`` of the dict ``**name`` unpacks when that is known here: ``name`` is
    bound once, by ``name = {'beta1': 0.9, ...}`` (string keys, literal values), and used
    nowhere but as ``**name`` (so nothing mutates it); else None."""
    scope = self.scope(name) if isinstance(name, cst.Name) else None
    if scope is None:
      return None
    assignments = list(scope[name.value])
    if len(assignments) != 1 or not all(id(access.node) in self.facts.double_starred
                                        for access in assignments[0].references):
      return None  # (every use of the binding, in any scope: `kw['lr'] = ...` is one)
    owner = assignments[0].scope
    if len(list(owner.assignments[name.value])) != 1:
      return None
    found = self.assignment(name)
    value = found[1] if found is not None and len(found[0]) == 1 else None
    if not isinstance(value, cst.Dict):
      return None
    found = []
    for element in value.elements:
      if not (isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
              and _literal(element.value)):
        return None
      found.append((element.key.evaluated_value, element.value))
    return found if len({k for k, _ in found}) == len(found) else None

  def given_a_function(self, call: cst.Call) -> bool:
    """The first argument of ``call`` is a Python function (:meth:`is_function`)."""
    return bool(call.args) and call.args[0].keyword is None and call.args[0].star == '' \
        and self.is_function(call.args[0].value)

  def name_bindings(self, targets: Iterable):
    """Bindings of the plain-name assignment targets among ``targets``."""
    for t in targets:
      if isinstance(t, cst.Name) and (b := self.binding(t)):
        yield b

  # -- what the facts say about a name ----------------------------------------------------
  def name_factory(self, expr):
    """The other module's factory (``codemod.flow``) whose optimizer the name ``expr``
    holds, or None (not a name, never bound to one, or rebound to something else)."""
    if not isinstance(expr, cst.Name):
      return None
    b = self.binding(expr)
    return None if b in self.facts.rebound else self.facts.flow_vars.get(b)

  def factory_of_call(self, value, bundle=False):
    """The other module's factory ``value`` calls (``create_optimizer(p)``), if any
    (``bundle``: one that returns its optimizer inside a tuple, list or dict instead)."""
    flow = self.facts.flow
    if flow is None or not isinstance(value, cst.Call):
      return None
    for q in sorted(self.qnames(value.func)):
      found = flow.resolve(q)
      if found is not None and found.bundle == bundle:
        return found
    return None

  def is_user_def(self, expr) -> bool:
    """``expr`` is ``MyDef(...)`` for a user subclass of a flax.optim def in this file, or
    in another module of the run (``codemod.flow.UserDef``: ``from .rmsprop_tensorflow
    import RMSPropTensorflow``)."""
    if not isinstance(expr, cst.Call):
      return False
    if isinstance(expr.func, cst.Name) and expr.func.value in self.facts.subclass_names:
      return True
    flow = self.facts.flow
    if flow is None or not isinstance(expr.func, (cst.Name, cst.Attribute)):
      return False
    if self.shimmed_def_factory(expr) is not None:
      return True  # it returns a flax.optim def on the shim, as a user def's is
    if last_name(expr.func) not in flow.user_def_names:
      return False
    return any(flow.resolve_user_def(q) is not None for q in self.qnames(expr.func))

  def shimmed_def_factory(self, expr):
    """The :class:`codemod.flow.DefFactory` ``expr`` calls when the run leaves it to the shim
    (``shimmed``: it returns flax.optim defs there, which a TrainState takes through
    ``optim_compat.to_optax``), else None."""
    return self._called_def_factory(expr, 'shimmed')

  def _called_def_factory(self, expr, flag: str):
    """The def factory (``codemod.flow.DefFactory``) the call ``expr`` names whose attribute
    ``flag`` (``allowed``, ``shimmed``) is set, by its qualified names, or by the bare name
    of a function of this module under the module's own name; else None."""
    flow = self.facts.flow
    if flow is None or not isinstance(expr, cst.Call):
      return None
    names = sorted(self.qnames(expr.func))
    if isinstance(expr.func, cst.Name) and flow.module:
      names.append(f'{flow.module}.{expr.func.value}')
    return next((found for q in names if (found := flow.resolve_def(q)) is not None
                 and getattr(found, flag, False)), None)

  def is_def(self, expr) -> bool:
    """``expr`` is a legacy def call (ours or a user subclass), a call of a function returning
    one that the run converts (:meth:`converted_def_factory`), or a name bound to one."""
    return self.legacy_def(expr) is not None or self.is_user_def(expr) or (
        isinstance(expr, cst.Name) and self.binding(expr) in self.facts.def_vars) or (
        self.converted_def_factory(expr) is not None)

  def converted_def_factory(self, expr):
    """The :class:`codemod.flow.DefFactory` that ``expr`` calls when the run converts it to an
    Optax transformation (``allowed``: every caller in the run ``.create`` s it), else None.
    A call by the bare name of a function of this module (``create_optimizer(name)``) is
    looked up under the module's own name."""
    if (found := self._called_def_factory(expr, 'allowed')) is not None:
      return found
    flow = self.facts.flow
    if flow is not None and isinstance(expr, cst.Call) and isinstance(
        expr.func, cst.Attribute):  # a def factory method, by its name
      found = flow.def_methods(expr.func.attr.value)
      if found and all(f.allowed for f in found):
        return found[0]
    return None

  def def_call(self, expr):
    """The def call ``expr`` is, or the one the name ``expr`` is bound to (None: unknown)."""
    if isinstance(expr, cst.Name):
      return self.facts.def_vars.get(self.binding(expr))
    return expr

  def is_traversal(self, expr) -> bool:
    """``expr`` builds a ``ModelParamTraversal`` or is a name bound to one."""
    if isinstance(expr, cst.Call):
      return self.symbol(expr.func) == api.TRAVERSAL or \
          'flax.traverse_util.ModelParamTraversal' in self.qnames(expr.func)
    return isinstance(expr, cst.Name) and self.binding(expr) in self.facts.traversal_vars


# -- CST shapes -------------------------------------------------------------------------------
def last_name(node) -> str:
  """``'optimizer'`` for ``state.optimizer`` or ``optimizer``; '' for anything else."""
  if isinstance(node, cst.Attribute):
    return node.attr.value
  return node.value if isinstance(node, cst.Name) else ''


def named_like_optimizer(node) -> bool:
  """``node`` is a name or attribute whose last name reads like an optimizer's
  (:data:`codemod.legacy_api.OPTIMIZER_NAMED`: ``optimizer``, ``state.optimizer``, ``opt``)."""
  return api.OPTIMIZER_NAMED.search(last_name(node)) is not None


def attr_chain(node) -> Optional[str]:
  """``'self.optimizer'`` for an attribute chain on a name (``self.optimizer``,
  ``state.train.opt``), else None (a name alone, a call, a subscript)."""
  parts = []
  while isinstance(node, cst.Attribute):
    parts.append(node.attr.value)
    node = node.value
  if not parts or not isinstance(node, cst.Name):
    return None
  return '.'.join([node.value, *reversed(parts)])


def target_names(target):
  """The ``cst.Name`` nodes an assignment or loop target binds (``a``, ``a, (b, *c)``)."""
  if isinstance(target, cst.Name):
    yield target
  elif isinstance(target, (cst.Tuple, cst.List)):
    for element in target.elements:
      yield from target_names(element.value)
  elif isinstance(target, cst.StarredElement):
    yield from target_names(target.value)


def names_in_targets(targets):
  """The plain names among assignment targets, inside tuples and lists too."""
  for t in targets:
    yield from target_names(t)


def container_values(node):
  """The element values of a tuple or list display, the values of a dict display."""
  if isinstance(node, cst.Dict):
    return [e.value for e in node.elements if isinstance(e, cst.DictElement)]
  return [e.value for e in node.elements if isinstance(e, cst.Element)]


def kwargs(call: cst.Call) -> dict:
  """``{keyword: Arg}`` of a call."""
  return {a.keyword.value: a for a in call.args if a.keyword is not None}


def call_argument(call: cst.Call, position: Optional[int], keyword: Optional[str]):
  """The expression ``call`` passes to the parameter at ``position`` among the positional
  ones, or named ``keyword`` (None: not passed, a ``*args`` / ``**kwargs`` call, or a
  positional-only parameter for ``keyword``)."""
  if any(a.star for a in call.args):
    return None
  if keyword is not None:
    for a in call.args:
      if a.keyword is not None and a.keyword.value == keyword:
        return a.value
  given = [a for a in call.args if a.keyword is None]
  if position is not None and position < len(given):
    return given[position].value
  return None


def apply_grads(call: cst.Call):
  """The gradient of ``opt.apply_gradient(g)`` / ``apply_gradient(grads=g)`` (legacy
  0.5.3: ``apply_gradient(self, grads, **hyper_param_overrides)``), or None when the call
  does not pass exactly one."""
  positional = [a.value for a in call.args if a.keyword is None]
  named = [a.value for a in call.args if a.keyword is not None and a.keyword.value == 'grads']
  return (positional + named)[0] if len(positional) + len(named) == 1 else None


def create_focus(call: cst.Call):
  """The ``focus`` argument of ``Def(...).create(target, focus)``, or None."""
  positional = [a for a in call.args if a.keyword is None]
  if len(positional) == 2:
    return positional[1].value
  return next((a.value for a in call.args if a.keyword is not None
               and a.keyword.value == 'focus'), None)


def legacy_module_name(expr, prefix=api.LEGACY) -> bool:
  """``expr`` is a string literal naming flax.optim or one of its submodules."""
  if not isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
    return False
  value = expr.evaluated_value
  return isinstance(value, str) and (value == prefix or value.startswith(prefix + '.'))


class Substitute(cst.CSTTransformer):
  """Replace placeholder names in a parsed template with real nodes."""

  def __init__(self, subs: dict):
    self.subs = subs

  def leave_Name(self, original, updated):
    return self.subs.get(updated.value, updated)


def template(source: str, **subs) -> cst.BaseExpression:
  """``source`` parsed as an expression, its placeholder names replaced by ``subs``."""
  return cst.parse_expression(source).visit(Substitute(subs))


def _literal(expr) -> bool:
  """A number, string, ``True`` / ``False`` / ``None``, or a negated number."""
  if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
    expr = expr.expression
  return isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)) or (
      isinstance(expr, cst.Name) and expr.value in ('True', 'False', 'None'))
