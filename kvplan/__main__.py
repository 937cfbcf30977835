"""``python -m kvplan``: the same command line as the ``kvplan`` entry point.

May import: kvplan.cli
"""

from kvplan.cli.entry import main

if __name__ == "__main__":
    main()
