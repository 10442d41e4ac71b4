"""The files a ``rewrite`` run takes: the walk of the directories it is given."""
from __future__ import annotations

import fnmatch
import os
import pathlib
from typing import Optional, Iterable

#: Directory names never descended into (plus hidden ones and virtualenvs).
SKIP_DIRS = {'__pycache__', 'build', 'dist', 'site-packages', 'node_modules', 'venv', 'env'}


#: The file names a run takes (in a directory, and when named on the command line).
SOURCE_SUFFIXES = ('.py', '.ipynb')


def _is_venv(d: pathlib.Path) -> bool:
  return (d / 'pyvenv.cfg').exists()


def named_file_problem(path: pathlib.Path) -> str | None:
  """Why a file named on the command line is not taken, or None: one that is neither
  ``.py`` nor ``.ipynb`` is taken only when it has no suffix and starts with a Python
  shebang (``#!/usr/bin/env python3``), so that ``notes.txt`` or ``README.md`` is never
  rewritten as Python source."""
  if path.suffix in SOURCE_SUFFIXES:
    return None
  if not path.suffix:
    try:
      with open(path, 'rb') as f:
        first = f.readline(200)
    except OSError:
      return None  # unreadable: the rewrite reports it
    if first.startswith(b'#!') and b'python' in first:
      return None
  return f'not a Python file (the run takes {" and ".join(SOURCE_SUFFIXES)} files, and ' \
         'scripts with a python shebang); left alone'


def iter_python_files(paths: Iterable[str], exclude: Iterable[str] = (),
                      skipped: Optional[list] = None) -> list[pathlib.Path]:
  """``.py`` files under ``paths``, sorted per path.

  A file named on the command line is taken as given when it is Python
  (:func:`named_file_problem`). In directories: hidden
  directories, ``.git``, virtualenvs (a ``pyvenv.cfg``), ``build``/``dist``/
  ``__pycache__``/``site-packages`` and ``exclude`` globs (matched against the
  path relative to the directory, and against each name) are skipped; symlinks
  are not followed out of the directory, and dangling ones are skipped (a path
  that does not exist, a dangling link named on the command line included, is
  left out: ``cmd_rewrite`` reports it). A file reached twice (named twice,
  under two given directories, or through a hard link) is listed once, where
  it is first reached. ``skipped`` (a list, if given) gets ``(path, why)`` for each ``.py``
  / ``.ipynb`` name in a directory that is not taken for what it is (a FIFO, socket or
  device; a dangling link; a link out of the directory), not for the skipped folders.
  """
  exclude = list(exclude)

  def excluded(rel: pathlib.PurePath) -> bool:
    text = rel.as_posix()
    return any(fnmatch.fnmatch(text, g) or any(fnmatch.fnmatch(p, g) for p in rel.parts)
               for g in exclude)

  out = []
  for p in map(pathlib.Path, paths):
    if not p.exists() or str(p) == '-':
      continue
    if not p.is_dir():
      if p.is_file() and named_file_problem(p) is None:
        out.append(p)
      continue
    root = p.resolve()
    found = []
    for dirpath, dirnames, filenames in os.walk(p, followlinks=False):
      d = pathlib.Path(dirpath)
      dirnames[:] = sorted(n for n in dirnames
                           if not n.startswith('.') and n not in SKIP_DIRS
                           and not _is_venv(d / n) and not excluded((d / n).relative_to(p)))
      for name in filenames:
        f = d / name
        if not name.endswith(SOURCE_SUFFIXES) or name.startswith('.') \
            or excluded(f.relative_to(p)):
          continue
        why = None
        if f.exists() and not f.is_file():
          why = 'not a regular file (a FIFO, socket or device: reading it could block)'
        elif f.is_symlink() and not f.exists():
          why = 'a dangling symbolic link'  # (named on the command line: an error)
        elif f.is_symlink():
          try:
            f.resolve().relative_to(root)
          except ValueError:
            why = 'a symbolic link out of the directory'
        if why is not None:
          if skipped is not None:
            skipped.append((f, why))
          continue
        found.append(f)
    out.extend(sorted(found))
  seen, unique = set(), []
  for f in out:  # a file named twice, inside two given folders or hard-linked: rewritten once
    try:
      st = os.stat(f)
      key = (st.st_dev, st.st_ino)
    except OSError:
      key = os.path.realpath(f)
    if key not in seen:
      seen.add(key)
      unique.append(f)
  return unique
