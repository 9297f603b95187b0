"""Mutation testing of the core modules: does the suite catch realistic single bugs?

Each mutant below is one realistic bug (an off-by-one, >= for >, swapped arguments, a
wrong axis, a missing collective, a wrong sign, a dropped stop_gradient, the wrong split,
a wrong default...) written by hand as (file, exact original snippet, replacement, the
tests that should catch it). The script copies the working tree (tracked and untracked,
not ignored files) to a temporary directory once, then for each mutant plants it in the
copy, runs only its tests there with ``pytest -x``, restores the file and classifies:

  * ``assertion``: a test failed on an assertion about the behaviour (AssertionError,
    pytest's ``Failed: DID NOT RAISE``);
  * ``crash``: killed, but by another exception (a test's scaffolding, a fixture, an
    import): a kill by accident, not by design;
  * ``survived``: every selected test passed.

The real files are never modified. For developers, not CI (tens of minutes on a CPU):

    python dev/mutation_test.py                 # every mutant
    python dev/mutation_test.py --only knn_temperature_multiplies
    python dev/mutation_test.py --set issue27   # one set (core, issue27)
    python dev/mutation_test.py --list
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Mutant:
  name: str
  path: str
  original: str
  replacement: str
  tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
  occurrence: int | None = None  # which occurrence of `original` when it is not unique


M = Mutant
LOSS_TESTS = ('tests/test_losses.py', 'tests/test_loss_properties.py')
MUTANTS = (
  # ---- losses: kernel
  M(
    'threshold_strict',
    'hscl_jax/losses/image.py',
    'jnp.where(g >= log_tau, 0.0, kernel.NEG_INF)',
    'jnp.where(g > log_tau, 0.0, kernel.NEG_INF)',
    ('tests/test_losses.py', 'tests/test_loss_properties.py', '-k', 'threshold'),
  ),
  M(
    'stop_gradient_ignored',
    'hscl_jax/losses/kernel.py',
    '    if not self.stop_gradient_weights:\n',
    '    if True:\n',
    ('tests/test_losses.py', '-k', 'stop_gradient'),
  ),
  M(
    'hucl_drops_stop_gradient_option',
    'hscl_jax/losses/image.py',
    'temperature, M, axis_name, block_size, precision, stop_gradient_weights, **queue_args',
    'temperature, M, axis_name, block_size, precision, False, **queue_args',
    ('tests/test_losses.py', 'tests/test_loss_properties.py', '-k', 'stop_gradient'),
    occurrence=0,  # hucl's (hscl's is the second)
  ),
  M(
    'pair_loss_sign_of_log_e',
    'hscl_jax/losses/kernel.py',
    'softplus(log_m - g + log_e)',
    'softplus(log_m - g - log_e)',
    ('tests/test_losses.py', '-k', 'test_value_matches_reference'),
  ),
  M(
    'lse_merge_wrong_sign',
    'hscl_jax/losses/kernel.py',
    'sb * jnp.exp(mb - m)',
    'sb * jnp.exp(m - mb)',
    ('tests/test_losses.py', '-k', 'blockwise_equals_dense'),
  ),
  M(
    'count_not_summed_over_devices',
    'hscl_jax/losses/kernel.py',
    'total, count = jax.lax.psum((total, count), axis_name)',
    'total = jax.lax.psum(total, axis_name)',
    # pmap: a value check; under shard_map JAX's replication check stops it first (a crash)
    ('tests/test_losses.py', '-k', 'pmap_value_equals_single_device'),
  ),
  M(
    'shard_sample_offset_dropped',
    'hscl_jax/losses/kernel.py',
    'flatten(z, labels, shard * batch)',
    'flatten(z, labels, 0)',
    ('tests/test_losses.py', '-k', 'shard_map_equals_single_device'),
  ),
  M(
    'nan_guard_dropped',
    'hscl_jax/losses/kernel.py',
    'total = jnp.where(jnp.all(jnp.isfinite(q.z)), total, jnp.nan)',
    'total = total',
    ('tests/test_losses.py', '-k', 'non_finite'),
  ),
  M(
    'padding_rows_valid',
    'hscl_jax/losses/kernel.py',
    'valid=padded.valid.at[-pad:].set(False)',
    'valid=padded.valid.at[-pad:].set(True)',
    ('tests/test_losses.py', '-k', 'blockwise_equals_dense'),
  ),
  # ---- losses: image
  M(
    'hscl_candidates_other_sample',
    'hscl_jax/losses/image.py',
    'candidates=kernel.other_label,',
    'candidates=kernel.other_sample,',
    ('tests/test_losses.py', '-k', 'test_value_matches_reference'),
  ),
  M(
    'default_m_ignores_devices',
    'hscl_jax/losses/image.py',
    'M = batch * views * devices - 2',
    'M = batch * views - 2',
    ('tests/test_losses.py', '-k', 'shard_map_equals_single_device'),
  ),
  M(
    'tau_schedule_epoch_off_by_one',
    'hscl_jax/losses/image.py',
    '(xp.asarray(epoch, dtype) - 1.0)',
    'xp.asarray(epoch, dtype)',
    ('tests/test_losses.py', '-k', 'tau_schedule'),
  ),
  M(
    'beta_schedule_ceil',
    'hscl_jax/losses/image.py',
    'drops = xp.floor(',
    'drops = xp.ceil(',
    ('tests/test_losses.py', '-k', 'beta_annealing'),
  ),
  M(
    'debias_denominator_sign',
    'hscl_jax/losses/image.py',
    'jnp.log1p(-tau_plus)',
    'jnp.log1p(tau_plus)',
    ('tests/test_losses.py', '-k', 'test_value_matches_reference'),
  ),
  M(
    'hcl_clamp_floor_wrong',
    'hscl_jax/losses/image.py',
    'log_m - 1.0 / temperature if clamp',
    'log_m - temperature if clamp',
    ('tests/test_losses.py', '-k', 'debiasing_never_nan or low_temperature'),
  ),
  # ---- losses: graph
  M(
    'graph_negatives_same_label',
    'hscl_jax/losses/graph.py',
    'candidates &= node_labels[:, None] != graph_labels[None, :]',
    'candidates &= node_labels[:, None] == graph_labels[None, :]',
    ('tests/test_graph_loss.py', '-k', 'matches_float64_reference_values'),
  ),
  M(
    'graph_mean_counts_padding',
    'hscl_jax/losses/graph.py',
    'jnp.maximum(jnp.sum(node_mask, dtype=jnp.float32), 1.0)',
    'jnp.float32(node_mask.shape[0])',
    ('tests/test_graph_loss.py', '-k', 'padding_invariance'),
  ),
  # ---- train
  M(
    'epoch_of_step_zero_based',
    'hscl_jax/training/plan.py',
    'return step // self.steps_per_epoch + 1',
    'return step // self.steps_per_epoch',
    ('tests/test_train_wiring.py', 'tests/test_configs.py', '-k', 'epoch or schedule'),
  ),
  M(
    'batchnorm_not_synced',
    'hscl_jax/training/loop.py',
    'model = models.create_model(config.model, bn_axis_name=parallel.AXIS)',
    'model = models.create_model(config.model)',
    ('tests/test_train_wiring.py', 'tests/test_train.py', '-k', 'batchnorm or four_devices_match'),
  ),
  M(
    'preemption_only_at_logging_steps',
    'hscl_jax/training/loop.py',
    '          preemption.check(sync_point=log_step)',
    '          if log_step:\n            preemption.check(sync_point=log_step)',
    ('tests/test_train.py', '-k', 'sigterm_in_any_phase and epoch-end'),
  ),
  M(
    'tau_schedule_default_temperature',
    'hscl_jax/config/methods.py',
    '    num_epochs=config.num_epochs,\n    temperature=config.temperature,\n  )',
    '    num_epochs=config.num_epochs,\n  )',
    ('tests/test_configs.py', 'tests/test_train_wiring.py', '-k', 'hyperparameters'),
  ),
  M(
    'hucl_tau_plus_dropped',
    'hscl_jax/config/methods.py',
    '    tau_plus=options.tau_plus,\n',
    '',
    ('tests/test_train_wiring.py', 'tests/test_train.py', '-k', 'configured_loss or variants'),
  ),
  # ---- optim
  M(
    'adam_l2_decoupled',
    'hscl_jax/training/optimizers.py',
    '    optax.add_decayed_weights(weight_decay, mask),\n'
    '    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),\n',
    '    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),\n'
    '    optax.add_decayed_weights(weight_decay, mask),\n',
    ('tests/test_optim.py',),
  ),
  M(
    'cosine_ignores_warmup',
    'hscl_jax/training/optimizers.py',
    'max(total_steps - warmup_steps, 1)',
    'max(total_steps, 1)',
    ('tests/test_configs.py', '-k', 'learning_rate_schedule'),
  ),
  M(
    'rank1_mask_includes_biases',
    'hscl_jax/training/optimizers.py',
    'p.ndim > 1',
    'p.ndim >= 1',
    ('tests/test_optim.py',),
  ),
  # ---- gradcache
  M(
    'gradcache_recompute_with_next_state',
    'hscl_jax/training/gradcache.py',
    'return new_state, (outputs, state)',
    'return new_state, (outputs, new_state)',
    ('tests/test_gradcache.py', '-k', 'batch_mixing or own_state'),
  ),
  M(
    'gradcache_pmean_not_psum',
    'hscl_jax/training/gradcache.py',
    'jax.lax.psum(grads, axis_name)',
    'jax.lax.pmean(grads, axis_name)',
    ('tests/test_gradcache.py', '-k', 'four_devices'),
  ),
  # ---- checkpointing
  M(
    'finished_steps_newest_first',
    'hscl_jax/rundir/checkpoints.py',
    'return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())',
    'return sorted((int(p.name) for p in path.iterdir() if p.name.isdigit()), reverse=True)',
    ('tests/test_train_wiring.py', 'tests/test_train.py', '-k', 'finished_steps or corrupt_latest'),
  ),
  # ---- knn
  M(
    'knn_temperature_multiplies',
    'hscl_jax/evaluation/knn.py',
    'weights = jnp.exp((top_sims - top_sims[:, :1]) / temperature)',
    'weights = jnp.exp((top_sims - top_sims[:, :1]) * temperature)',
    ('tests/test_knn.py',),
  ),
  M(
    'knn_query_mask_ignored',
    'hscl_jax/evaluation/knn.py',
    'total, hits = np.sum(query_mask), np.sum(correct & query_mask)',
    'total, hits = np.sum(query_mask), np.sum(correct)',
    ('tests/test_knn.py',),
  ),
  # ---- augment
  M(
    'crop_scale_ratio_swapped',
    'hscl_jax/data/augment.py',
    '    params.crop_scale,\n    params.crop_ratio,\n',
    '    params.crop_ratio,\n    params.crop_scale,\n',
    ('tests/test_augment.py',),
  ),
  M(
    'grayscale_reuses_flip_draw',
    'hscl_jax/data/augment.py',
    "jnp.where(draws['grayscale'] < params.grayscale_prob",
    "jnp.where(draws['flip'] < params.grayscale_prob",
    ('tests/test_augment.py',),
  ),
  M(
    'crop_offset_same_draw',
    'hscl_jax/data/augment.py',
    'left = offset_u[1] * (width - crop_w)',
    'left = offset_u[0] * (width - crop_w)',
    ('tests/test_augment.py',),
  ),
  M(
    'crop_width_height_swapped',
    'hscl_jax/data/augment.py',
    '  crop_w = jnp.sqrt(area * aspect)\n  crop_h = jnp.sqrt(area / aspect)\n',
    '  crop_w = jnp.sqrt(area / aspect)\n  crop_h = jnp.sqrt(area * aspect)\n',
    ('tests/test_augment.py',),
  ),
  # ---- data loaders
  M(
    'same_order_every_epoch',
    'hscl_jax/data/sampling.py',
    'np.random.default_rng([seed, epoch]).permutation(num_examples)',
    'np.random.default_rng(seed).permutation(num_examples)',
    ('tests/test_data_loaders.py',),
  ),
  # ---- linear evaluation
  M(
    'linear_eval_reports_train_split',
    'hscl_jax/evaluation/linear_probe.py',
    '**evaluate(classifier, test_x, test_y),',
    '**evaluate(classifier, train_x, train_y),',
    ('tests/test_linear_eval.py', '-k', 'pipeline or recomputed'),
  ),
  M(
    'linear_eval_top5_is_top1',
    'hscl_jax/evaluation/linear_probe.py',
    'jnp.mean(_topk_correct(logits, labels, top5))',
    'jnp.mean(_topk_correct(logits, labels, 1))',
    ('tests/test_linear_eval.py', '-k', 'pipeline or recomputed'),
  ),
  # ---- stored config, workdir lock, schema
  M(
    'free_section_not_matched',
    'hscl_jax/rundir/stored_config.py',
    "field == f or field.startswith(f + '.')",
    'field == f',
    ('tests/test_stored_config.py',),
  ),
  M(
    'lock_heartbeat_comparison_flipped',
    'hscl_jax/rundir/lock.py',
    "return time.time() - holder.get('heartbeat', 0.0) > stale_seconds",
    "return time.time() - holder.get('heartbeat', 0.0) < stale_seconds",
    ('tests/test_workdir_lock.py',),
  ),
  M(
    'schema_tau_plus_allows_one',
    'hscl_jax/config/checks.py',
    '    if not 0 <= value < 1:',
    '    if not 0 <= value <= 1:',
    ('tests/test_configs.py', 'tests/test_config_properties.py', '-k', 'config'),
  ),
  M(
    'schema_batch_zero_accepted',
    'hscl_jax/config/schema.py',
    'if value < 1 or value % divisor:',
    'if value % divisor:',
    ('tests/test_configs.py', 'tests/test_config_properties.py', '-k', 'config'),
  ),
)

# Issue 27: an independent set in the four classes a suite misses most (a reported number
# never recomputed, a state update checked at a degenerate parameter, random choices not
# checked against their draws, the lock's ownership paths), each run against whole test
# files. `--set issue27` runs them alone.
AUGMENT_TESTS = ('tests/test_augment.py',)
LOCK_TESTS = ('tests/test_workdir_lock.py',)
REPORT_TESTS = ('tests/test_compare.py',)
ISSUE27_MUTANTS = (
  # ---- class 3: augmentation parameters against their draws
  M(
    'jitter_order_ignored',
    'hscl_jax/data/augment.py',
    "order = jnp.argsort(draws['jitter_order'])",
    'order = jnp.arange(4)',
    AUGMENT_TESTS,
  ),
  M(
    'jitter_fixed_order_hue_before_saturation',
    'hscl_jax/data/augment.py',
    'adjust_hue(cheap[2](cheap[1](cheap[0](image))), hue)',
    'cheap[2](adjust_hue(cheap[1](cheap[0](image)), hue))',
    AUGMENT_TESTS,
  ),
  M(
    'jitter_third_op_before_hue_dropped',
    'hscl_jax/data/augment.py',
    '  for position in range(3):  # Positions that can come before the hue shift.',
    '  for position in range(2):  # Positions that can come before the hue shift.',
    AUGMENT_TESTS,
  ),
  M(
    'jitter_contrast_uses_saturation_strength',
    'hscl_jax/data/augment.py',
    'around_one(params.contrast, factor_u[1])',
    'around_one(params.saturation, factor_u[1])',
    AUGMENT_TESTS,
  ),
  M(
    'jitter_hue_only_positive',
    'hscl_jax/data/augment.py',
    '_lerp(-params.hue, params.hue, factor_u[3])',
    '_lerp(0.0, params.hue, factor_u[3])',
    AUGMENT_TESTS,
  ),
  M(
    'contrast_blends_with_rgb_mean',
    'hscl_jax/data/image_ops.py',
    'mean = jnp.mean(image @ jnp.asarray(_LUMA, image.dtype))',
    'mean = jnp.mean(image)',
    AUGMENT_TESTS,
  ),
  M(
    'jitter_applied_by_grayscale_draw',
    'hscl_jax/data/augment.py',
    "jnp.where(draws['jitter_apply'] < params.jitter_prob",
    "jnp.where(draws['grayscale'] < params.jitter_prob",
    AUGMENT_TESTS,
  ),
  M(
    'blur_sigma_from_apply_draw',
    'hscl_jax/data/augment.py',
    "params.blur_sigma[1], draws['blur_sigma'])",
    "params.blur_sigma[1], draws['blur_apply'])",
    AUGMENT_TESTS,
  ),
  M(
    'blur_edge_padding',
    'hscl_jax/data/image_ops.py',
    "padded = jnp.pad(image, pad, mode='reflect')",
    "padded = jnp.pad(image, pad, mode='edge')",
    AUGMENT_TESTS,
  ),
  # ---- class 4: the workdir lock's ownership paths
  M(
    'lock_permission_error_means_dead',
    'hscl_jax/rundir/lock.py',
    '    return True  # exists, owned by someone else',
    '    return False  # exists, owned by someone else',
    LOCK_TESTS,
  ),
  M(
    'lock_heartbeat_ignores_takeover',
    'hscl_jax/rundir/lock.py',
    '      if self._read() != self._record:',
    '      if self._read() is None:',
    LOCK_TESTS,
  ),
  M(
    'lock_release_removes_a_new_holders_lock',
    'hscl_jax/rundir/lock.py',
    'if self._record is not None and self._read() == self._record:',
    'if self._record is not None:',
    LOCK_TESTS,
  ),
  M(
    'lock_without_heartbeat_never_stale',
    'hscl_jax/rundir/lock.py',
    "return time.time() - holder.get('heartbeat', 0.0) > stale_seconds",
    "return time.time() - holder.get('heartbeat', time.time()) > stale_seconds",
    LOCK_TESTS,
  ),
  # ---- class 1: the comparison report's figures
  M(
    'report_std_ddof0',
    'hscl_jax/experiments/image_report.py',
    "return f'{values.mean():.2f} ± {values.std(ddof=1):.2f}'",
    "return f'{values.mean():.2f} ± {values.std():.2f}'",
    REPORT_TESTS,
  ),
  M(
    'report_top5_column_shows_top1',
    'hscl_jax/experiments/image_report.py',
    '{mean_std(stats["top5"])} | {mean_std(stats["knn"])} |',
    '{mean_std(stats["top1"])} | {mean_std(stats["knn"])} |',
    REPORT_TESTS,
  ),
  M(
    'report_final_knn_is_first_epoch',
    'hscl_jax/experiments/image_report.py',
    'return history[-1][key] if history else float',
    'return history[0][key] if history else float',
    REPORT_TESTS,
  ),
  M(
    'speed_table_strictly_above_target',
    'hscl_jax/experiments/image_report.py',
    'if value >= target), None)',
    'if value > target), None)',
    REPORT_TESTS,
  ),
  M(
    'speed_table_target_best_seed',
    'hscl_jax/experiments/image_report.py',
    "target = float(np.mean(scl['knn']))",
    "target = float(np.max(scl['knn']))",
    REPORT_TESTS,
  ),
  M(
    'queue_table_pairs_seeds_by_position',
    'hscl_jax/experiments/image_report.py',
    "same = [i for i, run in enumerate(summary[plain]['runs']) if run['seed'] in seeds]",
    'same = list(range(len(seeds)))',
    REPORT_TESTS,
  ),
  M(
    'queue_table_knn_with_from_plain',
    'hscl_jax/experiments/image_report.py',
    '{mean_std(summary[queued]["knn"])} |',
    '{mean_std(summary[plain]["knn"])} |',
    REPORT_TESTS,
  ),
  M(
    'run_times_knn_from_epoch_time',
    'hscl_jax/experiments/image_report.py',
    "knn_s = np.mean([sum(r.get('knn_time', 0.0)",
    "knn_s = np.mean([sum(r.get('epoch_time', 0.0)",
    REPORT_TESTS,
  ),
  M(
    'raw_pixels_mean_of_queries',
    'hscl_jax/experiments/raw_pixels.py',
    'mean = bank_x.mean(axis=0)',
    'mean = query_x.mean(axis=0)',
    REPORT_TESTS,
  ),
  M(
    'raw_pixels_queries_not_centred',
    'hscl_jax/experiments/raw_pixels.py',
    '    query_x - mean,\n',
    '    query_x,\n',
    REPORT_TESTS,
  ),
  M(
    'graph_every_setting_eval_is_train',
    'hscl_jax/experiments/graph_grid.py',
    'f\'{np.mean([r["eval_seconds"] for r in group]):.0f} |\'',
    'f\'{np.mean([r["train_seconds"] for r in group]):.0f} |\'',
    ('tests/test_graphs.py',),
  ),
  M(
    'graph_beta_of_the_first_dataset',
    'hscl_jax/experiments/graph_grid.py',
    'beta = best_beta(table, dataset, method, betas) if',
    'beta = best_beta(table, datasets[0], method, betas) if',
    ('tests/test_graphs.py',),
  ),
  # ---- class 1: the kNN monitor's inputs
  M(
    'knn_monitor_bank_mask_dropped',
    'hscl_jax/evaluation/features.py',
    '    bank_mask=bank_mask,\n  )',
    '    bank_mask=None,\n  )',
    ('tests/test_knn.py',),
  ),
  M(
    'knn_monitor_bank_from_query_split',
    'hscl_jax/evaluation/features.py',
    'MonitorFeatures(bank=extract(bank_source),',
    'MonitorFeatures(bank=extract(query_source),',
    ('tests/test_knn.py',),
  ),
  # ---- class 2: state updates at non-degenerate parameters
  M(
    'warmup_steps_truncated',
    'hscl_jax/training/optimizers.py',
    'warmup_steps = int(round(opt.warmup_epochs * steps_per_epoch))',
    'warmup_steps = int(opt.warmup_epochs * steps_per_epoch)',
    ('tests/test_optim.py',),
  ),
  M(
    'warmup_boundary_one_late',
    'hscl_jax/training/optimizers.py',
    'optax.join_schedules([warmup, main], [warmup_steps])',
    'optax.join_schedules([warmup, main], [warmup_steps + 1])',
    ('tests/test_optim.py',),
  ),
  M(
    'metrics_keep_drops_the_checkpoint_row',
    'hscl_jax/rundir/metrics.py',
    "if r.get('step', 0) <= keep_through_step]",
    "if r.get('step', 0) < keep_through_step]",
    ('tests/test_metrics.py',),
  ),
  M(
    'metrics_rebuilt_scalars_skip_the_first',
    'hscl_jax/rundir/metrics.py',
    '    for record in self.records[rebuilt:]:',
    '    for record in self.records[rebuilt + 1 :]:',
    ('tests/test_metrics.py',),
  ),
  M(
    'momentum_terms_swapped',
    'hscl_jax/training/queue.py',
    'momentum * k + (1.0 - momentum) * q',
    'momentum * q + (1.0 - momentum) * k',
    ('tests/test_queue_training.py',),
  ),
  M(
    'queue_position_one_short',
    'hscl_jax/training/queue.py',
    'position=(start + rows) % queue.size',
    'position=(start + rows - 1) % queue.size',
    ('tests/test_queue_training.py',),
  ),
  M(
    'queue_keys_online_despite_key_encoder',
    'hscl_jax/training/step.py',
    'keys = z if keys is None else keys',
    'keys = z',
    ('tests/test_queue_training.py',),
  ),
  M(
    'key_encoder_follows_pre_update_params',
    'hscl_jax/training/step.py',
    '_after_update(config, state.queue, params, key_encoder, keys, labels)',
    '_after_update(config, state.queue, state.params, key_encoder, keys, labels)',
    ('tests/test_queue_training.py',),
  ),
)

# Mutants of the code that landed with issues 26 and 28 (image-folder layouts, the
# comparison's paired statistics and plan, hard negatives, the PyTorch export), each run
# against its whole test files. `--set landed26_28` runs them alone.
FOLDER_TESTS = ('tests/test_tiny_imagenet.py', 'tests/test_data_sources.py')
PAIRED_TESTS = ('tests/test_compare_paired.py',)
LANDED26_28_MUTANTS = (
  M(
    'tiny_classes_sorted_not_wnids_order',
    'hscl_jax/data/image_folder.py',
    '    classes = [line.strip() for line in f if line.strip()]',
    '    classes = sorted(line.strip() for line in f if line.strip())',
    FOLDER_TESTS,
  ),
  M(
    'tiny_names_keep_every_synonym',
    'hscl_jax/data/image_folder.py',
    "names[class_id] = words.split(',')[0].strip() or class_id",
    'names[class_id] = words.strip() or class_id',
    FOLDER_TESTS,
  ),
  M(
    'val_preferred_over_test',
    'hscl_jax/data/image_folder.py',
    '  for candidate in (test, val):',
    '  for candidate in (val, test):',
    FOLDER_TESTS,
  ),
  M(
    'train_examples_zero_not_whole_split',
    'hscl_jax/data/sources.py',
    "num_examples = config.get('train_examples') or None",
    "num_examples = config.get('train_examples')",
    FOLDER_TESTS,
  ),
  M(
    'paired_difference_sign_flipped',
    'hscl_jax/experiments/image_pairs.py',
    'return {seed: first[seed] - second[seed] for seed in sorted(set(first) & set(second))}',
    'return {seed: second[seed] - first[seed] for seed in sorted(set(first) & set(second))}',
    PAIRED_TESTS,
  ),
  M(
    'paired_zero_counted_positive',
    'hscl_jax/experiments/significance.py',
    'positive=int((values > 0).sum()),',
    'positive=int((values >= 0).sum()),',
    PAIRED_TESTS,
  ),
  M(
    'paired_std_ddof0',
    'hscl_jax/experiments/significance.py',
    'std = float(values.std(ddof=1)) if n > 1 else math.nan',
    'std = float(values.std()) if n > 1 else math.nan',
    PAIRED_TESTS,
  ),
  M(
    'same_class_counts_the_anchor',
    'hscl_jax/experiments/image_batches.py',
    'same = (batches[:, :, None] == batches[:, None, :]).sum(axis=-1) - 1',
    'same = (batches[:, :, None] == batches[:, None, :]).sum(axis=-1)',
    PAIRED_TESTS,
  ),
  M(
    'same_class_one_order_for_every_epoch',
    'hscl_jax/experiments/image_batches.py',
    'batches = labels[order(epoch)].reshape(order.steps_per_epoch, batch_size)',
    'batches = labels[order(0)].reshape(order.steps_per_epoch, batch_size)',
    PAIRED_TESTS,
  ),
  M(
    'plan_one_seed_too_many',
    'hscl_jax/experiments/image_grid.py',
    'for s in settings(config, grids) if seed < count(s)]',
    'for s in settings(config, grids) if seed <= count(s)]',
    PAIRED_TESTS,
  ),
  M(
    'plan_setting_by_setting',
    'hscl_jax/experiments/image_grid.py',
    'for seed in range(last) for s in settings(config, grids) if',
    'for s in settings(config, grids) for seed in range(last) if',
    PAIRED_TESTS,
  ),
  M(
    'hscl_negatives_include_same_class',
    'hscl_jax/evaluation/hard_negatives.py',
    'return others & (labels[:, None] != labels[None, :])',
    'return others',
    ('tests/test_inspect.py',),
  ),
  M(
    'false_negatives_count_unweighted_slots',
    'hscl_jax/evaluation/hard_negatives.py',
    '  chosen = indices >= 0\n',
    '  chosen = indices >= -1\n',
    ('tests/test_inspect.py',),
  ),
  M(
    'export_kernel_height_width_swapped',
    'hscl_jax/evaluation/torch_export.py',
    '(3, 2, 0, 1)))',
    '(3, 2, 1, 0)))',
    ('tests/test_torch_export.py',),
  ),
)
SETS = {'core': MUTANTS, 'issue27': ISSUE27_MUTANTS, 'landed26_28': LANDED26_28_MUTANTS}
ALL_MUTANTS = MUTANTS + ISSUE27_MUTANTS + LANDED26_28_MUTANTS

# A line of pytest's short summary: FAILED or ERROR, then a test file (not a captured log
# line such as "ERROR    absl:future.py:387 ...", whose level is padded with spaces).
_SUMMARY = re.compile(r'^(?:FAILED|ERROR) [^\s:]+\.py\b.*$', re.M)


def summary_lines(output: str) -> list[str]:
  """The FAILED / ERROR lines of pytest's short test summary in `output`, in order."""
  return _SUMMARY.findall(output)


