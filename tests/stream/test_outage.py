"""A rank waits out an unreachable stream instead of crashing the job (a broker restart), and
only then: an error that retrying cannot fix is raised at once."""

import logging

import confluent_kafka
import pytest

from kale_airflow.stream import StreamError, StreamUnavailable
from kale_airflow.stream.base import PatientStream
from kale_airflow.stream.kafka import KafkaStream

log = logging.getLogger("test")


class Flaky:
    """Fails ``failures`` times with ``error``, then answers."""

    partitions_count = 4

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, 0

    def read(self, partition, offset, n):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return [(partition, offset, n)]


def test_an_unreachable_stream_is_retried_until_it_answers(monkeypatch):
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda s: None)
    inner = Flaky(3, StreamUnavailable("broker transport failure"))
    assert PatientStream(inner, 90.0, log).read(1, 5, 2) == [(1, 5, 2)]
    assert inner.calls == 4
    assert PatientStream(inner, 90.0, log).partitions_count == 4  # not a method: passes through


def test_other_stream_errors_and_a_long_outage_are_raised():
    inner = Flaky(1, StreamError("topic not found"))
    with pytest.raises(StreamError, match="not found"):
        PatientStream(inner, 90.0, log).read(0, 0, 1)
    assert inner.calls == 1  # never retried
    with pytest.raises(StreamUnavailable):
        PatientStream(Flaky(10**6, StreamUnavailable("down")), 0.3, log).read(0, 0, 1)
    with pytest.raises(StreamUnavailable):  # 0: fail at once
        PatientStream(Flaky(1, StreamUnavailable("down")), 0.0, log).read(0, 0, 1)


@pytest.mark.parametrize("code, transient", [
    (confluent_kafka.KafkaError._TRANSPORT, True),
    (confluent_kafka.KafkaError._TIMED_OUT, True),
    (confluent_kafka.KafkaError._ALL_BROKERS_DOWN, True),
    (confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, False),
    (confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE, True),
])
def test_the_kafka_adapter_tells_an_outage_from_a_refusal(code, transient):
    stream = KafkaStream("127.0.0.1:1", "t")
    err = stream._failure("Kafka commit failed", confluent_kafka.KafkaException(confluent_kafka.KafkaError(code)))
    assert isinstance(err, StreamUnavailable) is transient and isinstance(err, StreamError)
    flagged = confluent_kafka.KafkaError(confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, retriable=True)
    assert isinstance(stream._failure("x", confluent_kafka.KafkaException(flagged)), StreamUnavailable)
    assert "Kafka commit failed: " in str(err)
    assert isinstance(stream._failure("x", TimeoutError()), StreamUnavailable)
    assert str(stream._failure("x", TimeoutError())) == "x: TimeoutError"  # never an empty reason
