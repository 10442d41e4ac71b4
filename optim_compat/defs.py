"""The legacy optimizer defs, generated from the migration table (``spec.py``)."""
from optim_compat import base as _base
from optim_compat import spec as _spec

GradientDescent, _GradientDescentHyperParams, _ = _base.make_def_class(
    _spec.GRADIENT_DESCENT, __name__)
Momentum, _MomentumHyperParams, _MomentumParamState = _base.make_def_class(
    _spec.MOMENTUM, __name__)
Adam, _AdamHyperParams, _AdamParamState = _base.make_def_class(_spec.ADAM, __name__)
del _
AdaBelief, _AdaBeliefHyperParams, _AdaBeliefParamState = _base.make_def_class(
    _spec.ADABELIEF, __name__)
Adadelta, _AdadeltaHyperParams, _AdadeltaParamState = _base.make_def_class(
    _spec.ADADELTA, __name__)
Adagrad, _AdagradHyperParams, _AdagradParamState = _base.make_def_class(_spec.ADAGRAD, __name__)
RMSProp, _RMSPropHyperParams, _RMSPropParamState = _base.make_def_class(_spec.RMSPROP, __name__)
LAMB, _LAMBHyperParams, _LAMBParamState = _base.make_def_class(_spec.LAMB, __name__)
LARS, _LARSHyperParams, _LARSParamState = _base.make_def_class(_spec.LARS, __name__)
Adafactor, _AdafactorHyperParams, _AdafactorParamState = _base.make_def_class(
    _spec.ADAFACTOR, __name__)
