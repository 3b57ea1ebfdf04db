"""MLflow: log, register, compare, promote (aliases, never deprecated stages)."""
