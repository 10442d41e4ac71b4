"""``optim-migrate rule``: what a rule does, why, and an example (as ``ruff rule`` does).

    optim-migrate rule OM003        # one rule
    optim-migrate rule OM1          # every rule the prefix selects
    optim-migrate rule --all        # every rule
"""
from __future__ import annotations

import sys

from codemod.rules import RULES

EXIT_OK, EXIT_ERROR = 0, 2


def cmd_rule(args) -> int:
  """Print the catalog entries asked for (Markdown). Exit 2 for an id that names no rule."""
  if args.all == bool(args.rule):
    print('rule: name a rule id or prefix (e.g. OM003, OM1), or give --all', file=sys.stderr)
    return EXIT_ERROR
  if args.all:
    chosen = list(RULES.values())
  else:
    chosen = [r for rule_id, r in RULES.items() if rule_id.startswith(args.rule.upper())]
    if not chosen:
      print(f'rule: {args.rule!r} names no rule; valid: {", ".join(RULES)}', file=sys.stderr)
      return EXIT_ERROR
  print('\n'.join(rule.describe() for rule in chosen), end='')
  return EXIT_OK


def register(sub) -> None:
  """Add ``rule`` to the CLI's subcommands."""
  p = sub.add_parser('rule', help="explain a rule: what it does, why, an example (as 'ruff rule')")
  p.add_argument('rule', nargs='?', help='a rule id or prefix (OM003, OM1)')
  p.add_argument('--all', action='store_true', help='every rule')
  p.set_defaults(func=cmd_rule)
