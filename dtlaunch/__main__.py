"""``python -m dtlaunch`` is the ``dtlaunch`` command."""

from dtlaunch.cli import main

main()
