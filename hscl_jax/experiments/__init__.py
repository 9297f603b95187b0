"""The paper's experiments: grid libraries (image_grid, graph_grid) and their programs
(python -m hscl_jax.experiments.compare, python -m hscl_jax.experiments.compare_graphs)."""
