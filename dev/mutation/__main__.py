"""`python dev/mutation COMMAND ...`: the mutation tooling's one entry point.

python dev/mutation score hscl_jax/evaluation/knn.py --sample 25 --seed 0
python dev/mutation handwritten --list
"""

from __future__ import annotations

import pathlib
import sys

# The folder's modules import each other as `mutation.X`: its parent on the path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from mutation import coverage_map  # noqa: E402
from mutation import handwritten  # noqa: E402
from mutation import score  # noqa: E402

COMMANDS = {'score': score.main, 'handwritten': handwritten.main, 'map': coverage_map.main}


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in COMMANDS:
    names = ', '.join(COMMANDS)
    sys.exit(f'usage: python dev/mutation {{{names}}} ...; got {argv[:1] or "nothing"}')
  sys.argv = [f'dev/mutation {argv[0]}', *argv[1:]]
  return COMMANDS[argv[0]]()


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
