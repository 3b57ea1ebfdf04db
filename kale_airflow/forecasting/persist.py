"""Save and load any forecaster to a folder (used by the MLflow pyfunc wrapper)."""

from __future__ import annotations

import importlib
import json
import pickle
from pathlib import Path


def save_forecaster(forecaster, folder: str | Path) -> Path:
    """Write ``meta.json`` plus the model: the forecaster's own ``save`` if it declares
    ``supports_save``, else a pickle."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cls = type(forecaster)
    meta = {"name": forecaster.name, "class": f"{cls.__module__}:{cls.__qualname__}",
            "quantiles": list(forecaster.quantiles)}
    if forecaster.supports_save:
        forecaster.save(folder / "model.pt")
        meta["format"] = "own"
    else:
        (folder / "model.pkl").write_bytes(pickle.dumps(forecaster))
        meta["format"] = "pickle"
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    return folder


def load_forecaster(folder: str | Path):
    """Inverse of :func:`save_forecaster`."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    if meta["format"] == "pickle":
        return pickle.loads((folder / "model.pkl").read_bytes())
    module, _, name = meta["class"].partition(":")
    return getattr(importlib.import_module(module), name).load(folder / "model.pt")
