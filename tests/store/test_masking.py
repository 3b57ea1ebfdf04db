"""``masked()``: one function that hides the password of any URL (database, MLflow, Kafka) and of
any message quoting one, and the errors that apply it where they are made."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from kale_airflow.store.database import masked, masked_values

MASKED = [
    # database URLs (SQLAlchemy's own rendering kept its form)
    ("postgresql://u:s3cret@h/d", "postgresql://u:***@h/d"),
    ("postgresql+psycopg://kale:s3cret@db.kale:5432/kale?sslmode=require",
     "postgresql+psycopg://kale:***@db.kale:5432/kale?sslmode=require"),
    ("postgresql://kale:s3cret@db/kale?password=s3cret", "postgresql://kale:***@db/kale?password=***"),
    # MLflow tracking URIs
    ("http://alice:s3cret@mlflow:5000", "http://alice:***@mlflow:5000"),
    ("https://alice:s3cret@mlflow.example.com/", "https://alice:***@mlflow.example.com/"),
    ("https://:s3cret@mlflow.example.com", "https://:***@mlflow.example.com"),
    # Kafka
    ("kafka://alice:s3cret@b1:9092,b2:9092/samples", "kafka://alice:***@b1:9092,b2:9092/samples"),
    # passwords SQLAlchemy's parser cuts short or URL-encoded ones
    ("postgresql://u:s3c@ret@h/d", "postgresql://u:***@h/d"),
    ("postgresql://u:s3c/ret@h/d", "postgresql://u:***@h/d"),
    ("postgresql://u:s3c%40ret@h/d", "postgresql://u:***@h/d"),
    ("http://u:s3c:ret@h:1", "http://u:***@h:1"),
    # inside messages, reprs and JSON
    ("MLflow at http://kale:s3cret@127.0.0.1:9 is unreachable (ConnectionError: refused)",
     "MLflow at http://kale:***@127.0.0.1:9 is unreachable (ConnectionError: refused)"),
    ("cannot reach kale:s3cret@db.kale:5432 and http://a:s3cret@b/c",
     "cannot reach kale:***@db.kale:5432 and http://a:***@b/c"),
    ("{'uri': 'http://a:s3cret@b', 'other': 'c@d'}", "{'uri': 'http://a:***@b', 'other': 'c@d'}"),
    ('{"uri": "http://a:s3cret@b", "other": "c@d"}', '{"uri": "http://a:***@b", "other": "c@d"}'),
    ("settings(sasl.password=s3cret, token=s3cret)", "settings(sasl.password=***, token=***)"),
    ("https://h/api?user=u&access_token=s3cret&x=1", "https://h/api?user=u&access_token=***&x=1"),
]
UNCHANGED = ["sqlite:////var/kale/kale.db", "postgresql://kale@db/kale", "http://mlflow:5000/#/models/x/versions/3",
             "kafka://b1:9092,b2:9092/samples", "git@github.com:owner/repo", "ValueError: x@y", "at 12:30, kale@host",
             "holding 3 worker(s): forecast 1,200/s", "", "password authentication failed for user \"kale\""]


@pytest.mark.parametrize("text, expected", MASKED, ids=[t for t, _ in MASKED])
def test_the_password_is_masked(text, expected):
    assert masked(text) == expected
    assert "s3c" not in masked(text)
    assert masked(masked(text)) == masked(text)  # idempotent: masking twice changes nothing


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_credentials_is_unchanged(text):
    assert masked(text) == text


def test_sqlalchemy_urls_and_other_objects():
    assert masked(make_url("postgresql+psycopg://kale:s3cret@db/kale")) == "postgresql+psycopg://kale:***@db/kale"
    assert masked(make_url("postgresql://u:s3c@ret@h/d")) == "postgresql://u:***@h/d"  # SQLAlchemy keeps "ret@h"
    assert masked(ValueError("MLflow at http://a:s3cret@b failed")) == "MLflow at http://a:***@b failed"


def test_masked_values_masks_every_string_and_keeps_the_rest():
    doc = {"message": "http://a:s3cret@b", "n": 3, "x": None, "details": {"error": ["kafka://u:s3cret@k/t", 1.5]},
           "pair": ("c:s3cret@d", True)}
    assert masked_values(doc) == {"message": "http://a:***@b", "n": 3, "x": None,
                                  "details": {"error": ["kafka://u:***@k/t", 1.5]}, "pair": ("c:***@d", True)}


@given(st.sampled_from(["http", "https", "postgresql+psycopg", "kafka", "mlflow"]),
       st.text(st.sampled_from("abcXYZ019!$&'()*+,;=-._~%:@/"), min_size=1, max_size=20))
def test_no_password_survives(scheme, tail):
    """Whatever the password holds (but white space and quotes, which end a URL in a message)."""
    password = "PW" + tail.replace("'", "")
    out = masked(f"failed: {scheme}://kale:{password}@host.example:1234/path and more")
    assert password not in out and "kale:***@" in out


def test_errors_mask_their_message_where_they_are_made():
    from kale_airflow.metrics.embedded import MetricsError
    from kale_airflow.registry.mlflow_registry import RegistryUnavailable
    from kale_airflow.stream.base import StreamError

    for error in (RegistryUnavailable, StreamError, MetricsError):
        assert str(error("at http://kale:s3cret@h:1 is unreachable")) == "at http://kale:***@h:1 is unreachable"
