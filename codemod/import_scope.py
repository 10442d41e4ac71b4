"""Unused-import removal with the scope analysis spent on the statements that matter,
and import addition on the statements ``AddImportsVisitor`` reads.

LibCST's ``RemoveImportsVisitor`` decides whether an import is still used with a
scope analysis of the whole module: for a 170-line legacy file that keeps its
legacy code, that second full analysis cost more than the rewrite itself.
Whether an import binding of ``optim`` is referenced depends only on the
statements that contain the word ``optim`` (a reference, a ``global``, a
rebinding, an ``__all__`` entry and a string annotation all spell it), so
:func:`remove_unused_imports` analyses the module's head plus those
statements, and puts the result back among the others unchanged.
"""
from __future__ import annotations

import bisect
import functools
import io
import re
import symtable
import sys
import tokenize
from typing import Optional, Sequence

import libcst as cst
import libcst.helpers
import libcst.matchers
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import ImportAssignment, ScopeProvider

Removal = tuple[str, 'str | None', 'str | None']


def _words(removals: Sequence[Removal]) -> set[str]:
  """Every name a removal's binding can be referenced by (dotted parts too)."""
  words = set()
  for module, obj, asname in removals:
    words.add(asname or obj or module.split('.')[0])
    if obj is None:
      words.update(module.split('.'))
  return words


