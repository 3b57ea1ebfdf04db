"""Who approved a champion, against a real SQLite MLflow store in tmp_path: ``promote`` (what
``kale promote`` runs) records the reviewer and the time and marks the champion it replaced;
an alias moved by hand is recorded as ``approved-manually``; the review's description shows
metrics to 4 significant digits. A refused or unknown promotion changes nothing."""

from __future__ import annotations

import itertools

import pytest
from mlflow.exceptions import RestException

from kale_airflow.registry import approvals
from kale_airflow.registry import mlflow_registry as reg
from kale_airflow.registry.approvals import (
    APPROVED_AT,
    APPROVED_BY,
    MANUAL_APPROVER,
    REVIEW_TAG,
    SUPERSEDED_AT,
    SUPERSEDED_BY,
)
from kale_airflow.registry.mlflow_registry import CHAMPION, RegistryUnavailable, UnknownModelVersion

T0 = 1_790_000_000.0  # 2026-09-21T14:13:20+00:00
T0_ISO = "2026-09-21T14:13:20+00:00"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return reg.registry_client(uri)


_names = (f"promote-{i}" for i in itertools.count())


def _model(client, versions: int = 2, champion: str | None = "1", review: str | None = "promoted") -> str:
    """A registered model with ``versions`` versions, v``champion`` holding the alias (tagged ``review``)."""
    name = next(_names)
    client.create_registered_model(name)
    for _ in range(versions):
        client.create_model_version(name, source="file:///nowhere")
    if champion:
        client.set_registered_model_alias(name, CHAMPION, champion)
        if review:
            client.set_model_version_tag(name, champion, REVIEW_TAG, review)
    return name


def _tags(client, name: str, version: str) -> dict:
    return dict(client.get_model_version(name, version).tags)


# ------------------------------------------------------------------------- pure rules
@pytest.mark.parametrize(("tags", "by_hand"), [
    ({}, True),                                                      # never reviewed: moved in the UI
    ({REVIEW_TAG: "pending"}, True),                                 # held, then moved in the UI
    ({REVIEW_TAG: "promoted"}, False),                               # auto_promote
    ({REVIEW_TAG: "approved", APPROVED_BY: "alice"}, False),         # kale promote
    ({REVIEW_TAG: "approved-manually"}, False),                      # already recorded
    ({REVIEW_TAG: "approved", SUPERSEDED_BY: "3"}, True),            # replaced, then moved back by hand
], ids=["untagged", "pending", "promoted", "approved", "recorded", "moved-back"])
def test_which_champions_were_moved_by_hand(tags, by_hand):
    assert approvals.moved_by_hand(tags) is by_hand


def test_approval_tags_and_times():
    assert approvals.iso(T0) == T0_ISO
    assert approvals.approval_tags("approved", "alice", T0_ISO) == {REVIEW_TAG: "approved", APPROVED_BY: "alice",
                                                                     APPROVED_AT: T0_ISO}
    with pytest.raises(ValueError, match="'pending' is no approval"):
        approvals.approval_tags("pending", "alice", T0_ISO)


@pytest.mark.parametrize(("value", "shown"), [(0.873648237, "0.8736"), (12345.678, "1.235e+04"), (2.0, "2"),
                                              (40, "40"), (1e300, "1e+300"), ("n/a", "n/a")])
def test_metrics_are_shown_to_4_significant_digits(value, shown):
    assert approvals.format_metric(value) == shown


# ------------------------------------------------------------------------- kale promote
def test_promote_moves_the_champion_and_records_who_and_when(client):
    name = _model(client, versions=2, champion="1")
    result = reg.promote(client, name, "2", "alice", now=T0)
    assert reg.current_version(client, name, CHAMPION) == "2"
    assert _tags(client, name, "2") == {REVIEW_TAG: "approved", APPROVED_BY: "alice", APPROVED_AT: T0_ISO}
    # the previous champion keeps how it got there and says what replaced it
    assert _tags(client, name, "1") == {REVIEW_TAG: "promoted", SUPERSEDED_BY: "2", SUPERSEDED_AT: T0_ISO}
    assert (result.previous, result.by, result.at, result.already_champion) == ("1", "alice", T0_ISO, False)
    assert result.describe() == (f"{name} v2 is now the champion, approved by alice at {T0_ISO}; v1 is tagged "
                                 "superseded")


