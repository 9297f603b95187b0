"""A pytest plugin for the mutants' runs: cosmic-ray's ExceptionReplacer writes `except
CosmicRayTestingException`, a name cosmic-ray adds to the builtins of its own process. The
tests run in another process, where the name is undefined: a handler reached there raised
NameError, a crash the mutant is not (the mutant means "this handler catches nothing").
Defined here as an exception nothing raises, the handler catches nothing, and what it
was for propagates, as it would in the mutated program."""

from __future__ import annotations

import builtins


class CosmicRayTestingException(Exception):
  """Raised by nothing: the exception a replaced handler catches."""


builtins.CosmicRayTestingException = CosmicRayTestingException