def _import_only(stmt: cst.BaseStatement) -> bool:
  return isinstance(stmt, cst.SimpleStatementLine) and all(
      isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _import_nodes(stmt):
  if isinstance(stmt, cst.SimpleStatementLine):
    yield from (s for s in stmt.body if isinstance(s, (cst.Import, cst.ImportFrom)))


def may_remove(statements: Sequence[cst.BaseStatement], removals: Sequence[Removal]) -> bool:
  """False only when no import among ``statements`` matches a removal, so that
  ``RemoveImportsVisitor`` (which edits nothing else) would return them unchanged.

  Compound statements and relative imports count as possible matches.
  """
  modules = {module for module, obj, _ in removals if obj is None}
  objects = {(module, obj) for module, obj, _ in removals if obj is not None}
  for stmt in statements:
    if not isinstance(stmt, cst.SimpleStatementLine):
      return True
    for node in _import_nodes(stmt):
      if isinstance(node, cst.Import):
        if any(alias.evaluated_name in modules for alias in node.names):
          return True
      elif node.relative or node.module is None:
        return True
      elif not isinstance(node.names, cst.ImportStar):
        module = cst.helpers.get_full_name_for_node(node.module)
        if any((module, alias.evaluated_name) in objects for alias in node.names):
          return True
  return False


def _referenced(module: cst.Module, removals: Sequence[Removal]) -> bool:
  """True when LibCST's scope analysis of ``module`` finds every import that a removal
  names referenced, so that ``RemoveImportsVisitor`` (which removes only imports
  its own analysis finds unused) would return ``module`` unchanged.

  The visitor copies the module and builds three matcher visitors (~40 ms even on
  a five-line module); the scope analysis alone costs a tenth of that. An import
  counts as named when its module (``import m``) or its module and name (``from m
  import n``) are a removal's, whatever the aliases; a relative import makes the
  answer False (the visitor resolves it against the package), as does an import
  whose binding has no reference (the visitor decides, with ``__all__`` and string
  annotations as uses too).
  """
  modules = {module for module, obj, _ in removals if obj is None}
  objects = {(module, obj) for module, obj, _ in removals if obj is not None}
  scopes = cst.MetadataWrapper(module).resolve(ScopeProvider)
  for node, scope in scopes.items():
    if isinstance(node, cst.Import):
      named = [alias for alias in node.names if alias.evaluated_name in modules]
    elif isinstance(node, cst.ImportFrom):
      if isinstance(node.names, cst.ImportStar):
        continue
      if node.relative or node.module is None:
        return False
      name = cst.helpers.get_full_name_for_node(node.module)
      named = [alias for alias in node.names if (name, alias.evaluated_name) in objects]
    else:
      continue
    for alias in named:
      binding = alias.evaluated_alias or alias.evaluated_name
      if scope is None or not any(isinstance(a, ImportAssignment) and a.references
                                  for a in scope[binding]):
        return False
  return True


def remove_unused_imports(context: CodemodContext, tree: cst.Module, n_head: int,
                          removals: Sequence[Removal]) -> cst.Module:
  """Same result as ``RemoveImportsVisitor(context, removals).transform_module(tree)``.

  Args:
    context: the codemod's context (its ``full_package_name`` resolves relative imports).
    tree: the module.
    n_head: how many leading statements are always analysed (the caller's head:
      statements before the first compound one).
    removals: ``(module, obj, asname)`` as ``RemoveImportsVisitor`` takes them.

  Returns:
    The module with the unused ones among ``removals`` removed.
  """
  words = _words(removals)
  if not words:
    return tree
  pattern = re.compile(r'\b(?:' + '|'.join(map(re.escape, sorted(words))) + r')\b')
  body = list(tree.body)
  kept = [i for i in range(n_head, len(body)) if pattern.search(tree.code_for_node(body[i]))]
  if not may_remove([*body[:n_head], *(body[i] for i in kept)], removals):
    return tree
  if len(kept) == len(body) - n_head:
    if _referenced(tree, removals):
      return tree
    return RemoveImportsVisitor(context, removals).transform_module(tree)
  # each kept statement follows a marker, so that its result (none, when the visitor
  # removes a late import line whole) is found again; a `pass` binds and uses nothing
  reduced = tree.with_changes(body=[*body[:n_head], *(
      st for j, i in enumerate(kept) for st in (_marker(j), body[i]))])
  if _referenced(reduced, removals):  # the usual case: a file that keeps its legacy code
    return tree
  new_body = list(RemoveImportsVisitor(context, removals).transform_module(reduced).body)
  starts = [k for k, st in enumerate(new_body) if _is_marker(st)]
  if len(starts) != len(kept) or any(not _is_marker(new_body[k], j) for j, k in enumerate(starts)):
    raise RuntimeError('internal error: a statement marker was lost while removing imports')
  out = [[st] for st in body[n_head:]]
  for j, i in enumerate(kept):
    out[i - n_head] = new_body[starts[j] + 1:starts[j + 1] if j + 1 < len(kept) else None]
  head = new_body[:starts[0]] if starts else new_body
  return tree.with_changes(body=[*head, *(st for piece in out for st in piece)])


_MARKER = '# __optim_migrate_statement_{}__'


def _marker(j: int) -> cst.SimpleStatementLine:
  return cst.SimpleStatementLine(body=[cst.Pass()], trailing_whitespace=cst.TrailingWhitespace(
      whitespace=cst.SimpleWhitespace('  '), comment=cst.Comment(_MARKER.format(j))))


def _is_marker(stmt, j=None) -> bool:
  comment = stmt.trailing_whitespace.comment if isinstance(stmt, cst.SimpleStatementLine) else None
  return (comment is not None and comment.value.startswith('# __optim_migrate_statement_')
          and (j is None or comment.value == _MARKER.format(j)))


def _matches(node, module_aliases: dict, objects: dict) -> list[bool]:
  """For each alias of ``node``: would ``RemoveImportsVisitor`` with these removals act on it?"""
  if isinstance(node, cst.Import):
    return [alias.evaluated_name in module_aliases
            and alias.evaluated_alias == module_aliases[alias.evaluated_name]
            for alias in node.names]
  module = cst.helpers.get_full_name_for_node(node.module)
  wanted = objects.get(module, set())
  return [(alias.evaluated_name, alias.evaluated_alias) in wanted for alias in node.names]


def _bound_words(node) -> set[str]:
  """The names an import statement binds, dotted parts included (``import a.b`` binds ``a``)."""
  words = set()
  for alias in node.names:
    if alias.asname is not None:
      words.add(alias.evaluated_alias)
    else:
      words.update(alias.evaluated_name.split('.'))
  return words


def _drop_whole_statements(head: cst.Module, removals: Sequence[Removal]):
  """``head`` without its import statements that ``RemoveImportsVisitor`` would remove
  whole, when the answer is plain from the text; None when it is not (the caller runs
  LibCST).

  Plain means: each matched statement is a line holding one absolute import, every name
  of it is on the removal list, and no name it binds appears (as a word, in code,
  strings or comments) anywhere else in ``head``, so LibCST's scope analysis, its
  ``__all__`` and string-annotation checks all find it unused.
  """
  module_aliases = {module: asname for module, obj, asname in removals if obj is None}
  objects: dict[str, set] = {}
  for module, obj, asname in removals:
    if obj is not None:
      objects.setdefault(module, set()).add((obj, asname))
  codes = [head.code_for_node(st) for st in head.body]
  drop = []
  for i, st in enumerate(head.body):
    nodes = list(_import_nodes(st))
    if not nodes:
      continue
    if any(isinstance(n, cst.ImportFrom) and (n.relative or n.module is None
                                              or isinstance(n.names, cst.ImportStar))
           for n in nodes):
      return None
    hits = [_matches(n, module_aliases, objects) for n in nodes]
    if not any(any(h) for h in hits):
      continue
    if len(st.body) != 1 or not all(hits[0]) or (
        isinstance(nodes[0], cst.ImportFrom)
        and cst.helpers.get_full_name_for_node(nodes[0].module) == '__future__'):
      return None
    words = _bound_words(nodes[0])
    pattern = re.compile(r'\b(?:' + '|'.join(map(re.escape, sorted(words))) + r')\b')
    if any(pattern.search(code) for j, code in enumerate(codes) if j != i):
      return None
    drop.append(i)
  return head.with_changes(body=[st for i, st in enumerate(head.body) if i not in drop])


def remove_unused_head_imports(context: CodemodContext, head: cst.Module,
                               removals: Sequence[Removal]) -> cst.Module:
  """Same result as ``RemoveImportsVisitor(context, removals).transform_module(head)``.

  ``head`` holds the module's leading simple statements. The common case, a
  ``from flax import optim`` line whose name nothing else in ``head`` mentions,
  is decided from the text; anything else goes to LibCST's visitor.
  """
  dropped = _drop_whole_statements(head, removals)
  if dropped is not None:
    return dropped
  return RemoveImportsVisitor(context, removals).transform_module(head)


def _add_reads(body: Sequence[cst.BaseStatement]) -> int:
  """How many leading statements of ``body`` are enough for ``AddImportsVisitor``.

  The visitor reads (and may edit) only the module's leading run of import
  lines, after an optional first docstring or ``__strict__`` line, and the one
  statement after that run (which may get an empty line before it); it returns
  every later statement as it was. The count here may exceed what it reads,
  which is the safe side: the first statement always counts as skippable, and
  a line of several imports does not end the run.
  """
  return min(_run_end(body, 1) + 1, len(body))


def _module_name(node) -> str:
  return cst.helpers.get_full_name_for_node(node) or ''


def _legacy_import(node) -> bool:
  """``node`` imports flax.optim (``import flax.optim[.x]``, ``from flax.optim[.x] import
  ...``, ``from flax import optim``)."""
  if isinstance(node, cst.Import):
    return any(_module_name(a.name) == 'flax.optim' or
               _module_name(a.name).startswith('flax.optim.') for a in node.names)
  if not isinstance(node, cst.ImportFrom) or node.module is None or node.relative:
    return False
  module = _module_name(node.module)
  if module == 'flax.optim' or module.startswith('flax.optim.'):
    return True
  return module == 'flax' and not isinstance(node.names, cst.ImportStar) and any(
      a.evaluated_name == 'optim' for a in node.names)


def _jax_import(node) -> bool:
  names = ([_module_name(a.name) for a in node.names] if isinstance(node, cst.Import) else
           [_module_name(node.module)] if node.module is not None and not node.relative else [])
  return any(n.split('.')[0] in ('jax', 'flax') for n in names)


def _imports_in(stmt):
  if isinstance(stmt, cst.SimpleStatementLine):
    return list(_import_nodes(stmt))
  return list(libcst.matchers.findall(stmt, libcst.matchers.Import() | libcst.matchers.ImportFrom()))


def insertion_start(body: Sequence[cst.BaseStatement]) -> int:
  """Where the new imports' block starts: the index of the first statement of the
  module that ``AddImportsVisitor`` is shown, so that it adds after that run of imports.

  The run is the one holding the first flax.optim import (the imports it replaces
  are read there, after any set-up line before it: ``os.environ['XLA_FLAGS'] = ...``,
  a notebook's ``!pip install``), else the first run that imports jax or flax, else the
  module's leading run. A flax.optim import inside a compound statement (``try:``)
  puts the new imports right after that statement.
  """
  anchor = next((i for i, st in enumerate(body) if any(map(_legacy_import, _imports_in(st)))),
                None)
  if anchor is None:
    anchor = next((i for i, st in enumerate(body) if _import_only(st)
                   and any(map(_jax_import, _import_nodes(st)))), None)
  if anchor is None:
    return 0
  if not _import_only(body[anchor]):
    return anchor + 1
  while anchor > 0 and _import_only(body[anchor - 1]):
    anchor -= 1
  return anchor


def _section_end(body: Sequence[cst.BaseStatement], start: int) -> Optional[int]:
  """The end (an index of ``body``) of the import section holding the first flax.optim
  import, when another section of imports follows it (isort's groups: third-party, then
  first-party, set apart by a blank or comment line): the new imports (``optax``,
  ``flax.training``) then close the flax.optim import's section instead of following the
  first-party one (helper-28's D3). None: no such later section."""
  anchor = next((i for i in range(start, len(body)) if _import_only(body[i])
                 and any(map(_legacy_import, _import_nodes(body[i])))), None)
  if anchor is None:
    return None
  end = anchor + 1
  while end < len(body) and _import_only(body[end]) and not body[end].leading_lines:
    end += 1
  return end if end < len(body) and _import_only(body[end]) else None


def _run_end(body: Sequence[cst.BaseStatement], i: int) -> int:
  """The index after the run of import-only statements of ``body`` from ``i`` on."""
  while i < len(body) and _import_only(body[i]):
    i += 1
  return i


def _present(statements, item) -> bool:
  """An import among ``statements`` already binds what ``item`` (an ``ImportItem``) adds."""
  for st in statements:
    for node in _import_nodes(st):
      if isinstance(node, cst.Import) and item.obj_name is None:
        if any(a.evaluated_name == item.module_name and a.evaluated_alias == item.alias
               for a in node.names):
          return True
      elif (isinstance(node, cst.ImportFrom) and item.obj_name is not None and not node.relative
            and node.module is not None and _module_name(node.module) == item.module_name
            and not isinstance(node.names, cst.ImportStar)):
        if any(a.evaluated_name == item.obj_name and a.evaluated_alias == item.alias
               for a in node.names):
          return True
  return False


def add_imports(context: CodemodContext, tree: cst.Module, anchored: bool = True,
                where: Optional[tuple[int, Optional[int]]] = None) -> cst.Module:
  """``AddImportsVisitor``'s result (the imports to add are in ``context.scratch``, as
  LibCST keeps them), placed after the run of imports :func:`insertion_start` picks
  rather than always after the module's leading run (``anchored=False``: where the visitor
  itself places them, after the leading run).

  LibCST's visitor copies and walks the whole module it is given, with a
  matcher transformer, to act on its first few statements; it is given those
  (:func:`_add_reads`) and the rest is put back after its result. Imports the
  statements before that run already make are not added again. ``where``: ``(start,
  section)`` as :func:`place_imports` found them in a body of the same statements.
  """
  body = list(tree.body)
  if where is not None:
    start, section = where
  else:
    start = insertion_start(body) if anchored else 0
    section = _section_end(body, start) if anchored else None
  if start or section is not None:
    later = body[section:_run_end(body, section)] if section is not None else []
    key = AddImportsVisitor.CONTEXT_KEY
    context.scratch[key] = [i for i in context.scratch.get(key, [])
                            if not _present(body[:start], i) and not _present(later, i)]
    if not context.scratch[key]:
      return tree
  rest = body[start:]
  n = _add_reads(rest) if rest else 0
  if section is not None:  # (the new imports close the flax.optim import's own section)
    n = section - start
  if start == 0 and n == len(body):
    return AddImportsVisitor(context).transform_module(tree)
  part = AddImportsVisitor(context).transform_module(cst.Module(body=rest[:n]))
  added = list(part.body)
  if section is not None and len(added) > n:
    # a section of flax.optim imports only (removed next, with the blank line that sets it
    # apart): its new imports take that blank line
    first = section - 1
    while first > start and not body[first].leading_lines and _import_only(body[first - 1]):
      first -= 1
    if all(_legacy_import(node) for st in body[first:section] for node in _import_nodes(st)):
      added[n] = added[n].with_changes(leading_lines=body[first].leading_lines)
  return tree.with_changes(body=[*body[:start], *added, *rest[n:]])


# -- where a careful human (or isort) would put the added imports ------------------------
# add_imports places what LibCST's visitor places: names merged into an existing
# `from m import ...` go first (`train_state, checkpoints`), and every new line follows the
# run of imports it is shown (`import os` among optax and flax.training). place_imports
# merges names in order and puts standard-library modules in the file's stdlib section
# first, then hands the rest to add_imports.

def _stdlib(module: str) -> bool:
  top = module.split('.')[0]
  return top != '__future__' and top in sys.stdlib_module_names


def _stdlib_line(stmt) -> bool:
  """``stmt`` is a line of absolute imports of standard-library modules only."""
  nodes = list(_import_nodes(stmt)) if _import_only(stmt) else []
  return bool(nodes) and all(
      all(_stdlib(_module_name(a.name)) for a in node.names) if isinstance(node, cst.Import)
      else not node.relative and node.module is not None and _stdlib(_module_name(node.module))
      for node in nodes)


def _future_line(stmt) -> bool:
  return any(isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None
             and _module_name(node.module) == '__future__' for node in _import_nodes(stmt))


def _one_import(stmt):
  """The import of a line holding exactly one import (what LibCST's visitor reads), or None."""
  if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
      and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))):
    return stmt.body[0]
  return None