def test_promoting_a_superseded_version_back_clears_its_superseded_tags(client):
    name = _model(client, versions=2, champion="1")
    reg.promote(client, name, "2", "alice", now=T0)
    reg.promote(client, name, "1", "bob", now=T0 + 60)
    assert reg.current_version(client, name, CHAMPION) == "1"
    assert _tags(client, name, "1") == {REVIEW_TAG: "approved", APPROVED_BY: "bob",
                                        APPROVED_AT: "2026-09-21T14:14:20+00:00"}
    assert _tags(client, name, "2")[SUPERSEDED_BY] == "1"


def test_promote_without_a_champion_and_of_the_champion_itself(client):
    name = _model(client, versions=1, champion=None)
    first = reg.promote(client, name, "1", "alice", now=T0)
    assert first.previous is None and "there was no champion before" in first.describe()
    again = reg.promote(client, name, "1", "bob", now=T0)
    assert again.already_champion and "was already the champion; recorded its approval by bob" in again.describe()
    assert SUPERSEDED_BY not in _tags(client, name, "1") and _tags(client, name, "1")[APPROVED_BY] == "bob"


@pytest.mark.parametrize(("model", "version", "message"), [
    ("no-such-model", "1", r"has no registered model no-such-model: its first version comes from the "
                           r"retrain/refit DAG\. Nothing was changed\.$"),
    (None, "9", r"has no version '9' in MLflow at sqlite:///.*; its versions are 2, 1\. Nothing was changed\."),
], ids=["unknown-model", "unknown-version"])
def test_an_unknown_model_or_version_changes_nothing(client, model, version, message):
    name = _model(client, versions=2, champion="1")
    with pytest.raises(UnknownModelVersion, match=message):
        reg.promote(client, model or name, version, "alice", now=T0)
    assert reg.current_version(client, name, CHAMPION) == "1"
    assert _tags(client, name, "1") == {REVIEW_TAG: "promoted"} and _tags(client, name, "2") == {}


class AliasRefused:
    """A real client whose alias update is refused, as MLflow refuses a token without EDIT."""

    def __init__(self, real):
        self.real, self._registry_uri = real, "fake://registry"

    def set_registered_model_alias(self, *args):
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

        raise MlflowException("Permission denied", error_code=PERMISSION_DENIED)

    def __getattr__(self, attr):
        return getattr(self.real, attr)


def test_a_refused_alias_move_puts_the_tags_back(client):
    name = _model(client, versions=2, champion="1")
    client.set_model_version_tag(name, "2", REVIEW_TAG, "pending")
    with pytest.raises(RegistryUnavailable,  # naming the MLflow that refused
                       match=f"^MLflow at fake://registry refused or failed the promotion of {name} v2 .*PERMISSION"):
        reg.promote(AliasRefused(client), name, "2", "alice", now=T0)
    assert reg.current_version(client, name, CHAMPION) == "1"
    assert _tags(client, name, "2") == {REVIEW_TAG: "pending"} and SUPERSEDED_BY not in _tags(client, name, "1")


class Refusing:
    """A real client whose ``method`` fails with ``exc``, as MLflow's store or server does."""

    def __init__(self, real, method: str, exc: BaseException):
        self.real, self.method, self.exc, self._registry_uri = real, method, exc, "fake://registry"

    def __getattr__(self, attr):
        if attr == self.method:
            def refuse(*args, **kwargs):
                raise self.exc
            return refuse
        return getattr(self.real, attr)


