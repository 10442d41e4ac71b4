"""The codemod's rules: id, fix safety and what each rewrites.

Safety follows ruff / TorchFix: ``safe`` fixes are applied by default,
``unsafe`` ones only on request, ``manual`` ones become an inline
``# TODO(optim-migrate): <rule-id>: <what to do>`` comment and a report entry.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rule:
  id: str
  safety: str  # 'safe' | 'unsafe' | 'manual'
  summary: str


RULES = {r.id: r for r in (
    Rule('OM001', 'safe', '`Def(...).create(params)` -> `train_state.TrainState.create('
                          'apply_fn=None, params=params, tx=<Optax chain from the migration table>)`'),
    Rule('OM002', 'safe', '`opt.apply_gradient(grads)` -> `opt.apply_gradients(grads=grads)`; '
                          '`learning_rate=lr` -> set in an `optax.inject_hyperparams` state'),
    Rule('OM003', 'safe', '`opt.target` -> `opt.params`; `opt.replace(target=...)` -> `replace(params=...)`'),
    Rule('OM004', 'safe', '`opt.state.step` -> `opt.step`'),
    Rule('OM005', 'safe', 'imports: add `optax` / `flax.training.train_state`, drop unused `flax.optim`'),
    Rule('OM100', 'manual', 'a flax.optim use this version cannot convert safely'),
    Rule('OM101', 'manual', 'legacy optimizer def not in the migration table yet'),
    Rule('OM102', 'manual', 'per-call hyper-parameter override other than learning_rate, or mixed '
                            'override/no-override apply sites'),
    Rule('OM103', 'manual', 'optimizer state surgery (`opt.state`, `OptimizerState`)'),
)}

TODO_PREFIX = '# TODO(optim-migrate): '
