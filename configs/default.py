"""Shared defaults: the paper's protocol (docs/method.md), which the dataset configs override.

Every hyperparameter of a run lives here; `hscl_jax.training` reads nothing else. Values
that follow from others (steps per epoch, the learning-rate schedule, tau and beta of
each epoch, M = n - 2) are derived in `hscl_jax.training` in one place each.
Override any field on the command line, e.g. `--config.method=scl --config.num_epochs=50`.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

# Per-channel (mean, std) of each training split on [0, 1] pixels: config.augment.mean/std
# of configs/<dataset>.py (image folders keep AugmentParams' ImageNet default).
NORMALIZATION = {
  # 8x8 grey digits, 0..16 scaled to 0..1 (0.3055, 0.3759 on our 80% split), rounded.
  'digits': ((0.30,) * 3, (0.38,) * 3),
  'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  'stl10': ((0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)),
}


def get_config() -> ml_collections.ConfigDict:
  """Paper defaults for a 32-pixel dataset (CIFAR-10 statistics)."""
  config = ml_collections.ConfigDict()

  # --- Data ---
  config.dataset = 'cifar10'  # digits | cifar10 | cifar100 | stl10 | image_folder
  config.data_dir = config_dict.placeholder(str)  # TFDS data_dir; None = TFDS default
  config.folder = config_dict.placeholder(str)  # root of an image_folder dataset
  # Seed of the train/test split (digits; image folders without train/ and test/). Kept
  # apart from `seed` so that runs with different seeds share one split.
  config.split_seed = 0
  config.train_split = 'train'  # split trained on; also the kNN memory bank
  config.test_split = 'test'  # kNN queries
  # Train on a class-balanced subset of this many training examples, drawn by split_seed
  # (the same subset for every method and seed); the kNN bank and the linear evaluation
  # use the same subset, the test split stays whole. 0 or None (unset) = the whole split:
  # `--config.train_examples=0` on the command line.
  config.train_examples = config_dict.placeholder(int)
  # Image files and TFDS records of a split whose decoded uint8 size is at most this many
  # GiB are decoded once per process, in parallel, then read from memory (0 = always lazy).
  config.decode_cache_gib = 2.0
  # 'augmentation': the two views are augmentations of one image (SimCLR).
  # 'label': the second view is another image of the same class (Lemma 1 experiment).
  config.positive_mode = 'augmentation'
  # Class-aware batches (docs/training.md, "Class-aware batches"): 0 = uniform batches (the
  # paper's); m >= 1 = every global batch holds m examples of each of batch_size / m
  # classes, so an anchor meets exactly m - 1 other samples of its class.
  config.samples_per_class = 0

  # --- Method (docs/method.md, "The four settings"; eq. (3) of the paper) ---
  # A name of the methods table (hscl_jax/config/methods.py): ucl (SimCLR) | hucl (HCL) | scl
  # | hscl, and for hscl config.hardening picks the row.
  config.method = 'hscl'
  config.hardening = 'exp'  # hscl and diagnostics: 'exp' = H-SCL(beta), 'threshold' = H-SCL(tau)
  config.beta = 1.0  # exponential hardening strength (hucl, hscl with hardening='exp')
  # HCL annealing of beta: lower it by beta/l every num_epochs/l epochs; 0 = constant beta.
  config.beta_anneal_steps = 0
  # H-SCL(tau), eq. (4): tau = exp(l / temperature), l linear in the epoch from start to end.
  config.tau_start = -0.3
  config.tau_end = 0.0
  config.tau_plus = 0.0  # hucl debiasing class prior (0 = plain H-UCL)
  config.temperature = 0.5  # gamma
  config.M = config_dict.placeholder(int)  # None = n - 2 for the global batch (papers)
  config.stop_gradient_weights = False  # detach the hardening weights (variant)
  config.diagnostics = True  # Assumption 1 fraction and the four losses on training batches
  # Positives shared by the four diagnostic losses: 'sample' (other views; with
  # positive_mode='label' this is the Lemma 1 set-up) or 'label' (all same-label rows).
  config.diagnostics_positives = 'sample'
  # Negatives beyond the batch (HCL App. C.1, MoCo-v2; docs/training.md): a queue of the
  # keys of earlier batches with their labels, K = queue_size slots (0 = off; a multiple
  # of the 2 * batch_size rows of a step). queue_momentum m = 0: the keys are the online
  # projections, detached; m > 0: a key encoder, θ_k <- m θ_k + (1 - m) θ_q after each step,
  # gives the keys of every non-anchor row (MoCo-v2: K = 65536, m = 0.999, temperature 0.2).
  config.queue_size = 0
  config.queue_momentum = 0.0

  # --- Model ---
  config.model = ml_collections.ConfigDict()
  config.model.name = 'resnet50'  # resnet18 | resnet34 | resnet50 | small_cnn
  config.model.stem = 'cifar'  # cifar (3x3, stride 1, no max-pool) | imagenet (7x7/2 + max-pool)
  config.model.head_hidden = 512
  config.model.head_out = 128
  config.model.dtype = 'float32'  # compute dtype: float32 | bfloat16 (the loss is always f32)
  config.model.bn_momentum = 0.9
  # batch (the paper's; synced over devices) | group | layer: group and layer never mix
  # samples, so chunk_size > 0 then gives exactly the unchunked gradient.
  config.model.norm = 'batch'
  # relu (the paper's) | silu | gelu: smooth ones make the gradient continuous in the input.
  config.model.activation = 'relu'
  # symmetric (torchvision's, the paper's: the stride-2 3x3 convolutions pad 1 on each
  # side) | same (Flax's 'SAME'; a run stored before this field existed reads as same).
  config.model.strided_padding = 'symmetric'

  # --- Augmentation (fields of hscl_jax.data.augment.AugmentParams; SimCLR's recipe) ---
  config.augment = ml_collections.ConfigDict()
  config.augment.image_size = 32
  config.augment.crop_scale = (0.08, 1.0)
  config.augment.crop_ratio = (3 / 4, 4 / 3)
  config.augment.flip_prob = 0.5
  config.augment.jitter_prob = 0.8
  config.augment.brightness = 0.4
  config.augment.contrast = 0.4
  config.augment.saturation = 0.4
  config.augment.hue = 0.1
  config.augment.jitter_random_order = True  # torchvision's ColorJitter order
  config.augment.grayscale_prob = 0.2
  config.augment.blur_prob = 0.0  # SimCLR leaves blur off at 32 pixels (on at 96)
  config.augment.blur_min_size = 0  # blur whenever blur_prob > 0
  config.augment.blur_sigma = (0.1, 2.0)
  config.augment.blur_kernel_frac = 0.1
  config.augment.mean, config.augment.std = NORMALIZATION['cifar10']

  # --- Optimisation ---
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = 'adam'  # adam (coupled L2, as torch.optim.Adam) | adamw | sgd | lars
  config.optimizer.learning_rate = 1e-3  # peak learning rate
  config.optimizer.weight_decay = 1e-6
  config.optimizer.schedule = 'constant'  # constant | cosine (to 0 at the last step)
  config.optimizer.warmup_epochs = 0.0  # linear warm-up from 0 (either schedule)
  config.optimizer.b1 = 0.9  # adam/adamw
  config.optimizer.b2 = 0.999  # adam/adamw
  config.optimizer.eps = 1e-8  # adam/adamw
  config.optimizer.momentum = 0.9  # sgd/lars
  config.optimizer.nesterov = False  # sgd
  config.optimizer.trust_coefficient = 0.001  # lars
  # Exclude biases and BatchNorm parameters (rank <= 1) from weight decay (and from
  # LARS adaptation). The paper's PyTorch code decays everything.
  config.optimizer.exclude_rank1_from_decay = False

  config.batch_size = 512  # global, in samples (each gives two views)
  # Gradient caching: samples per device per chunk (0 = off). The step runs the encoder
  # chunk by chunk (forward, then the loss of the whole batch, then per chunk the forward
  # again with its backward), so memory holds one chunk's activations. BatchNorm then
  # normalises each chunk (its samples on every device) instead of the whole batch.
  config.chunk_size = 0
  # Unroll the loops over chunks instead of lax.scan: on CPU (XLA:CPU runs convolutions in
  # loop bodies slowly) ~1.2x the unchunked step instead of ~15-30x; compile time and
  # memory then grow with the number of chunks, so keep False on GPUs and TPUs.
  config.chunk_unroll = False
  config.num_epochs = 200
  config.seed = 0
  # Cap on optimisation steps per epoch (smoke tests); None = one full pass over the split.
  config.steps_per_epoch_limit = config_dict.placeholder(int)

  # --- kNN monitor (weights exp(sim / temperature), normalised backbone features) ---
  config.knn = ml_collections.ConfigDict()
  config.knn.every_epochs = 1  # 0 = never
  config.knn.k = 200
  config.knn.temperature = 0.5
  config.knn.batch_size = 512  # global batch for feature extraction
  config.knn.chunk_size = 256  # queries per on-device chunk

  # --- Linear evaluation (python -m hscl_jax.linear_eval --workdir=DIR, after training) ---
  config.linear_eval = ml_collections.ConfigDict()
  config.linear_eval.protocol = 'features'  # features (extracted once) | augmented (the paper's)
  config.linear_eval.num_epochs = 100
  config.linear_eval.learning_rate = 1e-3  # Adam, as the paper
  config.linear_eval.weight_decay = 1e-6
  config.linear_eval.batch_size = 512

  # --- Checkpoints and logging ---
  config.checkpoint_every_epochs = 1
  config.keep_checkpoints = 3
  config.log_every_steps = 50  # progress line (and non-finite check) period

  return config


def cpu_budget(config: ml_collections.ConfigDict, *, train_examples: int, num_epochs: int):
  """The CPU-budget comparison's settings (docs/results/cifar10/, configs/cifar10_folder.py
  says why each): small_cnn, a class-balanced subset, batch 128, Adam 3e-3 with warm-up
  and a cosine schedule, crops of at least 20 %, the kNN every epoch, the linear
  evaluation at batch 128 and Adam 1e-2, one checkpoint kept."""
  config.model.name = 'small_cnn'
  config.augment.crop_scale = (0.2, 1.0)
  config.train_examples = train_examples
  config.batch_size = 128
  config.num_epochs = num_epochs
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'cosine'
  config.optimizer.warmup_epochs = 0.5
  config.knn.every_epochs = 1
  config.linear_eval.batch_size = 128
  config.linear_eval.learning_rate = 1e-2
  config.checkpoint_every_epochs = 1
  config.keep_checkpoints = 1
  config.log_every_steps = 10
  return config
