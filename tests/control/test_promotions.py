"""Announced promotions: the autoscaler asks the registry for the champion aliases only when a
promotion was announced (or every RECHECK_S), not on every poke, and reloads then."""

import pytest

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.control.autoscaler import Autoscaler
from kale_airflow.control.promotions import (
    PROMOTION_KEY,
    RECHECK_S,
    AnnouncedChampions,
    ManualApprovals,
    announce,
    unchecked,
)
from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, THROUGHPUT_MODEL, RegistryUnavailable
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.control.test_autoscaler import NOW, FakeChampions


class CountingChampions(FakeChampions):
    """The MLflow registry's stand-in, counting the alias lookups it answers."""

    asks = 0

    def versions(self):
        self.asks += 1
        return super().versions()


@pytest.fixture
def setup(tmp_path):
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    store, mlflow, clock = StateStore(url), CountingChampions(), [0.0]
    dep = Deployment(stream_url=f"sqlite:///{tmp_path / 'stream.db'}", poll_interval_s=15, bin_s=60, max_workers=16)
    cfg = Config(Settings(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", database=url), dep)
    auto = Autoscaler(cfg, stream=EmbeddedStream(tmp_path / "stream.db", partitions=4), store=store,
                      registry=AnnouncedChampions(mlflow, store, clock=lambda: clock[0]), pods=list)
    return auto, store, mlflow, clock


def test_the_autoscaler_reloads_on_an_announced_promotion_without_polling_the_alias(setup):
    auto, store, mlflow, clock = setup
    auto.poke(NOW)
    auto.poke(NOW + 15)
    assert (mlflow.asks, mlflow.loads, auto.versions) == (1, 1, ("1", "1"))  # the second poke asked nothing
    mlflow.current = ("2", "1")  # the alias moved, but nobody announced it yet
    clock[0] = 60.0
    auto.poke(NOW + 30)
    assert (mlflow.asks, auto.versions) == (1, ("1", "1"))
    announce(store, {"promoted": True, "version": "2"}, FORECASTER_MODEL)  # the retrain's announce_champion
    auto.poke(NOW + 45)
    assert (mlflow.asks, mlflow.loads, auto.versions) == (2, 2, ("2", "1"))  # reloaded at the next poke
    auto.poke(NOW + 60)
    assert mlflow.asks == 2


def test_an_alias_moved_by_hand_is_picked_up_at_the_periodic_check(setup):
    auto, _, mlflow, clock = setup
    auto.poke(NOW)
    mlflow.current = ("1", "4")  # a reviewer moved the champion alias in the MLflow UI: no task announces it
    clock[0] = RECHECK_S - 1
    auto.poke(NOW + 15)
    assert auto.versions == ("1", "1")
    clock[0] = RECHECK_S
    auto.poke(NOW + 30)
    assert (mlflow.asks, mlflow.loads, auto.versions) == (2, 2, ("1", "4"))


def test_an_announcement_is_not_lost_when_the_registry_is_down_at_that_poke(setup):
    auto, store, mlflow, _ = setup
    auto.poke(NOW)
    mlflow.current, mlflow.down = ("1", "2"), RegistryUnavailable("MLflow down")
    announce(store, {"promoted": True, "version": "2"}, THROUGHPUT_MODEL)
    auto.poke(NOW + 15)
    assert auto.versions == ("1", "1") and auto.model_error == "MLflow down"  # still deciding with the cache
    mlflow.down = None
    auto.poke(NOW + 30)
    assert auto.versions == ("1", "2") and mlflow.loads == 2


def test_a_hold_announces_nothing(tmp_path):
    store = StateStore(f"sqlite:///{tmp_path / 'kale.db'}")
    assert announce(store, {"promoted": False, "version": "3"}, FORECASTER_MODEL) is None
    assert store.get_value(PROMOTION_KEY) is None
    extra = announce(store, {"promoted": True, "version": 3}, FORECASTER_MODEL, now=5.0)
    assert extra == {"model": FORECASTER_MODEL, "version": "3", "promoted_at": 5.0} == store.get_value(PROMOTION_KEY)


def test_the_autoscaler_reads_mlflow_through_the_announcement_check_by_default(tmp_path):
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    dep = Deployment(stream_url=f"sqlite:///{tmp_path / 'stream.db'}")
    auto = Autoscaler(Config(Settings(tmp_path, "sqlite:///m.db", database=url), dep),
                      stream=EmbeddedStream(tmp_path / "stream.db", partitions=1), pods=list)
    assert isinstance(auto.registry, AnnouncedChampions) and auto.registry.store is auto.state
    assert isinstance(auto.registry.on_answer, ManualApprovals)  # hand-moved champions get recorded


# ------------------------------------------------------------------ champions moved by hand
@pytest.mark.parametrize(("versions", "checked", "expected"), [
    (("1", "4"), {}, [(FORECASTER_MODEL, "1", None), (THROUGHPUT_MODEL, "4", None)]),  # first answer: both
    (("1", "4"), {FORECASTER_MODEL: "1", THROUGHPUT_MODEL: "4"}, []),                   # nothing moved
    (("2", "4"), {FORECASTER_MODEL: "1", THROUGHPUT_MODEL: "4"}, [(FORECASTER_MODEL, "2", "1")]),
    (("1", None), {}, [(FORECASTER_MODEL, "1", None)]),                                  # no throughput champion
], ids=["first-answer", "unchanged", "forecaster-moved", "no-throughput-champion"])
def test_only_champions_not_checked_yet_are_looked_up(versions, checked, expected):
    assert unchecked(versions, checked) == expected


@pytest.fixture
def mlflow_store(tmp_path):
    from kale_airflow.registry import mlflow_registry as reg

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = reg.registry_client(uri)
    client.create_registered_model(FORECASTER_MODEL)
    for _ in range(2):
        client.create_model_version(FORECASTER_MODEL, source="file:///nowhere")
    return uri, client


def test_a_champion_moved_in_the_mlflow_ui_is_tagged_approved_manually_at_the_next_answer(tmp_path, mlflow_store):
    """Bug class: a champion moved by hand keeps ``kale.review=pending`` and names no approver."""
    from kale_airflow.control.autoscaler import MlflowChampions
    from kale_airflow.registry import mlflow_registry as reg

    uri, client = mlflow_store
    reg.promote(client, FORECASTER_MODEL, "1", "alice")
    client.set_model_version_tag(FORECASTER_MODEL, "2", "kale.review", "pending")  # a held challenger
    clock, approvals = [0.0], ManualApprovals(uri, clock=lambda: 1_790_000_000.0)
    champions = AnnouncedChampions(MlflowChampions(uri), StateStore(f"sqlite:///{tmp_path / 'kale.db'}"),
                                   clock=lambda: clock[0], on_answer=approvals)
    assert champions.versions() == ("1", None)
    assert client.get_model_version(FORECASTER_MODEL, "1").tags["kale.approved_by"] == "alice"  # left alone
    client.set_registered_model_alias(FORECASTER_MODEL, "champion", "2")  # the reviewer, in the MLflow UI
    clock[0] = RECHECK_S
    assert champions.versions() == ("2", None)
    tags = client.get_model_version(FORECASTER_MODEL, "2").tags
    assert (tags["kale.review"], tags["kale.approved_at"]) == ("approved-manually", "2026-09-21T14:13:20+00:00")
    assert "moved outside kale" in tags["kale.approved_by"]
    assert client.get_model_version(FORECASTER_MODEL, "1").tags["kale.superseded_by"] == "2"
    assert approvals.checked == {FORECASTER_MODEL: "2"}


def test_a_failed_approval_check_never_stops_the_answer_and_is_tried_again(caplog):
    approvals = ManualApprovals("http://127.0.0.1:1")  # nothing listens
    approvals(("3", None))
    assert approvals.checked == {} and "checking again at the next answer" in caplog.text
