"""The mutation tooling (docs/testing.md): does the suite catch bugs?

One entry point, `python dev/mutation COMMAND ...` (`__main__.py`):

  * ``score``: a seeded sample of mutants nobody chose (cosmic-ray's operators), planted
    one at a time in a copy of the tree and run against the module's tests (`score.py`;
    also `python dev/mutation_score.py ...`), or with `--operators=semantic` of the
    semantic operators (`semantic.py`);
  * ``handwritten``: the suite's hand-written regression mutants (`handwritten.py`; also
    `python dev/mutation_test.py ...`);
  * ``map``: which test files execute each module, measured under coverage
    (`coverage_map.py`, stored in `map.json`), and which tests execute each line, with
    their seconds (`timings.py`; kept in .mutation_sessions/map_tests.json): the tests
    `score` runs a mutant against.

`equivalents.toml` lists, by hand, the sampled mutants that cannot change behaviour.
"""
