"""Result files that benchmarks and commands write."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | None, doc: dict) -> None:
    """Write ``doc`` as indented JSON (numpy numbers as floats) and say where; no path, no file."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=2, default=float))
        print(f"wrote {path}")
