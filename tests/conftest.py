import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')


@pytest.fixture(scope='session')
def legacy_python():
  """The old-stack interpreter (real flax.optim 0.5.3), built on first use.

  Never skipped: if the environment cannot be built the tests using it fail.
  """
  from equivalence_tests import legacy_env
  return str(legacy_env.ensure())


@pytest.fixture(autouse=True)
def _own_rewrite_cache(tmp_path_factory, monkeypatch):
  """Each test's ``rewrite`` runs (in process and in subprocesses) use a cache directory of
  their own (codemod.cache): none in the home directory, none shared between tests."""
  monkeypatch.setenv('OPTIM_MIGRATE_CACHE_DIR', str(tmp_path_factory.mktemp('rewrite-cache')))
