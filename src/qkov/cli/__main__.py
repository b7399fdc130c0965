"""``python -m qkov.cli``: the ``qkov`` command."""

from qkov.cli import main

main()
