"""Generators of the docs' reference pages (run by ``docs/conf.py`` at every build).

Nothing they write is committed (``docs/rules/``, ``docs/optimizers/`` and
``docs/_generated/`` are git-ignored): the pages are rebuilt from the rule table
(``codemod.rules.RULES``), the migration table (``optim_compat.spec.SPECS``) and the
command line parsers at every build, so they cannot drift from the code.
"""
