"""Rule family *restores*: checkpoint readers given a legacy optimizer (OM013).

``checkpoints.restore_checkpoint(dir, <optimizer or container>[, step])`` and
``serialization.from_state_dict`` / ``from_bytes`` ->
``optim_compat.checkpoint.restore_legacy(...)``, which converts legacy
checkpoints and reads TrainState-layout ones (or none yet) as before. The
readers and their target argument come from ``codemod.legacy_api.RESTORES``.
"""
from __future__ import annotations

import importlib.util
import re

import libcst as cst

from codemod import legacy_api as api
from codemod.facts.values import dict_display
from codemod.names import code, kwargs, template

_KNOWN_KEYWORDS = {'step', 'ckpt_dir', 'state', 'encoded_bytes'}
#: a parameter named like an optimizer or a train state (`optimizer`, `opt`, `train_state`)
_OPTIMIZER_LOOKING = re.compile(r'opt|state', re.I)


def _reader(q, call):
  """``(qualified name, position, keyword)`` of the restore ``call`` makes (a raw reader:
  ``(qualified name, None, None)``)."""
  qnames = q.n.qnames(call.func)
  if found := sorted(qnames & set(api.RESTORES)):
    return (found[0], *api.RESTORES[found[0]])
  return (sorted(qnames & api.RAW_RESTORES)[0], None, None)


def _target(call, index, keyword):
  kw = kwargs(call)
  positional = [a for a in call.args if a.keyword is None]
  return kw[keyword].value if keyword in kw else (
      positional[index].value if len(positional) > index else None)


def leave_restore(p, original) -> bool:
  """A checkpoint reader restoring an optimizer: converted or flagged. Ends the call's chain."""
  q = p.q
  if not any(original is c for c in q.f.restores):
    return False
  qname, index, keyword = _reader(q, original)
  o_target = _target(original, index, keyword) if index is not None else None
  if o_target is None:
    return True
  short = qname.rsplit('.', 1)[1]
  if not q.mentions_optimizer(o_target) and not q.mentions(o_target, q.is_container) \
      and not _names_a_dict_of_optimizers(q, o_target):
    if q.converts and q.f.handles_optimizers and q.mentions(o_target, lambda e: q.maybe_optimizer(e) and isinstance(
        e, cst.Name) and _OPTIMIZER_LOOKING.search(e.value) is not None):
      p.flag(original, 'OM013', f'{short} restores into `{code(o_target)}`, which nothing here '
                                'proves to hold an optimizer (a parameter, a container item): '
                                'if it holds one (a TrainState after this run), a checkpoint the '
                                'legacy code wrote needs optim_compat.checkpoint.restore_legacy'
                                '(path_or_state_dict, target[, step=]), which reads legacy and '
                                'TrainState checkpoints')
    return True
  landed = importlib.util.find_spec('optim_compat.checkpoint') is not None
  short = qname.rsplit('.', 1)[1]
  kw = kwargs(original)
  extra = set(kw) - {keyword, *_KNOWN_KEYWORDS}
  if not landed or not q.opts.fixable('OM013') or extra or len(original.args) > 3 \
      or (short != 'restore_checkpoint' and 'step' in kw):
    p.flag(original, 'OM013', f'{short} restores a flax.optim Optimizer with arguments the '
                              'codemod does not convert: use optim_compat.checkpoint.'
                              'restore_legacy(path_or_state_dict, target[, step=]), which reads '
                              'legacy and TrainState checkpoints')
    return True
  p.fix(original, apply_restore, [('OM013', f'{short}(..., optimizer) -> optim_compat.checkpoint.'
                                            'restore_legacy: legacy checkpoints are converted, '
                                            'TrainState ones and fresh runs behave as before')],
        data={'reader': (qname, index, keyword)})
  return True


def legacy_key_reads(q, call) -> list:
  """The reads of ``call``'s result (directly, or through the one name it is assigned to)
  with flax.optim's checkpoint keys."""
  if not q.f.legacy_key_reads:
    return []
  owners = [id(call)] + [q.n.binding(targets[0]) for targets, value in q.f.assignments
                         if value is call and len(targets) == 1
                         and isinstance(targets[0], cst.Name)]
  return [read for o in owners for read in q.f.legacy_key_reads.get(o, ())]


def _is_raw(q, call) -> bool:
  qname, index, keyword = _reader(q, call)
  target = _target(call, index, keyword) if index is not None else None
  return qname in api.RAW_RESTORES and (
      target is None or (isinstance(target, cst.Name) and target.value == 'None'))


def blocks(q) -> bool:
  """A raw restore read with flax.optim's keys keeps the file on the shim (OM121)."""
  return not q.unproven and any(_is_raw(q, c) and legacy_key_reads(q, c) for c in q.f.restores)


