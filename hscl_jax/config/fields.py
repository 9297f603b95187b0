"""Every field of a run's config, each declared once: its dotted name, default, check,
whether a resumed run may change it, and what it means.

`configs/default.py`'s `get_config()` is `default_config()`: the paper's protocol for a
32-pixel dataset (CIFAR-10 statistics), which the dataset configs override. Every
hyperparameter of a run is a field here; `hscl_jax.training` reads nothing else. Values
that follow from others (steps per epoch, the learning-rate schedule, tau and beta of each
epoch, M = n - 2) are derived in `hscl_jax.training` in one place each. Override any field
on the command line, e.g. `--config.method=scl --config.num_epochs=50`.

A check here looks at one value; config/schema checks the fields bounded by others, and
`models.create_model` and `data.augment.AugmentParams` check config.model and
config.augment, which they build (also from a stored run's config.json).

Adding a field is its `Field(...)` here and the code that reads it. A stored run's
config.json written before the field existed lacks it: its `absent=` states what that run
trained with, and rundir/versions derives the old runs' migration from it: a resumed run
continues with that value (a model field, which every program builds from config.json,
reads as it in the format that added it, and a resumed run given another is refused
naming it). Leave `absent` out (AS_GIVEN) only where a run without the field resumes
correctly with any value it is given.
"""

from __future__ import annotations

import ml_collections

from hscl_jax.config import choices
from hscl_jax.config import methods
from hscl_jax.config.checks import AS_GIVEN
from hscl_jax.config.checks import Field
from hscl_jax.config.checks import at_least
from hscl_jax.config.checks import choice
from hscl_jax.config.checks import in_unit_interval
from hscl_jax.config.checks import positive
from hscl_jax.config.checks import unset
from hscl_jax.config.checks import unset_or
from hscl_jax.errors import fail

