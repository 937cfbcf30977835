"""The command line: the typer app (:mod:`kvplan.cli.app`: ``estimate``, ``models``, ``gpus`` and the
registration of every other command), one thin module per further command (:mod:`kvplan.cli.commands`),
the shared option declarations (:mod:`kvplan.cli.options`) and the one mapping of errors to messages and
exit codes (:mod:`kvplan.cli.errors`). Each command loads, computes, renders. The console entry point
(:mod:`kvplan.cli.entry`) runs a plain ``kvplan estimate`` line without typer (:mod:`kvplan.cli.flags` reads
it as typer would; :mod:`kvplan.cli.estimate` is the command's one body) and hands any other line to the app.

May import: anything in kvplan
"""
