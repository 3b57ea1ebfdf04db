"""Sample stream backends behind one protocol (:class:`~.base.Stream`): embedded (SQLite,
default) and Kafka, opened by URL."""

from kale_airflow.stream.base import Record, Stream, StreamError


def open_stream(url: str) -> Stream:
    """``sqlite:///path/stream.db`` (embedded) or ``kafka://host:port/topic`` (needs the kafka extra)."""
    if url.startswith("sqlite:///"):
        from kale_airflow.stream.embedded import EmbeddedStream

        return EmbeddedStream(url[len("sqlite:///"):])
    if url.startswith("kafka://"):
        from kale_airflow.stream.kafka import KafkaStream

        return KafkaStream.from_url(url)
    raise StreamError(f"unknown stream URL {url!r}; use sqlite:///PATH or kafka://HOST:PORT/TOPIC")


__all__ = ["Record", "Stream", "StreamError", "open_stream"]
