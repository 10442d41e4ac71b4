"""codemod.positions.StatementPositions gives LibCST's PositionProvider ranges, node for node."""
import pathlib

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

from codemod.positions import StatementPositions

FIXTURES = pathlib.Path(__file__).parent / 'fixtures'
SOURCES = sorted(FIXTURES.rglob('*.py'))

ODD = {
    'comments_first': '# a header comment\n\n"""doc"""\nimport jax  # trailing\n\n\n# above\ndef f(x):\n'
                      '    return jax.tree_map(lambda a: a,\n                        x)\n# footer\n',
    'no_trailing_newline': 'x = 1\ny = [\n  2,\n]',
    'semicolons_and_tabs': 'a = 1; b = 2\nif a:\n\tc = (a +\n\t     b)\nelse:\n\tpass\n',
    'crlf': 'import os\r\n\r\ndef g():\r\n  return os.sep\r\n',
    'continuations': 'x = 1 + \\\n    2\nclass C(\n    object):\n  y = """\nlong\n"""\n',
}


def _all_nodes(module):
  found = []

  class Collect(cst.CSTVisitor):
    def on_visit(self, node):
      found.append(node)
      return True
  module.visit(Collect())
  return found


@pytest.mark.parametrize('text', [*map(lambda p: p.read_text(), SOURCES), *ODD.values()],
                         ids=[*(p.relative_to(FIXTURES).as_posix() for p in SOURCES), *ODD])
def test_the_same_ranges_as_the_provider(text):
  try:
    module = cst.parse_module(text)
  except cst.ParserSyntaxError:
    pytest.skip('a fixture that does not parse on purpose')
  expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
  positions = StatementPositions(module)
  for node in _all_nodes(module)[1:]:  # (the module itself is no statement's)
    assert positions.get(node) == expected[node], type(node).__name__


def test_a_hint_and_a_miss():
  module = cst.parse_module('import jax\n\n\ndef f(x):\n  return jax.tree_map(g, x)\n')
  call = module.body[1].body.body[0].body[0].value
  positions = StatementPositions(module)
  assert positions.get(call, hint=1).start.line == 5
  assert positions.get(module.body[0].body[0], hint=1).start.line == 1  # not in the hint: searched
  assert positions.get(cst.Name('elsewhere'), 'none') == 'none'
