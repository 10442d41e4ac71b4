"""Helpers shared by the ``bench_*.py`` modules (not a benchmark itself).

All times are wall-clock seconds from ``time.perf_counter``. Contenders are
interleaved (alternating rounds in one process) so that they share the
machine's noise; ratios are taken per round, then summarised.
"""
from __future__ import annotations

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


def interleave(contenders: dict[str, Callable[[], None]], rounds: int,
               order_flip: bool = True) -> dict[str, list[float]]:
  """Time each contender once per round, alternating; ``{name: [seconds per round]}``.

  Every callable must block until its work is done (``block_until_ready``).
  With ``order_flip`` the order is reversed every other round, so neither
  contender always runs first.
  """
  names = list(contenders)
  out = {n: [] for n in names}
  for r in range(rounds):
    order = names[::-1] if (order_flip and r % 2) else names
    for n in order:
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
