"""The command line: the typer app (:mod:`kvplan.cli.app`: ``estimate``, ``models``, ``gpus`` and the
registration of every other command), one thin module per further command (:mod:`kvplan.cli.commands`),
the shared option declarations (:mod:`kvplan.cli.options`) and the one mapping of errors to messages and
exit codes (:mod:`kvplan.cli.errors`). Each command loads, computes, renders.

May import: anything in kvplan
"""
