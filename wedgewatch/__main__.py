"""`python -m wedgewatch` is the same as the `wedgewatch` command."""

from wedgewatch.entry import main

main()
