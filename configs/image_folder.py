"""Your own images: an image folder of any of docs/training.md's layouts, on a CPU.

    python -m hscl_jax.main --config=configs/image_folder.py --config.folder=ROOT --workdir=RUN

A starting point for a folder of a few hundred to a few thousand photographs, each class a
sub-folder (ROOT/<class>/*, or ROOT/train/<class>/* with ROOT/test/ or ROOT/val/):
  * ImageNet's normalisation (torchvision's): the statistics of photographs in general,
    where a folder of one's own has none measured;
  * 32 px (images are centre-cropped to a square and resized), as CIFAR-10, and small_cnn:
    a CPU's budget (64 px costs about four times as much; a ResNet-18 step ~20x);
  * the whole training split (train_examples unset): no size assumed;
  * batch 64 (M = 126 negatives), so a folder of a few hundred images still gives several
    steps an epoch; a run whose epochs leave out a quarter or more of the examples says so
    at start, with the batch size that keeps them;
  * 30 epochs, Adam at 3e-3 with half an epoch of warm-up and a cosine schedule, crops of
    at least 20 % of the image: the CPU-budget settings measured on CIFAR-10
    (configs/cifar10_folder.py says why each);
  * the kNN monitor with k = 20 (the paper's 200 is most of a small folder's bank) and a
    checkpoint every 5 epochs: on a small folder an epoch takes seconds, and a kNN and a
    checkpoint each epoch would cost more than the training;
  * the linear evaluation at batch 64 and Adam 1e-2 (the features protocol).
On an accelerator, e.g. --config.model.name=resnet18 --config.augment.image_size=96
--config.model.stem=imagenet --config.batch_size=256 --config.num_epochs=200.
"""

from __future__ import annotations

from configs import default


def get_config():
  config = default.get_config()
  config.dataset = 'image_folder'
  config.augment.image_size = 32
  config.augment.mean, config.augment.std = default.NORMALIZATION['imagenet']
  config = default.cpu_budget(config, train_examples=0, num_epochs=30)
  config.batch_size = 64
  config.knn.k = 20
  config.knn.every_epochs = 5
  config.checkpoint_every_epochs = 5
  config.linear_eval.batch_size = 64
  return config
