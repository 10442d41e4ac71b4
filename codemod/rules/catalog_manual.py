"""The catalog's manual rules (OM1xx): what the codemod flags with a TODO (``codemod.rules.catalog``).

``OM1`` selects them all. OM100 was the catch-all of earlier versions: its uses
are OM106-OM125 now; an OM100 TODO an earlier run wrote is still reported.
"""
from codemod.rules.catalog import Rule

_IMPORT = 'from flax import optim\n\n\n'
_KEPT = 'The file keeps its legacy optimizer code (it still runs on the shim, optim_compat).'

MANUAL = (
    Rule('OM100', 'manual', family='findings', summary=
         'a flax.optim use an earlier version could not convert (now OM106-OM125)',
         why='Earlier versions flagged every unconvertible use as OM100; their TODOs are still '
             'reported until deleted. New runs use the specific ids.',
         readme='earlier versions\' catch-all for other `flax.optim` uses; their TODO lines are '
                'still reported (until deleted); this version flags those uses as `OM106`–`OM125`'),
    Rule('OM101', 'manual', family='defs', summary='legacy optimizer def not in the migration table yet',
         why='Only defs of the migration table have a measured Optax form. ' + _KEPT,
         before=_IMPORT + 'def make(params, inner_def):\n'
                '  return optim.WeightNorm(inner_def).create(params)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make(params, inner_def):\n'
               '  # TODO(optim-migrate): OM101: WeightNorm is converted only around a def of the migration table; use optim_compat.WeightNorm meanwhile (this file keeps its legacy optimizer code)\n'
               '  return optim.WeightNorm(inner_def).create(params)\n',
         readme='`WeightNorm` around anything but a table def built in place; `MultiOptimizer` '
                'groups that are not table defs'),
    Rule('OM102', 'manual', family='apply_gradient', summary=
         'per-call hyper-parameter override other than learning_rate, or mixed '
         'override/no-override apply sites',
         why='An Optax transformation takes no hyper-parameters when applied; an injected value '
             'persists in the state, where a legacy override held for one call. ' + _KEPT,
         before=_IMPORT + 'def step(params, grads):\n'
                '  opt = optim.Adam(learning_rate=0.1).create(params)\n'
                '  return opt.apply_gradient(grads, beta1=0.5)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def step(params, grads):\n'
               '  opt = optim.Adam(learning_rate=0.1).create(params)\n'
               "  # TODO(optim-migrate): OM102: apply_gradient overrides ['beta1'] have no Optax equivalent here; inject them with optax.inject_hyperparams (this file keeps its legacy optimizer code)\n"
               '  return opt.apply_gradient(grads, beta1=0.5)\n',
         readme="per-call overrides other than `learning_rate`, `MultiOptimizer`'s "
                '`hyper_params=[...]` in any other form than the one `OM002` converts (a short or '
                'reordered list, another field, a list built elsewhere, user-def groups), files '
                'where only some calls override, apply-time learning rates with a user def, or '
                "that the creating module's conversion does not inject (and calls without one "
                'when it does), or on a parameter in a file that creates no optimizer (whether '
                'the creating module injects it cannot be told there)'),
    Rule('OM103', 'manual', family='attributes', summary=
         'optimizer state surgery (`opt.state`, `OptimizerState`)',
         why='A TrainState keeps Optax state in `opt_state`, laid out per transformation; the '
             'legacy `param_states` have no counterpart to edit. ' + _KEPT,
         before=_IMPORT + 'def moments(params):\n'
                '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
                '  return opt.state.param_states\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def moments(params):\n'
               '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
               '  # TODO(optim-migrate): OM103: `.state` of a flax.optim Optimizer has no TrainState equivalent yet (this file keeps its legacy optimizer code)\n'
               '  return opt.state.param_states\n',
         readme='optimizer state surgery (`opt.state...` other than `.state.step`, '
                '`OptimizerState(...)`)'),
    Rule('OM104', 'manual', family='references', summary=
         'user `OptimizerDef` subclass: kept on the shim (`optim_compat`), wrapped with '
         '`optim_compat.to_optax(...)` for TrainState',
         why='A user def has no table entry; the shim runs it unchanged and to_optax makes it a '
             'GradientTransformation (its state bitwise the shim\'s, its params within 2 ulp: '
             'TrainState adds back `new - params`), with `inject=(\'learning_rate\',)` '
             'where the file sets the rate at apply time (its hyper-parameter dataclass holds '
             'it; a MultiOptimizer group of it too). Its instances in other modules of the run '
             '(`from .rmsprop_tf import RMSPropTF`) are wrapped the same way; a name holding a '
             'table def in one branch and a user def in another gets the wrap where the user '
             'def is assigned.',
         before=_IMPORT + 'class Sign(optim.OptimizerDef):\n  pass\n\n\n'
                'def make(params):\n  return Sign(None).create(params)\n',
         after='import optim_compat\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               '# TODO(optim-migrate): OM104: `Sign` subclasses a flax.optim class: it runs on the shim (optim_compat) and TrainState gets optim_compat.to_optax(Sign(...)); port it to an optax.GradientTransformation when convenient\n'
               'class Sign(optim_compat.OptimizerDef):\n'
               '  pass\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  return train_state.TrainState.create(apply_fn=None, params=params, tx=optim_compat.to_optax(Sign(None)))\n',
         readme='a user `OptimizerDef` subclass: kept, running on the shim '
                '(`optim_compat.OptimizerDef`), wrapped with `optim_compat.to_optax` for '
                '`TrainState`; port it when convenient'),
    Rule('OM105', 'manual', family='references', summary=
         'pre-Linen `flax.nn` model: migrate the model to Linen first',
         why='flax.nn was removed before flax.optim; the codemod converts the optimizer parts '
             'only.',
         before='from flax import nn, optim\n\n\ndef create(model):\n'
                '  return optim.Adam(learning_rate=1e-3).create(model), nn.Dense\n',
         after='from flax import nn\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def create(model):\n'
               '  # TODO(optim-migrate): OM105: pre-Linen flax.nn model: migrate the model to Linen first (the optimizer parts are converted)\n'
               '  return train_state.TrainState.create(apply_fn=None, params=model, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08)), nn.Dense\n',
         readme='pre-Linen `flax.nn` models: migrate the model to Linen first (the optimizer '
                'parts are still converted)'),
    Rule('OM106', 'manual', family='plan', summary=
         'the file needs fixes that are not selected (`--select` / `--ignore`): left unchanged',
         why='A partial migration would not run (a TrainState stepped with apply_gradient), so a '
             'file whose fixes are not all selected is left as it is.',
         options={'ignore': ('OM003',)},
         before=_IMPORT + 'def params_of(params):\n'
                '  return optim.GradientDescent(learning_rate=0.1).create(params).target\n',
         after='from flax import optim\n'
               '\n'
               '\n'
               'def params_of(params):\n'
               '  return optim.GradientDescent(learning_rate=0.1).create(params).target\n',
         readme='a file that needs a fix `--select` / `--ignore` leaves out: left unchanged (a '
                'partial migration would not run), one item naming the fixes'),
    Rule('OM107', 'manual', family='notebook', summary=
         'IPython syntax (a `%%` cell, `%magic`, `!shell`, `x?`) that mentions flax.optim',
         why='The codemod rewrites Python; a magic line it cannot parse may still use the '
             'optimizer, so the notebook is left as it is rather than half-migrated.',
         readme='IPython syntax in a notebook that mentions flax.optim (a `%%` cell, '
                '`optim.Adam?`): the notebook is left as it is'),
    Rule('OM108', 'manual', family='imports', summary=
         'a name the rewrite would import (`optax`, `train_state`, ...) is bound to something '
         'else in the file',
         why='The emitted code would name the wrong object. (`train_state` alone is imported '
             'as `flax_train_state` instead, unless the file also spells '
             '`train_state.TrainState`.) ' + _KEPT,
         before=_IMPORT + 'def init(params):\n  optax = {"epoch": 0}\n'
                '  return optim.Adam(learning_rate=0.1).create(params), optax\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               '# TODO(optim-migrate): OM108: `optax` is bound to something else in this file, and the rewrite would use that name for the module it imports: rename it, then rerun (this file keeps its legacy optimizer code)\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def init(params):\n'
               '  optax = {"epoch": 0}\n'
               '  return optim.Adam(learning_rate=0.1).create(params), optax\n',
         readme='a name the rewrite imports (`optax`, `optim_compat`, `jax_utils`, '
                '`traverse_util`; `train_state` only when the file also spells '
                '`train_state.TrainState`, else it is imported as `flax_train_state`) bound to '
                'something else in the file: rename it, the file keeps its legacy code'),
    Rule('OM109', 'manual', family='references', summary=
         'a flax.optim name with no automatic conversion where it is used',
         why='`optim.Optimizer(...)` built by hand, `isinstance(x, optim.Adam)` and the like '
             'have no Optax form. ' + _KEPT,
         before=_IMPORT + 'def is_adam(x):\n  return isinstance(x, optim.Adam)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def is_adam(x):\n'
               '  # TODO(optim-migrate): OM109: flax.optim.Adam has no automatic conversion here; see optim_compat for a drop-in (this file keeps its legacy optimizer code)\n'
               '  return isinstance(x, optim.Adam)\n',
         readme='a `flax.optim` name with no conversion where it stands: `optim.Optimizer(...)`, '
                '`isinstance(x, optim.Adam)`, ... (the file keeps its legacy code)'),
    Rule('OM110', 'manual', family='imports', summary='the flax.optim module itself used as a value',
         why='An alias or a None check of the module cannot be followed, and Flax >= 0.6 has '
             'no flax.optim. ' + _KEPT,
         before=_IMPORT + 'opt_lib = optim\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               '# TODO(optim-migrate): OM110: `optim`, the flax.optim module itself, is used as a value (an alias, a None check, an argument): the codemod cannot follow it, and Flax >= 0.6 has no flax.optim; convert its uses by hand (this file keeps its legacy optimizer code)\n'
               'opt_lib = optim\n',
         readme='the `flax.optim` module itself used as a value (`opt_lib = optim`, `if optim '
                'is None:` after a guarded import: the file keeps its legacy code; converting the '
                'rest would half-migrate it)'),
    Rule('OM111', 'manual', family='imports', summary='`from flax.optim import *`',
         why='The names it brings cannot be told apart from others. ' + _KEPT,
         before='from flax.optim import *\n\n\ndef make(params):\n'
                '  return Adam(learning_rate=0.1).create(params)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               '# TODO(optim-migrate): OM111: `from flax.optim import *`: the names it brings cannot be told apart from others, so nothing here is converted; import them by name, then rerun (this file keeps its legacy optimizer code)\n'
               'from flax.optim import *\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  return Adam(learning_rate=0.1).create(params)\n',
         readme='`from flax.optim import *` (the file keeps its legacy code)'),
    Rule('OM112', 'manual', family='imports', summary='flax.optim reached by name at run time',
         why='`importlib.import_module("flax.optim")`, `sys.modules["flax.optim"]`, '
             '`getattr(flax, "optim")` fail on Flax >= 0.6, and the module they get cannot be '
             'followed. ' + _KEPT,
         before='import importlib\n\nm = importlib.import_module("flax.optim")\n',
         after='import importlib\n'
               'import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               '\n'
               '# TODO(optim-migrate): OM112: `importlib.import_module("flax.optim")` reaches flax.optim by name at run time, and Flax >= 0.6 has no flax.optim (here: a ModuleNotFoundError); the codemod cannot follow the module it gets: use `optim_compat` (the shim, same names) in its place, or migrate its uses to Optax by hand (this file keeps its legacy optimizer code)\n'
               'm = importlib.import_module("flax.optim")\n',
         readme='flax.optim reached by name at run time (`importlib.import_module("flax.optim")` '
                'or a submodule, `__import__("flax.optim")`, `sys.modules["flax.optim"]` / '
                '`.get`, `getattr(flax, "optim")`: each site is flagged, use `optim_compat` in '
                'its place or migrate by hand, and the file keeps its legacy code; '
                '`torch.optim`, a name held in a variable, or a `"flax.optim" in sys.modules` '
                'test is not flagged)'),
    Rule('OM113', 'manual', family='imports', summary='a flax.optim import nothing in its module uses',
         why='A `from flax.optim import Adam` nothing uses may be a re-export (a package\'s '
             '`__init__.py`), as may any flax.optim import in a module with `__all__`: kept, '
             'not deleted, so that its importers still find it until they are migrated. An '
             'unused module import (`from flax import optim`, `import flax.optim`) elsewhere '
             'is dropped (OM005).',
         before='from flax.optim import Adam\n\nx = 1\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               '# TODO(optim-migrate): OM113: flax.optim is imported here (`from flax.optim import Adam`) but not used in this module: drop it from the import; if other modules import it from here (a re-export), migrate them first (meanwhile, the shim stands in for flax.optim here, OM014)\n'
               'from flax.optim import Adam\n'
               '\n'
               'x = 1\n',
         readme="a `flax.optim` import nothing in its module uses (maybe a re-export from a "
                "package's `__init__.py`, or names listed in `__all__`: kept, not deleted)"),
    Rule('OM114', 'manual', family='defs', summary=
         'an optimizer def handed to other code (returned, passed, kept in an attribute or a container)',
         why='As an Optax transformation it would arrive there without `.create()`. ' + _KEPT,
         before=_IMPORT + 'def make_def():\n  return optim.Adam(1e-3)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make_def():\n'
               '  # TODO(optim-migrate): OM114: `optim.Adam(1e-3)` is an optimizer def handed to other code (returned, passed as an argument, kept in an attribute or a container): as an Optax transformation it has no .create(); convert it where it is used (this file keeps its legacy optimizer code)\n'
               '  return optim.Adam(1e-3)\n',
         readme='a def returned or passed to other code (it would arrive there as an Optax '
                'transformation), or kept in an attribute or a list, dict or tuple (the file '
                'keeps its legacy code)'),
    Rule('OM115', 'manual', family='defs', summary=
         'a name that holds a def and later its optimizer, when which one a use reads is unclear',
         why='`opt = Adam(1e-3); opt = opt.create(p)` converts when the create is the name\'s '
             'next assignment in the same block and no read comes before the def or from a '
             'closure; otherwise the def needs its own name. ' + _KEPT,
         before=_IMPORT + 'def make(params):\n  opt = optim.Adam(1e-3)\n  f = lambda: opt\n'
                '  opt = opt.create(params)\n  return opt, f\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  # TODO(optim-migrate): OM115: `opt` holds this flax.optim def and later an optimizer (`opt = opt.create(...)`), and the codemod cannot tell which of the two each use reads (a use before the def or in a closure, or the two assignments not one after the other in one block): give the def its own name (`opt_def = ...`), then rerun (this file keeps its legacy optimizer code)\n'
               '  opt = optim.Adam(1e-3)\n'
               '  f = lambda: opt\n'
               '  opt = opt.create(params)\n'
               '  return opt, f\n',
         readme='a name that holds a def and then its optimizer (`opt = Adam(1e-3); opt = '
                'opt.create(p)`: converted, `tx=opt` reading the def and later reads the '
                "optimizer, when the create is the name's next assignment in the same block and "
                'no read comes before the def or from a closure; otherwise flagged saying so, '
                'the file keeps its legacy code)'),
    Rule('OM116', 'manual', family='attributes', summary=
         'an optimizer or def member with no TrainState / Optax counterpart',
         why='`.restore_state(...)`, `.state_dict()` where the view cannot be laid out (OM017), '
             '`.optimizer_def` other than a hyper-parameter read, `.optimize` not unpacked into '
             'names, a def\'s `.init_state`, `.apply_gradient` used as a value: nothing to '
             'convert them to. ' + _KEPT,
         before=_IMPORT + 'def load(params, saved):\n'
                '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
                '  return opt.restore_state(saved)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def load(params, saved):\n'
               '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
               '  # TODO(optim-migrate): OM116: `.restore_state` of a flax.optim Optimizer has no TrainState equivalent yet (this file keeps its legacy optimizer code)\n'
               '  return opt.restore_state(saved)\n',
         readme='a member of an optimizer or def with no `TrainState` / Optax counterpart: '
                '`.restore_state(...)`, `.state_dict()` where the legacy view cannot be laid out '
                '(OM017), `.optimize` not unpacked into names, a def\'s `.init_state`, '
                '`.apply_gradient` used as a value (`jax.jit(opt.apply_gradient)`), '
                '`.replicate(...)` with other arguments than `devices` / `axis_name`, a reset '
                '(`o.optimizer_def.create(...)`) of a value nothing proves is the optimizer (the '
                'file keeps its legacy code)'),
    Rule('OM117', 'manual', family='attributes', summary=
         'a legacy member read on a value nothing proves to be an optimizer',
         why='Function parameters of unknown origin, container items, attributes also assigned '
             'other things and names rebound by loops are not followed: the line is left as it '
             'is (it fails until converted by hand) and the rest of the file is converted.',
         before=_IMPORT + 'def make(params):\n'
                '  return optim.Adam(learning_rate=1e-3).create(params)\n\n\n'
                'def export(optimizer):\n  return optimizer.target\n\n\n'
                'def save(thing):\n  return export(thing)\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  return train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n'
               '\n'
               '\n'
               'def export(optimizer):\n'
               '  # TODO(optim-migrate): OM117: if `optimizer` is a flax.optim Optimizer, `.target` is `.params` on a TrainState\n'
               '  return optimizer.target\n'
               '\n'
               '\n'
               'def save(thing):\n'
               '  return export(thing)\n',
         readme='`.target` / `.state.step` / `.replace(target=)` / a legacy-only member on a '
                'value nothing proves is an optimizer: a function parameter of unknown origin, '
                'an attribute (`self.optimizer`) that gets `.apply_gradient` but is also assigned '
                "something else (one only ever assigned optimizers converts), another object's "
                'attribute of that name (`trainer.optimizer`, also on a call\'s result or a '
                'container item: `make_trainer(p).optimizer`, `trainers[0].optimizer`), a name an '
                'optimizer held that a loop, a walrus, `with` or tuple unpacking then rebinds, a '
                'name assigned a value computed from an optimizer nothing proves to be one (`new, '
                'm = step(opt, g)`, a jitted lambda\'s or `fori_loop`\'s result), a name unpacked '
                'from a container of optimizers or from what a function returns its optimizer in '
                '(`opt, lr = make(p)`); the file is still converted, so check the report'),
    Rule('OM118', 'manual', family='defs', summary=
         'def, `MultiOptimizer` or `create` arguments the codemod cannot convert statically',
         why='A def without a learning rate (none at apply time either), a '
             '`MultiOptimizer` group that is not a literal (traversal, def) pair, a `focus=` '
             'that is not a traversal built in the file. ' + _KEPT,
         before=_IMPORT + 'def make(params):\n  return optim.Adam(beta1=0.8).create(params)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  # TODO(optim-migrate): OM118: Adam has no learning rate and none is passed at apply time in this file; set learning_rate explicitly (this file keeps its legacy optimizer code)\n'
               '  return optim.Adam(beta1=0.8).create(params)\n',
         readme='a def built without any learning rate, '
                '`MultiOptimizer` arguments that are not literal (traversal, def) pairs, '
                '`create(...)` with other arguments or a `focus=` that is not a traversal built '
                'in the file (the file keeps its legacy code)'),
    Rule('OM119', 'manual', family='defs', summary='a `hyper_params` read with no literal value',
         why='OM012 replaces the read with the literal the def was built with; here no single '
             'def says which value it is, or it is not a literal, or it is '
             '`hyper_params.replace(...)` (new values for an override). ' + _KEPT + ' A read '
             'through `self.<attribute>` gets the literal with this TODO too, and the file '
             'converts: a subclass (in another module as well) may store an optimizer of '
             'another def in that attribute, whose value the literal is not.',
         before=_IMPORT + 'def make(params, lr):\n  opt_def = optim.Adam(learning_rate=lr)\n'
                '  return opt_def.create(params), opt_def.hyper_params.learning_rate\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make(params, lr):\n'
               '  opt_def = optim.Adam(learning_rate=lr)\n'
               '  # TODO(optim-migrate): OM119: hyper_params.learning_rate is `lr`, not a literal: read the value where the def is built (this file keeps its legacy optimizer code)\n'
               '  return opt_def.create(params), opt_def.hyper_params.learning_rate\n',
         readme='a `hyper_params` read no single def of the file answers with a literal, and '
                '`hyper_params.replace(...)` (new hyper-parameters for '
                '`apply_gradient(hyper_params=...)`: migrate by hand with '
                '`optax.inject_hyperparams` and `opt_state.hyperparams`; the file keeps its '
                'legacy code)'),
    Rule('OM120', 'manual', family='attributes', summary=
         '`.state.step` used as an array (`.astype`, `.dtype`, `.shape`, ...)',
         why='A TrainState fresh from TrainState.create, or stepped outside jit, holds the '
             'step as a Python int (legacy: an int32 array).',
         before=_IMPORT + 'def step_dtype(params):\n'
                '  opt = optim.GradientDescent(learning_rate=0.1).create(params)\n'
                '  return opt.state.step.dtype\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def step_dtype(params):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(learning_rate=0.1))\n'
               '  # TODO(optim-migrate): OM120: `.step` is a Python int on a TrainState fresh from TrainState.create or stepped outside jit (legacy: an int32 array): use jnp.asarray(<state>.step, jnp.int32) here\n'
               '  return opt.step.dtype\n',
         readme='`.state.step.astype(...)` / `.dtype` / `.shape` (array-only attributes): a '
                "converted `.step` can be a Python int; use `jnp.asarray(<state>.step, "
                'jnp.int32)`'),
    Rule('OM121', 'manual', family='attributes', summary=
         'reflection on the legacy fields by name (`hasattr(opt, "target")`, `to_state_dict`, '
         "a checkpoint restored with no target and read as `raw['target']`), and `pickle.dump` "
         'of an optimizer',
         why='No rule rewrites a field named in a string; on a TrainState `hasattr(x, '
             '"target")` is silently False, and its state dict has other keys. A TrainState '
             'holds its Optax transformation, whose closures pickle cannot serialize.',
         before=_IMPORT + 'def has_params(params):\n'
                '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
                '  return hasattr(opt, "target")\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def has_params(params):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  # TODO(optim-migrate): OM121: `hasattr(opt, "target")`: a TrainState has no attribute \'target\', so this is silently False (`target` is `params`, `state.step` is `step`): convert it by hand\n'
               '  return hasattr(opt, "target")\n',
         readme="`serialization.to_state_dict(opt)` (a `TrainState`'s keys are `step`, `params`, "
                '`opt_state`), `getattr` / `hasattr` / `setattr` / `delattr` naming a legacy '
                "field (`hasattr(state, 'target')` would be silently False), "
                '`dataclasses.replace(opt, target=...)` on a converted optimizer, and '
                "`raw = restore_checkpoint(d, target=None)` read as `raw['target']` / "
                "`raw['state']` (the file stays on the shim, whose checkpoints keep those keys)"),
    Rule('OM122', 'manual', family='crossmodule', summary=
         'an optimizer use nothing proves: another module keeps its legacy code, or it comes '
         'from an unknown module, or the file never imports flax.optim',
         why='Converting it would hand a TrainState method call to a legacy Optimizer (or the '
             'reverse). When the flax.optim optimizer comes from a module kept legacy, this '
             'file keeps its legacy code too.',
         before='def train(opt, g):\n  return opt.apply_gradient(g)\n',
         after='def train(opt, g):\n'
               '  # TODO(optim-migrate): OM122: this file never imports flax.optim: if this is a flax.optim Optimizer, migrate it where it is created\n'
               '  return opt.apply_gradient(g)\n',
         readme='`.apply_gradient` in a file that never imports `flax.optim` on anything the '
                'cross-module flow does not prove (below); `.create(...)` on a def another '
                'module\'s function returns, or on a def-like name (`optimizer_def`) nothing '
                'proves, and `.target` / `.state` on what it creates; `.target`, `.state.step`, '
                '`.optimizer_def`, `.replace(target=)` on a value named like an optimizer '
                '(`train_state.optimizer`) in a file that never imports `flax.optim`; an '
                'optimizer whose creating module keeps its legacy code (the file keeps its '
                'legacy code too); in a file kept legacy that never imports `flax.optim`, each '
                'Optimizer use it keeps that no other TODO on its line explains (its optimizer '
                'is made on the shim)'),
    Rule('OM123', 'manual', family='crossmodule', summary=
         'a factory\'s TrainState would reach legacy code in a file that keeps it',
         why='In a file kept legacy, `.target`, `.state`, `.apply_gradient`, ... on what another '
             'module\'s converted factory returns fail at run time. So a factory the run would '
             'convert stays legacy (on the shim) when a file using what it returns keeps its '
             'legacy code; a factory migrated before the run cannot, and its users are flagged.',
         readme='at the `def` of a factory (`def create_optimizer(p): return ...create(p)`) '
                'that another file of the run uses and keeps its legacy code for (named, with '
                'its line and reason): the factory\'s file keeps its legacy code too, on the '
                'shim. In a file that keeps its legacy code, each legacy use (`.target`, '
                '`.state`, `.apply_gradient`, `.replicate()`, ...) of a value that holds, or may '
                'hold, the `TrainState` of a factory migrated before this run: it would fail at '
                'run time'),
    Rule('OM124', 'manual', family='crossmodule', summary=
         'a call or use of another module\'s step function that would hand it the wrong kind '
         'of optimizer',
         why='A step function converted by the run takes TrainStates; one kept legacy takes '
             'flax.optim Optimizers. A caller whose optimizer ends up the other kind is flagged '
             '(and keeps its legacy code when its own optimizer would become a TrainState).',
         readme='a call of another module\'s step function (`train_step(opt, b)`, through '
                '`jax.pmap(train_step)` too) that would hand it a flax.optim Optimizer after the '
                'run, or hand a step kept legacy a `TrainState` (then the calling file keeps its '
                'legacy code); a step function named as a value (`functools.partial(train_step, '
                '...)`) when it and the file\'s optimizers end up on different sides'),
    Rule('OM125', 'manual', family='runner', summary=
         'a file outside the run imports a function the run converted',
         why='pre-commit passes only the changed files: an importer outside the run keeps '
             'calling the converted factory or step the legacy way until it is rewritten too.',
         readme='a file outside the run that imports a factory, step function or container '
                'class the run converts: reported at its import line (the file is not touched)'),
)
