"""One error family: every error kale-airflow raises on purpose is a :class:`KaleError`.

Each specific error also subclasses the builtin that fits (``ValueError`` for bad input,
``RuntimeError`` for a dependency that cannot answer), so callers can catch either.
Messages name the problem and what to do about it.
"""


class KaleError(Exception):
    """Base of kale-airflow's own errors."""
