"""The codemod as a LibCST command (``python -m libcst.tool codemod command.MigrateCommand``)."""
from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext

from codemod.plan import make_plan
from codemod.rewrite import apply_plan
from codemod.rules import Options


class MigrateCommand(CodemodCommand):
  """LibCST codemod: legacy flax.optim -> Optax + flax.training.train_state."""

  DESCRIPTION = __doc__

  def __init__(self, context: CodemodContext, options: Optional[Options] = None, flow=None):
    super().__init__(context)
    self.options = options or Options()
    self.flow = flow
    self.findings: list = []
    self.plan = None

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    from codemod import facts
    analysis = facts.analyze(tree, None, self.flow)
    self.plan = make_plan(analysis, self.options)
    self.findings = self.plan.findings
    if self.plan.verdict == 'untouched':
      return tree
    return apply_plan(analysis, self.plan, self.context)
