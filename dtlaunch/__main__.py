"""``python -m dtlaunch`` is the ``dtlaunch`` command."""

from dtlaunch.cli import main

if __name__ == "__main__":  # importing this module (a test walking the package) runs nothing
    main()
