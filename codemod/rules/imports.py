"""Rule family *imports*: the module's import statements and how flax.optim is reached.

OM005 (imports the rewrite needs added, flax.optim's own dropped once unused,
``import flax.optim`` -> ``import flax`` while ``flax`` is used), OM006
(``DynamicScale`` imports -> ``flax.training.dynamic_scale``), OM108 (a name
the rewrite would import is bound to something else), OM110 (the flax.optim
module used as a value), OM111 (``from flax.optim import *``), OM112
(flax.optim reached by name at run time), OM113 (a flax.optim import nothing
uses: maybe a re-export).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import io
import re
import tokenize
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from codemod import import_scope
from codemod import legacy_api as api
from codemod.findings import Finding
from codemod.names import code


def prepare(q) -> None:
  f = q.f
  q.conflicts = sorted(f.bound_names & api.EMITTED_NAMES) if (f.uses_legacy or f.flow_used or f.flow_fields) else []
  if ('train_state' in q.conflicts and api.TRAIN_STATE_ALIAS not in q.conflicts
      and 'TrainState' not in _attributes_of(q.analysis.full, 'train_state')):
    # `train_state` names something else here: flax's module is imported under another name
    # (only `train_state.TrainState` is ever emitted, and no code of the file spells it)
    q.train_state_alias = api.TRAIN_STATE_ALIAS
    q.conflicts = [c for c in q.conflicts if c != 'train_state']


def _attributes_of(module: cst.Module, name: str) -> set:
  """The attributes read on the name ``name`` anywhere in ``module`` (``name.X``)."""
  return {node.attr.value for node in _walk_attributes(module)
          if isinstance(node.value, cst.Name) and node.value.value == name}


def _walk_attributes(node):
  stack = [node]
  while stack:
    node = stack.pop()
    if isinstance(node, cst.Attribute):
      yield node
    stack.extend(node.children)


class _TrainStateAlias(cst.CSTTransformer):
  """``train_state.TrainState`` (what the rewrite emitted) -> ``<alias>.TrainState``."""

  def __init__(self, alias: str):
    super().__init__()
    self.alias = alias

  def leave_Attribute(self, original, updated):
    if (isinstance(updated.value, cst.Name) and updated.value.value == 'train_state'
        and updated.attr.value == 'TrainState'):
      return updated.with_changes(value=cst.Name(self.alias))
    return updated


#: a module-level ``__all__ = ...`` / ``__all__ += ...`` (the module lists what it exports)
_ALL = re.compile(r'^__all__[ \t]*(?::[^=\n]*)?\+?=', re.M)


def dead_imports(q) -> bool:
  """flax.optim is imported only as a module (``from flax import optim``, ``import flax.optim``)
  and nothing in the file uses it, in a file that declares no ``__all__``: the import is
  dropped (no module re-exports flax.optim's module under its own name in real code; a
  ``from flax.optim import Adam`` nothing uses may be a re-export of the def: flagged, OM113)."""
  f = q.f
  if not f.only_imports or f.star_imports or _ALL.search(q.analysis.text):
    return False
  return all(isinstance(i, cst.Import) or (
      code(i.module) == 'flax' and not isinstance(i.names, cst.ImportStar)
      and all(isinstance(a.name, cst.Name) and (a.name.value != 'optim' or a.asname is None)
              for a in i.names)) for i in f.legacy_imports)


def blocks(q) -> bool:
  f = q.f
  return bool(q.conflicts or f.star_imports or f.module_refs or f.dynamic_imports)


# -- sites ------------------------------------------------------------------------------------
def first_statement(p, node) -> None:
  """Flags written above the module's first statement (OM108)."""
  q = p.q
  if q.conflicts and (q.f.def_calls or q.f.create_calls or q.f.apply_calls):
    p.flag(node, 'OM108', f'{", ".join(f"`{x}`" for x in q.conflicts)} is bound to something else '
                          'in this file, and the rewrite would use that name for the module it '
                          'imports: rename it, then rerun', blocks=True,
           data={'names': q.conflicts})


