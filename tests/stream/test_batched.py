"""The batched stream calls the autoscaler's poke makes (``committed_many``, ``timestamps_at``),
without a broker: the embedded stream's answers equal the per-call ones, and the Kafka
backend's requests do not grow with the number of slices.

The Kafka half runs against a stand-in AdminClient that keeps commit metadata, as Apache
Kafka does (the local broker, Tansu 0.6, drops it: test_backlog_kafka.py pins that); the same
logic on the real broker is in test_backlog_kafka.py.
"""

from __future__ import annotations

import concurrent.futures
import types

import confluent_kafka
import pytest

from kale_airflow.core.rebalance import assign
from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.stream.embedded import EmbeddedStream
from kale_airflow.stream.kafka import MIRROR_BUCKETS, KafkaStream, _Stamps, mirror_key

TOPIC = "samples"


def job_slices(partitions: int, workers: int, skew: bool = False) -> list[tuple[str, Slice]]:
    rates = {str(p): (1.0 / (p + 1) if skew else 1.0) for p in range(partitions)}
    doc = assign(rates, workers).to_dict()
    return [(f"kale/{sl.group_suffix}", sl) for w in doc["assignment"] for sl in slices_for(doc, int(w))]


# ------------------------------------------------------------------ embedded
def test_embedded_batched_calls_answer_as_the_per_call_ones(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=3)
    s.append(0, [b"a", b"b"], ts=10.0)
    s.append(0, [b"c"], ts=5.0)  # append times need not grow with offsets
    s.append(1, [b"d"], ts=30.0)
    s.commit_many({"g/x": {0: 1}, "g/y": {0: 2, 1: 1}})
    pairs = [("g/x", 0), ("g/y", 0), ("g/y", 1), ("g/y", 2), ("never", 1)]
    assert s.committed_many(pairs) == {pair: s.committed(*pair) for pair in pairs} == \
        {("g/x", 0): 1, ("g/y", 0): 2, ("g/y", 1): 1, ("g/y", 2): 0, ("never", 1): 0}
    positions = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    expected = {(p, o): (r[0].ts if (r := s.read(p, o, 1)) else None) for p, o in positions}
    assert s.timestamps_at(positions) == expected == {(0, 0): 10.0, (0, 1): 10.0, (0, 2): 5.0, (0, 3): None,
                                                      (1, 0): 30.0, (1, 1): None, (2, 0): None}
    assert s.committed_many([]) == {} and s.timestamps_at([]) == {}


# ---------------------------------------------------------------- job groups
def test_a_slice_group_is_mirrored_in_its_jobs_group():
    assert mirror_key("kale/" + Slice(7).group_suffix) == ("kale", 7, True)
    assert mirror_key("team/kale/" + Slice(3, 0.0, 0.5).group_suffix) == ("team/kale/~0", 3, False)
    assert mirror_key("kale/" + Slice(3, 0.5, 1.0).group_suffix) == (f"kale/~{MIRROR_BUCKETS // 2}", 3, False)
    assert mirror_key("kale/" + Slice(3, 0.99, 1.0).group_suffix) == (f"kale/~{MIRROR_BUCKETS - 1}", 3, False)
    assert mirror_key("kale") is None and mirror_key("g") is None and mirror_key("kale/p3:0.5-1") is None


class FakeAdmin:
    """Consumer-group offsets as a broker keeps them (with commit metadata unless ``keeps_metadata``
    is off); counts the OffsetFetch and OffsetCommit requests it is asked for."""

    def __init__(self, keeps_metadata: bool = True):
        self.keeps_metadata = keeps_metadata
        self.offsets: dict[tuple[str, int], tuple[int, str | None]] = {}
        self.fetches: list[str] = []
        self.commits: list[str] = []
        self.refuse: set[str] = set()

    @staticmethod
    def _done(value=None, error: Exception | None = None):
        f = concurrent.futures.Future()
        f.set_exception(error) if error else f.set_result(value)
        return f

    def alter_consumer_group_offsets(self, reqs, request_timeout=None):
        (req,) = reqs
        self.commits.append(req.group_id)
        if req.group_id in self.refuse:
            return {req.group_id: self._done(error=confluent_kafka.KafkaException("GROUP_AUTHORIZATION_FAILED"))}
        for tp in req.topic_partitions:
            self.offsets[(req.group_id, tp.partition)] = (tp.offset, tp.metadata if self.keeps_metadata else None)
        return {req.group_id: self._done(types.SimpleNamespace(topic_partitions=list(req.topic_partitions)))}

    def list_consumer_group_offsets(self, reqs, request_timeout=None):
        (req,) = reqs
        self.fetches.append(req.group_id)
        tps = []
        for tp in req.topic_partitions:
            offset, metadata = self.offsets.get((req.group_id, tp.partition), (-1001, None))
            extra = {"metadata": metadata} if metadata else {}
            tps.append(confluent_kafka.TopicPartition(TOPIC, tp.partition, offset, **extra))
        return {req.group_id: self._done(types.SimpleNamespace(topic_partitions=tps))}


def kafka_on(admin: FakeAdmin, **config) -> KafkaStream:
    client = types.SimpleNamespace(TopicPartition=confluent_kafka.TopicPartition, KafkaError=confluent_kafka.KafkaError,
                                   admin=types.SimpleNamespace(AdminClient=lambda conf: admin))
    return KafkaStream("broker:9092", TOPIC, config, client=client)


def committed_positions(admin: FakeAdmin, slices, stream=None) -> dict:
    """Rank 0's checkpoint commit of every slice (one commit_many), flushed."""
    s = stream or kafka_on(admin)
    s.commit_many({g: {sl.partition: 100 * sl.partition + int(1000 * sl.lo)} for g, sl in slices})
    s.flush_commits()
    return {(g, sl.partition): 100 * sl.partition + int(1000 * sl.lo) for g, sl in slices}


