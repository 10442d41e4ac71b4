"""Faithful Optax transformations of legacy ``flax.optim`` update rules (the public names).

``optim_compat.transforms.<name>(...)`` (e.g. ``lamb``) builds the transformation of
the legacy def ``<Name>`` from the legacy arguments, running its per-parameter rule
in the legacy order of operations (:func:`from_legacy_rule`, its state
:class:`LegacyRuleState`); the codemod emits it where stock Optax differs
intrinsically (see ``spec.py``). ``weight_norm(inner_tx, wn_decay, wn_eps)`` is legacy
``WeightNorm`` around any Optax transformation (state :class:`WeightNormState`).
"""
from __future__ import annotations

import inspect
import warnings

from optim_compat import defs, spec
from optim_compat.legacy_rule import LegacyRuleState, from_legacy_rule  # noqa: F401 - public
from optim_compat.weight_norm import WeightNormState, weight_norm  # noqa: F401 - public

__all__ = ['LegacyRuleState', 'WeightNormState', 'from_legacy_rule', 'weight_norm',
           *sorted(e.name.lower() for e in spec.SPECS.values() if e.param_update is not None)]


def faithful_factory(entry: spec.OptimizerSpec):
  """``(learning_rate=None, <legacy hyper-params>) -> GradientTransformation``.

  The function has the legacy def's exact signature (so
  ``optax.inject_hyperparams`` can inject ``learning_rate`` and keep the
  rest static) and builds the faithful transformation of ``entry``.
  """

  def factory(*args, **kwargs):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      opt_def = getattr(defs, entry.name)(*args, **kwargs)
    return from_legacy_rule(opt_def, opt_def.hyper_params, entry.param_update)

  params = [inspect.Parameter(h.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=h.default)
            for h in entry.hyper_params]
  params += [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=v)
             for k, v in entry.extra_args]
  factory.__signature__ = inspect.Signature(params)
  factory.__name__ = factory.__qualname__ = entry.name.lower()
  factory.__doc__ = (f'Legacy flax.optim 0.5.3 ``{entry.name}`` as an Optax GradientTransformation '
                     f'(arguments as ``optim_compat.{entry.name}``; state: '
                     f'``transforms.LegacyRuleState``). {entry.differences}.')
  return factory


# one factory per table def that runs a legacy rule: optim_compat.transforms.lamb, .adagrad, ...
globals().update({e.name.lower(): faithful_factory(e) for e in spec.SPECS.values()
                  if e.param_update is not None})
