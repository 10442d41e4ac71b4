"""Sphinx configuration of the flax-optim-migrate docs (Sphinx + MyST, as flax and optax).

Build (the command the README gives; also run by tests/test_docs.py):

    pip install -e '.[docs]'
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Warnings are errors. No network: no intersphinx, the theme is Sphinx's own alabaster.
The reference pages under docs/rules/ and docs/optimizers/ (and docs/_generated/) are
written at every build by docs/_gen/ from the rule table and the migration table; they are
git-ignored, never edited by hand.
"""
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))               # docs/_gen
sys.path.insert(0, str(DOCS.parent))        # the packages, also without an install

project = 'flax-optim-migrate'
author = 'flax-optim-migrate contributors'
copyright = 'flax-optim-migrate contributors'

extensions = ['myst_parser', '_gen.ext']
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
exclude_patterns = ['_build', '_gen', '_generated', 'README.md', '.venv']
myst_heading_anchors = 3
myst_enable_extensions = ['colon_fence']

html_theme = 'alabaster'
html_title = 'flax-optim-migrate'
html_theme_options = {
    'description': 'Move JAX code off flax.optim onto Optax + TrainState, and prove it.',
    'page_width': '1100px',
    'sidebar_width': '240px',
    'fixed_sidebar': True,
}
html_static_path = []
html_copy_source = False
html_show_sourcelink = False
pygments_style = 'sphinx'
nitpicky = False
