"""``optim-migrate convert-checkpoint``: a legacy flax.optim checkpoint -> a TrainState checkpoint.

    optim-migrate convert-checkpoint SRC DST --optimizer "Adam(learning_rate=1e-3, weight_decay=1e-4)"
        [--format flax|orbax] [--step N] [--learning-rate-injected] [--force]

SRC is a msgpack checkpoint file or a directory of ``checkpoint_<step>`` files
(``--step`` picks one; default the latest). Every legacy optimizer in it (at the
root or inside a container) becomes the state dict of a ``TrainState`` built
with the tx the codemod emits for ``--optimizer``; the rest of a container is
copied unchanged. DST restores with
``flax.training.checkpoints.restore_checkpoint(DST, target=state)``.

``--optimizer`` names one table entry (the codemod's tx for it is rebuilt from the
table), or ``WeightNorm(<one>(...), wn_decay=...)``; MultiOptimizer checkpoints need their
traversals and restore through ``optim_compat.checkpoint.restore_legacy(path, state)``
instead.

Exit status: 0 written; 2 nothing written (unreadable SRC, structure mismatch,
existing DST without ``--force``, or with it a DST that is no checkpoint (``--force``
replaces a flax msgpack file or an orbax directory only), DST's directory missing (it
is not created), bad ``--optimizer``: not a call of a table entry, e.g. a bare ``Adam``, an argument given
twice or unpacked (``*a``, ``**kw``), a hyper-parameter that is not a literal number,
True/False or None, or an infinite learning rate (``1e999``)). The one exception: a
learning rate from your code (``Adam(config.lr)``) is accepted without
``--learning-rate-injected``, as the state does not hold it; with it, the state
does (``opt_state.hyperparams.learning_rate``), so it must be a literal number
(a negative one is taken, as legacy flax.optim takes it). SRC is only read.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

EXIT_OK, EXIT_ERROR = 0, 2


def cmd_convert_checkpoint(args) -> int:
  from optim_compat import checkpoint as ck
  src, dst = pathlib.Path(args.src), pathlib.Path(args.dst)
  if not dst.parent.is_dir():  # as record -o and rewrite --report: DST's folder is not made
    what = 'is not a directory' if dst.parent.exists() else 'does not exist'
    print(f'convert-checkpoint: {dst}: cannot write there: its directory {dst.parent} {what}',
          file=sys.stderr)
    return EXIT_ERROR
  if src.exists():
    s, d = src.resolve(), dst.resolve()
    if d == s or d in s.parents or (src.is_dir() and s in d.parents):
      print(f'convert-checkpoint: DST {dst} is SRC, contains it or lies inside it; the source is '
            'never modified', file=sys.stderr)
      return EXIT_ERROR
  try:  # before anything is read or printed: an existing DST, or one --force may not replace
    ck.check_target(dst, args.force)
  except FileExistsError as e:
    print(f'convert-checkpoint: {e}', file=sys.stderr)
    return EXIT_ERROR
  try:
    if args.optimizer is not None:
      # a bad --optimizer before reading SRC
      ck.parse_optimizer(args.optimizer, args.learning_rate_injected)
    sd = ck.read_state_dict(src, args.step)
    try:
      new_sd, notes = ck.convert_state_dict(sd, args.optimizer, args.learning_rate_injected)
    except ck.CheckpointError as e:  # (helper-39: layout messages did not name SRC)
      if str(e).startswith('--'):  # about an argument, not the file
        raise
      raise ck.CheckpointError(f'{src}: {e}') from None
    del sd
    for line in notes:
      print(line, file=sys.stderr)
    written = ck.write_checkpoint(new_sd, dst, args.format, args.force)
  except (ck.CheckpointError, OSError) as e:  # FileExistsError, an uncreatable DST folder, ...
    print(f'convert-checkpoint: {e}', file=sys.stderr)
    return EXIT_ERROR
  print(f'wrote {written} ({args.format})', file=sys.stderr)
  if not args.learning_rate_injected:
    # found by a new user: the codemod emits `optax.inject_hyperparams(...)` where a learning
    # rate is passed at apply time; this layout does not restore into that state
    print('convert-checkpoint: the layout written is for a plain Optax chain; if the migrated '
          'code wraps it in optax.inject_hyperparams (a learning rate passed at apply time), '
          'convert again with --learning-rate-injected', file=sys.stderr)
  return EXIT_OK


class _Once(argparse.Action):
  """Store an option's value, refusing it given twice (helper-39: `--step 3 --step 5` read
  step 5 silently)."""

  def __call__(self, parser, namespace, values, option_string=None):
    if getattr(namespace, '_given_' + self.dest, False):
      parser.error(f'{option_string} given twice')
    setattr(namespace, '_given_' + self.dest, True)
    setattr(namespace, self.dest, values)


def register(subparsers) -> None:
  """Add ``convert-checkpoint`` to ``optim-migrate``'s subcommands."""
  p = subparsers.add_parser('convert-checkpoint',
                            help='convert a legacy flax.optim checkpoint to a TrainState one',
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('src', help='legacy checkpoint file, or directory of checkpoint_<step> files')
  p.add_argument('dst', help='output file (flax) or directory (orbax); never SRC')
  p.add_argument('--optimizer', default=None, action=_Once,
                 help='the legacy def, e.g. "Adam(learning_rate=1e-3, weight_decay=1e-4)" '
                      '(default: inferred from the state fields when only one def has them)')
  p.add_argument('--format', choices=('flax', 'orbax'), default='flax', action=_Once)
  p.add_argument('--step', type=int, default=None, action=_Once,
                 help='with a directory SRC: which step (with a file SRC: must match its name)')
  p.add_argument('--learning-rate-injected', action='store_true',
                 help='the migrated code sets learning_rate per step (optax.inject_hyperparams)')
  p.add_argument('--force', action='store_true', help='replace an existing DST')
  p.set_defaults(func=cmd_convert_checkpoint)
