"""Source files: read once per run, decoded per PEP 263, parsed at most once, written atomically."""
from __future__ import annotations

import io
import re
import os
import pathlib
import stat
import tempfile
import tokenize
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
  import libcst as cst


class SourceFile:
  """One file of a run: its bytes (read once), its text and encoding, its LibCST parse and
  the analysis cache kept with it (``codemod.facts.analyze``), each made at first use.

  The cross-module pre-pass parses and plans a file through this object, and the main pass
  rewrites it from the same parse.
  """

  def __init__(self, path: pathlib.Path, data: Optional[bytes] = None):
    self.path = pathlib.Path(path)
    self._data = data
    self._decoded: Optional[tuple[str, str]] = None
    self._module: Optional[cst.Module] = None
    self._analysed: Optional[str] = None
    self._words: Optional[str] = None
    self.cache: dict = {}

  @property
  def data(self) -> bytes:
    """The file's bytes.

    Raises:
      OSError: it cannot be read.
    """
    if self._data is None:
      self._data = self.path.read_bytes()
    return self._data

  def words(self) -> str:
    """The text prefilters look for words in: the bytes as latin-1 (any bytes decode); for a
    ``.ipynb`` notebook, its code cells' sources joined (outputs and images can be most of
    its bytes), or the latin-1 bytes when it is not a well-formed notebook (the rewrite
    reports that)."""
    if self._words is None:
      self._words = self.data.decode('latin-1')
      if self.path.suffix == '.ipynb':
        self._words = _notebook_code(self._words)
    return self._words

  @property
  def text(self) -> str:
    """The source text, decoded per PEP 263 (coding cookie or BOM).

    Raises:
      OSError, UnicodeDecodeError, SyntaxError: unreadable, or a bad cookie.
    """
    if self._decoded is None:
      self._decoded = decode_source(self.data)
    return self._decoded[0]

  @property
  def encoding(self) -> str:
    self.text  # noqa: B018 - decodes
    return self._decoded[1]

  @property
  def analysed_text(self) -> str:
    """:attr:`text` as the codemod analyses it: its shim imports read as flax.optim
    (``codemod.shim_imports.analysed``; :attr:`text` itself when it has none)."""
    if self._analysed is None:
      from codemod import shim_imports
      self._analysed = shim_imports.analysed(self.text)
    return self._analysed

  @property
  def module(self) -> cst.Module:
    """The LibCST parse of :attr:`analysed_text` (:attr:`text` unless it imports the shim).

    Raises:
      libcst.ParserSyntaxError: it does not parse (and the errors of :attr:`text`).
    """
    if self._module is None:
      self._module = parse(self.analysed_text)
    return self._module


def parse(text: str) -> 'cst.Module':
  """LibCST's parse of ``text``, unless CPython refuses it for its depth.

  LibCST's native parser overflows its stack, and kills the process (SIGSEGV), on
  expressions nested a few thousand deep (``(((...)))``, a 20,000-term sum); CPython refuses
  such code first (``too many nested parentheses`` past 200 levels, a RecursionError while
  building its tree), so its AST parse runs before LibCST's and its refusal is the error.

  Raises:
    libcst.ParserSyntaxError: CPython refuses ``text`` for its depth (its message and
      position), or LibCST cannot parse it.
  """
  import ast
  import libcst as cst  # loaded at the first parse: a cache hit needs no LibCST
  refused = None
  try:
    compile(text, '<depth check>', 'exec', flags=ast.PyCF_ONLY_AST, dont_inherit=True)
  except SyntaxError as e:
    if 'too many' in (e.msg or '') and 'nested' in (e.msg or ''):
      refused = (e.msg, e.lineno or 1, (e.offset or 1) - 1)
  except (RecursionError, MemoryError) as e:
    refused = (f'nested too deeply: CPython cannot parse it either ({type(e).__name__})', 1, 0)
  except (ValueError, OverflowError):
    pass  # (a NUL byte: LibCST says where)
  if refused is not None:
    message, line, column = refused
    lines = text.splitlines(keepends=True) or ['']
    raise cst.ParserSyntaxError(message, lines=lines, raw_line=min(line, len(lines)),
                                raw_column=max(column, 0))
  return cst.parse_module(text)


def unreadable(source: SourceFile) -> Optional[str]:
  """Why python (or Jupyter) could not read the file, as the run's error line, or None:
  bytes that do not decode (PEP 263), a CPython syntax error (``ast``, no LibCST: named
  files the prefilters pass over get this check, not a parse), a notebook that is not
  notebook JSON."""
  import ast
  import json
  path = source.path
  try:
    data = source.data
    if path.suffix == '.ipynb':
      try:
        nb = json.loads(data.decode('utf-8'))
      except (UnicodeDecodeError, ValueError) as e:
        return f'{path}: not a notebook: {e}'
      return None if isinstance(nb, dict) and isinstance(nb.get('cells'), list) else \
          f'{path}: not a notebook: no "cells" list'
    text = source.text
  except OSError as e:
    return f'{path}: cannot read: {e.strerror or e}'
  except (UnicodeDecodeError, SyntaxError) as e:
    return f'{path}: cannot read: {e}'
  try:
    ast.parse(text, str(path))
  except SyntaxError as e:
    return f'{path}:{e.lineno}:{e.offset or 1}: cannot parse: {e.msg}'
  except (ValueError, RecursionError, MemoryError) as e:
    return f'{path}: cannot parse: {e}'
  return None


