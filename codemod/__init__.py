"""codemod: rewrite legacy ``flax.optim`` code to Optax + ``TrainState`` (LibCST).

``codemod.engine.rewrite_source`` / ``rewrite_file`` do one file; the
``optim-migrate rewrite`` command (``codemod.cli``) does a repository. How a file
goes through the codemod: ``docs/architecture.md``.
"""
__all__ = ['FileResult', 'rewrite_file', 'rewrite_source']


def __getattr__(name: str):
  # the engine loads at first use, so that importing a submodule (codemod.legacy_api, the
  # rule catalog) does not load the whole codemod
  if name == 'FileResult':  # (no engine needed: codemod.result)
    from codemod.result import FileResult
    return FileResult
  if name in __all__:
    from codemod import engine
    return getattr(engine, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
