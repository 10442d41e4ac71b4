"""Rule family *fallback*: a file that keeps its legacy optimizer code runs on the shim (OM014).

Such a file (the plan's verdict is keep-legacy, or its only flax.optim use is an
import it may re-export) gets, right before its first top-level statement that
imports or names flax.optim::

    import optim_compat
    optim_compat.install()  # (OM014) ...

``optim_compat.install()`` points every ``flax.optim`` path at the shim when Flax
has none (Flax >= 0.6): ``from flax import optim [as X]``, ``import flax.optim
as X``, ``from flax.optim import Adam``, ``from flax.optim.adam import
_AdamParamState``, ``flax.optim.Adam`` after ``import flax``,
``flax.optim.dynamic_scale``, ``importlib.import_module("flax.optim")`` all get
the shim's module of the same name (``optim_compat.legacy_paths``), with the
legacy numerics (bitwise to flax.optim 0.5.3 on the same stack); on Flax <= 0.5.3
it does nothing. Every name and spelling of the file stays as it is, so its TODOs,
the cross-module flow (the file still says flax.optim: its users stay legacy, and
they get the same shim objects) and a later run see the same file. A file that
never references flax.optim (a step function kept legacy) needs nothing.
"""
from __future__ import annotations

import re

import libcst as cst

from codemod import legacy_api as api
from codemod.findings import Finding
from codemod.names import code
from codemod.rules import TODO_PREFIX

#: The comment on the inserted call (read back: the line is not inserted twice).
COMMENT = '# optim-migrate OM014: flax.optim is the shim on Flax >= 0.6'
INSTALL = 'optim_compat.install'


def wanted(q) -> bool:
  """The file keeps flax.optim code after this run: it keeps its legacy code, or it converts
  but keeps a flax.optim import nothing uses (a re-export)."""
  f = q.f
  if not (q.opts.shim_fallback and q.opts.fixable('OM014')) or q.unproven:
    return False
  from codemod.rules.imports import dead_imports
  return q.blocked or (f.only_imports and not f.star_imports and not dead_imports(q))


def touches_legacy(q) -> bool:
  """A top-level statement of ``q``'s module imports or names flax.optim (where OM014 puts
  ``install()``); computed once per file."""
  found = getattr(q, '_touches_legacy', None)
  if found is None:
    found = q._touches_legacy = any(_touches(stmt) for stmt in q.analysis.module.body)
  return found


def _touches(stmt) -> bool:
  """``stmt`` imports flax.optim, names ``flax.optim`` or a string naming it, or calls
  ``getattr(flax, "optim")``."""
  for node in _walk(stmt):
    if isinstance(node, cst.Import):
      if any(code(a.name) == api.LEGACY or code(a.name).startswith(api.LEGACY + '.')
             for a in node.names):
        return True
    elif isinstance(node, cst.ImportFrom) and node.module is not None:
      module = code(node.module)
      if module == api.LEGACY or module.startswith(api.LEGACY + '.'):
        return True
      if module == 'flax' and not isinstance(node.names, cst.ImportStar) and any(
          isinstance(a.name, cst.Name) and a.name.value == 'optim' for a in node.names):
        return True
    elif isinstance(node, cst.Attribute) and code(node) == api.LEGACY:
      return True
    elif isinstance(node, cst.SimpleString) and api.LEGACY in node.value:
      return True
    elif _getattr_optim(node):
      return True
  return False


def _getattr_optim(node) -> bool:
  """``getattr(flax, "optim"[, default])``: flax.optim reached by name (OM112)."""
  return (isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
          and node.func.value == 'getattr' and len(node.args) >= 2
          and isinstance(node.args[1].value, cst.SimpleString)
          and node.args[1].value.value.strip('\'"') == 'optim')


def _walk(node):
  yield node
  for child in node.children:
    yield from _walk(child)


def _installs(stmt) -> bool:
  """``stmt`` is a call of ``optim_compat.install()`` this family wrote."""
  return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
          and isinstance(stmt.body[0], cst.Expr) and code(stmt.body[0].value) == f'{INSTALL}()')


def first_statement(body):
  """The module's first statement, past the fallback lines an earlier run put on top
  (module-wide TODOs stand above it, as on the first run)."""
  i = 0
  if i + 1 < len(body) and _plain_import(body[i]) and _installs(body[i + 1]):
    i += 2
  elif i < len(body) and _installs(body[i]):
    i += 1
  return body[i] if i < len(body) else (body[0] if body else None)


