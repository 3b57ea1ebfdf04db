"""Shared fixtures: small synthetic traces built in memory (no network, no shared files)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def daily_series(days: int = 21, step_s: int = 300, base: float = 100.0, amp: float = 60.0, noise: float = 0.0,
                 seed: int = 0, start: str = "2024-01-01") -> pd.Series:
    """A regular series with a daily sine pattern (optionally noisy)."""
    n = int(days * 86400 / step_s)
    t = np.arange(n) * step_s
    y = base + amp * np.sin(2 * np.pi * t / 86400)
    if noise:
        y = y * (1 + noise * np.random.default_rng(seed).standard_normal(n))
    idx = pd.date_range(start, periods=n, freq=pd.Timedelta(seconds=step_s))
    return pd.Series(np.maximum(y, 0.0), index=idx, name="value")


@pytest.fixture
def daily():
    return daily_series()


@pytest.fixture(scope="session")
def airflow_template(tmp_path_factory):
    from tests.airflow_harness import migrated_template

    return migrated_template(tmp_path_factory.mktemp("airflow"))


@pytest.fixture
def airflow_home(airflow_template, tmp_path):
    from tests.airflow_harness import fresh_home

    return fresh_home(airflow_template, tmp_path / "home")