def test_a_version_that_is_not_a_number_is_unknown_and_lists_the_versions(client):
    name = _model(client, versions=2, champion="1")
    with pytest.raises(UnknownModelVersion, match=r"has no version 'latest' in MLflow at .*; its versions are 2, 1"):
        reg.promote(client, name, "latest", "alice", now=T0)


@pytest.mark.parametrize(("method", "version", "what"), [
    ("get_model_version", "2", "the lookup of {name} v2"),
    ("search_model_versions", "7", "the search for versions of {name}"),  # only for a version not found
])
@pytest.mark.parametrize("exc", [
    RestException({"error_code": "INTERNAL_ERROR", "message": "database is locked"}),
    OSError("network is unreachable"),
], ids=["server error", "not mlflow"])
def test_a_failed_version_lookup_names_the_registry_and_what_failed(client, method, version, what, exc):
    name = _model(client, versions=2, champion="1")
    with pytest.raises(RegistryUnavailable, match=f"^MLflow at fake://registry refused or failed "
                                                  f"{what.format(name=name)} \\({type(exc).__name__}") as err:
        reg.promote(Refusing(client, method, exc), name, version, "alice", now=T0)
    assert err.value.__cause__ is exc
    assert reg.current_version(client, name, CHAMPION) == "1"


def test_superseded_tags_that_cannot_be_written_leave_the_promotion_and_warn_without_the_password(client, caplog):
    name = _model(client, versions=2, champion="1")
    exc = RestException({"error_code": "PERMISSION_DENIED",
                         "message": "http://kale:s3cret-pw@mlflow:5000 refused a tag of v1"})

    class TagsOfV1Refused(Refusing):
        def set_model_version_tag(self, name, version, key, value):
            if version == "1":
                raise exc
            return self.real.set_model_version_tag(name, version, key, value)

    with caplog.at_level("WARNING", logger=reg.__name__):
        out = reg.promote(TagsOfV1Refused(client, "none", exc), name, "2", "alice", now=T0)
    assert out.version == "2" and reg.current_version(client, name, CHAMPION) == "2"
    assert [r.getMessage() for r in caplog.records] == [
        f"{name} v2 is champion, but the superseded tags (of v2 and v1) could not be updated: "
        "PERMISSION_DENIED: http://kale:***@mlflow:5000 refused a tag of v1"]


def test_a_refused_automatic_promotion_puts_a_retried_tasks_tags_back(client):
    name = _model(client, versions=2, champion="1")
    client.set_model_version_tag(name, "2", REVIEW_TAG, "pending")  # an earlier try held it
    with pytest.raises(RegistryUnavailable, match="refused or failed the promotion"):
        reg.review(AliasRefused(client), name, "2", 0.5, 1.0, "mase", True, {}, now=T0)
    assert reg.current_version(client, name, CHAMPION) == "1" and _tags(client, name, "2")[REVIEW_TAG] == "pending"


def test_an_unknown_version_lists_the_newest_twenty_versions(client):
    many, twenty = _model(client, versions=21, champion=None), _model(client, versions=20, champion=None)
    with pytest.raises(UnknownModelVersion) as err:
        reg.promote(client, many, "99", "alice", now=T0)
    assert f"its versions are {', '.join(map(str, range(21, 1, -1)))} .... Nothing was changed." in str(err.value)
    with pytest.raises(UnknownModelVersion) as err:
        reg.promote(client, twenty, "99", "alice", now=T0)
    assert f"its versions are {', '.join(map(str, range(20, 0, -1)))}. Nothing was changed." in str(err.value)


# ------------------------------------------------------------------------- auto promotion and review
def test_an_automatic_promotion_records_auto_promote_and_supersedes_the_champion(client):
    name = _model(client, versions=2, champion="1")
    out = reg.review(client, name, "2", 0.5, 1.0, "mase", True, {}, now=T0)
    assert out.promoted and reg.current_version(client, name, CHAMPION) == "2"
    assert _tags(client, name, "2") | {"kale.challenger_wins": None} == {
        REVIEW_TAG: "promoted", APPROVED_BY: "auto_promote", APPROVED_AT: T0_ISO, "kale.challenger_wins": None}
    assert _tags(client, name, "1")[SUPERSEDED_BY] == "2" and _tags(client, name, "1")[SUPERSEDED_AT] == T0_ISO


