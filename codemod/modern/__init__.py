"""The ``OM2xx`` rule family: JAX / Flax APIs removed beside ``flax.optim``.

``codemod.modern.table`` holds the knowledge as data (old qualified name, new
form, kind of rewrite, safety, facts); ``codemod.modern.rewrite`` is its own
LibCST pass, run by the engine after the ``OM0xx`` / ``OM1xx`` pass on every
file that passes the table's text prefilter (``rewrite.may_apply``); its fixes
are one mixin module per family (``imports``, ``drops``, ``references``,
``arrays``, ``linen``) over ``base`` (with ``facts`` and ``helpers``). Kept free
of imports here so that ``codemod.rules`` can read the table without a cycle.
"""
