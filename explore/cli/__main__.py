"""``python -m explore.cli``: the ``explore`` command."""

from explore.cli import entry

if __name__ == "__main__":
    entry()
