"""Helpers shared by the ``bench_*.py`` modules (not a benchmark itself).

All times are wall-clock seconds from ``time.perf_counter``. Contenders are
interleaved (alternating rounds in one process) so that they share the
machine's noise; ratios are taken per round, then summarised.
"""
from __future__ import annotations

import itertools
import re
import statistics
import time
from typing import Callable, Sequence


def summary(values: Sequence[float]) -> tuple[float, float, float]:
  """``(median, min, max)`` of ``values``."""
  return statistics.median(values), min(values), max(values)


def fmt_range(values: Sequence[float], digits: int = 3) -> str:
  """``'min–max a–b over n'`` for details strings."""
  _, lo, hi = summary(values)
  return f'min–max {lo:.{digits}f}–{hi:.{digits}f} over {len(values)}'


def interleave(contenders: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
  """Time each contender once per round; ``{name: [seconds per round]}``.

  Every callable must block until its work is done (``block_until_ready``).
  The order within a round cycles through all permutations of the
  contenders, so none always runs first, last or after the same one.
  """
  names = list(contenders)
  orders = list(itertools.permutations(names))
  out = {n: [] for n in names}
  for r in range(rounds):
    for n in orders[r % len(orders)]:
      t0 = time.perf_counter()
      contenders[n]()
      out[n].append(time.perf_counter() - t0)
  return out


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
  """Per-round ``num[i] / den[i]``."""
  return [a / b for a, b in zip(num, den)]


_HLO_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S', re.M)


def hlo_op_count(compiled_text: str) -> int:
  """Number of HLO instructions (``name = ...`` lines) in ``Compiled.as_text()``,
  over all computations, fusion bodies included."""
  return len(_HLO_INSTR.findall(compiled_text))


def hlo_entry_op_count(compiled_text: str) -> int:
  """Instructions of the ``ENTRY`` computation only (each fusion counts once):
  roughly the number of kernels and copies the step runs."""
  m = re.search(r'^ENTRY [^\n]*\{\n(.*?)^\}', compiled_text, re.M | re.S)
  return len(_HLO_INSTR.findall(m.group(1))) if m else 0
