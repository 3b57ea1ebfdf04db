"""Sample stream backends behind one protocol: embedded (SQLite, default) and Kafka."""

from kale_airflow.stream.base import Record, Stream, open_stream

__all__ = ["Record", "Stream", "open_stream"]