def notebook_cells(text: str) -> list[tuple[str, str]]:
  """``(cell_type, source)`` of every cell of notebook JSON ``text`` (a list of lines joined).

  Raises:
    ValueError, AttributeError, TypeError: not notebook JSON with a list of cells.
  """
  import json
  out = []
  for cell in json.loads(text).get('cells'):
    src = cell.get('source', '')
    out.append((cell.get('cell_type'), src if isinstance(src, str) else ''.join(src)))
  return out


def _notebook_code(text: str) -> str:
  """The code cells' sources of notebook JSON ``text`` joined, or ``text`` itself when it is
  not a notebook whose cells' sources are strings."""
  try:
    parts = [src for kind, src in notebook_cells(text) if kind == 'code']
  except (ValueError, AttributeError, TypeError):
    return text
  return '\n'.join(parts) + '\n'


def read_source(path: pathlib.Path) -> tuple[str, str]:
  """``(text, encoding)``: decoded per PEP 263 (coding cookie or BOM), newlines kept.

  Raises:
    OSError, UnicodeDecodeError, SyntaxError: unreadable file or bad cookie.
  """
  return decode_source(path.read_bytes())


def decode_source(data: bytes) -> tuple[str, str]:
  """``(text, encoding)`` of Python source bytes, per PEP 263 (cookie or BOM).

  Raises:
    UnicodeDecodeError, SyntaxError: bytes that do not decode, or a bad cookie; a NUL byte
      (binary data, or UTF-16/32 text, which CPython does not run) is a SyntaxError that
      says so.
  """
  nul = data.find(b'\0')
  if nul >= 0:
    raise SyntaxError(f'a NUL byte at offset {nul}: binary data or UTF-16/32 text, not Python '
                      'source (CPython runs UTF-8 or a PEP 263 encoding)')
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
  except SyntaxError as e:
    if 'invalid or missing encoding declaration' not in str(e):
      raise  # (an unknown encoding named by a cookie, a BOM against a cookie: as tokenize says)
    encoding = 'utf-8'  # a first or second line that is not UTF-8: named below, by position
  try:
    return data.decode(encoding), encoding
  except UnicodeDecodeError as e:  # named by line and column, as an editor shows them
    line = data.count(b'\n', 0, e.start) + 1
    column = e.start - (data.rfind(b'\n', 0, e.start) + 1) + 1
    declared = _CODING.search(b'\n'.join(data.splitlines()[:2])) is not None
    advice = (f'its coding line declares {encoding}, which its bytes are not: fix the '
              'declaration, or convert the file' if declared else
              'declare its encoding with a PEP 263 coding line, or convert it')
    raise SyntaxError(f'line {line}, column {column} (byte {e.start}): {data[e.start:e.end]!r} '
                      f'is not {encoding} ({e.reason}); CPython refuses the file too '
                      f'({advice})') from e


#: A PEP 263 coding declaration (on one of the first two lines).
_CODING = re.compile(rb'^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+', re.M)


def write_atomic(path: pathlib.Path, text: str, encoding: str = 'utf-8') -> None:
  """Replace ``path`` with ``text`` via a temporary file and ``os.replace``.

  A symlink is written through (its target is replaced; the link stays). A
  file with other hard links is rewritten in place instead (a rename would
  detach this name from the others); if that write fails, its old bytes are
  put back before the error is raised.

  ``encoding`` is the file's own (``utf-8-sig`` keeps a BOM); newlines are
  written as they are in ``text``.

  Raises:
    PermissionError: the file is read-only (its owner's write bit is clear, or
      this user may not write it): nothing is written, though a rename in a
      writable directory could replace it.
    OSError: the temporary file or the write failed (``path`` is unchanged).
  """
  path = path.resolve()
  st = path.stat()
  if not st.st_mode & stat.S_IWUSR or not os.access(path, os.W_OK):
    raise PermissionError(f'{path} is read-only; make it writable to rewrite it')
  data = text.encode(encoding)
  if st.st_nlink > 1:
    old = path.read_bytes()
    try:
      with open(path, 'r+b') as f:
        f.write(data)
        f.truncate()
    except BaseException:
      with open(path, 'wb') as f:
        f.write(old)
      raise
    return
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    os.chmod(tmp, st.st_mode)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


