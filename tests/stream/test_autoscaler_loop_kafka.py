"""The autoscaler loop of tests/dags/test_autoscaler_loop.py (jump -> scale-up, drop ->
stabilized scale-down, the training DAG rebalancing and starting local workers) with the
stream on a real Kafka-protocol broker (Tansu, see conftest.py) instead of the embedded one:
the producer, the autoscaler's observations (arrivals, end offsets, group offsets, the oldest
unconsumed record) and the workers all go through :class:`KafkaStream`.

Two Tansu 0.6 deviations (pinned by strict xfails in test_kafka.py) are worked around with
settings that are just as valid on Apache Kafka, where they are not needed:

- ListOffsets by timestamp always answers 0, so ``arrivals`` cannot use Kafka's time index:
  the stream counts arrivals from the end offsets it observes (``kale.arrivals:
  end-offsets``);
- ListOffsets "latest" answers the base offset of the last record batch + 1, so the producer
  sends batches of at most 50 records (``producer.batch.num.messages``): end offsets are then
  at most 49 records short per partition.

The control plane is PostgreSQL (as in a deployment with Kafka); the configuration is the
embedded test's (``LOOP_CONFIG``, with its low price of lag). The scenario itself (timings,
assertions) is the embedded test's function, imported, so the two cannot drift apart, and
so are its DAG runs in its home's one long-lived ``dag.test`` process.
Takes about a minute and a half on a 2-core machine, longer when it is loaded.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.dags import test_autoscaler_loop as loop

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]

KAFKA_CONFIG = {"kale.arrivals": "end-offsets", "producer.batch.num.messages": 50}

@pytest.fixture
def live_kafka(airflow_home, kafka_broker, postgres_database):
    """The loop's world with a 4-partition Kafka topic as the stream and PostgreSQL as the
    control plane (a deployment with Kafka has a server database too; a SQLite control plane
    is the embedded test's)."""
    topic = kafka_broker.create_topic(4, prefix="loop")
    url = kafka_broker.url(topic)
    airflow_home.env["KALE_KAFKA_CONFIG"] = json.dumps(KAFKA_CONFIG)
    airflow_home.env["KALE_DATABASE_URL"] = postgres_database
    try:  # its dag.test process starts with the environment above
        rate = loop.prepare_loop(airflow_home, stream_url=url)
        proc = subprocess.Popen([sys.executable, "-c", loop.PRODUCER, url, str(rate)],
                                env=os.environ | {"KALE_KAFKA_CONFIG": airflow_home.env["KALE_KAFKA_CONFIG"]})
        yield airflow_home, rate
        proc.kill()
        proc.wait()
        loop.stop_workers(airflow_home)
    finally:
        airflow_home.close()  # before the database is dropped: its pooled connections go with it


def test_jump_scales_up_and_drop_scales_down_on_kafka(live_kafka):
    home, _ = live_kafka
    loop.test_jump_scales_up_and_drop_scales_down_only_after_stabilization(live_kafka)
    # The decisions were made on Kafka's numbers: arrival rates from the observed end offsets
    # (the producer ran at 2,500, 12,000 and 1,000 samples/s), backlogs from the workers'
    # commits in the topic's consumer groups.
    made = loop.decisions(home)
    rates = [d["arrival_rate"] for d in made if d.get("arrival_rate") is not None]
    assert max(rates) > 6000 and min(rates) < 2000, rates
    assert any(d.get("backlog") is not None for d in made)
