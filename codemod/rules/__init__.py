"""The codemod's rules: id, fix safety and what each rewrites.

Safety follows ruff / TorchFix: ``safe`` fixes are applied by default,
``unsafe`` ones only with ``--unsafe-fixes`` (otherwise they are reported,
with an inline TODO, like ``manual`` ones), ``manual`` ones become an inline
``# TODO(optim-migrate): <rule-id>: <what to do>`` comment and a report entry.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional


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
    Rule('OM004', 'safe', '`opt.state.step` -> `opt.step` (also `step[0]` on a replicated optimizer)'),
    Rule('OM005', 'safe', 'imports: add `optax` / `flax.training.train_state`, drop unused `flax.optim`'),
    Rule('OM006', 'safe', '`DynamicScale` imports -> `flax.training.dynamic_scale`'),
    Rule('OM007', 'safe', 'annotations: `optim.Optimizer` -> `train_state.TrainState`, '
                          '`optim.OptimizerDef` -> `optax.GradientTransformation`'),
    Rule('OM008', 'safe', '`MultiOptimizer` + `ModelParamTraversal` and `create(p, focus=)` -> '
                          '`optax.multi_transform` with labels from the traversal filters; '
                          'unselected leaves -> `optax.set_to_zero()`'),
    Rule('OM009', 'unsafe', '`opt.replicate()` -> `jax_utils.replicate(opt)`: legacy also averaged '
                            'the gradients over the pmap axis inside `apply_gradient`'),
    Rule('OM010', 'safe', '`opt.unreplicate()` -> `jax_utils.unreplicate(opt)`'),
    Rule('OM011', 'safe', '`opt.compute_gradient(f)` -> `jax.value_and_grad(f)(opt.params)`; '
                          '`opt.optimize(f)` -> that, then `apply_gradients`'),
    Rule('OM012', 'safe', '`opt.optimizer_def.hyper_params.<name>` -> the literal the def was built with'),
    Rule('OM013', 'safe', 'restoring an optimizer checkpoint -> '
                          '`optim_compat.checkpoint.restore_legacy` (legacy layout converted; a '
                          'TrainState-layout checkpoint or none yet behaves as restore_checkpoint)'),
    Rule('OM100', 'manual', 'a flax.optim use this version cannot convert safely'),
    Rule('OM101', 'manual', 'legacy optimizer def not in the migration table yet'),
    Rule('OM102', 'manual', 'per-call hyper-parameter override other than learning_rate, or mixed '
                            'override/no-override apply sites'),
    Rule('OM103', 'manual', 'optimizer state surgery (`opt.state`, `OptimizerState`)'),
    Rule('OM104', 'manual', 'user `OptimizerDef` subclass: kept on the shim (`optim_compat`), '
                            'wrapped with `optim_compat.to_optax(...)` for TrainState'),
    Rule('OM105', 'manual', 'pre-Linen `flax.nn` model: migrate the model to Linen first'),
)}

# the OM2xx family (JAX / Flax APIs removed beside flax.optim): its table is data only
from codemod.modern import table as _om2xx  # noqa: E402

RULES.update({i: Rule(i, safety, summary) for i, safety, summary in _om2xx.RULES})

TODO_PREFIX = '# TODO(optim-migrate): '


@dataclasses.dataclass(frozen=True)
class Options:
  """Which rules run and how (``rewrite``'s flags / ``[tool.optim-migrate]``).

  ``select`` / ``ignore`` hold rule ids or prefixes (``OM0`` = every fix,
  ``OM1`` = every manual rule), as in ruff.
  """
  select: Optional[tuple[str, ...]] = None
  ignore: tuple[str, ...] = ()
  unsafe_fixes: bool = False
  prefer_stock_optax: bool = False
  #: keep every optimizer use legacy (the engine's second pass when a first pass would leave
  #: a half-migrated file: an OM100 item it could not convert next to converted code)
  keep_legacy: bool = False

  def enabled(self, rule: str) -> bool:
    if self.select is not None and not any(rule.startswith(s) for s in self.select):
      return False
    return not any(rule.startswith(s) for s in self.ignore)

  def fixable(self, rule: str) -> bool:
    """The rule's fix is applied (enabled, and safe or unsafe with --unsafe-fixes)."""
    safety = RULES[rule].safety
    return self.enabled(rule) and (safety == 'safe' or (safety == 'unsafe' and self.unsafe_fixes))


def check_rule_ids(ids: Iterable[str]) -> list[str]:
  """Ids/prefixes in ``ids`` that name no rule (for a clear CLI error)."""
  return [i for i in ids if not any(r.startswith(i) for r in RULES)]
