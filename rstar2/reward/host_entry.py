"""The reward host's entry point: ``python -m rstar2.reward.host_entry READ_FD WRITE_FD``.

A module of its own because ``rstar2.reward`` imports :mod:`rstar2.reward.host`: run as
``-m rstar2.reward.host`` it would be executed a second time as ``__main__`` (runpy warns, on
the user's console, of unpredictable behaviour). This module's body is guarded, so the pool's
forkserver children, which re-import the parent's ``__main__``, run nothing from it.
"""

import sys

if __name__ == "__main__":
    from rstar2.reward.host import main

    main(sys.argv[1:])
