"""The one exception minispec raises for bad input.

Every message names the file, field or parameter at fault and what was expected, so a user can act
on it.
"""


class MinispecError(Exception):
    """Bad input to minispec: a file, a config field or a parameter not as it was expected."""
