"""codemod: rewrite legacy ``flax.optim`` code to Optax + ``TrainState`` (LibCST).

``codemod.engine.rewrite_source`` / ``rewrite_file`` do one file; the
``optim-migrate rewrite`` command (``codemod.cli``) does a repository.
"""
from codemod.engine import FileResult, rewrite_file, rewrite_source

__all__ = ['FileResult', 'rewrite_file', 'rewrite_source']
