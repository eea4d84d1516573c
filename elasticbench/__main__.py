"""`python -m elasticbench` runs the command line."""

from .harness.cli import entry

if __name__ == "__main__":
    entry()
