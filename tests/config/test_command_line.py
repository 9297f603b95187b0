"""config/command_line: how every program starts: the --config file found in both flag
forms and its own `configs` package importable, overrides parsed as the programs parse
them, and --config_help's listing of the fields, a section or one field."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root
from configs import digits  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax.config import command_line  # noqa: E402
from hscl_jax.config import fields  # noqa: E402


def _parse(*args):
  """Loads a config file with overrides exactly as hscl_jax.main does."""
  argv = ['prog', *args]
  flag_values = flags.FlagValues()
  # sys_argv: the override flags (--config.x) are defined from the --config file named there.
  config_flags.DEFINE_config_file(
    'config', None, flag_values=flag_values, lock_config=True, sys_argv=argv
  )
  flag_values(argv)
  return flag_values.config


# ml_collections loads config files with importlib's deprecated load_module().
_LOAD_MODULE_WARNING = 'ignore:the load_module:DeprecationWarning'


def test_the_config_file_argument_is_found_in_both_flag_forms(tmp_path):
  """--config=PATH and --config PATH; a PATH:ARG suffix dropped unless the whole value is a
  file; a trailing --config without a value, or none, is no path."""
  find = command_line.config_file_argument
  assert find(['prog', '--config=configs/digits.py', '--workdir=w']) == 'configs/digits.py'
  assert find(['prog', '--workdir', 'w', '--config', 'configs/digits.py']) == 'configs/digits.py'
  assert find(['prog', '--config=configs/tiny_imagenet.py:cpu']) == 'configs/tiny_imagenet.py'
  odd = tmp_path / 'a:b.py'  # a file whose name holds a colon is taken whole
  odd.write_text('')
  assert find(['prog', f'--config={odd}']) == str(odd)
  assert find(['prog', '--workdir=w', '--config']) is None
  assert find(['prog', '--workdir=w']) is None


def test_a_config_file_elsewhere_imports_its_own_configs_package(tmp_path, monkeypatch):
  """make_config_importable puts the config's package first on sys.path: its
  `configs` wins over another one already on the path (here the repository's)."""
  package = tmp_path / 'elsewhere' / 'configs'
  package.mkdir(parents=True)
  (package / '__init__.py').write_text('WHERE = "elsewhere"\n')
  (package / 'mine.py').write_text('')
  monkeypatch.setattr(sys, 'path', [str(REPO), *sys.path])
  monkeypatch.delitem(sys.modules, 'configs')
  command_line.make_config_importable(['prog', f'--config={package / "mine.py"}'])
  import configs

  assert getattr(configs, 'WHERE', None) == 'elsewhere'


def _listed(listing: str) -> dict[str, tuple[str, str]]:
  """{field: (its override as a shell reads it, the rest of its lines)} of a --config_help
  listing: `  --config.FIELD=VALUE  (notes)` then the meaning, indented further."""
  entries, name = {}, None
  for line in listing.splitlines()[1:]:
    if line.startswith('  --config.'):
      override, *notes = shlex.split(line)
      name = override.split('=', 1)[0].removeprefix('--config.')
      entries[name] = (override, ' '.join(notes))
    else:
      entries[name] = (entries[name][0], f'{entries[name][1]} {line.strip()}'.strip())
  return entries


def test_the_config_help_lists_every_field_with_its_default_and_meaning():
  """--config_help without a file: every field of config/fields, in order, at its default,
  with its meaning (its doc, rewrapped) and, for a field unset by default, its type."""
  listed = _listed(command_line.config_help(''))
  assert list(listed) == list(fields.FIELDS)
  for name, field in fields.FIELDS.items():
    override, notes = listed[name]
    unset = isinstance(field.default, type(fields.unset(int)))
    default = None if unset else field.default
    assert override == f'--config.{name}={default}', name
    assert ' '.join(field.doc.split()) in notes, name
    assert ('default ' in notes) is False, name  # the value is the default
    if unset:
      assert f'None = unset; type {field.default.type.__name__}' in notes


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
def test_the_config_help_of_a_file_gives_its_values_as_overrides_that_rebuild_it():
  """With configs/digits.py: every field at digits' value, the default named where they
  differ; the listed overrides, applied to cifar10.py by the program's flag parser, give
  digits' config (every field that is set)."""
  config = digits.get_config()
  listed = _listed(command_line.config_help('', config, 'configs/digits.py'))
  overrides = []
  for name, (override, notes) in listed.items():
    value, default = fields.value_of(config, name), fields.FIELDS[name].initial()
    assert ('default ' in notes) == (value != default and value is not None), (name, notes)
    if value is not None:
      overrides.append(override)
  assert '--config.augment.image_size=8' in overrides and '--config.batch_size=256' in overrides
  rebuilt = _parse(f'--config={REPO}/configs/cifar10.py', *overrides)
  assert rebuilt.to_dict() == config.to_dict()


def test_the_config_help_lists_a_section_or_a_field_and_refuses_other_names():
  section = _listed(command_line.config_help('augment'))
  assert list(section) == [n for n in fields.FIELDS if n.startswith('augment.')]
  assert list(_listed(command_line.config_help('config.knn'))) == [
    n for n in fields.FIELDS if n.startswith('knn.')
  ]
  assert list(_listed(command_line.config_help('keep_best'))) == ['keep_best']
  with pytest.raises(errors.UserError) as refused:
    command_line.config_help('augmnt')
  assert str(refused.value) == (
    '--config_help=augmnt: no config section or field of that name. Fix: pass a section '
    '(model, augment, optimizer, knn, probe, linear_eval) or a field (e.g. batch_size), or '
    '--config_help alone for all.'
  )
  assert command_line.config_help_argument(['p', '--config_help', '--config=x.py']) == ''
  assert command_line.config_help_argument(['p', '--config_help=model']) == 'model'
  assert command_line.config_help_argument(['p', '--config=x.py']) is None


def test_hscl_train_lists_the_fields_of_its_config_file_before_any_flag_is_required():
  """As a user types it: no --workdir, exit 0, the listing on stdout."""
  result = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.main', '--config=configs/digits.py', '--config_help=augment'],
    cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  assert (
    result.stdout
    == command_line.config_help('augment', digits.get_config(), 'configs/digits.py') + '\n'
  )


# config/command_line's flag parsing: an override naming no config field is one line with
# the closest spelling (or the fields there are), and --config is read in both forms.


def _config():
  import ml_collections

  return ml_collections.ConfigDict(
    {
      'beta': 1.0,
      'dataset': 'digits',
      'optimizer': {'learning_rate': 0.1, 'name': 'adam'},
      'linear_eval': {'learning_rate': 0.5, 'num_epochs': 3},
      'model': {'name': 'small_cnn', 'dtype': 'float32'},
    }
  )


@pytest.mark.parametrize(
  'override,line',
  [
    # A close spelling beside it.
    (
      '--config.betta=2',
      "--config.betta: config has no field 'betta'. Fix: did you mean --config.beta?",
    ),
    (
      '--config.model.nmae=resnet18',
      "--config.model.nmae: config.model has no field 'nmae'. "
      'Fix: did you mean --config.model.name?',
    ),
    # The same name in other sections: every one of them (ConfigDict's keys are sorted).
    (
      '--config.learning_rate=0.3',
      "--config.learning_rate: config has no field 'learning_rate'. Fix: did you mean "
      '--config.linear_eval.learning_rate or --config.optimizer.learning_rate?',
    ),
    # The closest of several names elsewhere, not merely a close one.
    (
      '--config.model.num_epoch=2',
      "--config.model.num_epoch: config.model has no field 'num_epoch'. Fix: did you mean "
      '--config.linear_eval.num_epochs?',
    ),
    # Nothing close anywhere: the fields of that section.
    (
      '--config.model.zzz=1',
      "--config.model.zzz: config.model has no field 'zzz'. Fix: spell one of the fields of "
      'config.model: dtype, name',
    ),
    (
      '--noconfig.zzz',
      "--config.zzz: config has no field 'zzz'. Fix: spell one of the fields of config: beta, "
      'dataset, linear_eval, model, optimizer',
    ),
    # A misspelt section: named, and the whole override respelt (not a leaf's complaint).
    (
      '--config.optimiser.learning_rate=0.3',
      "--config.optimiser.learning_rate: config has no section 'optimiser'. Fix: did you mean "
      '--config.optimizer.learning_rate?',
    ),
    (
      '--config.linear_evl.num_epochs=3',
      "--config.linear_evl.num_epochs: config has no section 'linear_evl'. Fix: did you mean "
      '--config.linear_eval.num_epochs?',
    ),
    (
      '--config.zzz.name=x',
      "--config.zzz.name: config has no section 'zzz'. Fix: spell one of the sections of "
      'config: linear_eval, model, optimizer',
    ),
    # Below a value.
    (
      '--config.dataset.name=x',
      "--config.dataset.name: config.dataset is a value ('digits'), not a section. "
      'Fix: --config.dataset=NEW_VALUE',
    ),
  ],
)
def test_an_override_naming_no_field_is_one_line_with_the_fix(override, line):
  argv = ['prog', '--config=configs/x.py', '--config.beta=2', override, '--workdir=w']
  assert command_line.unknown_override(argv, _config()) == line


def test_overrides_that_name_fields_pass():
  argv = [
    'prog',
    '--config=c.py',
    '--config.optimizer.learning_rate=1',
    '--config.model',
    '{}',
    '--config_other=1',
    '--workdir',
    'w',
    'config.zzz=1',
  ]
  assert command_line.unknown_override(argv, _config()) is None


@pytest.mark.parametrize(
  'argv,value',
  [
    (['p', '--config=a.py:cpu', '--config.beta=1'], 'a.py:cpu'),
    (['p', '--config', 'b.py', '--config.beta=1'], 'b.py'),
    (['p', '--config.beta=1', '--configs=c.py'], None),
    (['p', '--config'], None),
  ],
)
def test_flag_argument_reads_both_forms(argv, value):
  assert command_line.flag_argument(argv, 'config') == value