def _skips_first(body) -> bool:
  """LibCST's visitor keeps a leading docstring or ``__strict__`` line first."""
  if not body or not isinstance(body[0], cst.SimpleStatementLine) or not body[0].body:
    return False
  first = body[0].body[0]
  return (isinstance(first, cst.Expr) and isinstance(first.value, cst.SimpleString)
          and len(body[0].body) == 1) or (
      isinstance(first, cst.Assign) and len(first.targets) == 1
      and isinstance(first.targets[0].target, cst.Name)
      and first.targets[0].target.value == '__strict__')


def _top_run(shown) -> tuple[int, int]:
  """``(first, end)``: the indices of ``shown`` that LibCST's visitor reads as the module's
  top imports (it merges names into those) and inserts new import lines at (``end``)."""
  first = 1 if _skips_first(shown) else 0
  end = first
  while end < len(shown) and _one_import(shown[end]) is not None:
    end += 1
  return first, end


def _by_type(name: str):
  kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
  return kind, name.lower(), name


#: Orders a list of imported names may be sorted in: case-insensitive (isort's default
#: ``force_sort_within_sections``-insensitive order), isort's ``order_by_type`` (CONSTANTS,
#: Classes, then the rest) and plain code-point order.
_NAME_ORDERS = ((lambda name: (name.lower(), name)), _by_type, (lambda name: name))