def _plain_import(stmt) -> bool:
  return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
          and isinstance(stmt.body[0], cst.Import) and len(stmt.body[0].names) == 1
          and code(stmt.body[0].names[0]) == 'optim_compat')


def _docstring(stmt) -> bool:
  return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
          and isinstance(stmt.body[0], cst.Expr)
          and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _future(stmt) -> bool:
  return (isinstance(stmt, cst.SimpleStatementLine)
          and any(isinstance(s, cst.ImportFrom) and s.module is not None
                  and code(s.module) == '__future__' for s in stmt.body))


def anchor(body) -> int | None:
  """Where the fallback goes: the index of the first top-level statement that touches
  flax.optim (after the docstring and ``__future__`` imports), or None when the module
  has none, or already calls ``optim_compat.install()`` before it."""
  for i, stmt in enumerate(body):
    if _installs(stmt):
      return None
    if (i == 0 and _docstring(stmt)) or _future(stmt):
      continue
    if _touches(stmt):
      return i
  return None


def plan(q):
  """The fallback's report entry (OM014, at the first statement that touches flax.optim),
  or None when the file gets no fallback."""
  if not wanted(q):
    return None
  body = q.analysis.full.body
  at = anchor(body)
  if at is None:
    return None
  line, col = q.n.pos(body[at])
  return Finding(line or 1, col or 1, 'OM014',
                 'this file keeps its legacy optimizer code: optim_compat.install() before its '
                 'first flax.optim use points flax.optim at the shim (optim_compat, the legacy '
                 'numerics) on Flax >= 0.6, so the file runs as it is; the TODOs say what keeps '
                 'it legacy', True)


def _import_only(stmt) -> bool:
  return isinstance(stmt, cst.SimpleStatementLine) and all(
      isinstance(x, (cst.Import, cst.ImportFrom)) for x in stmt.body)


def apply(tree: cst.Module) -> cst.Module:
  """``tree`` with ``import optim_compat`` and ``optim_compat.install()`` (the import only
  when the module lacks it) before its first statement that touches flax.optim: an import
  (keeping the TODO lines above it, its other comments and blank lines above the inserted
  lines), else right after the imports before it (``import flax`` for ``flax.optim.X``)."""
  body = list(tree.body)
  at = anchor(body)
  if at is None:
    return tree
  has_import = any(isinstance(s, cst.SimpleStatementLine) and any(
      isinstance(x, cst.Import) and any(code(a.name) == 'optim_compat' and a.asname is None
                                        for a in x.names) for x in s.body) for s in body[:at])
  lines = [] if has_import else [cst.parse_statement('import optim_compat\n')]
  lines.append(cst.parse_statement(f'{INSTALL}()  {COMMENT}\n'))
  stmt = body[at]
  if not _import_only(stmt):
    last = next((i for i in range(at - 1, -1, -1) if _import_only(body[i])), None)
    if last is not None:  # after the import run before it
      body[last + 1:last + 1] = lines
      return tree.with_changes(body=body)
  leading = list(stmt.leading_lines)
  todo = next((i for i, ll in enumerate(leading)
               if ll.comment is not None and ll.comment.value.startswith(TODO_PREFIX)),
              len(leading))
  lines[0] = lines[0].with_changes(leading_lines=leading[:todo])
  body[at:at + 1] = [*lines, stmt.with_changes(leading_lines=leading[todo:])]
  return tree.with_changes(body=body)


def drop_stale(tree: cst.Module) -> cst.Module:
  """``tree`` (a module this run converts) without the ``optim_compat.install()`` line an
  earlier run wrote when the module kept its legacy code (a run over one file, then over the
  whole tree: helper-21), and without the ``import optim_compat`` written with it when nothing
  else uses that module. The comments and blank lines above them move to the next statement."""
  body = list(tree.body)
  for i, stmt in enumerate(body):
    if _installs(stmt) and stmt.trailing_whitespace.comment is not None and \
        stmt.trailing_whitespace.comment.value == COMMENT:
      start = i - 1 if i > 0 and _plain_import(body[i - 1]) else i
      rest = tree.with_changes(body=body[:start] + body[i + 1:])
      if start < i and re.search(r'\boptim_compat\b', rest.code):
        start = i  # (the import stays: the converted code uses the shim's names)
      leading = [ll for s_ in body[start:i + 1] for ll in s_.leading_lines]
      after = body[i + 1:]
      if after:
        after[0] = after[0].with_changes(leading_lines=[*leading, *after[0].leading_lines])
      return tree.with_changes(body=body[:start] + after)
  return tree
