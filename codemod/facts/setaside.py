"""Statements no rule can see, set aside before the analysis and put back after the rewrite.

Scope analysis is then spent on the legacy code, not on a module's other 90%;
line numbers (finding positions) stay those of the original.
"""
from __future__ import annotations

import re

import libcst as cst

from codemod import legacy_api as api
from codemod.names import target_names

_KEEP = '__optim_migrate_kept_{}__'
_WORD = re.compile(r'\w+')
_STARRED = re.compile(r'\*\*\s*([A-Za-z_]\w*)')
#: Top-level statements below which the whole module is analysed as is.
MIN_STATEMENTS = 8


def _top_level_names(stmt) -> set[str]:
  """Module-level names ``stmt`` binds (defs, classes, plain assignment targets)."""
  if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
    return {stmt.name.value}
  names = set()
  if isinstance(stmt, cst.SimpleStatementLine):
    for small in stmt.body:
      targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign) else
                 [small.target] if isinstance(small, (cst.AnnAssign, cst.AugAssign)) else [])
      for t in targets:
        names.update(n.value for n in target_names(t))
  return names


def reduce(tree: cst.Module) -> tuple[cst.Module, dict]:
  """The module with top-level statements no rule can see replaced by line-preserving
  placeholders (``pass  # __optim_migrate_kept_N__``), and the originals.

  A statement is kept when it is an import, mentions a word of
  :data:`codemod.legacy_api.WORDS`, or mentions a name bound by a kept statement (to a
  fixpoint).
  """
  body = list(tree.body)
  if len(body) < MIN_STATEMENTS:
    return tree, {}
  empty = cst.Module(body=[])
  codes = [empty.code_for_node(st) for st in body]
  keep = [bool(api.WORDS_RE.search(c)) or (
      isinstance(st, cst.SimpleStatementLine)
      and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in st.body))
      for st, c in zip(body, codes)]
  # the fixpoint as a worklist over an index of each statement's words (a name in
  # \b...\b is a whole \w+ run): one regex of all bound names per round, over every
  # statement, was quadratic in a chain of statements each naming what the one before binds
  where: dict[str, list[int]] = {}
  for i, c in enumerate(codes):
    for word in set(_WORD.findall(c)):
      where.setdefault(word, []).append(i)
  bound: set[str] = set()
  frontier = [i for i, k in enumerate(keep) if k]
  binders: dict[str, list[int]] = {}  # (built on the first `**name`)
  while frontier:
    new = set().union(*(_top_level_names(body[i]) for i in frontier)) - bound
    bound |= new
    # `Adam(**adam_kwargs)`: the statements binding a name a kept one unpacks are kept too
    # (codemod.names.Names.keyword_dict reads that dict)
    starred = {name for i in frontier for name in _STARRED.findall(codes[i])}
    frontier = []
    if starred and not binders:
      for i, st in enumerate(body):
        for name in _top_level_names(st):
          binders.setdefault(name, []).append(i)
    for i in (i for name in starred for i in binders.get(name, ())):
      if not keep[i]:
        keep[i] = True
        frontier.append(i)
    for name in new:
      hits = where.get(name, ()) if _WORD.fullmatch(name) else [
          i for i, c in enumerate(codes) if re.search(r'\b' + re.escape(name) + r'\b', c)]
      for i in hits:
        if not keep[i]:
          keep[i] = True
          frontier.append(i)
  if all(keep):
    return tree, {}
  originals, reduced = {}, []
  for i, (st, k, c) in enumerate(zip(body, keep, codes)):
    if k:
      reduced.append(st)
      continue
    n_lines = c.count('\n')
    originals[_KEEP.format(i)] = st
    reduced.append(cst.SimpleStatementLine(
        body=[cst.Pass()], leading_lines=[cst.EmptyLine()] * max(n_lines - 1, 0),
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace('  '), comment=cst.Comment('# ' + _KEEP.format(i)))))
  return tree.with_changes(body=reduced), originals


def restore(tree: cst.Module, originals: dict) -> cst.Module:
  """Put the statements :func:`reduce` set aside back in place."""
  if not originals:
    return tree
  originals = dict(originals)
  body = []
  for st in tree.body:
    comment = (st.trailing_whitespace.comment if isinstance(st, cst.SimpleStatementLine)
               else None)
    key = comment.value[2:] if comment is not None else None
    body.append(originals.pop(key) if key in originals else st)
  if originals:
    raise RuntimeError(f'internal error: {len(originals)} statement(s) lost while rewriting')
  return tree.with_changes(body=body)
