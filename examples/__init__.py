"""The bundled example of ``optim-migrate demo``, installed as the package ``optim_migrate_examples``.

``legacy/train_digits.py`` uses flax.optim; ``migrated/train_digits.py`` is the codemod's output
for it. They are programs to run (``python legacy/train_digits.py --steps N --out FILE.json``),
not modules to import.
"""
