"""Sample stream backends behind one protocol (:class:`~.base.Stream`): embedded (SQLite,
default) and Kafka, opened by URL."""

from kale_airflow.stream.base import Record, Stream, StreamError, StreamPositionError


def open_stream(url: str) -> Stream:
    """``sqlite:///path/stream.db`` (embedded), ``kafka://host:port[,host:port]/topic`` or
    ``airflow-conn://CONN_ID/topic`` (Kafka settings from an Airflow Connection; both Kafka forms
    need the kafka extra and also read librdkafka settings from ``KALE_KAFKA_CONFIG``)."""
    if url.startswith("sqlite:///"):
        from kale_airflow.stream.embedded import EmbeddedStream

        return EmbeddedStream(url[len("sqlite:///"):])
    if url.startswith(("kafka://", "airflow-conn://")):
        from kale_airflow.stream.kafka import KafkaStream

        return KafkaStream.from_url(url)
    raise StreamError(f"unknown stream URL {url!r}; use sqlite:///PATH, kafka://HOST:PORT/TOPIC "
                      "or airflow-conn://CONN_ID/TOPIC")


__all__ = ["Record", "Stream", "StreamError", "StreamPositionError", "open_stream"]