def _sorted_by(names, key) -> bool:
  keys = [key(name) for name in names]
  return all(a <= b for a, b in zip(keys, keys[1:]))


def _no_comment(ws):
  if isinstance(ws, cst.ParenthesizedWhitespace) and ws.first_line.comment is not None:
    return ws.with_changes(first_line=cst.TrailingWhitespace())
  return ws


def merge_names(node: cst.ImportFrom, new: Sequence[cst.ImportAlias]) -> cst.ImportFrom:
  """``node`` importing ``new`` too: each new name in its sorted place when ``node``'s own
  names are sorted (in one of ``_NAME_ORDERS``), else after them; the layout
  (commas, a multi-line parenthesized list, a trailing comma) is kept."""
  old = list(node.names)
  names = [a.evaluated_name for a in old]
  key = next((k for k in _NAME_ORDERS if _sorted_by(names, k)), None)
  new = sorted(new, key=lambda a: _NAME_ORDERS[0](a.evaluated_name))
  merged = list(old)
  if key is None:
    merged.extend(new)
  else:
    for alias in new:
      keys = [key(a.evaluated_name) for a in merged]
      merged.insert(bisect.bisect_right(keys, key(alias.evaluated_name)), alias)
  separators = [a.comma for a in old[:-1] if isinstance(a.comma, cst.Comma)
                and _no_comment(a.comma.whitespace_after) is a.comma.whitespace_after]
  if separators:
    separator = separators[0]
  elif node.lpar is not None and isinstance(node.lpar.whitespace_after,
                                            cst.ParenthesizedWhitespace):
    separator = cst.Comma(whitespace_after=_no_comment(node.lpar.whitespace_after))
  else:
    separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(' '))
  last = old[-1]
  out = []
  for i, alias in enumerate(merged):
    if i == len(merged) - 1:
      comma = last.comma
    elif any(alias is a for a in old[:-1]):
      comma = alias.comma
    else:
      comma = separator
    out.append(alias.with_changes(comma=comma))
  return node.with_changes(names=out)


