"""OM2xx fixes of array calls: ``jax.ops`` scatter updates (OM206), static sizes (OM211), PIL
image conversion (OM212), and OM223 (a loop over a jax array whose elements become dict keys)."""
from __future__ import annotations

import libcst as cst

from codemod.modern import table
from codemod.modern.base import _ARRAY_CTORS, _DICT_KEYS, _NUMPY_WRAPS, _PIL, _SCATTER, _STATIC
from codemod.modern.helpers import _EQ, _atom, _bind, _code, _comp_fors, _dotted, _keys_with, _names


class _Arrays:
  """Array calls (scatter, static sizes, PIL) and OM223 loops."""

  def _scatter(self, original: cst.Call, updated: cst.Call, api: table.Api):
    args = _bind(updated.args, ('x', 'idx', 'y', 'indices_are_sorted', 'unique_indices'))
    name = self.qname_in(original.func, _SCATTER)
    if args is None or not all(k in args for k in ('x', 'idx', 'y')):
      self.flag(original, 'OM224', f'`{name}(...)` with these arguments is not rewritten: use '
                f'`x.at[idx].{api.extra}(y)` (removed in jax 0.3.2)')
      return updated
    if not self.opts.fixable(api.rule):
      return updated
    orig = _bind(original.args, ('x', 'idx', 'y', 'indices_are_sorted', 'unique_indices'))
    x, idx = args['x'], args['idx']
    if not self.is_jax_value(orig['x']):
      asarray = self.module_expr(original, 'jax.numpy')
      if asarray is None:
        self.flag(original, 'OM224', f'`{name}`: no name for jax.numpy here to make '
                  '`jnp.asarray(x).at[...]`: rewrite by hand')
        return updated
      x = cst.Call(func=_dotted([*_names(asarray), 'asarray']), args=[cst.Arg(x)])
    if isinstance(orig['idx'], cst.Subscript) and isinstance(idx, cst.Subscript) and \
        self.qname_in(orig['idx'].value, table.INDEX_HELPERS):
      elements = list(idx.slice)
      elements[-1] = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    else:
      elements = [cst.SubscriptElement(slice=cst.Index(value=idx))]
    method_args = [cst.Arg(args['y'])] + [
        cst.Arg(args[k], keyword=cst.Name(k), equal=_EQ) for k in ('indices_are_sorted',
                                                                    'unique_indices') if k in args]
    new = cst.Call(func=cst.Attribute(value=cst.Subscript(
        value=cst.Attribute(value=_atom(x), attr=cst.Name('at')), slice=elements),
        attr=cst.Name(api.extra)), args=method_args)
    self.fixed(original, api.rule, f'`{name}(x, idx, y)` -> `x.at[idx].{api.extra}(y)`: '
               f'{api.since}')
    module, fn = name.rsplit('.', 1)
    for entry in ((module, fn, None), ('jax.ops', 'index', None)):
      if entry not in self.removes:
        self.removes.append(entry)
    return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

  def _static_sizes(self, original: cst.Call, updated: cst.Call):
    api = _STATIC['jax.lax.dynamic_slice']
    position = next((i for i, a in enumerate(original.args)
                     if (a.keyword is not None and a.keyword.value == 'slice_sizes')
                     or (a.keyword is None and not a.star and i == 2)), None)
    if position is None:
      return updated
    sizes = original.args[position].value
    if not (isinstance(sizes, cst.Call) and self.qname_in(sizes.func, _ARRAY_CTORS)
            and len(sizes.args) == 1 and sizes.args[0].keyword is None and not sizes.args[0].star
            and isinstance(sizes.args[0].value, (cst.Tuple, cst.List))):
      return updated
    if not self.decide(sizes, api.rule, f'`{_code(sizes)}` as `slice_sizes` -> a tuple of '
                       f'the same values: {api.why}', ''):
      return updated
    new_sizes = updated.args[position].value.args[0].value
    elements = list(new_sizes.elements)
    if len(elements) == 1:
      elements = [elements[0].with_changes(comma=cst.Comma())]
    as_tuple = cst.Tuple(elements=elements)
    args = list(updated.args)
    args[position] = args[position].with_changes(value=as_tuple)
    return updated.with_changes(args=args)

  def _pil(self, original: cst.Call, updated: cst.Call):
    api = _PIL['PIL.Image.fromarray']
    if not self.facts.imports_jax or not original.args:
      return updated
    first = original.args[0]
    if first.star or (first.keyword is not None and first.keyword.value != 'obj'):
      return updated
    value = first.value
    if isinstance(value, cst.Call) and self.qname_in(value.func, _NUMPY_WRAPS):
      return updated
    if not self.opts.fixable(api.rule):
      return updated
    numpy = self.module_expr(original, 'numpy')
    if numpy is None:
      self.flag(original, 'OM224', '`PIL.Image.fromarray(x)`: no name for numpy here to make '
                '`np.asarray(x)`: wrap the argument by hand if it may be a jax array')
      return updated
    self.fixed(original, api.rule, f'`fromarray(x)` -> `fromarray(np.asarray(x))`: {api.why}')
    args = list(updated.args)
    args[0] = args[0].with_changes(value=cst.Call(
        func=_dotted([*_names(numpy), 'asarray']), args=[cst.Arg(args[0].value)]))
    return updated.with_changes(args=args)

  # -- OM223: loops over a jax array whose elements become dict keys -------------------------
  def visit_For(self, node):
    if isinstance(node.target, cst.Name) and self.is_jax_value(node.iter) and \
        _keys_with(node.body, node.target.value, self):
      self.flag(node, _DICT_KEYS.rule, f'`{node.target.value}` is a 0-d jax array (unhashable) '
                f'used as a dict key: iterate `{_code(node.iter)}.tolist()` for Python scalars '
                '(or key by `int(...)` / `.item()`)')

  def visit_DictComp(self, node):
    for comp in _comp_fors(node.for_in):
      if isinstance(comp.target, cst.Name) and isinstance(node.key, cst.Name) and \
          node.key.value == comp.target.value and self.is_jax_value(comp.iter):
        self.flag(node, _DICT_KEYS.rule, f'`{comp.target.value}` is a 0-d jax array '
                  f'(unhashable) used as a dict key: iterate `{_code(comp.iter)}.tolist()`')