def visit_node(p, node) -> None:
  """The flax.optim module as a value (OM110) or reached by name (OM112), where entered."""
  f = p.q.f
  if any(node is ref for ref in f.module_refs):
    p.flag(node, 'OM110', f'`{code(node)}`, the flax.optim module itself, is used as a value '
                          '(an alias, a None check, an argument): the codemod cannot follow it, '
                          'and Flax >= 0.6 has no flax.optim; convert its uses by hand',
           blocks=True)
  if id(node) in f.dynamic_imports:
    p.flag(node, 'OM112', f'`{code(node)}` reaches flax.optim by name at run time, and Flax >= '
                          f'0.6 has no flax.optim (here: {f.dynamic_imports[id(node)]}); the '
                          'codemod cannot follow the module it gets: use `optim_compat` (the '
                          'shim, same names) in its place, or migrate its uses to Optax by hand',
           blocks=True)


def visit_import(p, node) -> None:
  f = p.q.f
  if any(node is i for i in f.star_imports):
    p.flag(node, 'OM111', '`from flax.optim import *`: the names it brings cannot be told apart '
                          'from others, so nothing here is converted; import them by name, then '
                          'rerun', blocks=True)
  if f.only_imports and not dead_imports(p.q) and any(node is i for i in f.legacy_imports):
    q = p.q
    excerpt = ' '.join(code(node).replace('(', ' ').replace(')', ' ').split())
    meanwhile = ('meanwhile, the shim stands in for flax.optim here, OM014'
                 if q.opts.shim_fallback and q.opts.fixable('OM014') else
                 'flax >= 0.6 has no flax.optim; `optim-migrate run` supplies the shim meanwhile')
    exported = sorted(set(_bound_names(node)) & _exported(q))
    if exported:
      p.flag(node, 'OM113', f'flax.optim names imported here (`{excerpt}`) are exported by '
                            f'this module\'s `__all__` ({", ".join(exported)}), a re-export '
                            'nothing in it uses: migrate the modules that import them from '
                            f'here, then drop them ({meanwhile})')
      return
    p.flag(node, 'OM113', f'flax.optim is imported here (`{excerpt}`) but not used in this '
                          'module: drop it from the import; if other modules import it from '
                          f'here (a re-export), migrate them first ({meanwhile})')


def _bound_names(node):
  """The names an import statement binds (``from flax.optim import Adam as A``: ``A``)."""
  if isinstance(node.names, cst.ImportStar):
    return []
  return [code(a.asname.name) if a.asname else code(a.name).split('.')[0] for a in node.names]


def _exported(q) -> frozenset:
  """The string items of the module's ``__all__ = [...]`` / ``(...)`` / ``+= [...]`` (read off
  the text: the analysed module may be reduced to the statements the rules need)."""
  return _all_items(q.analysis.text)