def _alias_node(item) -> cst.ImportAlias:
  return cst.ImportAlias(
      name=cst.parse_expression(item.obj_name),
      asname=cst.AsName(name=cst.Name(item.alias)) if item.alias else None)


def _merge_into_top(shown, items):
  """LibCST's merging of ``from m import x`` items into the first ``from m import ...`` of
  the top imports of ``shown``, with the names in order (:func:`merge_names`). Returns
  ``shown`` and the items left for the visitor (modules with a star or a relative import
  among the top ones, names already imported there)."""
  first, end = _top_run(shown)
  top = [(i, _one_import(shown[i])) for i in range(first, end)]
  if any(isinstance(node, cst.ImportFrom) and (node.relative or node.module is None)
         for _, node in top):
    return shown, items
  shown, left = list(shown), []
  by_module: dict[str, list] = {}
  for item in items:
    if (item.obj_name is None or item.relative or item.module_name == '__future__'
        or _present(shown[first:end], item)):
      left.append(item)
    else:
      by_module.setdefault(item.module_name, []).append(item)
  for module, wanted in by_module.items():
    froms = [(i, node) for i, node in top if isinstance(node, cst.ImportFrom)
             and _module_name(node.module) == module]
    if not froms or any(isinstance(node.names, cst.ImportStar) for _, node in froms):
      left.extend(wanted)
      continue
    i, node = froms[0]
    merged = merge_names(node, [_alias_node(item) for item in dict.fromkeys(wanted)])
    shown[i] = shown[i].with_changes(body=[merged])
    top = [(j, merged if j == i else n) for j, n in top]
  return shown, left


