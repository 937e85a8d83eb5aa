"""The one base of every error a user acts on (a leaf module: anything may import it).

Guarantees: :func:`rstar2.cli.main` catches :class:`UserError` alone and prints
``rstar2: KIND: MESSAGE`` on one line and exits ``exit_code`` (2 for input the user can fix
before anything runs, 1 for a run that stopped for a reason it names), never a traceback. A
subclass sets ``kind`` and ``exit_code``; ``key`` names the config key or input concerned
where there is one.
"""

from __future__ import annotations

from typing import ClassVar


class UserError(Exception):
    """An error the user acts on; the message is one line and safe to print as it is."""

    kind: ClassVar[str] = "error"
    exit_code: ClassVar[int] = 2
    key: str = ""
