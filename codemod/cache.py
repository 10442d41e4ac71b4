"""The ``rewrite`` cache: one entry per file result, keyed by what the result depends on.

A file's :class:`codemod.result.FileResult` is a function of its bytes, the path the run
names it by (messages and the report carry it), the options, the cross-module flow facts
it can use (the factories and step functions of other modules whose function name its text
holds: :func:`flow_key`) and the tool itself (its version and the size and modification
time of each of its source files, so that an edited checkout never reads results of the
code it had). The key is the SHA-256 of all of these; nothing else is consulted, so a hit
is the result the rewrite would compute.

Where: ``.optim-migrate-cache/`` in the project root (the directory of the
``pyproject.toml`` with ``[tool.optim-migrate]``, else the nearest one above the first path
holding ``.git`` or ``pyproject.toml``), else the platform cache directory
(``$XDG_CACHE_HOME/optim-migrate``, ``~/.cache/optim-migrate``); ``$OPTIM_MIGRATE_CACHE_DIR``
overrides both. The directory holds a ``.gitignore`` of ``*`` and a ``CACHEDIR.TAG``.

Safe under parallel runs: an entry is written to a temporary file in its directory and
renamed over its name (``os.replace``), so a reader sees a whole entry or none. An entry
that cannot be read, is not a pickle of the expected classes (a restricted unpickler: only
the result and finding classes and builtin containers), or was written for another key is a
miss, never an error; so is a cache directory that cannot be created or written.

Beside the entries, one file of prefilter verdicts (``prefilter-<salt>.json``: for the
SHA-256 of a file's bytes, whether the text prefilters pass it, :meth:`Cache.verdict`): a
warm run reads it instead of scanning every file of the tree for the prefilters' words (a
third of such a run on the ecosystem tree). Written the same way, when a run added verdicts.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import pickle
import tempfile
from typing import Optional

#: Bump when the entry layout changes.
FORMAT = 2  # 2: FileResult.fields
DIRNAME = '.optim-migrate-cache'
ENV = 'OPTIM_MIGRATE_CACHE_DIR'
#: The packages whose code makes a result (their files' sizes and mtimes are in every key).
_TOOL_PACKAGES = ('codemod', 'optim_compat')


def tool_fingerprint() -> str:
  """The installed version and the ``(path, size, mtime)`` of every source file of the
  codemod and the shim table it reads (hex SHA-256)."""
  from importlib import metadata
  h = hashlib.sha256(f'format {FORMAT}\n'.encode())
  try:
    h.update(metadata.version('flax-optim-migrate').encode())
  except metadata.PackageNotFoundError:
    h.update(b'no version')
  root = pathlib.Path(__file__).resolve().parents[1]
  for package in _TOOL_PACKAGES:
    for path in sorted((root / package).rglob('*.py')):
      try:
        st = path.stat()
      except OSError:
        continue
      h.update(f'{path.relative_to(root)} {st.st_size} {st.st_mtime_ns}\n'.encode())
  return h.hexdigest()


def project_root(start: pathlib.Path) -> Optional[pathlib.Path]:
  """The nearest directory at or above ``start`` holding ``.git`` or ``pyproject.toml``."""
  start = start.resolve()
  for d in [start, *start.parents] if start.is_dir() else [start.parent, *start.parent.parents]:
    if (d / '.git').exists() or (d / 'pyproject.toml').is_file():
      return d
  return None


def default_directory(start: pathlib.Path, config: Optional[pathlib.Path] = None) -> pathlib.Path:
  """Where the cache lives for a run over ``start`` (module docstring)."""
  if os.environ.get(ENV):
    return pathlib.Path(os.environ[ENV])
  root = config.parent if config is not None else project_root(start)
  if root is not None:
    return root / DIRNAME
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return pathlib.Path(base) / 'optim-migrate'


def flow_key(flow, text: str) -> str:
  """The part of a file's :class:`codemod.flow.Flow` its rewrite can use: its own module
  name, whether the flow knows any function at all, each factory and step function whose
  function name ``text`` holds (a call or import of it must spell it), and each class with
  optimizer fields one of whose fields ``text`` reads (``.optimizer``: a reader that names
  no class is flagged with the class its field is named like)."""
  if flow is None:
    return 'no flow'
  known = [*flow.factories.values(), *flow.steps.values()]
  used = sorted(repr(f) for f in known if f.function in text or any(
      f'.{field}' in text for field in getattr(f, 'fields', ())) or (
          # a module's layout, which a module naming it adopts (its classes' subclasses too)
          f.function == '__layout__' and f.qualified.rsplit('.', 2)[-2] in text))
  # its classes that a subclass elsewhere sets a learning rate for (Flow.inject_classes)
  inject = sorted(c for c in flow.inject_classes if c.rsplit('.', 1)[0] == flow.module)
  return repr((flow.module, flow.is_package, bool(known), used, inject))


#: The entries of the cross-module pre-pass's per-file scans (``codemod.flow._scan``).
SCAN_CLASSES = ('Factory', 'Fields', 'ContainerFactory', 'DefFactory', 'DefSink', 'UserDef',
                'Handoff', 'DefUse', 'Layout', 'Step')


class _Unpickler(pickle.Unpickler):
  """Only the classes an entry holds: a result, its findings, a scan's table entries, builtin
  values."""
  ALLOWED = {('codemod.result', 'FileResult'), ('codemod.findings', 'Finding'),
             *(('codemod.flow', name) for name in SCAN_CLASSES)}

  def find_class(self, module, name):
    if (module, name) in self.ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'{module}.{name} is not a cache entry class')


class Cache:
  """The cache of one run: ``directory`` and the salt of its options and tool."""

  def __init__(self, directory: pathlib.Path, options, fingerprint: Optional[str] = None):
    self.directory = pathlib.Path(directory)
    self.salt = f'{fingerprint or tool_fingerprint()}\n{options!r}\n'
    self.hits = self.misses = 0
    self._ready: Optional[bool] = None
    self._verdicts: Optional[dict] = None
    self._new_verdicts = 0

  def key(self, data: bytes, path: str, flow=None, text: Optional[str] = None) -> str:
    """The entry key of a file (``data``: its bytes, ``path``: as the run names it)."""
    text = data.decode('latin-1') if text is None else text
    h = hashlib.sha256(self.salt.encode())
    h.update(f'{path}\n{flow_key(flow, text)}\n'.encode('utf-8', 'surrogateescape'))
    h.update(hashlib.sha256(data).digest())
    return h.hexdigest()

  def _path(self, key: str) -> pathlib.Path:
    return self.directory / f'v{FORMAT}' / key[:2] / key

  def get(self, key: str, original: str):
    """The cached :class:`codemod.result.FileResult` of ``key`` (``original``: the file's
    text, which entries do not store), or None (a miss: absent, unreadable, corrupt)."""
    try:
      blob = self._path(key).read_bytes()
      stored_key, result = _Unpickler(io.BytesIO(blob)).load()
      if stored_key != key or type(result).__name__ != 'FileResult':
        raise ValueError('entry of another key')
      result.original = original
      if result.new is None:
        result.new = original
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss
      self.misses += 1
      return None
    self.hits += 1
    return result

  def put(self, key: str, result) -> None:
    """Store ``result`` (a successful one: results with an error are not stored); a cache
    that cannot be written is skipped silently."""
    if result.error is not None or result.new is None or not self._prepare():
      return
    stored = dataclasses.replace(result, original='',
                                 new=None if result.new == result.original else result.new)
    _replace(self._path(key), pickle.dumps((key, stored), protocol=pickle.HIGHEST_PROTOCOL))

  # -- the pre-pass's scans ------------------------------------------------------------------
  def scan_key(self, data: bytes, names, shown: str, outside: bool, flow, text: str) -> str:
    """The key of one file's scan by the cross-module pre-pass (``codemod.flow._scan``): its
    bytes, module names, the path messages name it by, whether the run rewrites it, and the
    part of the flow its planning can use (:func:`flow_key`, as for its result)."""
    h = hashlib.sha256(f'scan\n{self.salt}'.encode())
    h.update(f'{names!r}\n{shown}\n{outside}\n{flow_key(flow, text)}\n'.encode(
        'utf-8', 'surrogateescape'))
    h.update(hashlib.sha256(data).digest())
    return h.hexdigest()

  def get_scan(self, key: str):
    """A stored scan (``(factories, steps, uses)``), or None (a miss)."""
    try:
      stored_key, value = _Unpickler(io.BytesIO(self._scan_path(key).read_bytes())).load()
      if stored_key != key or not (isinstance(value, tuple) and len(value) == 3):
        raise ValueError('entry of another key')
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss
      return None
    return value

  def put_scan(self, key: str, value) -> None:
    """Store a scan (a cache that cannot be written is skipped silently)."""
    if self._prepare():
      _replace(self._scan_path(key), pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL))

  def _scan_path(self, key: str) -> pathlib.Path:
    return self.directory / f'v{FORMAT}' / 'scan' / key[:2] / key

  # -- prefilter verdicts ------------------------------------------------------------------
  #: At most this many verdicts are kept (the oldest dropped first): edits add new ones.
  MAX_VERDICTS = 200_000

  def _verdicts_path(self) -> pathlib.Path:
    salt = hashlib.sha256(self.salt.encode()).hexdigest()[:16]
    return self.directory / f'v{FORMAT}' / f'prefilter-{salt}.json'

  def verdict(self, data: bytes, compute) -> bool:
    """Whether the prefilters pass a file of bytes ``data``: the stored verdict, else
    ``compute()`` (stored by :meth:`save_verdicts`)."""
    if self._verdicts is None:
      try:
        loaded = json.loads(self._verdicts_path().read_text())
        self._verdicts = loaded if isinstance(loaded, dict) else {}
      except (OSError, ValueError):
        self._verdicts = {}
    digest = hashlib.sha256(data).hexdigest()
    found = self._verdicts.get(digest)
    if isinstance(found, bool):
      return found
    found = self._verdicts[digest] = bool(compute())
    self._new_verdicts += 1
    return found

  def save_verdicts(self) -> None:
    """Write the verdicts when this run added some (atomically; skipped silently when the
    cache cannot be written)."""
    if not self._new_verdicts or not self._prepare():
      return
    kept = dict(list(self._verdicts.items())[-self.MAX_VERDICTS:])
    if _replace(self._verdicts_path(), json.dumps(kept, separators=(',', ':')).encode()):
      self._new_verdicts = 0

  def _prepare(self) -> bool:
    """Create the directory with its ``.gitignore`` and ``CACHEDIR.TAG`` (once a run)."""
    if self._ready is None:
      try:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, text in (('.gitignore', '# written by optim-migrate\n*\n'),
                           ('CACHEDIR.TAG', 'Signature: 8a477f597d28d172789f06886806bc55\n'
                            '# optim-migrate rewrite cache (--no-cache to bypass)\n')):
          if not (self.directory / name).exists():
            (self.directory / name).write_text(text)
        self._ready = True
      except OSError:
        self._ready = False
    return self._ready


def _replace(path: pathlib.Path, data: bytes) -> bool:
  """Write ``data`` to a temporary file beside ``path`` and rename it over ``path`` (a
  reader sees the whole old file or the whole new one); False when that cannot be done."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix='.', suffix='.tmp')
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(data)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.unlink(tmp)
      raise
  except OSError:
    return False
  return True
