"""The ``kale_kafka`` Airflow Connection: the Kafka cluster's brokers and credentials kept where
Airflow users keep endpoints and secrets (declared in the provider info, so Admin > Connections
offers a Kafka form with Kale's fields).

Name it in the stream URL, ``airflow-conn://<conn id>/<topic>``; :func:`kale_airflow.stream.kafka.
connection_config` reads it (and also a connection of the Kafka provider's ``kafka`` type, whose
extra holds the librdkafka settings). Fields: ``host`` (and ``port``) → ``bootstrap.servers``
(a comma-separated list works), ``login``/``password`` → SASL username/password, ``extra`` →
any librdkafka setting::

    AIRFLOW_CONN_KALE_KAFKA='{"conn_type": "kale_kafka", "host": "b1.example:9093,b2.example:9093",
                             "login": "kale", "password": "<secret>", "extra": {"ssl.ca.location": "/etc/ca.pem"}}'
"""

from __future__ import annotations

from airflow.sdk import BaseHook

CONN_TYPE = "kale_kafka"


class KaleKafkaHook(BaseHook):
    """The ``kale_kafka`` connection type (declared in the provider info)."""

    conn_name_attr = "kale_kafka_conn_id"
    default_conn_name = "kale_kafka"
    conn_type = CONN_TYPE
    hook_name = "Kale Kafka"

    def __init__(self, kale_kafka_conn_id: str = default_conn_name, **kwargs):
        super().__init__(**kwargs)
        self.kale_kafka_conn_id = kale_kafka_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict:
        return {"hidden_fields": ["schema"],
                "relabeling": {"host": "Bootstrap servers", "port": "Port (when the host is a single broker)",
                               "login": "SASL username", "password": "SASL password",
                               "extra": "librdkafka settings (JSON)"},
                "placeholders": {"host": "b1.example:9093,b2.example:9093",
                                 "extra": '{"security.protocol": "SASL_SSL", "ssl.ca.location": "/etc/ssl/ca.pem"}'}}

    def config(self) -> tuple[str, dict]:
        """(bootstrap servers, librdkafka settings) of the connection."""
        from kale_airflow.stream.kafka import connection_config

        return connection_config(self.kale_kafka_conn_id)

    def test_connection(self) -> tuple[bool, str]:
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:
            return False, "the Kafka client is not installed: pip install 'kale-airflow[kafka]'"
        try:
            bootstrap, settings = self.config()
            topics = AdminClient({**settings, "bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
            return True, f"Kafka at {bootstrap} answers ({len(topics)} topics)"
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            from kale_airflow.store.database import masked

            return False, masked(exc)
