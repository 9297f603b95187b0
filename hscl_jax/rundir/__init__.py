"""The run directory: the one owner of a workdir's layout (checkpoints, metrics, the stored
config, the lock) and of restoring a trained run from it."""
