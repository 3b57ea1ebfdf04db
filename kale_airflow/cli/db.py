"""``kale db``: the control-plane database's schema (``upgrade``, ``current``, ``check``).

They work on ``KALE_DATABASE_URL`` (else the embedded SQLite file under ``KALE_HOME``), or
``--url``; ``current`` and ``check`` only read (a SQLite file that does not exist is
reported, not created). ``upgrade`` is the deliberate step before a new kale-airflow rolls out on
PostgreSQL (where components refuse a database that is behind unless
``KALE_DB_AUTO_UPGRADE=1``); it creates an empty database at the head revision, recognises
a kale-airflow 0.1.0 database (``schema_version`` 1) and keeps every row.
"""

from __future__ import annotations

import argparse

EXIT_BEHIND = 1


def _url(args: argparse.Namespace) -> str:
    from kale_airflow.config import settings

    return args.url or settings().database_url


def _database(args: argparse.Namespace):
    from kale_airflow.store import Database

    return Database(_url(args), prepare=False)


def _no_file(args: argparse.Namespace) -> str | None:
    """For ``current``/``check``, which only read: the line to print when the SQLite file does
    not exist (opening it would create it and its folder), else None."""
    from kale_airflow.cli.readonly import sqlite_file
    from kale_airflow.store import masked
    from kale_airflow.store.schema import HEAD_REVISION

    path = sqlite_file(_url(args))
    if path is None or path.exists():
        return None
    return (f"{masked(_url(args))}: no database ({path} does not exist); `kale db upgrade` creates it at revision "
            f"{HEAD_REVISION}")


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Create or upgrade the schema to the head revision; print from where to where."""
    from kale_airflow.store import masked, migrate

    db = _database(args)
    try:
        before, after = migrate.upgrade(db)
    finally:
        db.dispose()
    if before.describe() == after.describe():
        print(f"{masked(db.url)}: already at {after.describe()}")
    else:
        print(f"{masked(db.url)}: upgraded from {before.describe()} to {after.describe()}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    """Print where the database stands and the head this kale-airflow needs."""
    from kale_airflow.store import masked, migrate
    from kale_airflow.store.schema import HEAD_REVISION

    missing = _no_file(args)
    if missing:
        print(missing)
        return 0
    db = _database(args)
    try:
        state = migrate.current(db)
    finally:
        db.dispose()
    note = "" if state.at_head else f"; this kale-airflow needs revision {HEAD_REVISION}: run kale db upgrade"
    print(f"{masked(db.url)}: {state.describe()}{note}")
    return 0


def cmd_db_check(args: argparse.Namespace) -> int:
    """Exit 0 when the database is at the head revision, 1 when it is behind or empty."""
    from kale_airflow.store import masked, migrate
    from kale_airflow.store.schema import HEAD_REVISION

    missing = _no_file(args)
    if missing:
        print(missing)
        return EXIT_BEHIND
    db = _database(args)
    try:
        state = migrate.current(db)
    finally:
        db.dispose()
    if state.at_head:
        print(f"{masked(db.url)}: {state.describe()}")
        return 0
    print(f"{masked(db.url)}: {state.describe()}, not revision {HEAD_REVISION}: run kale db upgrade")
    return EXIT_BEHIND


def add_db(sub) -> None:
    """Register ``kale db`` and its subcommands."""
    db = sub.add_parser("db", help="the control-plane database's schema: upgrade, current, check",
                        description=__doc__.split("\n\n", 1)[1].replace("``", "").replace("%", "%%"))
    commands = db.add_subparsers(dest="db_command", required=True)
    for name, func, text in (
            ("upgrade", cmd_db_upgrade, "create or upgrade the schema to this kale-airflow's revision, rows kept"),
            ("current", cmd_db_current, "print the database's schema revision and the one this kale-airflow needs"),
            ("check", cmd_db_check, "exit 0 if the schema is at this kale-airflow's revision, 1 if not")):
        cmd = commands.add_parser(name, help=text, description=text)
        cmd.add_argument("--url", help="the database (default: KALE_DATABASE_URL, else the embedded SQLite file)")
        cmd.set_defaults(func=func)
