"""The bundled example: migrated output is current, and both versions train alike."""
import pathlib

from codemod import demo, engine

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / 'examples'


def test_migrated_example_is_current_codemod_output():
  result = engine.rewrite_file(EXAMPLES / 'legacy' / 'train_digits.py')
  assert result.error is None and not result.manual
  assert result.new == (EXAMPLES / 'migrated' / 'train_digits.py').read_text()


def test_legacy_through_shim_and_migrated_have_bitwise_equal_losses():
  legacy, migrated = demo.run_pair(EXAMPLES, steps=40, devices=2)
  assert legacy['devices'] == migrated['devices'] == 2
  assert len(legacy['losses']) == 40
  assert legacy['losses'] == migrated['losses']
  assert legacy['losses'][-1] < 0.5 * legacy['losses'][0]
  assert legacy['final_step'] == migrated['final_step'] == 40