def _line_key(stmt, by_kind: bool):
  node = next(_import_nodes(stmt))
  name = (_module_name(node.names[0].name) if isinstance(node, cst.Import)
          else _module_name(node.module))
  return (isinstance(node, cst.ImportFrom), name.lower()) if by_kind else (name.lower(),)


def _split_leading(lines):
  """``lines`` (a statement's leading lines) as ``(detached, attached)``: the comment lines
  right above the statement are its own; the rest (blank lines, and comments set apart from
  it by one) separate it from what comes before."""
  lines = list(lines)
  cut = len(lines)
  while cut > 0 and lines[cut - 1].comment is not None:
    cut -= 1
  return lines[:cut], lines[cut:]


def _stdlib_place(body, end: int):
  """Where an added standard-library import goes among ``body[:end]`` (isort's stdlib
  section), or None (no import there).

  Returns ``('section', lines, by_kind)``: among ``lines``, the standard-library import
  lines of the first section holding one (sections: runs of import lines set apart by blank
  or comment lines or code), sorted by module (``by_kind`` False), by ``import`` lines then
  ``from`` lines (True, isort's default) or not sorted (None: after them); or ``('top', i,
  None)``: before ``body[i]``, the first import after any ``from __future__`` one, as a
  section of its own.
  """
  sections, current = [], []
  for i in range(end):
    if not _import_only(body[i]):
      current = []
      continue
    if body[i].leading_lines or not current:
      current = []
      sections.append(current)
    current.append(i)
  for section in sections:
    lines = [i for i in section if _stdlib_line(body[i])]
    if lines:
      by_kind = next((k for k in (False, True) if _sorted_by(
          [body[i] for i in lines], functools.partial(_line_key, by_kind=k))), None)
      return 'section', lines, by_kind
  first = next((i for i in range(end) if _import_only(body[i]) and not _future_line(body[i])),
               None)
  return None if first is None else ('top', first, None)


def _stdlib_statement(item) -> cst.SimpleStatementLine:
  if item.obj_name is None:
    text = f'import {item.module_name}' + (f' as {item.alias}' if item.alias else '')
  else:
    text = (f'from {item.module_name} import {item.obj_name}'
            + (f' as {item.alias}' if item.alias else ''))
  return cst.parse_statement(text + '\n')


