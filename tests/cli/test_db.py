"""``kale db upgrade``, ``kale db current`` and ``kale db check``: on KALE_DATABASE_URL (or
``--url``), from kale-airflow 0.1.0's database and from nothing; PostgreSQL components refuse
a database that is behind until ``kale db upgrade`` ran."""

import pytest

from kale_airflow.cli.main import main
from kale_airflow.store import SchemaUpgradeRequired, StateStore
from kale_airflow.store.database import forget_databases
from tests.store.legacy import NEW, make_v1_database


def kale(capsys, *argv) -> tuple[int, str]:
    code = main(["db", *argv])
    return code, capsys.readouterr().out.strip()


def test_upgrade_from_0_1_0_then_check_and_current(db_url, capsys, monkeypatch):
    monkeypatch.delenv("KALE_DB_AUTO_UPGRADE", raising=False)
    monkeypatch.setenv("KALE_DATABASE_URL", db_url)
    make_v1_database(db_url)
    code, out = kale(capsys, "check")
    assert code == 1 and "schema_version 1" in out and "not revision 0003: run kale db upgrade" in out
    code, out = kale(capsys, "current")
    assert code == 0 and "this kale-airflow needs revision 0003" in out
    if db_url.startswith("postgresql"):  # no auto-upgrade: the components wait for the command
        with pytest.raises(SchemaUpgradeRequired, match="kale db upgrade"):
            StateStore(db_url)
    code, out = kale(capsys, "upgrade")
    assert code == 0 and "upgraded from schema_version 1" in out and out.endswith("to revision 0003 (head)")
    assert kale(capsys, "check")[0] == 0
    assert kale(capsys, "upgrade")[1].endswith("already at revision 0003 (head)")
    forget_databases()
    assert StateStore(db_url).current()["generation"] == NEW  # the rows are still there


def test_an_empty_database_is_created_at_the_head_by_upgrade(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert kale(capsys, "check", "--url", url) == (1, f"{url}: no database ({tmp_path / 'new.db'} does not exist); "
                                                      "`kale db upgrade` creates it at revision 0003")
    assert not (tmp_path / "new.db").exists()  # check only reads
    assert kale(capsys, "upgrade", "--url", url) == (0, f"{url}: upgraded from empty to revision 0003 (head)")
    assert kale(capsys, "check", "--url", url) == (0, f"{url}: revision 0003 (head)")


def test_an_unreachable_database_is_named_without_its_password(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["db", "upgrade", "--url", f"postgresql://kale:s3cret-pw@127.0.0.1:{port}/kale"]) == 2
    err = capsys.readouterr().err
    assert f"kale:***@127.0.0.1:{port}/kale" in err and "s3cret-pw" not in err and "server is running" in err
