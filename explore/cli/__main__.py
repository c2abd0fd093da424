"""``python -m explore.cli``: the ``explore`` command."""

from explore.cli import main

if __name__ == "__main__":
    main()
