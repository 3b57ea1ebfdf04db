"""Sample stream backends behind one protocol (:class:`~.base.Stream`): embedded (SQLite,
default) and Kafka, opened by URL."""

from kale_airflow.stream.base import Record, Stream, StreamError, StreamPositionError, StreamUnavailable


EMBEDDED = "sqlite:///"
KAFKA = ("kafka://", "airflow-conn://")


def check_stream_url(url: str) -> None:
    """Raise the :class:`StreamError` that :func:`open_stream` raises for ``url`` before it opens
    anything (an unknown scheme, no file, a bad Kafka URL, credentials in it), else nothing;
    connects to nothing and creates nothing (``kale config validate`` runs it)."""
    if url.startswith(EMBEDDED):
        if not url[len(EMBEDDED):].strip():
            raise StreamError(f"the embedded stream URL {url!r} names no file; use sqlite:///PATH")
        return
    if url.startswith(KAFKA):
        from kale_airflow.stream.kafka import parse_url

        parse_url(url)
        return
    from kale_airflow.store.database import masked

    raise StreamError(f"unknown stream URL {masked(url)!r}; use sqlite:///PATH, kafka://HOST:PORT/TOPIC "
                      "or airflow-conn://CONN_ID/TOPIC")


def open_stream(url: str) -> Stream:
    """``sqlite:///path/stream.db`` (embedded), ``kafka://host:port[,host:port]/topic`` or
    ``airflow-conn://CONN_ID/topic`` (Kafka settings from an Airflow Connection; both Kafka forms
    need the kafka extra and also read librdkafka settings from ``KALE_KAFKA_CONFIG``)."""
    check_stream_url(url)
    if url.startswith(EMBEDDED):
        from kale_airflow.stream.embedded import EmbeddedStream

        return EmbeddedStream(url[len(EMBEDDED):])
    from kale_airflow.stream.kafka import KafkaStream

    return KafkaStream.from_url(url)


__all__ = ["Record", "Stream", "StreamError", "StreamPositionError", "StreamUnavailable", "check_stream_url", "open_stream"]
