"""Errors a user can cause and fix.

`InputError` is raised at the edge, before anything reaches JAX, whenever a file, record, field or
config value is wrong. Its message is one paragraph naming where the problem is and what to change.
The command line turns it into exit code 2; anything else is a bug (exit code 1).
"""


class InputError(ValueError):
    """Bad input (file, record, field or config value). The message names the place."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if key is not None:
            where.append(f"'{key}'")
        prefix = (": ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.path = path
        self.key = key