@pytest.mark.parametrize("skew", [False, True], ids=["whole partitions", "shared partitions"])
def test_committed_many_asks_the_job_groups_whatever_the_number_of_slices(skew):
    asked = {}
    for partitions, workers in ((8, 4), (64, 32), (256, 64)):
        admin = FakeAdmin()
        slices = job_slices(partitions, workers, skew)
        truth = committed_positions(admin, slices)
        reader = kafka_on(admin)
        got = reader.committed_many(list(truth) + [("kale/" + Slice(999).group_suffix, 999)])
        assert got == truth | {("kale/" + Slice(999).group_suffix, 999): 0}  # never committed: 0, as committed()
        asked[partitions] = admin.fetches
    if not skew:  # one request, the job group (and the group never committed)
        assert asked[8] == asked[64] == asked[256] == ["kale", "kale/" + Slice(999).group_suffix]
        return
    for partitions, workers in ((8, 4), (64, 32), (256, 64)):
        # The job group and the bucket groups in use (at most 1 + MIRROR_BUCKETS), then the own
        # group of each slice whose entry another slice of its bucket overwrote.
        keys = [mirror_key(g)[:2] for g, _ in job_slices(partitions, workers, skew)]
        overwritten = len(keys) - len(set(keys))
        assert len(asked[partitions]) == len({k[0] for k in keys}) + overwritten + 1, asked[partitions]
        assert len({k[0] for k in keys}) <= 1 + MIRROR_BUCKETS
    assert len(asked[256]) < len(job_slices(256, 64, True)) / 20  # 13 requests for 319 slices


def test_an_entry_of_another_slice_or_none_means_the_slices_own_group_is_asked():
    admin = FakeAdmin()
    a, b = "kale/" + Slice(3, 0.5, 0.55).group_suffix, "kale/" + Slice(3, 0.55, 0.6).group_suffix  # one bucket
    s = kafka_on(admin)
    s.commit_many({a: {3: 10}})
    s.commit_many({b: {3: 20}})  # b's entry replaces a's in the bucket group
    s.flush_commits()
    admin.fetches.clear()
    assert kafka_on(admin).committed_many([(a, 3), (b, 3)]) == {(a, 3): 10, (b, 3): 20}
    assert admin.fetches == [f"kale/~{int(0.5 * MIRROR_BUCKETS)}", a]
    off = kafka_on(admin, **{"kale.mirror": "false"})  # no job groups: every slice group, as before
    admin.fetches.clear()
    assert off.committed_many([(a, 3), (b, 3)]) == {(a, 3): 10, (b, 3): 20} and sorted(admin.fetches) == [a, b]


def test_a_broker_that_drops_commit_metadata_still_serves_whole_partitions_from_the_job_group():
    admin = FakeAdmin(keeps_metadata=False)  # Tansu 0.6
    slices = job_slices(16, 8, skew=True)
    truth = committed_positions(admin, slices)
    reader = kafka_on(admin)
    assert reader.committed_many(list(truth)) == truth
    split = [g for g, sl in slices if (sl.lo, sl.hi) != (0.0, 1.0)]
    admin.fetches.clear()
    assert reader.committed_many(list(truth)) == truth  # the bucket groups, learned to be mute, are not asked
    assert sorted(admin.fetches) == sorted(["kale", *split])


def test_the_job_group_is_written_only_after_the_slice_commit_is_confirmed():
    admin = FakeAdmin()
    g = "kale/" + Slice(2).group_suffix
    s = kafka_on(admin)
    s.commit(g, {2: 5})
    assert admin.commits == [g] and ("kale", 2) not in admin.offsets  # sent, not confirmed: not mirrored
    s.wait_commits()
    assert admin.commits == [g, "kale"] and admin.offsets[("kale", 2)] == (5, g)
    s.commit("not-a-slice", {2: 7})
    s.flush_commits()
    assert admin.commits == [g, "kale", "not-a-slice"]


def test_a_refused_job_group_turns_mirroring_off_and_the_slice_groups_are_asked():
    admin = FakeAdmin()
    admin.refuse.add("kale")
    g = "kale/" + Slice(2).group_suffix
    s = kafka_on(admin)
    s.commit_many({g: {2: 5}})  # the slice commit stands; the job group's refusal is logged
    s.flush_commits()
    assert not s.mirror and admin.offsets[(g, 2)][0] == 5
    admin.fetches.clear()
    assert s.committed_many([(g, 2)]) == {(g, 2): 5} and admin.fetches == [g]


# ---------------------------------------------------------------- timestamps
def test_fetched_timestamps_answer_positions_inside_what_was_fetched():
    st = _Stamps()
    st.put(4, 10, [10, 11, 13], [1000, 1001, 1003])  # a gap at 12 (a transaction marker)
    assert [st.get(4, o) for o in (9, 10, 12, 13, 14)] == [None, 1000, 1003, 1003, None]
    assert st.get(5, 10) is None
    st.forget_beyond({4: 20})
    assert st.get(4, 11) == 1001
    st.forget_beyond({4: 12})  # the log is shorter than what was fetched: emptied or recreated
    assert st.get(4, 11) is None


def test_kale_mirror_is_a_boolean_setting():
    from kale_airflow.stream.base import StreamError

    assert kafka_on(FakeAdmin()).mirror is True
    assert kafka_on(FakeAdmin(), **{"kale.mirror": False}).mirror is False
    assert kafka_on(FakeAdmin(), **{"kale.mirror": "Off"}).mirror is False
    with pytest.raises(StreamError, match="kale.mirror must be true or false"):
        kafka_on(FakeAdmin(), **{"kale.mirror": "maybe"})