def _insert_stdlib(body, place, stmt):
  """``body`` with ``stmt`` (a standard-library import line) at ``place``
  (:func:`_stdlib_place`'s answer)."""
  body = list(body)
  kind, lines, by_kind = place
  if kind == 'top':
    i = lines
    detached, attached = _split_leading(body[i].leading_lines)
    body[i] = body[i].with_changes(leading_lines=[cst.EmptyLine(), *attached])
    return [*body[:i], stmt.with_changes(leading_lines=detached), *body[i:]]
  i = lines[-1] + 1
  if by_kind is not None:
    key = _line_key(stmt, by_kind)
    i = next((j for j in lines if _line_key(body[j], by_kind) > key), i)
  if i == lines[0]:  # first of its section: it takes the section's leading lines
    stmt = stmt.with_changes(leading_lines=body[i].leading_lines)
    body[i] = body[i].with_changes(leading_lines=())
  body.insert(i, stmt)
  return body


def place_imports(context: CodemodContext, tree: cst.Module, anchored: bool = True) -> cst.Module:
  """:func:`add_imports`, with the imports placed as isort (or a careful human) would: a
  name added to an existing ``from m import a, b`` in its sorted place when ``a, b`` are
  sorted (after them when not), and a standard-library module (``import os``) in the
  file's stdlib section, sorted among it when it is sorted (at the top of the imports,
  a section of its own, when no section imports the standard library), instead of among
  the added third-party imports."""
  key = AddImportsVisitor.CONTEXT_KEY
  items = list(context.scratch.get(key, []))
  if not items or any(i.module_name == '__future__' or i.relative for i in items):
    return add_imports(context, tree, anchored)
  body = list(tree.body)
  start = insertion_start(body) if anchored else 0
  section = _section_end(body, start) if anchored else None
  rest = body[start:]
  n = section - start if section is not None else _add_reads(rest) if rest else 0
  shown, items = _merge_into_top(rest[:n], items)
  end = start + _top_run(shown)[1]  # (the visitor inserts nothing before this index)
  later = body[section:_run_end(body, section)] if section is not None else []
  stdlib = [i for i in dict.fromkeys(items) if _stdlib(i.module_name)
            and not _present([*body[:start], *shown], i) and not _present(later, i)]
  body = [*body[:start], *shown, *rest[n:]]
  if not stdlib or _stdlib_place(body, end) is None:
    stdlib = []
  context.scratch[key] = [i for i in items if i not in stdlib]
  # (the merges replaced statements in place: the same start and section)
  tree = add_imports(context, tree.with_changes(body=body), anchored, where=(start, section))
  if not stdlib:
    return tree
  body = list(tree.body)  # (the same statements as before up to `end`: the visitor adds after)
  for stmt in sorted(map(_stdlib_statement, stdlib), key=lambda st: _line_key(st, False)):
    body = _insert_stdlib(body, _stdlib_place(body, end), stmt)
    end += 1
  return tree.with_changes(body=body)


# -- a removed import keeps the blank line that set its section apart ---------------------
def _names(node) -> list[str]:
  return [] if isinstance(node.names, cst.ImportStar) else [a.evaluated_name for a in node.names]


def _edited(before, after) -> bool:
  """``after`` can be ``before`` (an import line) with names dropped or ``import flax.optim``
  made ``import flax``: same kinds of import, same modules, no new name, same leading lines."""
  b, a = list(_import_nodes(before)), list(_import_nodes(after))
  if not _import_only(before) or not _import_only(after) or len(a) != len(b):
    return False
  for x, y in zip(b, a):
    if type(x) is not type(y):
      return False
    if isinstance(x, cst.ImportFrom):
      if x.relative or y.relative or _module_name(x.module) != _module_name(y.module):
        return False
      if not set(_names(y)) <= set(_names(x)):
        return False
    elif not all(any(m == n or m.startswith(n + '.') for m in _names(x)) for n in _names(y)):
      return False
  return all(p.deep_equals(q) for p, q in zip(before.leading_lines, after.leading_lines)) and \
      len(before.leading_lines) == len(after.leading_lines)


