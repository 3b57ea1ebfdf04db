"""ScaleWorkersOperator's retries: a try that applied its decision and then failed leaves the
next try the generation to start, until a training run has started it."""

import pytest
from sqlalchemy import exc

from kale_airflow.operators.scale import ScaleWorkersOperator
from kale_airflow.store import StateStore

DECISION = {"status": "scale", "current": 0, "current_generation": None, "workers": 2,
            "reason": "scale_up_forecast", "message": "first start"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    monkeypatch.delenv("KALE_DATABASE_URL", raising=False)
    return tmp_path


def test_a_retry_after_the_reply_was_lost_returns_the_generation_to_start(home, monkeypatch):
    """Bug class: the retry answering ``skip`` (``start_generation`` skipped, the old workers
    stopped by the new generation's name: nothing trains while the control plane says 2)."""
    real = StateStore.apply_generation

    def applied_then_lost(self, *args, **kwargs):
        real(self, *args, **kwargs)  # committed...
        raise exc.OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))

    op = ScaleWorkersOperator(task_id="scale_workers", decision=DECISION, shadow=False)
    monkeypatch.setattr(StateStore, "apply_generation", applied_then_lost)
    with pytest.raises(exc.OperationalError):
        op.execute({"run_id": "manual__1"})  # ...and the reply lost: Airflow retries the task
    monkeypatch.setattr(StateStore, "apply_generation", real)
    retry = op.execute({"run_id": "manual__1"})
    assert retry["skip"] is False and retry["generation"] == "g000001-2w" and retry["workers"] == 2
    store = StateStore(home / "kale.db")
    assert store.current_generation() == "g000001-2w"
    store.claim_generation("g000001-2w", "manual__1__g000001-2w")  # the training run started its workers
    assert op.execute({"run_id": "manual__1"})["skip"] is True


def test_a_database_that_is_behind_fails_the_task_at_once_naming_the_upgrade(home, monkeypatch):
    """Bug class: retries spent on a schema only ``kale db upgrade`` can fix."""
    from airflow.sdk.exceptions import AirflowFailException

    from tests.store.legacy import make_v1_database

    monkeypatch.setenv("KALE_DB_AUTO_UPGRADE", "0")
    make_v1_database(f"sqlite:///{home / 'kale.db'}")
    op = ScaleWorkersOperator(task_id="scale_workers", decision=DECISION, shadow=False)
    with pytest.raises(AirflowFailException, match=r"SchemaUpgradeRequired: .*run `kale db upgrade`"):
        op.execute({"run_id": "manual__1"})
