"""I/O at the edges: gather observations, load models, persist state."""
