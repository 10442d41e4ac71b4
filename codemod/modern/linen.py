"""OM2xx fixes of Flax calls: ``FrozenDict`` methods on ``init`` results (OM207; unproven:
OM208), recurrent cells (OM222), ``MultiHeadDotProductAttention`` (OM209) / ``Dropout``
(OM210) constructions and their calls."""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ImportAssignment, ScopeProvider

from codemod.modern.base import _CELLS, _DROPOUT, _FLAGS, _FROZEN, _MHA
from codemod.modern.helpers import _EQ, _code, _dotted, _names, _returns, _unsafe_why
from codemod.modern.table import FLAX_COLLECTIONS, FLAX_TREE_CALLS, FROZEN_DICT_TYPES


_MHA_WORD = 'MultiHeadDotProductAttention'
_MHA_LAST = frozenset(q.rsplit('.', 1)[-1] for q in _MHA)


class _Linen:
  """Flax calls: constructions, cells, frozen dicts, MHA and Dropout."""
  _mha_text = None  # the module's code, read once when a call may need it (_unproven_mha)

  def _construction(self, func):
    """``('mha' | 'dropout', constructor call)`` when ``func`` is proven to be a
    ``MultiHeadDotProductAttention`` / ``Dropout`` instance: built inline, held by a name whose
    reaching value built it, or ``self.<attr>`` assigned only that in its class."""
    values = []
    if isinstance(func, cst.Call):
      values = [func]
    elif isinstance(func, cst.Name) and self._layers_assigned():
      found = self.value_of(func)
      values = [found[0]] if found is not None and found[1] is None else []
    elif (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
          and func.value.value == 'self' and self._classes):
      values = self.facts.self_attrs.get((id(self._classes[-1]), func.attr.value), [])
    kinds = set()
    for v in values:
      if not isinstance(v, cst.Call):
        return None
      if self.qname_in(v.func, _MHA) or self._partial_mha(v.func) or (
          isinstance(v.func, cst.Name) and self._global_mha(v.func, partial=False)) or (
          self._field_mha(v.func)) or self._own_mha(v.func):
        kinds.add('mha')
      elif self.qname_in(v.func, _DROPOUT):
        kinds.add('dropout')
      else:
        return None
    if len(kinds) != 1 or (len(values) != 1 and kinds == {'dropout'}):
      return None
    return kinds.pop(), values[0]

  def _partial_mha(self, func) -> bool:
    """``func`` is ``functools.partial(nn.MultiHeadDotProductAttention, ...)``, built inline
    or held by a name whose reaching value it is (``attn_cls = functools.partial(...)``, then
    ``attn_cls()(q, kv, mask)``): what calling it builds is that class."""
    if isinstance(func, cst.Name) and self._layers_assigned():
      found = self.value_of(func)
      if found is None:  # a module-level alias read in a function or method
        return self._global_mha(func, partial=True)
      func = found[0] if found[1] is None else None
    return (isinstance(func, cst.Call) and bool(func.args) and func.args[0].keyword is None
            and not func.args[0].star and self.qname_in(func.func, {'functools.partial'})
            and self.qname_in(func.args[0].value, _MHA) is not None)

  def _global_mha(self, name: cst.Name, partial: bool) -> bool:
    """``name`` is a module-level name every assignment of which (there is at least one) binds
    ``functools.partial(nn.MultiHeadDotProductAttention, ...)`` (``partial``) or the class
    itself (``MHA = nn.MultiHeadDotProductAttention``): helper-33's D1, module-level aliases
    called in a compact method or built in ``setup``."""
    scope = self.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if not assignments or any(type(a.scope).__name__ != 'GlobalScope' for a in assignments):
      return False
    for a in assignments:
      entry = self.facts.values.get(id(getattr(a, 'node', None)))
      if entry is None or entry[1] is not None:
        return False
      value = entry[0]
      if not (self._partial_mha(value) if partial and isinstance(value, cst.Call)
              else not partial and self.qname_in(value, _MHA) is not None):
        return False
    return True

  def _field_mha(self, func) -> bool:
    """``func`` is ``self.<field>`` of the enclosing module class whose declared default is
    the attention class, a partial of it or a module-level alias of either (``attn_cls: type
    = nn.MultiHeadDotProductAttention``, then ``self.attn_cls(num_heads=2)(q, kv, mask)``): a
    class passed in its place takes ``mask=`` by keyword too if it is one like it."""
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
            and func.value.value == 'self' and self._classes):
      return False
    declared = self._field_declarations(func.attr.value)
    if len(declared) != 1 or declared[0].value is None:
      return False
    value = declared[0].value
    return bool(self.qname_in(value, _MHA) is not None or (
        isinstance(value, cst.Call) and self._partial_mha(value)) or (
        isinstance(value, cst.Name) and (self._global_mha(value, partial=False)
                                         or self._global_mha(value, partial=True))))

  def _field_declarations(self, name: str) -> list[cst.AnnAssign]:
    """The ``name: T [= default]`` lines of the enclosing class's body (its dataclass
    fields so named)."""
    return [line.body[0] for line in self._classes[-1].body.body
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            and isinstance(line.body[0], cst.AnnAssign)
            and m.matches(line.body[0].target, m.Name(name))]

  def _own_mha(self, func) -> bool:
    """``func`` names a class of this module subclassing the attention class (``class
    MyAttention(nn.MultiHeadDotProductAttention)``), or a module-level function every
    ``return`` of which builds it (``def make_attn(): return nn.MultiHeadDotProductAttention(
    ...)``): helper-35's D1."""
    if not isinstance(func, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, func, None)
    assignments = list(scope[func.value]) if scope is not None else []
    if len(assignments) != 1 or type(assignments[0].scope).__name__ != 'GlobalScope':
      return False
    node = getattr(assignments[0], 'node', None)
    if isinstance(node, cst.ClassDef):
      return any(self.qname_in(b.value, _MHA) is not None or (
          isinstance(b.value, cst.Name) and b.value.value != func.value
          and self._own_mha(b.value)) for b in node.bases)
    if isinstance(node, cst.FunctionDef):
      returns = m.findall(node, m.Return())
      return bool(returns) and all(
          isinstance(r.value, cst.Call) and self.qname_in(r.value.func, _MHA) is not None
          for r in returns)
    return False

  def _unproven_mha(self, call: cst.Call) -> None:
    """OM224 on a call with three or more positional arguments (or a ``*`` argument) whose
    callee may hold an attention layer this module builds, where it cannot be proven one
    (helper-35's and helper-36's cases, each left positional with no flag before): a loop
    over, an item of, or a name unpacked from ``self.<attr>`` holding them (``for l in
    self.layers``, ``self.layers[0](...)``, ``self.d['a'](...)``, ``a, b = self.layers``), a
    name or attribute bound to a value naming the class (``a, b = MHA(...), nn.Dense(3)``, a
    lambda building one, ``MHA if c else Other``), ``self.<field>(...)`` of a field with no
    attention default, ``getattr(nn, 'MultiHeadDotProductAttention')``. On flax >= 0.7 the
    third positional argument is ``inputs_v``, the mask before."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    starred = any(a.star == '*' for a in call.args)
    if (len(positional) < 3 and not starred) or any(
        a.keyword is not None and a.keyword.value == 'mask' for a in call.args):
      return
    if _MHA_WORD not in self._module_text():
      return
    why = self._may_hold_mha(call.func)
    if why:
      self.flag(call, 'OM224', f'{why} may be a MultiHeadDotProductAttention: since flax 0.7 '
                'its third positional argument is `inputs_v` (the mask before); if it is one, '
                'pass mask= (and deterministic=) by keyword')

  def _module_text(self) -> str:
    if self._mha_text is None:
      self._mha_text = self._module_node.code
    return self._mha_text

  def _holds_mha(self, node, depth: int = 0, anywhere: bool = False) -> bool:
    """``node`` contains a reference of the attention class (or of this module's alias,
    subclass or factory of it), ``getattr(x, '...MultiHeadDotProductAttention')``, or reads
    ``self.<attr>`` of the enclosing class assigned such a value (one level; ``anywhere``:
    of any class of the module, for code read away from its class, a call site's arguments)."""
    for n in m.findall(node, m.Name() | m.Attribute() | m.SimpleString()):
      if isinstance(n, cst.SimpleString):
        if _MHA_WORD in n.value:
          return True
      elif isinstance(n, cst.Attribute):
        if self.qname_in(n, _MHA) is not None:
          return True
        if depth == 0 and isinstance(n.value, cst.Name) and n.value.value == 'self' and any(
            self._holds_mha(v, 1) for (cls, attr), values in self.facts.self_attrs.items()
            if attr == n.attr.value and (anywhere or (
                self._classes and cls == id(self._classes[-1]))) for v in values):
          return True
      elif n.value in _MHA_LAST and self.qname_in(n, _MHA) is not None:
        return True
      elif n.value not in ('self', 'nn') and (self._own_mha(n) or self._global_mha(n, False)
                                            or self._global_mha(n, True)):
        return True
    return False

  def _may_hold_mha(self, func) -> str:
    """Why ``func`` (a callee) may be an attention layer, or ``''``."""
    if isinstance(func, cst.Call):
      callee = func.func
      if (isinstance(callee, cst.Attribute) and isinstance(callee.value, cst.Name)
          and callee.value.value == 'self' and self._classes):
        declared = self._field_declarations(callee.attr.value)
        if declared and (declared[0].value is None or m.matches(declared[0].value, m.Name('None'))):
          return f'`{_code(func)}` (the class a field with no default is given)'
      if isinstance(callee, cst.Name):
        found = self.value_of(callee)
        if found is not None and found[1] is None and isinstance(found[0], cst.IfExp) and (
            self._holds_mha(found[0])):
          return f'`{_code(func)}` (`{callee.value}` is one of two classes)'
    root = func
    while isinstance(root, (cst.Subscript, cst.Call)):
      if isinstance(root, cst.Call) and self._holds_mha(root):
        return f'`{_code(func)}` (built from a value naming the attention class)'
      root = root.value if isinstance(root, cst.Subscript) else root.func
    if (isinstance(root, cst.Attribute) and isinstance(root.value, cst.Name)
        and root.value.value == 'self' and self._classes):
      if any(self._holds_mha(v) for v in self.facts.self_attrs.get(
          (id(self._classes[-1]), root.attr.value), [])):
        return f'`{_code(func)}` (`{_code(root)}` holds attention layers)'
      declared = self._field_declarations(root.attr.value)
      if declared and (self._holds_mha(declared[0].annotation)
                       or self._given_mha(root.attr.value)):
        return (f'`{_code(func)}` (field `{root.attr.value}` is given attention layers in this '
                'module)')
      return ''
    if isinstance(root, cst.Name):
      scope = self.get_metadata(ScopeProvider, root, None)
      assignments = list(scope[root.value]) if scope is not None else []
      for a in assignments:
        node = getattr(a, 'node', None)
        it = self.facts.for_iters.get(id(node))
        if it is not None and self._holds_mha(it):
          return f'`{root.value}` (an item of `{_code(it)}`, which holds attention layers)'
        entry = self.facts.values.get(id(node))
        bound = entry[0] if entry is not None else None
        if (entry is not None and entry[1] is not None and isinstance(bound, (cst.Tuple, cst.List))
            and not any(isinstance(e, cst.StarredElement) for e in bound.elements)
            and entry[1] < len(bound.elements)):
          bound = bound.elements[entry[1]].value  # (`c, e = MHA(...), nn.Dense(3)`: e is no MHA)
        if isinstance(node, cst.Param):
          owner = next((f for f in self.facts.functions.values() if any(
              q is node for q in (*f.params.params, *f.params.posonly_params,
                                  *f.params.kwonly_params))), None)
          if owner is not None and self._given_mha(owner.name.value, param=node, owner=owner):
            return (f'`{root.value}` (a parameter of `{owner.name.value}`, which is given '
                    'attention layers in this module)')
        if bound is not None and self._holds_mha(bound):
          value = ' '.join(_code(bound).split())
          value = value if len(value) <= 60 else value[:57] + '...'
          return f'`{root.value}` (bound to `{value}`, which names attention layers)'
    return ''

  def _given_mha(self, name: str, param=None, owner=None) -> bool:
    """Some call of this module passes a value naming the attention class as ``name=`` (a
    module field, ``Block(attn=nn.MultiHeadDotProductAttention(...))``), or to the parameter
    ``param`` of the function ``owner`` (named ``name``), by position or keyword."""
    module = self._module_node
    if param is None:
      return any(self._holds_mha(a.value, anywhere=True) for a in m.findall(
          module, m.Arg(keyword=m.Name(name))))
    params = [*owner.params.posonly_params, *owner.params.params]
    index = next((i for i, q in enumerate(params) if q is param), None)
    for call in m.findall(module, m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name)))):
      # (a method called as `self.f(...)`: its `self` is not among the arguments)
      shift = 1 if isinstance(call.func, cst.Attribute) and params and \
          params[0].name.value in ('self', 'cls') else 0
      positional = [a for a in call.args if a.keyword is None and not a.star]
      if any(index is not None and i + shift == index and self._holds_mha(a.value, anywhere=True)
             for i, a in enumerate(positional)):
        return True
      if any(a.keyword is not None and a.keyword.value == param.name.value
             and self._holds_mha(a.value, anywhere=True) for a in call.args):
        return True
    return False

  def _layers_assigned(self) -> bool:
    """Does any assignment of the module assign an attention or Dropout construction? Else a
    name's reaching value (``value_of``, which needs every node's position) cannot be one."""
    if self._layer_values is None:
      self._layer_values = any(
          (isinstance(v, cst.Call) and (self.qname_in(v.func, _MHA) or self.qname_in(v.func, _DROPOUT)
                                        or self._partial_mha(v)))
          or self.qname_in(v, _MHA) is not None  # (`MHA = nn.MultiHeadDotProductAttention`)
          for v, index, _ in self.facts.values.values() if index is None)
    return self._layer_values

  def visit_ClassDef(self, node):
    self._classes.append(node)

  def leave_ClassDef(self, original, updated):
    self._classes.pop()
    return updated

  def _cells(self, call: cst.Call) -> None:
    """OM222: a recurrent cell built without ``features``, or its static ``initialize_carry``."""
    func = call.func
    name = self.qname_in(func, _CELLS)
    if name is not None:
      if not any(a.keyword is None or (a.keyword.value == 'features') or a.star
                 for a in call.args):
        cell = _code(func)
        self.flag(call, 'OM222', _FLAGS[name].extra.format(
            name=f'`{cell}()` has no `features` (required since flax 0.7.0)', cell=cell))
      return
    if isinstance(func, cst.Attribute) and func.attr.value == 'initialize_carry':
      name = self.qname_in(func.value, _CELLS)
      if name is not None:
        cell = _code(func.value)
        self.flag(call, 'OM222', _FLAGS[name].extra.format(
            name=f'static `{cell}.initialize_carry(rng, batch_dims, size)` is gone (flax 0.7.0)',
            cell=cell))

  def _frozen(self, original: cst.Call, updated: cst.Call):
    attr = original.func.attr.value
    receiver = original.func.value
    by_key = False
    if attr == 'pop':
      if not (len(original.args) == 1 and original.args[0].keyword is None
              and not original.args[0].star and self._unpacked_in_two(original)):
        return updated
      key = original.args[0].value
      if not isinstance(key, (cst.SimpleString, cst.ConcatenatedString, cst.Name)):
        return updated
      proven = self.from_init(receiver)
      by_key = not proven and self._named_after_key(original, key)
      proven = proven or by_key
      if not proven and not ((self.facts.imports_flax or self.facts.imports_jax)
                             and isinstance(key, cst.SimpleString)):
        return updated  # (a JAX file without flax still flags, as `.unfreeze()` does: a run
        # that adds `import flax` for a proven pop must not flag the others only the next time)
    elif attr == 'copy':  # `.copy({...})`: only a FrozenDict takes an argument there
      if not (len(original.args) == 1 and original.args[0].keyword is None
              and not original.args[0].star and isinstance(original.args[0].value, cst.Dict)
              and self.facts.imports_flax):
        return updated
      proven = True
    else:
      if original.args or id(original) in self.facts.guarded_unfreeze:
        return updated  # (guarded by a test on the receiver: right as written)
      proven = self.from_init(receiver)
      if not proven and not (self.facts.imports_flax or self.facts.imports_jax):
        return updated  # (`.unfreeze()` is FrozenDict's alone: a JAX file without flax still flags)
    api = _FROZEN[attr]
    rule = 'OM207' if proven else 'OM208'
    shown = (f'`{_code(receiver)}.{attr}(...)` -> `flax.core.{attr}({_code(receiver)}, ...)`'
             if attr in ('pop', 'copy') else
             f'`{_code(receiver)}.unfreeze()` -> `flax.core.unfreeze({_code(receiver)})`')
    why = ('`.copy({...})` is FrozenDict-only (`dict.copy` takes no argument); what Flax `init` '
           'returns is a dict since flax 0.7.1' if attr == 'copy' else
           f'{_code(original.args[0].value)} is a Flax variable collection: unpacked in two, '
           'this is FrozenDict\'s `(rest, value)`, and what Flax `init` returns is a dict since '
           'flax 0.7.1' if by_key else
           'what Flax `init` returns is a dict since flax 0.7.1' if proven else
           f'if `{_code(receiver)}` is what a Flax `init` returns (a dict since flax 0.7.1); '
           f'`flax.core.{attr}` takes a FrozenDict too ({_unsafe_why("OM208")})')
    if not self.opts.fixable(rule):
      self.decide(original, rule, '', f'{shown}: {why}')
      return updated
    core = self.module_expr(original, 'flax.core')
    if core is None:
      self.flag(original, 'OM224', f'{shown}: no name for flax here: rewrite by hand')
      return updated
    self.decide(original, rule, f'{shown}: {why}', '')
    args = [cst.Arg(updated.func.value)] + [cst.Arg(a.value) for a in updated.args]
    return cst.Call(func=_dotted([*_names(core), api.extra]), args=args,
                    lpar=updated.lpar, rpar=updated.rpar)

  def _named_after_key(self, call: cst.Call, key) -> bool:
    """``rest, params = v.pop('params')``: a Flax collection popped, its value named after
    it (:data:`codemod.modern.table.FLAX_COLLECTIONS`), so FrozenDict's ``(rest, value)``."""
    if not (isinstance(key, cst.SimpleString) and key.evaluated_value in FLAX_COLLECTIONS):
      return False
    second = self.facts.assign_of[id(call)].targets[0].target.elements[1].value
    return isinstance(second, cst.Name) and second.value == key.evaluated_value

  def _unpacked_in_two(self, call: cst.Call) -> bool:
    parent = self.facts.assign_of.get(id(call))
    if parent is None:
      return False
    targets = [t.target for t in parent.targets]
    return len(targets) == 1 and isinstance(targets[0], (cst.Tuple, cst.List)) and \
        len(targets[0].elements) == 2

  def from_init(self, expr, depth: int = 0) -> bool:
    """``expr`` is proven to hold what a Flax ``init`` returned (its variables), or one part
    of it popped off: ``model.init(...)``, ``init_with_output(...)[1]`` (as the second target),
    a call of a local def or ``jax.jit(m.init)`` that returns one, or a name whose reaching
    value is one of those; or a dict or FrozenDict a Flax function returns
    (:data:`codemod.modern.table.FLAX_TREE_CALLS`: ``checkpoints.convert_pre_linen(p)``);
    or a parameter its function's docstring documents as a ``FrozenDict`` (that one also in
    a file that never imports flax: the docstring is the evidence)."""
    if depth > 8:
      return False
    if isinstance(expr, cst.Call) and self.facts.imports_flax:
      f = expr.func
      if self.qname_in(f, FLAX_TREE_CALLS):
        return True
      if isinstance(f, cst.Attribute) and f.attr.value == 'init':
        return self._flax_receiver(f.value) or _flax_rngs(expr)
      if isinstance(f, cst.Attribute) and f.attr.value == 'pop' and len(expr.args) == 1:
        return self.from_init(f.value, depth + 1)
      if isinstance(f, cst.Name):
        return self._init_function(f, depth)
      return False
    if isinstance(expr, cst.Subscript) and self.facts.imports_flax and len(expr.slice) == 1 \
        and isinstance(expr.slice[0].slice, cst.Index) \
        and isinstance(key := expr.slice[0].slice.value, cst.SimpleString):
      # a collection of what `init` returned (`variables['params']`), or the `'params'`
      # collection of any `.init(...)` result (`models.MLP().init(rng, x)['params']`: the
      # collection name is Flax's, whatever module the class comes from)
      base = expr.value
      if isinstance(base, cst.Name) and (found := self.value_of(base)) is not None \
          and found[1] is None:
        base = found[0]
      return self.from_init(expr.value, depth + 1) or (
          key.evaluated_value == 'params' and isinstance(base, cst.Call)
          and isinstance(base.func, cst.Attribute) and base.func.attr.value == 'init')
    if isinstance(expr, cst.Name):
      found = self.value_of(expr)
      if found is None:
        # a parameter its docstring documents as a FrozenDict (`p (frozen_dict.FrozenDict):`)
        return self.documented_param(expr, FROZEN_DICT_TYPES) is not None
      value, index = found
      if index is None:
        return self.from_init(value, depth + 1)
      if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        attr = value.func.attr.value
        if attr == 'init_with_output' and index == 1:
          return self.facts.imports_flax and self._flax_receiver(value.func.value)
        if attr == 'pop' and len(value.args) == 1:  # variables, params = variables.pop(...)
          return self.from_init(value.func.value, depth + 1)
        if attr == 'pop' and self.qname_in(value.func, {'flax.core.pop'}):
          return self.from_init(value.args[0].value, depth + 1)
      return False
    return False

  def _flax_receiver(self, expr, depth: int = 0) -> bool:  # (see also _flax_rngs)
    """``expr`` (what ``.init`` is called on) is not another library's object: its root name is
    a flax import, or a local whose reaching value is not a call into another imported
    library (``tx = optax.adam(...)``)."""
    root = expr
    while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
      root = root.func if isinstance(root, cst.Call) else root.value
    if not isinstance(root, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, root, None)
    assignments = list(scope[root.value]) if scope is not None else []
    if any(isinstance(a, ImportAssignment) for a in assignments):
      return all(q.name.startswith('flax') for a in assignments if isinstance(a, ImportAssignment)
                 for q in a.get_qualified_names_for(root.value))
    if depth < 4 and root is expr:
      found = self.value_of(root)
      if found is not None and isinstance(found[0], cst.Call):
        call = found[0]
        if call.args and self.qname_in(call.func, {'functools.partial'}):
          # `model_def = functools.partial(Model, config=c)`: what `model_def()` builds
          return self._flax_receiver(call.args[0].value, depth + 1)
        return self._flax_receiver(call.func, depth + 1)
    return True

  def _init_function(self, name: cst.Name, depth: int) -> bool:
    scope = self.get_metadata(ScopeProvider, name, None)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) != 1:
      return False
    node = getattr(assignments[0], 'node', None)
    fn = self.facts.functions.get(id(node)) if isinstance(node, cst.Name) else None
    if fn is None and isinstance(node, cst.FunctionDef):
      fn = node
    if fn is not None:
      returns = _returns(fn)
      return bool(returns) and all(r is not None and self.from_init(r, depth + 1) for r in returns)
    entry = self.facts.values.get(id(node))
    if entry is not None and entry[1] is None and isinstance(entry[0], cst.Call):
      wrapped = entry[0]  # init = jax.jit(model.init)
      if self.qname_in(wrapped.func, {'jax.jit', 'jax.pmap'}) and wrapped.args:
        inner = wrapped.args[0].value
        return isinstance(inner, cst.Attribute) and inner.attr.value == 'init' and \
            self._flax_receiver(inner.value)
    return False

  def _mha(self, original: cst.Call, updated: cst.Call):
    api = _MHA['flax.linen.MultiHeadDotProductAttention']
    positional = [a for a in original.args if a.keyword is None]
    if any(a.star == '*' for a in original.args) and not any(
        a.keyword is not None and a.keyword.value == 'mask' for a in original.args):
      self.flag(original, 'OM224', 'MultiHeadDotProductAttention called with a `*` argument: '
                'since flax 0.7 its third positional argument is `inputs_v` (the mask before): '
                'pass mask= (and deterministic=) by keyword')
      return updated
    if any(a.star for a in original.args) or len(positional) < 3:
      return updated
    if any(a.keyword is None for a in original.args[len(positional):]):
      return updated
    names = ['mask', 'deterministic'][:len(positional) - 2]
    # (`(q, kv, mask, deterministic=d)` is fine: only a keyword the positional ones name clashes)
    if len(positional) > 4 or any(a.keyword is not None and a.keyword.value in names
                                  for a in original.args):
      self.flag(original, 'OM224', 'MultiHeadDotProductAttention called with these positional '
                'arguments: pass mask= and deterministic= by keyword')
      return updated
    if not self.decide(original, api.rule, f'positional {" and ".join(names)} of '
                       f'MultiHeadDotProductAttention -> keyword: {api.why}', ''):
      return updated
    args = list(updated.args)
    for offset, kw in enumerate(names):
      i = 2 + offset
      args[i] = args[i].with_changes(keyword=cst.Name(kw), equal=_EQ)
    return updated.with_changes(args=args)

  def _dropout(self, original: cst.Call, updated: cst.Call, ctor: cst.Call):
    api = _DROPOUT['flax.linen.Dropout']
    if any(a.star for a in ctor.args) or \
        any(a.keyword is not None and a.keyword.value == 'deterministic' for a in ctor.args) or \
        len([a for a in ctor.args if a.keyword is None]) >= 3:
      return updated
    if any(a.star for a in original.args):
      return updated
    if any(a.keyword is not None and a.keyword.value == 'deterministic' for a in original.args) or \
        len([a for a in original.args if a.keyword is None]) >= 2:
      return updated
    if any(a.keyword is not None and a.keyword.value == 'broadcast_dims' for a in original.args):
      self.flag(original, 'OM224', 'Dropout(...)(x, broadcast_dims=...): flax 0.3.0\'s call '
                'argument is a module attribute since 0.3.1: move it to `nn.Dropout(..., '
                'broadcast_dims=...)` and pass `deterministic=False` (0.3.0\'s default)')
      return updated
    if not self.decide(original, api.rule, '`deterministic=False` made explicit on a Dropout '
                       f'call that gives none: {api.why}', ''):
      return updated
    args = list(updated.args)
    args.append(cst.Arg(cst.Name('False'), keyword=cst.Name('deterministic'), equal=_EQ))
    return updated.with_changes(args=args)


def _flax_rngs(call: cst.Call) -> bool:
  """``call`` (``m.init(...)``) passes, first, a dict display naming the ``'params'`` rng
  stream (``m.init({'params': key, 'dropout': k2}, x)``): Flax's ``Module.init`` signature,
  whatever class ``m`` is built from (score_sde's ``WideResnet`` of its own models package)."""
  first = call.args[0] if call.args else None
  return (first is not None and first.keyword is None and not first.star
          and isinstance(first.value, cst.Dict) and any(
              isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
              and e.key.evaluated_value == 'params' for e in first.value.elements))
