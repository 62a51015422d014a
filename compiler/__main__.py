"""``python -m compiler``: the command line (:mod:`compiler.cli`)."""

from compiler.cli import main

main()
