"""The catalog's fix rules (OM0xx): what the codemod rewrites (``codemod.rules.catalog``)."""
from codemod.rules.catalog import Rule

_IMPORT = 'from flax import optim\n\n\n'

FIXES = (
    Rule('OM001', 'safe', family='defs', summary=
         '`Def(...).create(params)` -> `train_state.TrainState.create(apply_fn=None, '
         'params=params, tx=<Optax chain from the migration table>)`',
         why='flax.optim is gone from Flax >= 0.6; the migration table (optim_compat/spec.py) '
             'gives each def the Optax chain that reproduces its legacy update (bitwise or to '
             'the ulps the table states), and TrainState holds what the Optimizer held.',
         before=_IMPORT + 'def create(params):\n  return optim.Adam(learning_rate=1e-3).create(params)\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def create(params):\n'
               '  return train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n',
         readme='`Def(...).create(params)` → `train_state.TrainState.create(apply_fn=None, '
                'params=params, tx=<Optax chain>)`, for every import form (`from flax import '
                'optim`, `import flax.optim as X`, `from flax.optim import Adam as A`, `from '
                'flax.optim.adam import Adam`, bare `flax.optim.Adam` after `import flax`; '
                'and the shim\'s where a user pointed the file at it by hand, `import '
                'optim_compat as optim`, `from optim_compat import Adam`: converted as the '
                'flax.optim form, kept as written, with no `install()`, where the file keeps its '
                'legacy code); '
                '`WeightNorm(def)` → `optim_compat.transforms.weight_norm(<def\'s Optax '
                'chain>, wn_decay, wn_eps)`, also for a name wrapped in place where the config '
                'asks (nerfies\' `d = Adam(lr)`; `if wn: d = WeightNorm(d)` → `d = '
                'optim_compat.transforms.weight_norm(d)`, `tx=d`); a '
                'user `OptimizerDef` subclass → `tx=optim_compat.to_optax(MyDef(...))`; a def '
                'built from `*args` / `**kw` the code cannot read (awac\'s `Adam(**kwargs)`; a '
                'dict bound once with literal values and used only so is read and converted '
                'to the Optax chain) → `optim_compat.to_optax(optim_compat.Adam(**kw))`, the '
                'shim\'s own def reading them at run time (`inject=(\'learning_rate\',)` when '
                'the rate is set at apply time); a jitted create (scenic\'s `jax.jit(d.create, '
                "backend='cpu')(params)`) → `jax.jit(lambda params: train_state.TrainState."
                "create(apply_fn=None, params=params, tx=d), backend='cpu')(params)`; a bound "
                '`d.create` handed on otherwise (`f = d.create`, `jax.pmap(d.create)`) is OM114; '
                'the reset idiom `o = o.optimizer_def.create(o.target)` → `o.replace(step=0, '
                'params=o.params, opt_state=o.tx.init(o.params))`'),
    Rule('OM002', 'safe', family='apply_gradient', summary=
         '`opt.apply_gradient(grads)` -> `opt.apply_gradients(grads=grads)`; '
         '`learning_rate=lr` -> set in an `optax.inject_hyperparams` state',
         why='A TrainState steps with apply_gradients; an Optax transformation takes no '
             'hyper-parameters when applied, so an apply-time learning rate is written into the '
             'state of an injected transformation (it holds for that call, as in legacy, because '
             'every call sets it).',
         before=_IMPORT + 'def step(params, grads, lr):\n'
                '  opt = optim.GradientDescent().create(params)\n'
                '  return opt.apply_gradient(grads, learning_rate=lr)\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def step(params, grads, lr):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.inject_hyperparams(optax.sgd)(learning_rate=0.0))\n'
               '  return opt.replace(opt_state=optax.tree_utils.tree_set(opt.opt_state, learning_rate=lr)).apply_gradients(grads=grads)\n',
         readme="`apply_gradient(g)` (or `grads=g`, legacy 0.5.3's keyword) → "
                '`apply_gradients(grads=g)`. `apply_gradient(g, learning_rate=lr)` (and defs '
                'built without a learning rate) → `lr` written into an '
                '`optax.inject_hyperparams` state with `optax.tree_utils.tree_set`, functionally '
                "and under jit. A `MultiOptimizer`'s per-group rates, `apply_gradient(g, "
                'hyper_params=[opt.optimizer_def.hyper_params[i].replace(learning_rate=x_i), '
                "...])` (one per group, in order, on every apply call) → each group's "
                'transformation injected and `x_i` set in `opt_state.inner_states[label]` (run on '
                "the recorded `multi_group_hyper_params` case of real flax.optim: 1.5 ulp, the "
                "table's bound for its LAMB group is 2)"),
    Rule('OM003', 'safe', family='attributes', summary=
         '`opt.target` -> `opt.params`; `opt.replace(target=...)` -> `replace(params=...)`',
         why='A TrainState calls the parameters `params` (the member table, '
             'codemod/legacy_api.py, holds the renames).',
         before=_IMPORT + 'def params_of(params):\n'
                '  opt = optim.GradientDescent(learning_rate=0.1).create(params)\n'
                '  return opt.target\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def params_of(params):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(learning_rate=0.1))\n'
               '  return opt.params\n',
         readme='`.target` → `.params` and `replace(target=)` → `replace(params=)`; '
                '`replace(target=flax.core.freeze(p))`, or `replace(target=p)` of a parameter '
                'or of a helper\'s result in a module that calls `freeze`, keeps the kind the '
                'TrainState\'s params '
                'have (`freeze(p) if isinstance(opt.params, flax.core.FrozenDict) else '
                'flax.core.unfreeze(p)`: Flax `init` returns a dict since 0.7.1, and a '
                'FrozenDict would not match `opt_state` at the next step)'),
    Rule('OM004', 'safe', family='attributes', summary=
         '`opt.state.step` -> `opt.step` (also `step[0]` on a replicated optimizer)',
         why='A TrainState keeps the step count on itself; note that a fresh one holds the '
             'Python int 0 where legacy held an int32 array.',
         before=_IMPORT + 'def step_of(params):\n'
                '  opt = optim.GradientDescent(learning_rate=0.1).create(params)\n'
                '  return opt.state.step\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def step_of(params):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(learning_rate=0.1))\n'
               '  return opt.step\n',
         readme='`.state.step` → `.step` (so `state.step[0]` on a replicated optimizer → '
                '`step[0]`). A fresh `TrainState` holds the Python int 0 (legacy: an int32 '
                'array), and stays an int when stepped outside `jit`: the report says so on every '
                'site, and `.state.step.astype(...)` / `.dtype` / `.shape` (array-only '
                'attributes) also get an `OM120` TODO'),
    Rule('OM005', 'safe', family='imports', summary=
         'imports: add `optax` / `flax.training.train_state`, drop unused `flax.optim`',
         why='The rewritten code names Optax and TrainState; Flax >= 0.6 has no flax.optim to '
             'import. One report entry per file lists what was added and dropped.',
         before=_IMPORT + 'def create(params):\n  return optim.Adam(learning_rate=1e-3).create(params)\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def create(params):\n'
               '  return train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n',
         readme='imports: `optax`, `flax.training.train_state`, `jax`, `flax.jax_utils`, '
                '`flax.traverse_util` added as needed, legacy imports dropped once unused; one '
                'report entry per file lists the imports added and dropped (at the first dropped '
                'one). Like any fix a file needs, ignoring it leaves that file unchanged'),
    Rule('OM006', 'safe', family='imports', summary=
         '`DynamicScale` imports -> `flax.training.dynamic_scale`',
         why='DynamicScale moved to flax.training.dynamic_scale; it is the same class.',
         before='from flax.optim import DynamicScale\n\nscaler = DynamicScale()\n',
         after='from flax.training.dynamic_scale import DynamicScale\n'
               '\n'
               'scaler = DynamicScale()\n',
         readme='`DynamicScale` / `dynamic_scale` from `flax.optim` → '
                '`flax.training.dynamic_scale` (also in half-migrated files)'),
    Rule('OM007', 'safe', family='references', summary=
         'annotations: `optim.Optimizer` -> `train_state.TrainState`, `optim.OptimizerDef` '
         '(and a converted `optim.MultiOptimizer`) -> `optax.GradientTransformation`; a '
         'parameter typed so in its docstring',
         why='Annotations and dataclass fields name the legacy classes; after the rewrite the '
             'values are TrainStates and Optax transformations. A parameter whose docstring '
             'types it `flax.optim.Optimizer` (`Args:` / `Parameters`, also in a module that '
             'never imports flax.optim) is proven an optimizer as an annotated one is, and the '
             'docstring names the modern type.',
         before=_IMPORT + 'def step(opt: optim.Optimizer, grads):\n'
                '  return opt.apply_gradient(grads)\n',
         after='from flax.training import train_state\n'
               '\n'
               '\n'
               'def step(opt: train_state.TrainState, grads):\n'
               '  return opt.apply_gradients(grads=grads)\n',
         readme='annotations and dataclass fields: `optim.Optimizer` → `train_state.TrainState`, '
                '`optim.OptimizerDef` (`optim.MultiOptimizer`) → `optax.GradientTransformation`; '
                'parameters so typed in a docstring (also where flax.optim is never imported)'),
    Rule('OM008', 'safe', family='defs', summary=
         '`MultiOptimizer` + `ModelParamTraversal` and `create(p, focus=)` -> '
         '`optax.multi_transform` with labels from the traversal filters; unselected leaves -> '
         '`optax.set_to_zero()`',
         why='Legacy never moved a leaf no traversal selects; multi_transform with a frozen '
             'set_to_zero group keeps it so.',
         before=_IMPORT + 'def make(params):\n'
                '  kernels = optim.ModelParamTraversal(lambda path, _: "kernel" in path)\n'
                '  return optim.MultiOptimizer((kernels, optim.Adam(1e-3))).create(params)\n',
         after='from flax import traverse_util\n'
               'import jax\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  kernels = traverse_util.ModelParamTraversal(lambda path, _: "kernel" in path)\n'
               "  return train_state.TrainState.create(apply_fn=None, params=params, tx=optax.multi_transform({'kernels': optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08), 'frozen': optax.set_to_zero()}, lambda params_: kernels.update(lambda _: 'kernels', jax.tree_util.tree_map(lambda _: 'frozen', params_))))\n",
         readme="`MultiOptimizer((trav, def), ...)` → `optax.multi_transform({label: tx, ..., "
                "'frozen': optax.set_to_zero()}, labels)`, labels built by each "
                "`ModelParamTraversal`'s `update` over a tree of `'frozen'` (so unselected leaves "
                'never move, never a chain of `masked`); `create(p, focus=trav)` the same with '
                'one group (`focus=None` is every param, as in legacy; a `focus` that is not a '
                'traversal built in the file, e.g. a parameter that may be None, is flagged and '
                'keeps the file legacy)'),
    Rule('OM009', 'unsafe', family='methods', summary=
         '`opt.replicate()` -> `jax_utils.replicate(opt)`: legacy also averaged the gradients '
         'over the pmap axis inside `apply_gradient`',
         why='The replication converts, but legacy apply_gradient also pmean-ed the gradients '
             'of a replicated optimizer; the step must now do it, so the fix is unsafe and '
             'leaves a TODO.',
         options={'unsafe_fixes': True},
         before=_IMPORT + 'def make(params):\n'
                '  return optim.Momentum(learning_rate=0.1).create(params).replicate()\n',
         after='from flax import jax_utils\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def make(params):\n'
               "  # TODO(optim-migrate): OM009: .replicate() -> jax_utils.replicate(...): legacy also averaged the gradients over pmap axis 'batch' in apply_gradient; add grads = jax.lax.pmean(grads, 'batch') before apply_gradients unless the step already does\n"
               '  return jax_utils.replicate(train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(learning_rate=0.1, momentum=0.9, nesterov=False)))\n',
         readme='`opt.replicate()` → `jax_utils.replicate(opt)`, with a TODO: legacy also '
                '`pmean`-ed the gradients inside `apply_gradient`'),
    Rule('OM010', 'safe', family='methods', summary='`opt.unreplicate()` -> `jax_utils.unreplicate(opt)`',
         why='TrainState has no unreplicate method; flax.jax_utils does it.',
         before=_IMPORT + 'def host(params, grads):\n'
                '  opt = optim.Momentum(learning_rate=0.1).create(params)\n'
                '  return opt.apply_gradient(grads).unreplicate()\n',
         after='from flax import jax_utils\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def host(params, grads):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(learning_rate=0.1, momentum=0.9, nesterov=False))\n'
               '  return jax_utils.unreplicate(opt.apply_gradients(grads=grads))\n',
         readme='`opt.unreplicate()` → `jax_utils.unreplicate(opt)`'),
    Rule('OM011', 'safe', family='methods', summary=
         '`opt.compute_gradient(f)` -> `jax.value_and_grad(f)(opt.params)`; `opt.optimize(f)` '
         '-> that, then `apply_gradients`',
         why='TrainState has neither method; jax.value_and_grad on the params is what they did.',
         before=_IMPORT + 'def step(params, loss_fn):\n'
                '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
                '  loss, grads = opt.compute_gradient(loss_fn)\n'
                '  return opt.apply_gradient(grads), loss\n',
         after='import jax\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def step(params, loss_fn):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  loss, grads = jax.value_and_grad(loss_fn)(opt.params)\n'
               '  return opt.apply_gradients(grads=grads), loss\n',
         readme='`loss, g = opt.compute_gradient(f)` → `jax.value_and_grad(f)(opt.params)`; '
                'three targets → `has_aux=True`; `opt, loss = opt.optimize(f[, '
                'learning_rate=lr])` → that, then `apply_gradients` (two statements)'),
    Rule('OM012', 'safe', family='defs', summary=
         '`opt.optimizer_def.hyper_params.<name>` -> the literal the def was built with',
         why='An Optax transformation keeps no hyper-parameters to read back; legacy per-call '
             'overrides never changed the def\'s values, so the literal is what the read gave. '
             'A name bound to the whole `hyper_params` and read only as each group\'s '
             '`.replace(learning_rate=x)` in `apply_gradient(g, hyper_params=[...])` (l2p\'s '
             'freeze branch) goes with that call\'s conversion (OM002): the line is dropped.',
         before=_IMPORT + 'def make(params):\n'
                '  opt_def = optim.Adam(learning_rate=3e-4)\n'
                '  return opt_def.create(params), opt_def.hyper_params.learning_rate\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  opt_def = optax.adam(learning_rate=3e-4, b1=0.9, b2=0.999, eps=1e-08)\n'
               '  return train_state.TrainState.create(apply_fn=None, params=params, tx=opt_def), 3e-4\n',
         readme='`opt.optimizer_def.hyper_params.<name>` / `opt_def.hyper_params.<name>` → the '
                'literal the def was built with (legacy per-call overrides never changed it); '
                '`hp = opt.optimizer_def.hyper_params` (or `(a_hp, b_hp) = ...`) read only for '
                'the per-group learning rates of apply calls that convert → dropped'),
    Rule('OM013', 'safe', family='restores', summary=
         'restoring an optimizer checkpoint -> `optim_compat.checkpoint.restore_legacy` (legacy '
         'layout converted; a TrainState-layout checkpoint or none yet behaves as '
         'restore_checkpoint)',
         why='A TrainState does not restore from a legacy checkpoint (other field names and '
             'state layout); restore_legacy converts it on the way in.',
         before='from flax import optim\nfrom flax.training import checkpoints\n\n\n'
                'def restore(workdir, params):\n'
                '  opt = optim.Adam(learning_rate=1e-3).create(params)\n'
                '  return checkpoints.restore_checkpoint(workdir, opt)\n',
         after='from flax.training import checkpoints, train_state\n'
               'import optax\n'
               'import optim_compat.checkpoint\n'
               '\n'
               '\n'
               'def restore(workdir, params):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  return optim_compat.checkpoint.restore_legacy(workdir, opt)\n',
         readme='`checkpoints.restore_checkpoint(dir, <optimizer or container>[, step])`, '
                '`serialization.from_state_dict` / `from_bytes` → '
                '`optim_compat.checkpoint.restore_legacy(...)`: legacy checkpoints are '
                'converted, TrainState-layout ones and fresh runs (no checkpoint yet) behave as '
                'before; other arguments (`prefix=`, ...) are flagged; '
                '`checkpoints.save_checkpoint(dir, ...)` → `os.path.abspath(dir)` (orbax, Flax '
                '≥ 0.7, rejects a relative directory), also in a file kept on the shim'),
    Rule('OM014', 'safe', family='fallback', summary=
         'a file that keeps its legacy optimizer code -> `optim_compat.install()` before its '
         'first flax.optim use: it runs on the shim (legacy numerics) on Flax >= 0.6',
         why='A file kept legacy (the TODOs say why) would fail at its first flax.optim import '
             'on Flax >= 0.6; install() points every flax.optim path (imports, submodules, '
             '`flax.optim.X` after `import flax`, import_module strings) at the shim, so the '
             'file runs at once, bitwise to flax.optim 0.5.3 on the same stack, and changes '
             'nothing on Flax <= 0.5.3. Off with --no-shim-fallback (shim-fallback = false).',
         before=_IMPORT + 'def make(params):\n  return optim.Adam(beta1=0.8).create(params)\n',
         after='import optim_compat\n'
               'optim_compat.install()  # optim-migrate OM014: flax.optim is the shim on Flax >= 0.6\n'
               'from flax import optim\n'
               '\n'
               '\n'
               'def make(params):\n'
               '  # TODO(optim-migrate): OM118: Adam has no learning rate and none is passed at apply time in this file; set learning_rate explicitly (this file keeps its legacy optimizer code)\n'
               '  return optim.Adam(beta1=0.8).create(params)\n',
         readme='a file that keeps its legacy optimizer code (any reason; also one whose only '
                '`flax.optim` use is an import it may re-export) gets `import optim_compat` + '
                '`optim_compat.install()` right before its first statement that imports or '
                'names flax.optim: on Flax ≥ 0.6 every `flax.optim` path (`from flax import '
                'optim`, `import flax.optim as X`, `from flax.optim.adam import '
                '_AdamParamState`, `flax.optim.Adam` after `import flax`, '
                '`importlib.import_module("flax.optim")`, ...) then gives the shim\'s module of '
                'the same name (the legacy numerics), on Flax ≤ 0.5.3 nothing changes; names and '
                'TODOs stay as they are (`--no-shim-fallback` or `shim-fallback = false`: the '
                'TODOs only). One report entry per file'),
    Rule('OM015', 'safe', family='references', summary=
         '`isinstance(x, (optim.Optimizer, train_state.TrainState))` -> '
         '`isinstance(x, train_state.TrainState)`; `if isinstance(x, optim.Optimizer): ... '
         'else: <rest>` -> `<rest>`',
         why='Code written to take both a flax.optim Optimizer and a TrainState (alpa\'s '
             '`auto_donate_argnums`) names a class Flax >= 0.6 no longer has; after the rewrite '
             'the optimizers this run converts are TrainStates and take the branch already '
             'written for them. An Optimizer other code still hands in (one kept on the shim) '
             'no longer matches: the report says so at each site.',
         before='import flax\nfrom flax.training import train_state\n\n\n'
                'def donate(x):\n'
                '  return isinstance(x, (flax.optim.Optimizer, train_state.TrainState))\n',
         after='import flax\nfrom flax.training import train_state\n\n\n'
               'def donate(x):\n'
               '  return isinstance(x, train_state.TrainState)\n',
         readme='`isinstance(x, (optim.Optimizer, train_state.TrainState))` (code that takes '
                'both) → `isinstance(x, train_state.TrainState)`; also `issubclass`; '
                '`if isinstance(x, optim.Optimizer): <legacy> else: <rest>` → `<rest>` (with no '
                'else, the `if` goes where its block keeps other statements)'),
    Rule('OM016', 'safe', family='defs', summary=
         '`d = cfg.get(key, optim.Adam(lr))` then `d.create(p)`: the default def converts, '
         '`.create` takes `d` as its `tx`',
         why='A def a caller may override through a mapping (site-selection-tool\'s '
             '`optimization_params.get(\'optimizer\', optim.Adam(learning_rate))`) is used only '
             'by `.create`: the default becomes its Optax transformation and the create a '
             'TrainState. A value callers put under that key must be an Optax transformation '
             'now; the report says so at each site.',
         before=_IMPORT + 'def fit(params, cfg):\n'
                '  opt = cfg.get(\'optimizer\', optim.Adam(0.1))\n'
                '  opt = opt.create(params)\n'
                '  return opt\n',
         after='import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def fit(params, cfg):\n'
               '  opt = cfg.get(\'optimizer\', optax.adam(learning_rate=0.1, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=opt)\n'
               '  return opt\n',
         readme='`d = cfg.get(key, optim.Adam(lr))` later `.create`d: the default def converts '
                'in place, the create takes `tx=d` (a value callers put under the key must be '
                'an Optax transformation now; the report says so)'),
    Rule('OM017', 'safe', family='attributes', summary=
         '`opt.state...` only read (`jax.tree_util.tree_leaves(opt.state.param_states)`) -> '
         '`optim_compat.legacy_state(opt, <def>).…`, `opt.state_dict()` -> '
         '`optim_compat.legacy_state_dict(opt, <def>)`: the legacy view of the TrainState\'s '
         'state',
         why='State surgery that only reads the legacy state (alpa\'s sharding checks over '
             '`optimizer.state.param_states`) gets the legacy view of the TrainState\'s '
             '`opt_state`: the same tree flax.optim kept, mapped from the Optax state as the '
             'checkpoint converter maps it (bitwise). Only where the read goes straight into '
             'a call that does not mutate it (tree_leaves, tree_map, np.asarray, print, ...) '
             'and every def of the file is one table def (the view\'s layout: arguments that '
             'are not literals are left out, as the layout does not depend on them; '
             'Adafactor\'s does, so it needs literal ones). State written back '
             '(`opt.replace(state=reset(opt.state, ...))`: hypernerf zeroes the Adam moments of '
             'a sub-tree; a skip branch advances only `state.step`) becomes '
             '`optim_compat.with_legacy_state(opt, ..., <def>)`, the reads inside it the view, '
             'and the legacy state classes the file builds (`OptimizerState`, '
             '`adam._AdamParamState`) the shim\'s; elsewhere writes stay OM103. `opt.state_dict()` (jax3d\'s nesf logs a histogram of each of its '
             'leaves) is a fresh tree in flax.optim too: it becomes the legacy state dict, '
             '`target` and `state` with `step` and `param_states`, bitwise the shim\'s.',
         before='import jax\n' + _IMPORT + 'def moments(params, grads):\n'
                '  opt = optim.Adam(0.01).create(params)\n'
                '  opt = opt.apply_gradient(grads)\n'
                '  return jax.tree_util.tree_leaves(opt.state.param_states)\n',
         after='import jax\n'
               'import optax\n'
               'import optim_compat\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def moments(params, grads):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  opt = opt.apply_gradients(grads=grads)\n'
               '  return jax.tree_util.tree_leaves(optim_compat.legacy_state(opt, optim_compat.Adam(0.01)).param_states)\n',
         readme='`opt.state...` only read by a call that does not mutate it (`tree_leaves`, '
                '`tree_map`, `np.asarray`, `print`, ...) → `optim_compat.legacy_state(opt, '
                '<the file\'s def>)...`, the legacy view; `opt.state_dict()` → '
                '`optim_compat.legacy_state_dict(opt, <def>)`; `opt.replace(state=s)` → '
                '`optim_compat.with_legacy_state(opt, s, <def>)`, the state classes the file '
                'builds → the shim\'s (one table def in the file; its '
                'arguments, where not literals, left out: the view reads only the layout, '
                'which for Adafactor needs literal ones); a file with no def (the optimizer '
                'comes from another module, hypernerf\'s training.py) gets the calls without '
                'the def, the layout read off the opt_state\'s Optax classes at run time '
                '(`optim_compat.legacy_view.inferred_def`), where the receiver is stepped by '
                'a converted `apply_gradient` in the same function and the file names no '
                '`MultiOptimizer` and no `focus=` (groups need the def)'),
    Rule('OM018', 'safe', family='attributes', summary=
         '`pickle.dump(opt, f)` of a converted optimizer -> `pickle.dump(opt.replace(tx=None), '
         'f)`: a TrainState\'s tx does not pickle',
         why='A legacy Optimizer pickles (jax3d\'s mobilenerf stages pickle '
             '`unreplicate(state)` every 10k steps); a TrainState does not: its `tx` is an Optax '
             'transformation of closures (AttributeError: Can\'t pickle local object). The '
             'pickle keeps step, params and opt_state and drops `tx`, which the code that '
             'made it can give back. A name the file also binds to `pickle.load(...)` is taken '
             'as such a TrainState when each of its uses reads `.target` / `.state.step` or '
             'pickles it again; one that is stepped or handed on stays flagged (OM117): a '
             'loaded TrainState has no tx to step with. A pickle the legacy code wrote loads '
             'only with flax.optim (or `optim_compat.install()`), as an Optimizer.',
         before='import pickle\n' + _IMPORT + 'def save(params, path):\n'
                '  opt = optim.Adam(0.01).create(params)\n'
                '  pickle.dump(opt, open(path, \'wb\'))\n'
                '  loaded = pickle.load(open(path, \'rb\'))\n'
                '  return loaded.target\n',
         after='import pickle\n'
               'import optax\n'
               'from flax.training import train_state\n'
               '\n'
               '\n'
               'def save(params, path):\n'
               '  opt = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-08))\n'
               '  pickle.dump(opt.replace(tx=None), open(path, \'wb\'))\n'
               '  loaded = pickle.load(open(path, \'rb\'))\n'
               '  return loaded.params\n',
         readme='`pickle.dump(opt, f)` of a converted optimizer (or of `unreplicate(opt)`) → '
                '`pickle.dump(opt.replace(tx=None), f)`; a name also bound to `pickle.load(...)` '
                'and only read for `.target` / `.state.step` or pickled is that TrainState'),
)