@functools.lru_cache(maxsize=4)
def _all_items(text: str) -> frozenset:
  """:func:`_exported` of ``text`` (once per text, not once per import flagged)."""
  if not _ALL.search(text):
    return frozenset()
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return frozenset()
  found = set()
  for stmt in tree.body:
    targets = (stmt.targets if isinstance(stmt, ast.Assign) else
               [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else [])
    if any(isinstance(t, ast.Name) and t.id == '__all__' for t in targets) and isinstance(
        stmt.value, (ast.List, ast.Tuple)):
      found.update(e.value for e in stmt.value.elts
                   if isinstance(e, ast.Constant) and isinstance(e.value, str))
  return frozenset(found)


def _dynamic_scale_moves(original: cst.ImportFrom):
  """``[(alias, (module, name, asname)) or (alias, None)]`` of a ``from flax.optim import``
  naming ``DynamicScale`` / ``dynamic_scale``, or None when it names neither."""
  if original.module is None or isinstance(original.names, cst.ImportStar):
    return None
  module = code(original.module)
  if module not in (api.LEGACY, api.LEGACY + '.dynamic_scale'):
    return None
  moves = []
  for alias in original.names:
    name = alias.name.value if isinstance(alias.name, cst.Name) else None
    asname = alias.asname.name.value if alias.asname else None
    if name == 'DynamicScale':
      moves.append((alias, ('flax.training.dynamic_scale', 'DynamicScale', asname)))
    elif name == 'dynamic_scale' and module == api.LEGACY:
      moves.append((alias, ('flax.training', 'dynamic_scale', asname)))
    else:
      moves.append((alias, None))
  return module, moves


def leave_import_from(p, original: cst.ImportFrom) -> None:
  """``DynamicScale`` / ``dynamic_scale`` from flax.optim -> flax.training (OM006)."""
  if not p.q.opts.fixable('OM006'):
    return
  found = _dynamic_scale_moves(original)
  if found is None:
    return
  module, moves = found
  findings = [('OM006', f'{module}.{alias.name.value} -> flax.training.dynamic_scale')
              for alias, move in moves if move is not None]
  if findings:
    p.fix(original, apply_import_from, findings)


def apply_import_from(ctx, original, updated, fix):
  _, moves = _dynamic_scale_moves(original)
  keep = []
  for (_, move), alias in zip(moves, updated.names):
    if move is None:
      keep.append(alias)
    else:
      ctx.add_import(*move)
  if len(keep) == len(updated.names):
    return updated
  if not keep:
    return cst.RemoveFromParent()
  keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return updated.with_changes(names=keep)


# -- the module's imports, once the sites are rewritten ----------------------------------------
def legacy_imports(tree: cst.Module):
  """``(module, obj, asname)`` of each ``import flax.optim[ as X]`` /
  ``from flax.optim[.sub] import Y[ as X]`` / ``from flax import optim[ as X]`` of the module,
  top-level or nested (``try: from flax import optim`` / ``except ImportError: import
  optim_compat as optim``: both go when unused)."""
  for stmt in _simple_lines(tree):
    for small in stmt.body:
      if isinstance(small, cst.Import):
        for alias in small.names:
          name = code(alias.name)
          if name.startswith(api.LEGACY):
            yield name, None, alias.asname.name.value if alias.asname else None
      elif isinstance(small, cst.ImportFrom) and small.module is not None and \
          not isinstance(small.names, cst.ImportStar):
        module = code(small.module)
        for alias in small.names:
          obj = alias.name.value if isinstance(alias.name, cst.Name) else None
          if module.startswith(api.LEGACY) or (module == 'flax' and obj == 'optim'):
            yield module, obj, alias.asname.name.value if alias.asname else None


def _simple_lines(node):
  for child in node.children:
    if isinstance(child, cst.SimpleStatementLine):
      yield child
    elif isinstance(child, (cst.BaseCompoundStatement, cst.BaseSuite, cst.ExceptHandler,
                            cst.Else, cst.Finally)):
      yield from _simple_lines(child)


def removals(q, tree: cst.Module) -> list:
  """The imports to drop when unused: flax.optim's own, in a module that converts.

  RemoveImportsVisitor drops only imports left unused: a legacy import in use stays. A file
  that keeps its legacy code keeps its flax.optim imports, used or not: they say (to the
  reader and to later runs' cross-module flow) that its optimizers are flax.optim ones (only
  flax.optim's own imports: an `import flax` the migration left unused stays). An import
  nothing uses may be a re-export: kept, flagged (OM113).
  """
  f = q.f
  if not f.uses_legacy or (f.only_imports and not dead_imports(q)) or q.blocked:
    return []
  return [('flax', 'optim', None), ('flax.optim', None, None), *legacy_imports(tree)]


def _legacy_alias(alias: cst.ImportAlias) -> bool:
  return alias.asname is None and (
      code(alias.name) == api.LEGACY or code(alias.name).startswith(api.LEGACY + '.'))


class _PlainFlaxImport(cst.CSTTransformer):
  """``import flax.optim`` -> ``import flax`` (the line still binds ``flax`` for
  ``flax.linen`` and the like, and Flax >= 0.6 has no ``flax.optim`` to import); dropped
  where a module-level ``import flax`` binds it already (a line with comments above it
  stays, as ``import flax``)."""

  def __init__(self, bound: bool):
    super().__init__()
    self.bound = bound  # a module-level `import flax` (no `as`) exists

  def leave_SimpleStatementLine(self, original, updated):
    if (self.bound and not any(ll.comment for ll in original.leading_lines)
        and all(isinstance(s, cst.Import) and all(map(_legacy_alias, s.names))
                for s in original.body)):
      return cst.RemoveFromParent()
    return updated

  def leave_Import(self, original, updated):
    names = [a.with_changes(name=cst.Name('flax')) if _legacy_alias(a) else a
             for a in updated.names]
    return updated.with_changes(names=names)


def plain_flax_imports(tree: cst.Module) -> cst.Module:
  """``tree`` with each ``import flax.optim`` the migration kept (its ``flax`` is
  used) turned into ``import flax``, or dropped beside a module-level ``import flax``."""
  if not re.search(r'\bimport[^\n#]*\bflax\.optim\b', tree.code):
    return tree
  bound = any(isinstance(s, cst.Import) and any(code(a.name) == 'flax' and a.asname is None
                                                for a in s.names)
              for line in tree.body if isinstance(line, cst.SimpleStatementLine)
              for s in line.body)
  return tree.visit(_PlainFlaxImport(bound))


def _used_names(source: str) -> tuple[set[str], set[str], int]:
  """Names ``source`` uses outside import statements (not after a ``.``), the names
  imports bind, and the last line of an import statement that mentions ``optim``.

  A token scan: it over-approximates use (a shadowing local counts), which is
  the safe direction for deciding that an import is unused.
  """
  used, imported, last_optim_import = set(), set(), 0
  in_import, start, prev, line_tokens = False, True, None, []
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
      if in_import and 'optim' in line_tokens:
        last_optim_import = tok.start[0]
      in_import, start, prev, line_tokens = False, True, None, []
      continue
    if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
      continue
    if start:
      in_import = tok.type == tokenize.NAME and tok.string in ('import', 'from')
      start = False
    if tok.type == tokenize.NAME:
      line_tokens.append(tok.string)
      if in_import:
        imported.add(tok.string)
      elif not (prev is not None and prev.type == tokenize.OP and prev.string == '.'):
        used.add(tok.string)
    prev = tok
  return used, imported, last_optim_import


def _add_imports(context: CodemodContext, tree: cst.Module, adds) -> cst.Module:
  """``tree`` with the imports ``adds`` (LibCST ``ImportItem`` entries) added.

  With nothing to add LibCST's visitor would return the module unchanged; it is
  not built (its construction alone costs ~10 ms). The entries are taken back out
  of the context afterwards.
  """
  if not adds:
    return tree
  context.scratch[AddImportsVisitor.CONTEXT_KEY] = adds
  try:
    return import_scope.place_imports(context, tree)
  finally:
    context.scratch.pop(AddImportsVisitor.CONTEXT_KEY, None)


def fix_imports(context: CodemodContext, tree: cst.Module, drop) -> cst.Module:
  """Add the imports the rewrite needs and drop the unused legacy ones (``drop``).

  LibCST's ``AddImportsVisitor`` only looks at the leading statements, and an
  import whose name appears nowhere else needs no scope analysis: both run on
  the module's head (the statements before the first compound statement),
  which keeps a 20,000-statement file from being re-analysed twice. Only a
  legacy import whose name still appears (maybe shadowed), or one after the
  head, gets ``RemoveImportsVisitor``'s scope analysis, on the head and the
  statements that name it (``import_scope.remove_unused_imports``).
  """
  # (one item once: AddImportsVisitor merging into an existing `from flax.training import x`
  # writes a name once per request, `dynamic_scale as dynamic_scale_lib` twice)
  adds = list(dict.fromkeys(context.scratch.pop(AddImportsVisitor.CONTEXT_KEY, [])))
  context.scratch.pop(RemoveImportsVisitor.CONTEXT_KEY, None)
  k = next((i for i, st in enumerate(tree.body) if isinstance(st, cst.BaseCompoundStatement)),
           len(tree.body))
  head, tail = tree.with_changes(body=tree.body[:k]), list(tree.body[k:])
  used, _, last_optim_import = _used_names(tree.code)
  head_lines = head.code.count('\n') + 1
  if last_optim_import > head_lines:  # a legacy import after the head: every removal in the
    # scope-analysed pass, on the statements naming one; the added imports go in the head
    # (added to the whole module, they followed a block whose legacy import they replace:
    # `if __name__ == '__main__': from flax import optim ...`, a NameError in the block)
    head = _add_imports(context, head, adds)
    tree = before = tree.with_changes(body=[*head.body, *tail])
    tree = import_scope.remove_unused_imports(context, tree, len(head.body), drop)
    tree = import_scope.drop_unread_legacy_imports(tree, drop)
    return import_scope.keep_section_breaks(before, tree)
  fast, slow = [], []
  for module, obj, asname in dict.fromkeys(drop):
    bound = asname or obj or module.split('.')[0]
    legacy = module.startswith(api.LEGACY) or (module == 'flax' and obj == 'optim')
    if bound not in used:
      fast.append((module, obj, asname))
    elif legacy:
      slow.append((module, obj, asname))
  head = _add_imports(context, head, adds)
  if fast and import_scope.may_remove(head.body, fast):
    head = import_scope.keep_section_breaks(
        head, import_scope.remove_unused_head_imports(context, head, fast))
  tree = before = tree.with_changes(body=[*head.body, *tail])
  if slow:
    tree = import_scope.remove_unused_imports(context, tree, len(head.body), slow)
    tree = import_scope.drop_unread_legacy_imports(tree, slow)
    tree = import_scope.keep_section_breaks(before, tree)
  return tree


def finish(context: CodemodContext, q, tree: cst.Module, full: cst.Module) -> cst.Module:
  """The rewritten module with its imports fixed (``full``: the module as parsed, whose
  top-level flax.optim imports are the candidates to drop)."""
  drop = removals(q, full)
  if q.train_state_alias is not None:
    tree = tree.visit(_TrainStateAlias(q.train_state_alias))
    items = context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
    context.scratch[AddImportsVisitor.CONTEXT_KEY] = [
        dataclasses.replace(i, alias=q.train_state_alias)
        if (i.module_name, i.obj_name, i.alias) == ('flax.training', 'train_state', None) else i
        for i in items]
  tree = fix_imports(context, tree, drop)
  if not drop:
    return tree
  before = tree
  tree = plain_flax_imports(tree)
  if any(isinstance(stmt, cst.Try) for stmt in full.body):
    tree = tree.with_changes(body=[stmt for stmt in tree.body if not _emptied_try(stmt)])
  return import_scope.keep_section_breaks(before, tree)


def _emptied_try(stmt) -> bool:
  """``stmt`` is a ``try`` whose every block is ``pass``: an import fallback whose imports
  the rewrite dropped (``try: from flax import optim`` / ``except ImportError: import
  optim_compat as optim``)."""
  def passes(block) -> bool:
    return block is None or all(
        isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in line.body)
        for line in block.body.body)
  return (isinstance(stmt, cst.Try) and passes(stmt) and passes(stmt.orelse)
          and passes(stmt.finalbody) and all(passes(h) for h in stmt.handlers))


