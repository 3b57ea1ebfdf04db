"""Heavy forecasters behind the core interface (imported lazily by name)."""
