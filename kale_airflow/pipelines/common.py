"""What the retrain and refit pipelines share: the champion/challenger review and data hashes."""

from __future__ import annotations

import hashlib

import pandas as pd

from kale_airflow.config import Settings


def promote_or_hold(settings: Settings, name: str, version: str, challenger: dict, champion: dict | None,
                    metric: str, auto_promote: bool) -> dict:
    """Compare on the recorded metric (lower is better) and move aliases or tag for review."""
    from kale_airflow.registry.mlflow_registry import registry_client, review

    comparison = {f"challenger {k}": v for k, v in challenger.items() if isinstance(v, (int, float))}
    if champion:
        comparison |= {f"champion {k}": v for k, v in champion.items() if isinstance(v, (int, float))}
    # Only client calls (no fluent API): no MLflow global is changed. A registry error raises
    # RegistryUnavailable before any alias or tag moves.
    r = review(registry_client(settings.mlflow_uri), name, version, challenger[metric],
               champion.get(metric) if champion else None, metric, auto_promote, comparison)
    return r.to_dict()


def data_hash(frame: pd.Series | pd.DataFrame) -> str:  # pragma: no mutate block
    """Stable short hash of the training data (index and values)."""
    digest = hashlib.sha256(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return digest.hexdigest()[:16]
