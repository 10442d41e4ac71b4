"""Module names: which dotted name each file of a run has, and which modules a file imports.

A module's dotted name is its path relative to the tree root (the directory
given, raised past parent packages that have an ``__init__.py``); for files
named one by one, the working directory is a root too, as pre-commit runs from
the repository root. Read by the cross-module flow (``codemod.flow``) and by
the report of importers outside the run (``codemod.runner``).
"""
from __future__ import annotations

import pathlib
import re
from typing import Iterable, Mapping, Optional


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


def module_names(path: pathlib.Path, roots: Iterable[pathlib.Path],
                 raised: bool = False) -> list[tuple[str, bool]]:
  """``[(dotted name, is_package)]`` of ``path`` relative to each root it lies under.

  A root that is itself inside a package (it has an ``__init__.py``) is raised
  to the package's parent, as Python's import path would be (``raised``: ``roots`` are
  :func:`package_root` s already).
  """
  out = []
  absolute = path.absolute()
  for root in roots if raised else map(package_root, roots):
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


def import_lines(text: str) -> str:
  """The lines of ``text`` (split at ``\\n``, as ``re.M`` sees lines) that hold the word
  ``import``, joined by ``\\n``: a one-line pattern anchored at a line start (:data:`_FROM`,
  :data:`_IMPORT`) finds in it what it finds in ``text``, in the same order, without
  scanning every line of a long module."""
  out, find, rfind = [], text.find, text.rfind
  i = find('import')
  while i >= 0:
    end = find('\n', i)
    end = len(text) if end < 0 else end
    out.append(text[rfind('\n', 0, i) + 1:end])
    i = find('import', end)
  return '\n'.join(out)


_FROM = re.compile(r'^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([^#\n]*)', re.M)
_IMPORT = re.compile(r'^[ \t]*import[ \t]+([^#\n;]*)', re.M)


_FROM_ALL = re.compile(r'^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^#\n;]*)', re.M)


def reexports(text: str, module: Optional[str], is_package: bool) -> dict[str, str]:
  """``{'pkg.name': 'pkg.sub.name'}``: the names ``text`` (module ``module``) imports from
  other modules, which importers of ``module`` may take from it (``from .optim import
  create_optim`` in ``jeffnet/linen/__init__.py``: ``jeffnet.linen.create_optim`` is
  ``jeffnet.linen.optim.create_optim``). Every ``from ... import`` line counts, in a
  function or not: an over-approximation, used only to follow a name to a known factory."""
  if module is None or 'import' not in text:
    return {}
  found = {}
  for dots, name, names in _FROM_ALL.findall(text):
    base = absolute_name(dots + name, module, is_package) if (dots or name) else None
    if not base:
      continue
    for part in names.strip('()').replace('\\', ' ').split(','):
      words = part.split()
      if len(words) == 3 and words[1] == 'as' and words[0].isidentifier():
        found[f'{module}.{words[2]}'] = f'{base}.{words[0]}'
      elif len(words) == 1 and words[0].isidentifier():
        found[f'{module}.{words[0]}'] = f'{base}.{words[0]}'
  return found


def imported_modules(text: str, module: Optional[str], is_package: bool) -> set[str]:
  """Dotted names of the modules ``text`` may import (``from a.b import c`` gives ``a.b``
  and ``a.b.c``; relative imports resolved against ``module``). From the first line of each
  import statement: a cheap over- and under-approximation, used only to find modules outside
  the run that an importer in it names."""
  found = set()
  text = import_lines(text)  # (both patterns match within one line)
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


def outside_modules(files: list[tuple[pathlib.Path, list[tuple[str, bool]], str]],
                    roots: Iterable[pathlib.Path], texts: Mapping[pathlib.Path, str],
                    ) -> list[tuple[pathlib.Path, list, str]]:
  """Modules the run's files import that lie under one of ``roots`` but are not in the
  run (``rewrite train.py`` alone, or pre-commit's changed files): ``(path, module names,
  path shown)``, to be read by the pre-pass (never written), so that a module migrated
  or kept legacy earlier still tells its importers what its functions return and take.
  ``texts``: the files' texts, by path (latin-1: only words are looked for)."""
  roots = list(dict.fromkeys(map(package_root, roots)))
  inside = None  # the run's files, resolved once a candidate exists (most trees have none)
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
          if not candidate.is_file():
            continue
          if inside is None:
            inside = set()
            for path, _, _ in files:
              try:
                inside.add(path.resolve())
              except OSError:
                continue
          if candidate.resolve() in inside:
            continue
        except OSError:
          continue
        inside.add(candidate.resolve())
        out.append((candidate, [(name, candidate.name == '__init__.py')],
                    candidate.relative_to(root).as_posix()))
  return out
