r"""Embeddings of images by a training run's encoder, written as .npz (the program;
hscl_jax.evaluation.embedding says what it computes and does the work).

    python -m hscl_jax.embed --workdir=RUN --folder=DIR --out=FILE.npz
    python -m hscl_jax.embed --workdir=RUN --split=test --out=FILE.npz [--projections] \
        [--checkpoint=best|latest|STEP]

--folder embeds every image under DIR (labelled when DIR holds one sub-folder per class);
--split embeds the run's own train or test split. The file holds `features` (L2-normalised;
the backbone's, the kNN monitor's, or with --projections the projection head's), `labels`
(-1 where unknown), `class_names`, and `paths` (folder) or `indices` (split).
"""

from __future__ import annotations

from absl import app
from absl import flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.evaluation import embedding
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the training run.', required=True)
_OUT = flags.DEFINE_string('out', None, 'The .npz file to write.', required=True)
_FOLDER = flags.DEFINE_string('folder', None, 'Embed every image under this folder.')
_SPLIT = flags.DEFINE_enum('split', None, embedding.SPLITS, "Embed the run's own split instead.")
_PROJECTIONS = flags.DEFINE_bool(
  'projections', False, "The projection head's outputs instead of the backbone's features."
)
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, trained_run.CHECKPOINT_HELP)
_CHECKPOINT_STEP = flags.DEFINE_integer('checkpoint_step', None, trained_run.CHECKPOINT_STEP_HELP)


def _embed_from_flags() -> dict:
  workdir = _WORKDIR.value
  return embedding.embed(
    workdir,
    _OUT.value,
    folder=_FOLDER.value,
    split=_SPLIT.value,
    projections=_PROJECTIONS.value,
    checkpoint_step=trained_run.checkpoint_choice(_CHECKPOINT.value, _CHECKPOINT_STEP.value),
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  summary = errors.exit_on_user_error(_embed_from_flags)
  print(
    f'embedded {summary["num_images"]} images ({summary["what"]}, dim {summary["dim"]}, '
    f'checkpoint step {summary["checkpoint_step"]}) in {summary["seconds"]:.1f}s -> '
    f'{summary["out"]}'
  )


def run():
  """The `hscl-embed` console script; `python -m hscl_jax.embed` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
