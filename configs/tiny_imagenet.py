"""Tiny-ImageNet-200 read in its official layout (wnids.txt, train/<wnid>/images/, val/), 64 px.

    python -m hscl_jax.main --config=configs/tiny_imagenet.py \
        --config.folder=DIR/tiny-imagenet-200 --workdir=RUN

The folder is the one the official tiny-imagenet-200.zip unpacks to: the 200 classes in
wnids.txt's order, their names from words.txt, the labelled val/ split (val_annotations.txt)
as the test split, as every paper that reports Tiny-ImageNet does. Images at their native
64 px; normalisation measured on the training split (50,000 images at 64 px, [0, 1]
pixels): mean (0.4800, 0.4480, 0.3975), std (0.2765, 0.2690, 0.2818). The rest is the
paper's protocol (configs/default.py) with ResNet-18 (CIFAR stem: at 64 px the 7x7/2
stem and max-pool would leave 2x2 maps at the last stage): an accelerator's run.

The CPU budget of the comparison in docs/results/tiny_imagenet/ is `:cpu`:

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --seeds=3 --seeds_for=scl=5,hscl_beta=5 \
        --workdir=ROOT --report_dir=docs/results/tiny_imagenet

(the finished runs are recorded in docs/results/tiny_imagenet/runs/, so the same command
goes on from them with an empty ROOT: docs/training.md, "The paper's comparison").

The same comparison swept over the label density of a batch (class-aware batches: 4 and 16
samples of each class; docs/results/tiny_imagenet_density/), each density its own grid,
then one report across the three:

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 --seeds=3 \
        --seeds_for=hucl=5,hscl_beta=5,scl=5 --workdir=ROOT_M4 \
        --report_dir=docs/results/tiny_imagenet_density/m4
    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=16 --seeds=3 \
        --seeds_for=ucl=0,scl=0,hscl_tau=0 --workdir=ROOT_M16 \
        --report_dir=docs/results/tiny_imagenet_density/m16
    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --sweep=samples_per_class \
        --points=0=docs/results/tiny_imagenet,\
4=docs/results/tiny_imagenet_density/m4,16=docs/results/tiny_imagenet_density/m16 \
        --report_dir=docs/results/tiny_imagenet_density

At three times the budget (9 epochs) at 4 per class, the three methods of the open
question on seeds 0-4, then the report that sets them beside the 3-epoch runs of the
same seeds (docs/results/tiny_imagenet_density/budgets/):

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 \
        --config.num_epochs=9 --seeds=5 --seeds_for=ucl=0,hscl_tau=0 --workdir=ROOT_M4_E9 \
        --report_dir=docs/results/tiny_imagenet_density/m4_e9
    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 --sweep=num_epochs \
        --points=3=docs/results/tiny_imagenet_density/m4,\
9=docs/results/tiny_imagenet_density/m4_e9 \
        --report_dir=docs/results/tiny_imagenet_density/budgets

The sigmoid family asked the same question (does hardening help a supervised loss?) on
that 9-epoch protocol: Sig-SCL and Sig-H-SCL(beta) (the config's beta, 1), seeds 0-2,
their runs recorded beside the softmax ones in m4_e9/runs/ (--records), and their report
beside H-UCL, SCL and H-SCL(beta) of the same seeds, paired by seed
(docs/results/tiny_imagenet_sigmoid/). --seeds=3 with ucl=0,hscl_tau=0 puts every row
on seeds 0-2, so Table I compares the same seeds (the softmax rows' seeds 3-4 are in
m4_e9's report); a larger --seeds takes more seeds of every row, paired where both exist:

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 \
        --config.num_epochs=9 --grid=sigmoid --seeds=3 --seeds_for=ucl=0,hscl_tau=0 \
        --workdir=ROOT_SIG --records=docs/results/tiny_imagenet_density/m4_e9 \
        --report_dir=docs/results/tiny_imagenet_sigmoid

Sig-H-SCL(beta) at beta = 0.2, the softmax runs' tilt (e^{2s} at temperature 0.5, where
the sigmoid's g = t*s has t near 10), seeds 0-2, alone (a record is reused only at the
config's beta, which the diagnostics every run records read, so Sig-SCL's beta = 1 records
do not pair here; the reading pairs them):

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 \
        --config.num_epochs=9 --config.beta=0.2 --grid=sigmoid --seeds=3 \
        --seeds_for=ucl=0,hucl=0,scl=0,hscl_beta=0,hscl_tau=0,sig_scl=0 \
        --workdir=ROOT_SIG --records=docs/results/tiny_imagenet_density/m4_e9 \
        --report_dir=docs/results/tiny_imagenet_sigmoid/beta0.2

  * 32 px (a run costs what a CIFAR-10 run costs; 64 px costs about four times as much);
  * model small_cnn (a ResNet-18 step costs ~20x as much on a CPU);
  * train_examples 20,000: a class-balanced subset, 100 images per class (the kNN bank
    and the linear evaluation use it too; the 10,000 val images are the queries). Raw
    pixels' kNN on that bank is 4.2 %, on 10,000 images 3.7 %: the larger bank gives
    a learned representation more to find per class;
  * 3 epochs (468 steps): the grid has to fit in about 3 hours, and of the two ways to
    spend ~470 steps the larger bank is the one that clears the bar (every learned
    representation's kNN at least 1.5x the raw pixels'). Measured here: 10,000 images
    for 4 epochs gave UCL seed 0 5.40 % kNN against 3.66 % raw (1.48x, below the bar);
    20,000 for 4 epochs gave UCL 6.42 / 7.21 / 7.16 % after epochs 2-4 against 4.23 %
    raw (1.70x from epoch 3 on), but cost about 3.5 hours for the grid;
  * batch 128 (M = 254 negatives; about 0.6 other samples of an anchor's class), Adam
    3e-3 with half an epoch of warm-up and a cosine schedule, crops of at least 20 % of
    the image, the kNN monitor every epoch, the linear evaluation's features protocol
    at batch 128 and Adam 1e-2: the settings measured on CIFAR-10 at this budget
    (configs/cifar10_folder.py says why each);
  * a run takes about 17 minutes on a quiet core (an epoch 4.4 minutes, its kNN 1.2,
    the linear evaluation 0.6), so the 19 runs of the comparison (3 seeds, 5 for SCL
    and H-SCL(beta)) take about 2.7 hours with two workers, one per core.
"""

from __future__ import annotations

from configs import default

NORMALIZATION = ((0.4800, 0.4480, 0.3975), (0.2765, 0.2690, 0.2818))


def get_config(budget: str | None = None):
  """The accelerator protocol at 64 px; `budget='cpu'` (`--config=...:cpu`) the CPU one."""
  config = default.get_config()
  config.dataset = 'image_folder'
  config.augment.image_size = 64
  config.augment.mean, config.augment.std = NORMALIZATION
  config.model.name = 'resnet18'
  if budget is None:
    return config
  if budget != 'cpu':
    raise ValueError(f"configs/tiny_imagenet.py takes ':cpu' or nothing, not ':{budget}'")
  config.augment.image_size = 32
  return default.cpu_budget(config, train_examples=20_000, num_epochs=3)
