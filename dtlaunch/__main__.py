"""``python -m dtlaunch`` (and the ``dtlaunch`` script) is the ``dtlaunch`` command."""

import sys


def main() -> None:
    """The CLI, imported here so that a Ctrl-C while it loads ends with a line
    that says so, not a traceback of whatever module was loading."""
    try:
        from dtlaunch.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        print("dtlaunch: interrupted; nothing was left running", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":  # importing this module (a test walking the package) runs nothing
    main()