def keep_section_breaks(before: cst.Module, after: cst.Module) -> cst.Module:
  """``after`` (``before`` with top-level statements removed or import lines edited by an
  import removal) where a removed statement's blank line, the one setting its section apart
  from the previous one, goes to the statement that followed it when that one had none:
  removing ``import flax.optim as fo`` at the head of a section (``import jax`` below it)
  would otherwise join the section to the one before. Comment lines right above a removed
  import go with it (they were about it). ``after`` as it is when its statements do not
  line up with ``before``'s."""
  old, new = before.body, after.body
  if len(new) >= len(old):
    return after
  out, carry, j, moved = [], None, 0, False
  for stmt in old:
    kept = new[j] if j < len(new) else None
    if kept is not None and (kept is stmt or _edited(stmt, kept) or kept.deep_equals(stmt)):
      if carry and not kept.leading_lines:
        kept, moved = kept.with_changes(leading_lines=carry), True
      out.append(kept)
      carry, j = None, j + 1
    elif carry is None:
      carry = _split_leading(stmt.leading_lines)[0] or None
  if j != len(new) or not moved:
    return after
  return after.with_changes(body=out)


def _globals_read(code: str) -> 'set[str] | None':
  """The names some scope of ``code`` reads as module globals (CPython's own ``symtable``:
  a read at module level, or an implicit or declared global read in a function or class),
  plus every word of a string literal (an ``__all__`` entry, a string annotation); None
  when ``code`` does not compile."""
  try:
    top = symtable.symtable(code, '<rewritten>', 'exec')
    strings = [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
               if t.type == tokenize.STRING or t.type == getattr(tokenize, 'FSTRING_MIDDLE', -1)]
  except (SyntaxError, ValueError, tokenize.TokenError):
    return None
  read, stack = set(), [top]
  while stack:
    table = stack.pop()
    at_module = table.get_type() == 'module'
    read.update(s.get_name() for s in table.get_symbols()
                if s.is_referenced() and (at_module or s.is_global()))
    stack.extend(table.get_children())
  for text in strings:
    read.update(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', text))
  return read


class _DropAliases(cst.CSTTransformer):
  """Drops the aliases in ``drop`` (ids) from the module's top-level import lines; a line
  left without a name goes."""

  def __init__(self, drop: set):
    super().__init__()
    self.drop = drop

  def visit_FunctionDef(self, node) -> bool:
    return False

  def visit_ClassDef(self, node) -> bool:
    return False

  def _kept(self, original, names):
    kept = [a for a, o in zip(names, original) if id(o) not in self.drop]
    if kept and len(kept) != len(names):
      kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return kept

  def leave_Import(self, original, updated):
    kept = self._kept(original.names, updated.names)
    return updated.with_changes(names=kept) if kept else cst.RemoveFromParent()

  def leave_ImportFrom(self, original, updated):
    if isinstance(updated.names, cst.ImportStar):
      return updated
    kept = self._kept(original.names, updated.names)
    if not kept:
      return cst.RemoveFromParent()
    return updated.with_changes(names=kept, lpar=updated.lpar if len(kept) > 1 else None,
                                rpar=updated.rpar if len(kept) > 1 else None)


def drop_unread_legacy_imports(tree: cst.Module, removals: Sequence[Removal]) -> cst.Module:
  """``tree`` without the top-level flax.optim imports among ``removals`` that no code reads.

  LibCST's scope analysis, which ``RemoveImportsVisitor`` asks, can take a parameter that is
  rebound in its function (``def step(optim, g): optim = optim.apply_gradient(g)``) for a
  read of the module's ``from flax import optim``; the import then stays in a converted
  file and fails on Flax >= 0.6 (no ``flax.optim``). CPython's ``symtable`` decides here
  whether each remaining legacy binding is read (string literals count as reads).
  """
  legacy = [r for r in removals if r[0].startswith('flax.optim') or r[:2] == ('flax', 'optim')]
  module_aliases = {module: asname for module, obj, asname in legacy if obj is None}
  objects: dict[str, set] = {}
  for module, obj, asname in legacy:
    if obj is not None:
      objects.setdefault(module, set()).add((obj, asname))
  found = []  # (alias node, the name it binds)
  for stmt in tree.body:
    for node in _import_nodes(stmt):
      if isinstance(node, cst.ImportFrom) and (node.relative or node.module is None
                                               or isinstance(node.names, cst.ImportStar)):
        continue
      for alias, hit in zip(node.names, _matches(node, module_aliases, objects)):
        if hit:
          found.append((alias, alias.evaluated_alias or alias.evaluated_name.split('.')[0]))
  if not found:
    return tree
  read = _globals_read(tree.code)
  if read is None:
    return tree
  drop = {id(alias) for alias, bound in found if bound not in read}
  return tree.visit(_DropAliases(drop)) if drop else tree
