"""Where each legacy per-parameter state field lives in the emitted Optax state.

Companion of the migration table (``optim_compat.spec.SPECS``), keyed by the
same def names: for the transformation a table entry's ``emit`` builds, which
Optax state field holds which legacy ``flax.optim`` 0.5.3 per-parameter field
(the checkpoint keys under ``state/param_states/<path>/``). Used by
``optim_compat.checkpoint`` in both directions (legacy checkpoint -> TrainState,
and back for rollback). Kept beside the table, not in it, so that checkpoint
knowledge is added without touching the entries; ``tests/test_checkpoints.py``
fails if a table entry has no row here.

Rules shared by every entry:

* every ``count`` field of every Optax state takes the legacy ``step`` (legacy
  flax.optim keeps one int32 pre-increment step for all leaves; optax counts
  the same updates, starting at 0);
* faithful transformations (``transforms.LegacyRuleState``) and whole-tree
  transformations (``optim_compat.to_optax`` of ``MultiOptimizer`` /
  ``WeightNorm``, state ``OptimizerState``) hold the legacy per-parameter
  states themselves, so their rows are empty;
* ``inject_hyperparams`` values are not in legacy checkpoints (legacy saves no
  hyper-parameters): they are kept from the target.

Facts: the legacy equations of ``shared/legacy-flax-optim.md`` §2 set against
the optax state definitions (optax 0.2.8): e.g. legacy Adam
``grad_ema = b1*grad_ema + (1-b1)*g`` is ``ScaleByAdamState.mu``; legacy LARS
keeps ``momentum = beta*momentum + lr*ratio*g`` while ``optax.lars`` traces the
already negated ``-lr*ratio*g`` (its ``scale_by_learning_rate`` runs before
``trace``), so the trace is the negated legacy buffer. Each row is proven by the
resume tests in ``tests/test_checkpoints.py`` (real flax.optim checkpoints
resumed as TrainState match the legacy continuation).
"""
from __future__ import annotations

#: def name -> {optax state class name: {state field: legacy field}}.
#: A leading ``-`` on the legacy field negates the value. A class listed with
#: no fields only tells two defs apart (present in one's emitted state only).
OPTAX_STATE_SOURCES: dict[str, dict[str, dict[str, str]]] = {
    'GradientDescent': {},
    'Momentum': {'TraceState': {'trace': 'momentum'}},
    'Adam': {'ScaleByAdamState': {'mu': 'grad_ema', 'nu': 'grad_sq_ema'}},
    'AdaBelief': {'ScaleByBeliefState': {'mu': 'grad_ema', 'nu': 'grad_sq_ema'}},
    'Adadelta': {'ScaleByAdaDeltaState': {'e_g': 'sq_avg', 'e_x': 'acc_delta'}},
    # non-centered: scale_by_rms (legacy `mg` is None); centered: scale_by_stddev
    'RMSProp': {'ScaleByRmsState': {'nu': 'v'},
                'ScaleByRStdDevState': {'mu': 'mg', 'nu': 'v'}},
    # optax.lars = chain(masked(add_decayed_weights), masked(scale_by_trust_ratio),
    # scale_by_learning_rate, trace): the trace holds -legacy momentum
    'LARS': {'TraceState': {'trace': '-momentum'}, 'MaskedState': {}},
    # emitted as optim_compat.transforms.<name>: LegacyRuleState, the legacy layout
    'Adagrad': {},
    'LAMB': {},
    'Adafactor': {},
}


def sources(def_name: str) -> dict[str, dict[str, str]]:
  """The row of ``def_name``.

  Raises:
    KeyError: ``def_name`` is not a table entry (the message lists them).
  """
  try:
    return OPTAX_STATE_SOURCES[def_name]
  except KeyError:
    raise KeyError(f'no checkpoint state mapping for {def_name!r}; known: '
                   f'{sorted(OPTAX_STATE_SOURCES)}') from None