# -- the OM005 report entry ----------------------------------------------------------------
def _imports(source: str, parsed: Optional[dict] = None) -> Optional[dict[str, ast.stmt]]:
  """``{import statement as code: its node}`` (first occurrence), or None if it does not parse.

  ``parsed`` gets ``source``'s tree when it parses: the engine's output check would
  parse it again with the same parser (``ast.parse`` is ``compile`` with
  ``PyCF_ONLY_AST``) to say whether it is valid Python.
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return None
  if parsed is not None:
    parsed[source] = tree
  found = {}
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      found.setdefault(ast.unparse(node), node)
  return found


def import_finding(source: str, new_source: str, parsed: Optional[dict] = None) -> Optional[Finding]:
  """The ``OM005`` report entry for the imports a rewrite added and dropped, or None.

  Positioned at the first dropped import (else line 1); the message lists both.
  ``parsed``: see :func:`_imports` (it gets ``new_source``'s tree).
  """
  before, after = _imports(source), _imports(new_source, parsed)
  if before is None or after is None:
    return None
  added = [k for k in after if k not in before]
  dropped = [k for k in before if k not in after]
  if not added and not dropped:
    return None
  first = min((before[k] for k in dropped), key=lambda n: (n.lineno, n.col_offset), default=None)
  parts = ([f'added {"; ".join(f"`{k}`" for k in added)}'] if added else []) + (
      [f'dropped {"; ".join(f"`{k}`" for k in dropped)}'] if dropped else [])
  return Finding(first.lineno if first else 1, first.col_offset + 1 if first else 1, 'OM005',
                 'imports: ' + ', '.join(parts), True, data={'added': added, 'dropped': dropped})
