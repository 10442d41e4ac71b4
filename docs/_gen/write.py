"""Write generated pages: only files whose text changed, and remove stale ones."""
from __future__ import annotations

import pathlib


def sync(folder: pathlib.Path, pages: dict[str, str]) -> list[str]:
  """Make ``folder`` hold exactly ``pages`` (file name -> text) among its ``*.md`` files.

  A file whose text is unchanged is not rewritten (Sphinx then keeps its cached
  doctree); a ``*.md`` file not in ``pages`` (a rule or optimizer that is gone) is
  deleted. Returns the names written.
  """
  folder.mkdir(parents=True, exist_ok=True)
  written = []
  for name, text in pages.items():
    path = folder / name
    if not path.is_file() or path.read_text(encoding='utf-8') != text:
      path.write_text(text, encoding='utf-8')
      written.append(name)
  for path in folder.glob('*.md'):
    if path.name not in pages:
      path.unlink()
  return written
