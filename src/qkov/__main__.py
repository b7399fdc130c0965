"""``python -m qkov``: the ``qkov`` command (what ``torchrun ... -m qkov train ...`` runs)."""

from qkov.cli import main

main()