def leave_raw_restore(p, original) -> bool:
  """A checkpoint restored with no target, then read with a flax.optim Optimizer's keys
  (``raw['target']``, ``raw['state']['step']``), in a file whose optimizers this run converts:
  the checkpoints it writes from now on are TrainStates' (``step``, ``params``,
  ``opt_state``), so that read fails with KeyError on the program's next run (OM121, the file
  stays on the shim). In a file with nothing to convert (an evaluation script of a trainer the
  run may convert) the read is flagged."""
  q = p.q
  if not any(original is c for c in q.f.restores) or not _is_raw(q, original):
    return False
  reads = legacy_key_reads(q, original)
  if not reads:
    return True
  keys = ', '.join(sorted({key for _, key in reads}))
  missing = ('a KeyError here, or `.get`\'s default: a silent wrong load'
             if any(isinstance(read, cst.Call) for read, _ in reads) else 'a KeyError here')
  head = (f'{_reader(q, original)[0].rsplit(".", 1)[1]} with no target returns the '
          f'checkpoint\'s raw dict, read with flax.optim\'s keys ({keys}): ')
  restore = ('restore into the TrainState with optim_compat.checkpoint.restore_legacy(ckpt_dir, '
             'state), which reads both')
  if q.unproven:
    # (an evaluation script of a trainer the run converts: helper-27's eval_raw.py)
    p.flag(original, 'OM121', head + 'a checkpoint written by a TrainState (what the code that '
                              'saves it becomes once migrated) holds `step`, `params`, '
                              f'`opt_state` instead ({missing}): read both layouts\' keys, '
                              'or ' + restore.replace('the TrainState', 'a TrainState'))
    return True
  p.flag(original, 'OM121', head + 'converted, this file\'s optimizers would write TrainState '
                            'checkpoints (`step`, `params`, `opt_state`: a KeyError here on the '
                            'next run), while the shim writes the legacy layout; to convert it, '
                            + restore, blocks=True)
  return True


def _names_a_dict_of_optimizers(q, target) -> bool:
  """``target`` is a name bound once, to a dict display holding an optimizer (``ckpt =
  {'opt': optimizer, 'epoch': 0}``, then ``restore_checkpoint(d, ckpt)``)."""
  display = dict_display(q.n, target) if isinstance(target, cst.Name) else None
  return display is not None and q.mentions_optimizer(display)


def leave_save(p, original) -> bool:
  """``checkpoints.save_checkpoint(d, ...)`` in a legacy file, converted or kept on the shim
  (whatever it saves): ``d`` -> ``os.path.abspath(d)`` (Flax >= 0.7 saves with orbax, which
  rejects a relative directory: 'Checkpoint path should be absolute'). Ends the call's chain."""
  q = p.q
  if not any(original is c for c in q.f.saves) or not q.opts.fixable('OM013'):
    return False
  qname = sorted(q.n.qnames(original.func) & set(api.SAVES))[0]
  index, keyword = api.SAVES[qname]
  directory = _target(original, index, keyword)
  if directory is None or _absolute_already(q, directory):
    return False  # (any target: orbax rejects a relative directory for every save)
  p.fix(original, apply_save, [('OM013', f'{qname.rsplit(".", 1)[1]}(dir, ...): dir -> '
                                         'os.path.abspath(dir) (orbax, Flax >= 0.7, rejects a '
                                         'relative checkpoint directory)')],
        data={'reader': (qname, index, keyword)})
  return True


def _absolute_already(q, expr) -> bool:
  return isinstance(expr, cst.Call) and bool(
      q.n.qnames(expr.func) & {'os.path.abspath', 'os.path.realpath'}) or (
      isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
      and expr.func.attr.value in ('abspath', 'realpath', 'resolve', 'absolute'))


def apply_save(ctx, original, updated, fix):
  _, index, keyword = fix.data['reader']
  ctx.add_import('os')
  kw = kwargs(updated)
  if keyword in kw:
    args = [a.with_changes(value=template('os.path.abspath(D)', D=a.value))
            if a.keyword is not None and a.keyword.value == keyword else a for a in updated.args]
  else:
    args = list(updated.args)
    args[index] = args[index].with_changes(value=template('os.path.abspath(D)', D=args[index].value))
  return updated.with_changes(args=args)


def apply_restore(ctx, original, updated, fix):
  qname, index, keyword = fix.data['reader']
  short = qname.rsplit('.', 1)[1]
  kw = kwargs(updated)
  positional = [a for a in updated.args if a.keyword is None]
  target = _target(updated, index, keyword)
  if short == 'restore_checkpoint':
    source_arg = kw['ckpt_dir'].value if 'ckpt_dir' in kw else positional[0].value
    rest = ', step=' + code(kw['step'].value) if 'step' in kw else (
        ', step=' + code(positional[2].value) if len(positional) > 2 else '')
    src = f'optim_compat.checkpoint.restore_legacy(S, T{rest})'
    subs = {'S': source_arg, 'T': target}
  elif short == 'from_state_dict':
    source_arg = kw['state'].value if 'state' in kw else positional[-1].value
    src = 'optim_compat.checkpoint.restore_legacy(S, T)'
    subs = {'S': source_arg, 'T': target}
  else:
    source_arg = kw['encoded_bytes'].value if 'encoded_bytes' in kw else positional[-1].value
    src = 'optim_compat.checkpoint.restore_legacy(serialization.msgpack_restore(S), T)'
    subs = {'S': source_arg, 'T': target}
    ctx.add_import('flax', 'serialization')
  ctx.add_import('optim_compat.checkpoint')
  return template(src, **subs)
