"""`python -m wedgewatch` is the same as the `wedgewatch` command."""

from wedgewatch.cli import main

main()
