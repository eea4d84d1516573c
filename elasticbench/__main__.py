"""`python -m elasticbench` runs the command line."""

from .cli import main

main()