def test_the_description_shows_metrics_to_4_significant_digits(client):
    name = _model(client, versions=2, champion="1")
    reg.review(client, name, "2", 0.873648237, 0.91, "mase", False,
               {"challenger mase": 0.873648237, "challenger fit_seconds": 12345.678, "challenger n_obs": 40})
    lines = client.get_model_version(name, "2").description.splitlines()
    assert lines[0] == "Challenger v2: mase 0.8736 vs champion v1 0.91."
    assert lines[4:7] == ["| challenger mase | 0.8736 |", "| challenger fit_seconds | 1.235e+04 |",
                          "| challenger n_obs | 40 |"]


# ------------------------------------------------------------------------- moved by hand
def test_a_champion_moved_by_hand_is_recorded_as_approved_manually(client):
    name = _model(client, versions=2, champion="1")
    client.set_model_version_tag(name, "2", REVIEW_TAG, "pending")
    client.set_registered_model_alias(name, CHAMPION, "2")  # a reviewer in the MLflow UI
    assert reg.record_manual_approval(client, name, "2", "1", now=T0) is True
    assert _tags(client, name, "2") == {REVIEW_TAG: "approved-manually", APPROVED_BY: MANUAL_APPROVER,
                                        APPROVED_AT: T0_ISO}
    assert _tags(client, name, "1") == {REVIEW_TAG: "promoted", SUPERSEDED_BY: "2", SUPERSEDED_AT: T0_ISO}
    assert reg.record_manual_approval(client, name, "2", "1", now=T0 + 60) is False  # recorded once
    assert _tags(client, name, "2")[APPROVED_AT] == T0_ISO


def test_a_champion_moved_back_by_hand_loses_its_superseded_tags(client):
    name = _model(client, versions=2, champion="1")
    reg.review(client, name, "2", 0.5, 1.0, "mase", True, {}, now=T0)  # v2 promoted, v1 superseded
    client.set_registered_model_alias(name, CHAMPION, "1")  # a reviewer moves it back
    assert reg.record_manual_approval(client, name, "1", "2", now=T0 + 60) is True
    assert SUPERSEDED_BY not in _tags(client, name, "1") and SUPERSEDED_AT not in _tags(client, name, "1")
    assert _tags(client, name, "2")[SUPERSEDED_BY] == "1"


def test_a_manual_champion_without_another_predecessor_supersedes_nothing(client):
    name = _model(client, versions=2, champion="2", review=None)  # moved in the UI before Kale saw any
    assert reg.record_manual_approval(client, name, "2", None, now=T0) is True
    assert _tags(client, name, "1") == {} and SUPERSEDED_BY not in _tags(client, name, "2")
    same = _model(client, versions=2, champion="2", review=None)  # the champion seen before is this one
    assert reg.record_manual_approval(client, same, "2", "2", now=T0) is True
    assert SUPERSEDED_BY not in _tags(client, same, "2") and _tags(client, same, "1") == {}
    alone = _model(client, versions=1, champion=None)
    assert reg.record_manual_approval(client, alone, "1", None, now=T0) is False  # no champion at all


def test_an_approved_champion_or_one_no_longer_champion_is_left_alone(client):
    name = _model(client, versions=2, champion="1")
    assert reg.record_manual_approval(client, name, "1", None, now=T0) is False  # auto-promoted: approved
    assert reg.record_manual_approval(client, name, "2", "1", now=T0) is False  # not the champion (any more)
    assert _tags(client, name, "1") == {REVIEW_TAG: "promoted"} and _tags(client, name, "2") == {}
