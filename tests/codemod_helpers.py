"""Helpers shared by the codemod tests."""


def kept_lines(text: str) -> str:
  """``text`` without the lines a run adds to a file it keeps legacy: its TODOs and the shim
  fallback (``import optim_compat`` / ``optim_compat.install()``, OM014)."""
  return ''.join(line for line in text.splitlines(keepends=True)
                 if not line.lstrip().startswith('# TODO(optim-migrate): ')
                 and not line.startswith('optim_compat.install()  # optim-migrate OM014')
                 and line != 'import optim_compat\n')
