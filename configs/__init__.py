"""Training configurations: `python -m hscl_jax.main --config=configs/<name>.py`."""
