"""Online-training runtime: samples, producer, reference worker, checkpoints, worker backends."""
