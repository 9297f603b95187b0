"""The paper's experiments: grid libraries (grid, graph_grid) and their programs
(python -m hscl_jax.experiments.compare, python -m hscl_jax.experiments.compare_graphs).
Their reports' plots and tests of significance need the `[report]` extra
(pip install -e '.[report]')."""
