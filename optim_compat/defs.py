"""The legacy optimizer defs, generated from the migration table (``spec.py``)."""
from optim_compat import base as _base
from optim_compat import spec as _spec

GradientDescent, _GradientDescentHyperParams, _ = _base.make_def_class(
    _spec.GRADIENT_DESCENT, __name__)
Momentum, _MomentumHyperParams, _MomentumParamState = _base.make_def_class(
    _spec.MOMENTUM, __name__)
Adam, _AdamHyperParams, _AdamParamState = _base.make_def_class(_spec.ADAM, __name__)
del _