# Per-channel (mean, std) of each training split on [0, 1] pixels: config.augment.mean/std
# of configs/<dataset>.py (a config without its own keeps the default, CIFAR-10's).
NORMALIZATION = {
  # 8x8 grey digits, 0..16 scaled to 0..1 (0.3055, 0.3759 on our 80% split), rounded.
  'digits': ((0.30,) * 3, (0.38,) * 3),
  'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  'stl10': ((0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)),
  # ImageNet's (torchvision's): photographs of one's own, configs/image_folder.py.
  'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
DIAGNOSTICS_POSITIVES = ('sample', 'label')
LINEAR_EVAL_PROTOCOLS = ('features', 'augmented')  # both run by evaluation/linear_evaluation

KEEP = "drop the override to keep the config file's value"
_AT_LEAST_1 = at_least(1, 'use e.g. 1')

DATA = (
  Field(
    'dataset',
    'cifar10',
    choice(choices.DATASETS),
    doc='digits | cifar10 | cifar100 | stl10 | image_folder',
  ),
  Field('data_dir', unset(str), free=True, doc='TFDS data_dir; None = TFDS default'),
  Field('folder', unset(str), doc='root of an image_folder dataset'),
  Field(
    'split_seed',
    0,
    doc='Seed of the train/test split (digits; image folders without train/ and test/). '
    'Kept apart from `seed` so that runs with different seeds share one split.',
  ),
  Field('train_split', 'train', doc='split trained on; also the kNN memory bank'),
  Field('test_split', 'test', doc='kNN queries'),
  Field(
    'train_examples',
    unset(int),
    unset_or(at_least(0, 'use 0 (or leave it unset) for the whole training split')),
    doc='Train on a class-balanced subset of this many training examples, drawn by '
    'split_seed (the same subset for every method and seed); the kNN bank and the linear '
    'evaluation use the same subset, the test split stays whole. 0 or None (unset) = the '
    'whole split: `--config.train_examples=0` on the command line.',
  ),
  Field(
    'decode_cache_gib',
    2.0,
    at_least(0, 'use e.g. 2'),
    free=True,
    doc='Image files and TFDS records of a split whose decoded uint8 size is at most this '
    'many GiB are decoded once per process, in parallel, then read from memory (0 = always '
    'lazy).',
  ),
  Field(
    'positive_mode',
    'augmentation',
    choice(choices.POSITIVE_MODES),
    doc="'augmentation': the two views are augmentations of one image (SimCLR). 'label': "
    'the second view is another image of the same class (Lemma 1 experiment).',
  ),
  Field(
    'samples_per_class',
    0,  # config/schema: a whole number; training: against the data
    doc='Class-aware batches (docs/training.md, "Class-aware batches"): 0 = uniform batches '
    "(the paper's); m >= 1 = every global batch holds m examples of each of batch_size / m "
    'classes, so an anchor meets exactly m - 1 other samples of its class.',
  ),
)

# Method: docs/method.md, "The four settings"; eq. (3) of the paper.
METHOD = (
  Field(
    'method',
    'hscl',
    choice(methods.NAMES),
    doc='A name of the methods table (hscl_jax/config/methods.py): ucl (SimCLR) | hucl (HCL) '
    '| scl | hscl, and for hscl config.hardening picks the row; the sigmoid (SigLIP) family '
    'sigmoid | sigmoid_scl | sigmoid_hscl (hardening exp).',
  ),
  Field(
    'hardening',
    'exp',
    choice(methods.HARDENINGS),
    doc="hscl and diagnostics: 'exp' = H-SCL(beta), 'threshold' = H-SCL(tau); "
    "sigmoid_hscl: 'exp' only",
  ),
  Field(
    'beta',
    1.0,
    at_least(0, 'use e.g. --config.beta=1.0; beta=0 is SCL/UCL'),
    doc="exponential hardening strength (hucl, hscl with hardening='exp')",
  ),
  Field(
    'beta_anneal_steps',
    0,  # config/schema checks it against num_epochs
    doc='HCL annealing of beta: lower it by beta/l every num_epochs/l epochs; 0 = constant beta.',
  ),
  Field(
    'tau_start',
    -0.3,
    doc='H-SCL(tau), eq. (4): tau = exp(l / temperature), l linear in the epoch from start '
    '(tau_start) to end (tau_end).',
  ),
  Field('tau_end', 0.0, doc="H-SCL(tau), eq. (4): the level l at the last epoch (tau_start's)"),
  Field(
    'tau_plus',
    0.0,
    in_unit_interval('use 0 (no debiasing) or e.g. 0.1'),
    doc='hucl debiasing class prior (0 = plain H-UCL)',
  ),
  Field('temperature', 0.5, positive('use e.g. --config.temperature=0.5 (the paper)'), doc='gamma'),
  Field(
    'sigmoid_log_t',
    methods.SIGMOID_START['log_t'],
    doc="The sigmoid methods' scale t = e^{log_t} at the start (SigLIP's log 10); log_t and "
    'sigmoid_b are trained with the model and kept in the train state.',
    absent=methods.SIGMOID_START['log_t'],
  ),
  Field(
    'sigmoid_b',
    methods.SIGMOID_START['b'],
    doc="The sigmoid methods' bias b at the start (SigLIP's)",
    absent=methods.SIGMOID_START['b'],
  ),
  Field(
    'M',
    unset(int),
    unset_or(positive('leave it unset (None = n - 2)')),
    doc='None = n - 2 for the global batch (papers)',
  ),
  Field('stop_gradient_weights', False, doc='detach the hardening weights (variant)'),
  Field('diagnostics', True, doc='Assumption 1 fraction and the four losses on training batches'),
  Field(
    'diagnostics_positives',
    'sample',
    choice(DIAGNOSTICS_POSITIVES),
    doc="Positives shared by the four diagnostic losses: 'sample' (other views; with "
    "positive_mode='label' this is the Lemma 1 set-up) or 'label' (all same-label rows).",
  ),
  Field(
    'queue_size',
    0,  # config/schema checks it against the global batch
    doc='Negatives beyond the batch (HCL App. C.1, MoCo-v2; docs/training.md): a queue of the '
    'keys of earlier batches with their labels, K = queue_size slots (0 = off; a multiple '
    'of the 2 * batch_size rows of a step).',
  ),
  Field(
    'queue_momentum',
    0.0,
    in_unit_interval('use 0 (no key encoder) or e.g. 0.999 (MoCo-v2)'),
    doc='queue_momentum m = 0: the keys are the online projections, detached; m > 0: a key '
    'encoder, θ_k <- m θ_k + (1 - m) θ_q after each step, gives the keys of every non-anchor row '
    '(MoCo-v2: K = 65536, m = 0.999, temperature 0.2).',
  ),
)


def _padding_before_the_field(stored) -> str:
  """A ResNet stored before model.strided_padding padded its strided convolutions as Flax's
  'SAME'; small_cnn's convolutions pad 'SAME' whatever the field says, so it holds none."""
  return 'same' if str(stored.get('model.name', '')).startswith('resnet') else AS_GIVEN


# Model: checked by models.create_model, which builds it (also from a stored config.json).
MODEL = (
  Field('model.name', 'resnet50', doc='resnet18 | resnet34 | resnet50 | small_cnn'),
  Field(
    'model.stem', 'cifar', doc='cifar (3x3, stride 1, no max-pool) | imagenet (7x7/2 + max-pool)'
  ),
  Field('model.head_hidden', 512, doc="width of the projection head's hidden layer"),
  Field('model.head_out', 128, doc='dimension of the projections the loss compares'),
  Field('model.dtype', 'float32', doc='compute dtype: float32 | bfloat16 (the loss is always f32)'),
  Field('model.bn_momentum', 0.9, doc="BatchNorm's running-average momentum, in [0, 1)"),
  Field(
    'model.norm',
    'batch',
    doc="batch (the paper's; synced over devices) | group | layer: group and layer never mix "
    'samples, so chunk_size > 0 then gives exactly the unchunked gradient.',
  ),
  Field(
    'model.activation',
    'relu',
    doc="relu (the paper's) | silu | gelu: smooth ones make the gradient continuous in the input.",
    absent='relu',
  ),
  Field(
    'model.strided_padding',
    'symmetric',
    doc="symmetric (torchvision's, the paper's: the stride-2 3x3 convolutions pad 1 on each "
    "side) | same (Flax's 'SAME'; a run stored before this field existed reads as same).",
    absent=_padding_before_the_field,
  ),
)

# Augmentation: the fields of hscl_jax.data.augment.AugmentParams, which checks them
# (SimCLR's recipe).
AUGMENT = (
  Field('augment.image_size', 32, doc='side of the crops, in pixels'),
  Field(
    'augment.crop_scale',
    (0.08, 1.0),
    doc="random resized crop: range of the crop's area, a fraction of the image's",
  ),
  Field(
    'augment.crop_ratio', (3 / 4, 4 / 3), doc="range of the crop's aspect ratio (width / height)"
  ),
  Field('augment.flip_prob', 0.5, doc='probability of a horizontal flip'),
  Field(
    'augment.jitter_prob', 0.8, doc='probability of the colour jitter (its four parts together)'
  ),
  Field('augment.brightness', 0.4, doc='colour jitter: brightness factor from U(1 - b, 1 + b)'),
  Field('augment.contrast', 0.4, doc='colour jitter: contrast factor from U(1 - c, 1 + c)'),
  Field('augment.saturation', 0.4, doc='colour jitter: saturation factor from U(1 - s, 1 + s)'),
  Field('augment.hue', 0.1, doc='colour jitter: hue shift from U(-hue, hue), in turns (<= 0.5)'),
  Field('augment.jitter_random_order', True, doc="torchvision's ColorJitter order"),
  Field('augment.grayscale_prob', 0.2, doc='probability of converting to grayscale'),
  Field('augment.blur_prob', 0.0, doc='SimCLR leaves blur off at 32 pixels (on at 96)'),
  Field('augment.blur_min_size', 0, doc='blur whenever blur_prob > 0'),
  Field(
    'augment.blur_sigma',
    (0.1, 2.0),
    doc="range of the Gaussian blur's standard deviation, in pixels",
  ),
  Field(
    'augment.blur_kernel_frac', 0.1, doc='blur kernel side as a fraction of image_size (odd, >= 3)'
  ),
  Field(
    'augment.mean',
    NORMALIZATION['cifar10'][0],
    doc='per-channel mean subtracted from [0, 1] pixels',
  ),
  Field(
    'augment.std',
    NORMALIZATION['cifar10'][1],
    doc='per-channel standard deviation the pixels are divided by',
  ),
)

OPTIMIZER = (
  Field(
    'optimizer.name',
    'adam',
    choice(choices.OPTIMIZERS),
    doc='adam (coupled L2, as torch.optim.Adam) | adamw | sgd | lars',
  ),
  Field('optimizer.learning_rate', 1e-3, positive('use e.g. 1e-3'), doc='peak learning rate'),
  Field(
    'optimizer.weight_decay',
    1e-6,
    at_least(0, 'use e.g. 1e-6'),
    doc='L2 coefficient (coupled for adam, decoupled for adamw)',
  ),
  Field(
    'optimizer.schedule',
    'constant',
    choice(choices.LR_SCHEDULES),
    doc='constant | cosine (to 0 at the last step)',
  ),
  Field(
    'optimizer.warmup_epochs',
    0.0,  # config/schema checks it against num_epochs
    doc='linear warm-up from 0 (either schedule)',
  ),
  Field('optimizer.b1', 0.9, in_unit_interval('use e.g. 0.9'), doc='adam/adamw'),
  Field('optimizer.b2', 0.999, in_unit_interval('use e.g. 0.9'), doc='adam/adamw'),
  Field('optimizer.eps', 1e-8, positive(KEEP), doc='adam/adamw'),
  Field('optimizer.momentum', 0.9, in_unit_interval('use e.g. 0.9'), doc='sgd/lars'),
  Field('optimizer.nesterov', False, doc='sgd'),
  Field('optimizer.trust_coefficient', 0.001, positive(KEEP), doc='lars'),
  Field(
    'optimizer.exclude_rank1_from_decay',
    False,
    doc='Exclude biases and BatchNorm parameters (rank <= 1) from weight decay (and from '
    "LARS adaptation). The paper's PyTorch code decays everything.",
  ),
)

TRAINING = (
  Field(
    'batch_size',
    512,  # config/schema checks it against the devices
    doc='global, in samples (each gives two views)',
  ),
  Field(
    'chunk_size',
    0,  # config/schema checks it against the per-device batch
    doc='Gradient caching: samples per device per chunk (0 = off). The step runs the encoder '
    'chunk by chunk (forward, then the loss of the whole batch, then per chunk the forward '
    "again with its backward), so memory holds one chunk's activations. BatchNorm then "
    'normalises each chunk (its samples on every device) instead of the whole batch.',
  ),
  Field(
    'chunk_unroll',
    False,
    free=True,  # how the compiler loops over the same chunks: not the result
    doc='Unroll the loops over chunks instead of lax.scan: on CPU (XLA:CPU runs convolutions '
    'in loop bodies slowly) ~1.2x the unchunked step instead of ~15-30x; compile time and '
    'memory then grow with the number of chunks, so keep False on GPUs and TPUs.',
  ),
  Field('num_epochs', 200, at_least(1, 'use e.g. 200'), doc='passes over the training split'),
  Field('seed', 0, doc="the run's one seed: initialisation, visiting order, augmentations"),
  Field(
    'steps_per_epoch_limit',
    unset(int),
    unset_or(at_least(1, 'leave it unset (a full pass per epoch)')),
    doc='Cap on optimisation steps per epoch (smoke tests); None = one full pass over the split.',
  ),
)


def _retrieval_metrics(field, value):
  try:
    choices.retrieval_metric_names(value)
  except ValueError as error:
    fail(field, str(error).rstrip('.'), "use e.g. 'precision_at_1,map_at_r', or ''")


# kNN monitor: weights exp(sim / temperature), normalised backbone features.
KNN = (
  Field('knn.every_epochs', 1, at_least(0, 'use 1, or 0 to disable'), doc='0 = never'),
  Field('knn.k', 200, at_least(1, 'use e.g. 200'), doc='neighbours that vote'),
  Field(
    'knn.temperature',
    0.5,
    positive('use e.g. 0.5'),
    doc="a neighbour's vote is exp(sim / temperature)",
  ),
  Field(
    'knn.batch_size',
    512,  # config/schema checks it against the devices
    free=True,
    doc='global batch for feature extraction',
  ),
  Field(
    'knn.chunk_size', 256, at_least(1, 'use e.g. 256'), free=True, doc='queries per on-device chunk'
  ),
  Field(
    'knn.retrieval',
    'precision_at_1,map_at_r',
    _retrieval_metrics,
    free=True,
    doc='Retrieval metrics of the same features with each kNN monitor (the test split '
    'ranked against the bank), comma-separated among precision_at_1, r_precision, '
    "map_at_r and recall_at_K (any K >= 1); '' = none (docs/training.md, 'Retrieval "
    "metrics')",
  ),
)

# The online linear probe (training/online_probe; docs/training.md, "The online linear probe"): its
# state is in every checkpoint, so a resumed run keeps these as it started.
PROBE = (
  Field(
    'probe.enabled',
    True,
    doc='Train a linear classifier in every step on the detached, normalised backbone '
    "features of the step's views (labelled data; the encoder's update is unchanged) and "
    "report its test top-1 (probe_top1) with each kNN monitor. A stored run's config "
    'without it trained without one.',
    absent=False,
  ),
  Field(
    'probe.learning_rate',
    1e-3,
    positive('use e.g. 1e-3'),
    doc="Adam with coupled L2, constant, as linear evaluation's",
  ),
  Field('probe.weight_decay', 1e-6, at_least(0, 'use e.g. 1e-6'), doc='coupled L2, as Adam'),
)

# Linear evaluation: python -m hscl_jax.linear_eval --workdir=DIR, after training; it reads
# these from DIR/config.json, so they may change freely.
LINEAR_EVAL = (
  Field(
    'linear_eval.protocol',
    'features',
    choice(LINEAR_EVAL_PROTOCOLS),
    free=True,
    doc="features (extracted once) | augmented (the paper's)",
  ),
  Field(
    'linear_eval.num_epochs',
    100,
    at_least(1, 'use e.g. 100'),
    free=True,
    doc="the classifier's epochs",
  ),
  Field(
    'linear_eval.learning_rate',
    1e-3,
    positive('use e.g. 1e-3'),
    free=True,
    doc='Adam, as the paper',
  ),
  Field(
    'linear_eval.weight_decay', 1e-6, at_least(0, 'use e.g. 1e-6'), free=True, doc='coupled L2'
  ),
  Field('linear_eval.batch_size', 512, at_least(1, 'use e.g. 100'), free=True, doc='global batch'),
)

CHECKPOINTS = (
  Field(
    'checkpoint_every_epochs',
    1,
    _AT_LEAST_1,
    free=True,
    doc='save every this many epochs (the last and the best epoch are saved whatever it says)',
  ),
  Field(
    'keep_checkpoints',
    3,
    _AT_LEAST_1,
    free=True,
    doc='newest checkpoints kept (the best one besides)',
  ),
  Field(
    'keep_best',
    'auto',
    free=True,
    doc='besides the newest: the best checkpoint by a figure of the epoch records. '
    "'auto': the kNN top-1 (knn_top1) where the kNN monitor runs, none without it; a "
    "figure, e.g. 'map_at_r' ('NAME:min' or 'NAME:max' says which way; a loss is smallest "
    "first); '' keeps none. A resumed run left at 'auto' keeps what it started with "
    "(docs/training.md, 'Which checkpoint')",
    absent='',  # a run stored before the field kept no best checkpoint
  ),
  Field(
    'log_every_steps',
    50,
    _AT_LEAST_1,
    free=True,
    doc='period of the progress line, the non-finite check and the per-step scalars '
    '(DIR/steps.jsonl, TensorBoard)',
  ),
  Field(
    'profile_steps',
    0,
    at_least(0, 'use 0 (off) or e.g. 5'),
    free=True,
    doc='a jax.profiler trace of this many steps after the compiling one, into DIR/profile; '
    '0 = off',
  ),
)

# In the order configs/default.py has always listed them (config.json keeps it).
DECLARED = (
  *DATA,
  *METHOD,
  *MODEL,
  *AUGMENT,
  *OPTIMIZER,
  *TRAINING,
  *KNN,
  *PROBE,
  *LINEAR_EVAL,
  *CHECKPOINTS,
)
FIELDS: dict[str, Field] = {field.name: field for field in DECLARED}


def _sections() -> dict[str, tuple[str, ...]]:
  """{section ('' = top level): its field names}, as the config nests them."""
  sections: dict[str, list[str]] = {'': []}
  for name in FIELDS:
    section, _, leaf = name.rpartition('.')
    if section and section not in sections['']:
      sections[''].append(section)
    sections.setdefault(section, []).append(leaf)
  return {section: tuple(names) for section, names in sections.items()}


CONFIG_FIELDS = _sections()
FREE_FIELDS = tuple(name for name, field in FIELDS.items() if field.free)


def default_config() -> ml_collections.ConfigDict:
  """Every field at its default, nested in its section, in declaration order."""
  config = ml_collections.ConfigDict()
  for field in DECLARED:
    *sections, leaf = field.name.split('.')
    node = config
    for section in sections:
      if section not in node:
        node[section] = ml_collections.ConfigDict()
      node = node[section]
    node[leaf] = field.initial()
  return config


def value_of(config, field: str):
  """The value of a dotted field."""
  for part in field.split('.'):
    config = config[part]
  return config
