"""The run config: its fields and their validation."""
