"""The documentation: README.md stays a front page, and every relative link resolves.

Links are Markdown's `[text](target)` and `![alt](target)` in README.md, docs/**/*.md and
benchmarks/README.md, outside code blocks and code spans; http(s):, mailto: and pure
#anchors are not checked, and a #fragment is dropped before the target is looked up
relative to the file that holds the link.
"""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / 'README.md'
MAX_README_LINES = 250

_FENCE = re.compile(r'^(```|~~~).*?^\1[^\n]*$', re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r'(`+)(?:(?!\1).)+?\1', re.DOTALL)
_LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
_EXTERNAL = ('http:', 'https:', 'mailto:')


def _doc_files():
  files = [README, REPO / 'benchmarks' / 'README.md']
  files += sorted((REPO / 'docs').rglob('*.md'))
  return [path for path in files if path.is_file()]


def _links(text):
  text = _CODE_SPAN.sub('', _FENCE.sub('', text))
  return [match.group(1) for match in _LINK.finditer(text)]


def test_link_pattern_reads_links_and_images_outside_code():
  text = (
    'See [the method](docs/method.md#notation) and ![a plot](fig.png "title").\n'
    '`[not a link](nowhere.md)`\n'
    '```\n[nor this](nowhere.md)\n```\n'
    '[web](https://example.com) [top](#set-up)\n'
  )
  assert _links(text) == ['docs/method.md#notation', 'fig.png', 'https://example.com', '#set-up']


def test_the_documentation_files_exist():
  names = {path.relative_to(REPO).as_posix() for path in _doc_files()}
  assert {'README.md', 'benchmarks/README.md', 'docs/method.md', 'docs/graphs.md'} <= names


def test_every_relative_link_resolves():
  broken = []
  for path in _doc_files():
    for target in _links(path.read_text(encoding='utf-8')):
      if not target or target.startswith(_EXTERNAL) or target.startswith('#'):
        continue
      relative = target.split('#', 1)[0]
      if not (path.parent / relative).exists():
        broken.append(f'{path.relative_to(REPO)}: {target}')
  assert not broken, 'links that do not resolve:\n' + '\n'.join(broken)


def test_readme_is_a_front_page():
  lines = README.read_text(encoding='utf-8').splitlines()
  assert len(lines) <= MAX_README_LINES, f'README.md has {len(lines)} lines'


def test_readme_keeps_the_set_up_commands():
  text = README.read_text(encoding='utf-8')
  assert 'python -m hscl_jax.main' in text
  assert 'python -m pytest' in text