# What a failed assertion about the behaviour looks like in pytest's short summary.
_ASSERTION = ('AssertionError', 'assert ', 'Failed: DID NOT RAISE', 'Failed: Regex pattern')


def _failure_reason(line: str) -> str:
  return line.split(' - ', 1)[1] if ' - ' in line else ''


def _is_assertion(line: str) -> bool:
  return line.startswith('FAILED') and _failure_reason(line).startswith(_ASSERTION)


def classify(returncode: int, output: str) -> tuple[str, str]:
  """(outcome, detail) of one pytest run (its output made with -rfE and wide COLUMNS):
  'assertion' if any failed test failed on an assertion (with -x there is one failure;
  without, the others do not hide it), else 'crash' (a fixture, an import, another
  exception), detailed by that failure or the first."""
  if returncode == 0:
    return 'survived', ''
  if returncode == 5:
    return 'no tests', 'no test collected: fix the selection'
  summary = summary_lines(output)
  if not summary:
    return 'crash', output.strip().splitlines()[-1][:120]
  asserted = [line for line in summary if _is_assertion(line)]
  if asserted:
    return 'assertion', _failure_reason(asserted[0])[:120]
  return 'crash', _failure_reason(summary[0])[:120] or summary[0][:120]


def copy_tree(destination: str, ref: str | None) -> None:
  """The working tree (tracked and untracked files, not ignored ones), or commit `ref`."""
  if ref:
    archive = subprocess.run(['git', 'archive', ref], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(['tar', '-x', '-C', destination], input=archive.stdout, check=True)
    return
  files = subprocess.run(
    ['git', 'ls-files', '-co', '--exclude-standard', '-z'],
    cwd=ROOT,
    check=True,
    capture_output=True,
    text=True,
  ).stdout.split('\0')
  for name in filter(None, files):
    source = os.path.join(ROOT, name)
    if not os.path.isfile(source):
      continue  # deleted in the working tree
    target = os.path.join(destination, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(source, target)


def plant(text: str, mutant: Mutant) -> str:
  count = text.count(mutant.original)
  if count == 0 or (count > 1 and mutant.occurrence is None):
    raise ValueError(f'{mutant.name}: the snippet occurs {count} times in {mutant.path}')
  start = -1
  for _ in range((mutant.occurrence or 0) + 1):
    start = text.index(mutant.original, start + 1)
  return text[:start] + mutant.replacement + text[start + len(mutant.original) :]


def run_mutant(
  workdir: str, mutant: Mutant, timeout: float, log_dir: str | None
) -> tuple[str, str, float]:
  path = os.path.join(workdir, mutant.path)
  with open(path) as f:
    original = f.read()
  try:
    mutated = plant(original, mutant)
  except ValueError as e:
    return 'stale', str(e), 0.0
  with open(path, 'w') as f:
    f.write(mutated)
  env = dict(os.environ, PYTHONPATH=workdir, PYTHONDONTWRITEBYTECODE='1', COLUMNS='1000')
  # Test files not written yet (or removed) are left out, so older trees can be measured.
  tests = [
    t
    for t in mutant.tests
    if not t.startswith('tests/') or os.path.exists(os.path.join(workdir, t.split('::')[0]))
  ]
  # -n 0: one process (pytest.ini's -n auto would start workers for a few tests).
  command = [
    sys.executable,
    '-m',
    'pytest',
    '-x',
    '-q',
    '-rfE',
    '-p',
    'no:cacheprovider',
    '-n',
    '0',
  ]
  start = time.time()
  try:
    result = subprocess.run(
      command + tests, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = result.stdout + result.stderr
    outcome, detail = classify(result.returncode, output)
    if log_dir:
      with open(os.path.join(log_dir, mutant.name + '.log'), 'w') as f:
        f.write(output)
  except subprocess.TimeoutExpired:
    outcome, detail = 'timeout', f'over {timeout:.0f} s'
  finally:
    with open(path, 'w') as f:
      f.write(original)
  return outcome, detail, time.time() - start


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--only', nargs='*', help='names of the mutants to run (default: all)')
  parser.add_argument(
    '--set', choices=sorted(SETS), help='run one set of mutants (default: every set)'
  )
  parser.add_argument('--list', action='store_true', help='list the mutants and exit')
  parser.add_argument('--timeout', type=float, default=600, help='seconds per mutant')
  parser.add_argument(
    '--ref', help='test commit REF (e.g. the suite before new tests) instead of the working tree'
  )
  parser.add_argument('--log-dir', help="write each mutant's pytest output to DIR/NAME.log")
  args = parser.parse_args()
  pool = SETS[args.set] if args.set else ALL_MUTANTS
  mutants = [m for m in pool if not args.only or m.name in args.only]
  if args.log_dir:
    os.makedirs(args.log_dir, exist_ok=True)
  if args.list:
    for m in mutants:
      print(f'{m.name:40s} {m.path:30s} {" ".join(m.tests)}')
    return 0
  unknown = set(args.only or ()) - {m.name for m in ALL_MUTANTS}
  if unknown:
    parser.error(f'unknown mutants: {", ".join(sorted(unknown))}')
  counts: dict[str, int] = {}
  with tempfile.TemporaryDirectory(prefix='hscl_mutants_') as workdir:
    copy_tree(workdir, args.ref)
    print(f'{"mutant":40s} {"outcome":10s} {"seconds":>7s}  detail', flush=True)
    for mutant in mutants:
      outcome, detail, seconds = run_mutant(workdir, mutant, args.timeout, args.log_dir)
      counts[outcome] = counts.get(outcome, 0) + 1
      print(f'{mutant.name:40s} {outcome:10s} {seconds:7.0f}  {detail}', flush=True)
  total = len(mutants)
  by_assertion = counts.get('assertion', 0)
  killed = by_assertion + counts.get('crash', 0) + counts.get('timeout', 0)
  print(
    f'\n{total} mutants: {killed} killed ({100 * killed / total:.0f} %), '
    f'{by_assertion} by an assertion ({100 * by_assertion / total:.0f} %); '
    + ', '.join(f'{k} {v}' for k, v in sorted(counts.items()))
  )
  return 0 if by_assertion == total else 1


if __name__ == '__main__':
  sys.exit(main())
