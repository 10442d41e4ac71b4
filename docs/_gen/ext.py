"""Sphinx extension: write the generated pages before Sphinx reads the sources."""
from __future__ import annotations

import pathlib

from _gen import cli, optimizers, rules


def generate(app) -> None:
  docs = pathlib.Path(app.srcdir)
  for module in (rules, optimizers, cli):
    module.generate(docs)


def setup(app):
  app.connect('builder-inited', generate)
  return {'parallel_read_safe': True, 'parallel_write_safe': True}
