"""Tiny-ImageNet-100 in CIFAR-100's shape: the paper's regime, for a GPU's run.

The data: the first 100 classes of Tiny-ImageNet-200's wnids.txt, their 250 training
images each (the zip in ../shared/data holds 250 of the release's 500: half of CIFAR-100's
500 per class, to be said wherever a result is shown) and their 50 validation images (the
test split): 25,000 + 5,000 images resized 64 -> 32 px with PIL's antialiased bilinear
filter, saved as JPEG q75 (tools/gpu_bundle.py packs them; 9.8 MiB gzipped). CIFAR-100's
class count and image size: at batch 512 with uniform batches an anchor meets
511 x 249 / 24,999 = 5.1 other samples of its class, CIFAR-100's density at the paper's
batch, with no class-aware sampling. Normalisation measured on the pack's training split
(25,000 images at 32 px, [0, 1] pixels): mean (0.4761, 0.4431, 0.3920), std (0.2546,
0.2467, 0.2600).

The rest is the paper's protocol (configs/default.py): ResNet-18 (CIFAR stem) in bfloat16
(the loss in float32), batch 512, Adam 1e-3 with weight decay 1e-6 (constant), temperature
0.5, beta 1, SimCLR's augmentations at 32 px, the features protocol of the linear
evaluation (100 epochs); the kNN monitor about KNN_POINTS times a run (Fig. 1's curve);
one checkpoint, at the end (the linear evaluation reads it; a SIGTERM saves one too).

EPOCHS, one epoch count for every run of the grid (runs pair only at equal E): fixed once
from the first measured ResNet-18 bfloat16 step rate, so that one run takes about 4
minutes, then never changed. While it is None (not measured yet) the config trains
PROVISIONAL_EPOCHS (a guess, not a measurement) and `tools/gpu_grid.py run` calibrates E
on the GPU it is lent (from docs/results/gpu/accelerator.json when first light recorded
one, else from benchmarks/bench_train_step.py run there); its merge writes E here, with
the rate it came from (CALIBRATION).

    python tools/gpu_bundle.py tin100 \
        --zip=../shared/data/tiny_imagenet/tiny-imagenet-200.zip --folder=/tmp/tin100
    python -m hscl_jax.main --config=configs/tin100.py --config.folder=/tmp/tin100 \
        --workdir=/tmp/tin100_run --config.method=scl
    python3 tools/gpu_grid.py run --out=OUT      # on a lent GPU: the grid's next runs
    python tools/gpu_grid.py merge --returned=OUT --data=/tmp/tin100   # here, afterwards
    python -m hscl_jax.experiments.compare --config=configs/tin100.py \
        --config.folder=/tmp/tin100 --seeds=3 --workdir=/tmp/tin100_grid \
        --report_dir=docs/results/tin100_gpu --report_only

The grid (tools/gpu_grid.py: GRID) is UCL, H-UCL, SCL, H-SCL(beta) and H-SCL(tau) over
seeds 0-2; its records and report are in docs/results/tin100_gpu/ (the merge writes them;
`compare --report_only` rewrites the report's tables from the records alone).
"""

from __future__ import annotations

from configs import default

NORMALIZATION = ((0.4761, 0.4431, 0.3920), (0.2546, 0.2467, 0.2600))
# E: None until measured (tools/gpu_grid.py's merge writes it and CALIBRATION).
EPOCHS = None
CALIBRATION = None
PROVISIONAL_EPOCHS = 30  # until E is measured: a guess (~5 s an epoch on an H100)
KNN_POINTS = 10  # kNN evaluations per run, about (and always at the last epoch)


def with_epochs(config, epochs: int):
  """`config` training `epochs` epochs, with the kNN monitor about KNN_POINTS times and
  one checkpoint at the end."""
  config.num_epochs = epochs
  config.knn.every_epochs = max(epochs // KNN_POINTS, 1)
  config.checkpoint_every_epochs = epochs
  return config


def get_config():
  config = default.get_config()
  config.dataset = 'image_folder'
  config.augment.image_size = 32
  config.augment.mean, config.augment.std = NORMALIZATION
  config.model.name = 'resnet18'
  config.model.dtype = 'bfloat16'
  config.keep_checkpoints = 1
  return with_epochs(config, EPOCHS or PROVISIONAL_EPOCHS)
