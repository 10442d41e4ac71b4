"""The forked worker pool ``rewrite`` runs files in, and its signal handling.

:class:`_Pool` starts worker processes that rewrite one file at a time (:func:`_work`,
with the cyclic collector paused: :func:`gc_paused`); a Ctrl-C is the parent's to
handle (workers ignore SIGINT and end with their parent), a worker that dies fails
its file alone.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import pickle
import signal
import sys
import threading
import time
from typing import Optional

from codemod import engine
from codemod.sources import SourceFile


@contextlib.contextmanager
def gc_paused():
  """Python's cyclic garbage collector paused within (resumed after, also on error; left
  off if it was off).

  A file's syntax tree and its metadata are millions of objects that live until the file
  is done, and the collector re-traversed them all again and again: a third of the CPU time
  on a 0.25 MB module, a growing share on larger ones. The rewrite leaves little cyclic
  garbage (the same peak memory without the collector); it is collected after the file.
  """
  was = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was:
      gc.enable()


def _work(args) -> engine.FileResult:
  """One file's rewrite with the cyclic collector paused (``args``: path, options, flow,
  the file's bytes or None)."""
  path, options, flow, data = args
  with gc_paused():
    return engine.rewrite_file(pathlib.Path(path), options, flow, SourceFile(path, data))


#: ``prctl`` option: the signal a process gets when the thread that created it ends.
_PR_SET_PDEATHSIG = 1


def _worker_init(parent: int) -> None:
  """In each pool worker, before any file: Ctrl-C is the parent's to handle (the worker
  ignores SIGINT, which a terminal sends to the whole process group; the parent stops the
  pool), and the worker ends when the parent does, even by ``kill -9`` (which runs no
  clean-up in the parent): on Linux the kernel sends it SIGKILL (``PR_SET_PDEATHSIG``),
  elsewhere a thread polls the parent's pid. Workers write no file (the parent writes the
  results), so killing one loses nothing."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if hasattr(signal, 'pthread_sigmask'):  # the parent blocks it while it forks: _Pool._spawn
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  if sys.platform.startswith('linux'):
    try:
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
      armed = False
    if armed:
      if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
      return
  threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                   name='optim-migrate-watch-parent').start()


def _watch_parent(parent: int, every_s: float = 0.5) -> None:
  """End this process once ``parent`` is no longer its parent (it died: the worker was
  re-parented)."""
  while os.getppid() == parent:
    time.sleep(every_s)
  os._exit(1)


def _pool_context():
  """The multiprocessing context of the pool: ``fork`` on Linux (no start-up import, no
  helper process such as a fork server that could outlive the run), else the platform's
  default."""
  if sys.platform.startswith('linux'):
    return multiprocessing.get_context('fork')
  return multiprocessing.get_context()


@contextlib.contextmanager
def _sigint_blocked():
  """SIGINT held pending (POSIX) while the pool forks a worker: the worker inherits the
  mask and unblocks it only once it ignores SIGINT, so a Ctrl-C at that moment gets no
  worker traceback; the parent gets the pending signal (a KeyboardInterrupt) on exit."""
  if not hasattr(signal, 'pthread_sigmask'):
    yield
    return
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pool_worker(conn, parent: int) -> None:
  """A pool worker: rewrites each task ``conn`` brings (``_work``'s arguments) and sends
  back ``(FileResult, None)``, or ``(None, message)`` when that raised; ``None`` or a closed
  pipe ends it."""
  _worker_init(parent)
  while True:
    try:
      task = conn.recv()
    except (EOFError, OSError):
      return
    if task is None:
      return
    try:
      out = (_work(task), None)
    except Exception as e:  # noqa: BLE001 - reported as this file's error
      out = (None, f'{type(e).__name__}: {e}')
    try:
      conn.send(out)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
      conn.send((None, f'cannot return the result: {type(e).__name__}: {e}'))


class _Pool:
  """``n`` worker processes that take one file at a time; their results are read by the
  calling thread (no helper thread: a Ctrl-C ends the workers and returns at once, and a
  worker killed while sending leaves nothing waiting on its half-sent result, as
  ``concurrent.futures``' manager thread could at exit). A worker that dies fails its
  file alone; a new one takes its place."""

  def __init__(self, n: int):
    self.context = _pool_context()
    self.parent = os.getpid()
    self.idle: list = []
    self.busy: dict = {}  # connection -> (process, task key)
    self.pending: collections.deque = collections.deque()
    try:
      for _ in range(n):
        self._spawn()
    except BaseException:  # Ctrl-C while they start: none is left behind
      self.close(now=True)
      raise

  def _spawn(self) -> None:
    """Start a worker and add it to the idle ones (a Ctrl-C meanwhile is raised after)."""
    here, there = self.context.Pipe()
    process = self.context.Process(target=_pool_worker, args=(there, self.parent),
                                   daemon=True, name='optim-migrate-worker')
    with _sigint_blocked():
      try:
        process.start()
      finally:
        there.close()  # the worker's end lives in the worker only: its death is an EOF here
      self.idle.append((process, here))

  @property
  def active(self) -> bool:
    """Tasks are queued or running."""
    return bool(self.pending or self.busy)

  def submit(self, key, task) -> None:
    """Queue ``task`` (``_work``'s arguments); its result comes back with ``key``."""
    self.pending.append((key, task))
    self._dispatch()

  def _dispatch(self) -> None:
    while self.pending and self.idle:
      process, conn = self.idle.pop()
      key, task = self.pending.popleft()
      try:
        conn.send(task)
      except OSError:  # it died idle: the task goes to a new worker
        self.pending.appendleft((key, task))
        self._drop(process, conn)
        self._spawn()
        continue
      self.busy[conn] = (process, key)

  def collect(self, timeout: Optional[float] = None) -> list:
    """``(key, FileResult or None, error message or None)`` of the tasks that finished
    within ``timeout`` seconds (None: wait for at least one; 0: only those done), the
    queue handed on to the workers freed."""
    if not self.busy:
      return []
    sentinels = {process.sentinel: conn for conn, (process, _) in self.busy.items()}
    ready = multiprocessing.connection.wait([*self.busy, *sentinels], timeout)
    out = []
    for conn in {sentinels.get(r, r) for r in ready}:
      process, key = self.busy.pop(conn)
      try:
        result, error = conn.recv()
      except (EOFError, OSError):  # died before its result was whole
        process.join(5)
        self._drop(process, conn)
        if self.pending:
          self._spawn()
        out.append((key, None, 'the worker process rewriting it died (exit status '
                               f'{process.exitcode})'))
        continue
      self.idle.append((process, conn))
      out.append((key, result, error))
    self._dispatch()
    return out

  @staticmethod
  def _drop(process, conn) -> None:
    conn.close()
    if process.is_alive():
      process.kill()
    process.join()

  def close(self, now: bool) -> None:
    """End the workers: ``now`` kills them (what they were doing is dropped), else each
    idle one is told to stop and any left after 5 s is killed."""
    workers = [*self.idle, *((p, c) for c, (p, _) in self.busy.items())]
    self.idle, self.busy = [], {}
    self.pending.clear()
    for process, conn in workers:
      if now:
        process.kill()
      else:
        with contextlib.suppress(OSError):
          conn.send(None)
    deadline = time.monotonic() + (0 if now else 5)
    for process, conn in workers:
      process.join(max(0.0, deadline - time.monotonic()))
      if process.is_alive():
        process.kill()
        process.join()
      conn.close()
