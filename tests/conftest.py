import os
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
HAS_CUDA = torch.cuda.is_available()


def pytest_configure(config):
    from cpu_watch import register  # which processes used the CPU during each test (timing flakes in CI)

    register(config)


# The quick selection, `python -m pytest -q -m quick`: a few cheap tests of every test file, so every area runs
# lightly in a few minutes on 2 CPU cores (the full CPU suite is `-m "not gpu"`). Per file, test names: a plain
# name selects each of its parametrizations, `name[id]` one of them; an empty list, with the reason beside it,
# for a file whose every test is costly. tests/test_quick_selection.py checks that every name exists and that
# every test file has an entry.
QUICK = {
    "test_architecture.py": ["test_no_import_cycles", "test_stages_import_only_downwards",
                             "test_the_judge_is_in_rooms_by_role", "test_every_module_imports[kernelcraft.cli]"],
    "test_attention_rule.py": ["test_written_out_attention_becomes_one_call", "test_near_misses",
                               "test_the_causal_test_is_kept_while_its_buffer_is_unchanged"],
    "test_bench.py": ["test_metrics_definitions", "test_metrics_intervals_from_the_per_task_cis",
                      "test_a_long_message_is_cut_after_a_whole_word_and_says_so", "test_bad_inputs_are_one_line_errors",
                      "test_pairs_source_rows", "test_bench_report_tables_align_numbers_and_their_headers"],
    "test_bench_outcomes.py": ["test_each_record_comes_to_one_outcome", "test_summary_counts_outcomes_overall_and_by_level",
                               "test_all_correct_none_faster_is_not_headlined_as_nothing_correct",
                               "test_the_bench_page_names_outcomes_and_explains_fast_p"],
    "test_bench_timeuse.py": ["test_every_evaluation_is_counted_once_on_its_clock",
                              "test_the_line_for_a_person_names_the_largest_phases"],
    "test_benchmark_scripts.py": [],  # each runs a script end to end (10-20 s): the full suite's
    "test_build_cache.py": [],  # every test shares one cold C++ build (~40 s): the full suite's
    "test_gemm_splice.py": ["test_the_regions_found", "test_what_is_no_region_or_ends_one"],
    "test_roofline.py": ["test_device_names_map_to_products_and_unknown_ones_to_none", "test_bound_and_fraction_arithmetic",
                         "test_an_unknown_gpu_has_no_roofline_and_says_so_once"],
    "test_tune_gemm_variants.py": ["test_the_variant_matches", "test_what_is_not_one_product_does_not_match",
                                   "test_the_layout_fields_keep_older_keys", "test_the_description_names_the_layout"],
    "test_docs.py": ["test_the_readme_fits_on_a_few_screens", "test_every_link_in_the_docs_resolves",
                     "test_the_project_speaks_of_the_product_inside_the_repository"],
    "test_build_fast.py": ["test_rewrite_ignores_comments_and_honours_the_switch",
                           "test_plan_bare_for_a_cu_that_names_nothing_of_torch",
                           "test_rewrite_swaps_extension_h_for_types_h_line_for_line"],
    "test_check.py": ["test_default_tolerance_table", "test_shape_dtype_mismatch",
                      "test_nan_where_reference_has_none_is_nan_or_inf", "test_tuple_outputs_compared_elementwise",
                      "test_tensor_subclass_is_lazy_output"],
    "test_cli.py": ["test_eval_json_correct", "test_missing_candidate_file_is_usage_error",
                    "test_unknown_task_name_is_usage_error", "test_tasks_json_lists_builtin_tasks"],
    "test_cli_terms.py": ["test_optimize_lines_say_what_verified_and_the_null_control_mean",
                          "test_optimize_summary_counts_each_outcome_apart", "test_a_wide_interval_above_one_is_a_note",
                          "test_the_run_page_explains_its_terms_where_the_numbers_are"],
    "test_cli_ux.py": ["test_click_parse_errors_are_one_line_usage_errors",
                       "test_values_that_make_no_sense_are_refused_before_anything_runs",
                       "test_in_a_terminal_tables_fit_its_width", "test_tables_are_not_cut_at_80_columns_in_a_pipe",
                       "test_version", "test_an_unknown_task_name_suggests_the_closest"],
    "test_cluster.py": [],  # a local Ray cluster starts in ~20 s: the full suite's
    "test_cpu_watch.py": ["test_only_failed_tests_are_reported", "test_a_run_where_every_test_passed_says_nothing"],
    "test_corpus_throughput.py": ["test_quotas_follow_the_pool_with_one_per_level_at_least",
                                  "test_pack_refuses_what_it_cannot_use"],
    "test_cusplit.py": ["test_never_raises_on_odd_input", "test_splits_the_kernelbench_example", "test_declines"],
    "test_eval.py": ["test_legit_candidate_is_correct_with_speedup[diag_matmul_rowscale]",
                     "test_incorrect_record_has_contract_shape",
                     "test_bad_task_and_options_raise"],
    "test_exemplars.py": ["test_bucket_probabilities_follow_the_formula", "test_same_seed_same_draws"],
    "test_faults.py": ["test_fault_fixtures_exist_and_have_headers",
                       "test_evaluate_many_mixed_good_and_crashing_in_order"],
    "test_guards.py": ["test_every_cheat_has_fixtures", "test_header_parser_rejects_malformed",
                       "test_same_values_nan_and_structure", "test_process_state_sees_patches_and_flags",
                       "test_hack_denied[timer_patch_harness_clock-screen_off]",
                       "test_hack_denied[stale_cache_value-screen_off]",
                       "test_legit_correct[guard_diag_rowscale-screen_on]"],
    "test_process_isolation.py": ["test_wire_refuses_oversized_and_non_object_frames", "test_the_pid_namespace_setting_is_checked",
                         "test_freeze_and_thaw_a_child"],
    "test_learn.py": ["test_split_is_by_task_and_per_level_and_ci", "test_learn_cli_usage_errors"],
    "test_dim_reduce.py": ["test_a_reduction_over_one_dimension_becomes_one_kernel_call", "test_short_rows_run_the_pytorch_op"],
    "test_pooling_kernels.py": ["test_a_pooling_becomes_one_kernel_call", "test_what_the_kernel_does_not_take_stays_pytorch"],
    "test_depthwise_kernels.py": ["test_a_depthwise_convolution_becomes_one_kernel_call",
                                  "test_a_weight_given_as_an_input_is_the_kernels_argument",
                                  "test_what_the_kernel_does_not_take_stays_pytorch"],
    "test_fuse_reduce.py": ["test_region_and_full_reduction_become_one_kernel", "test_near_misses_keep_the_reduction"],
    "test_lock_scope.py": ["test_bad_lock_scope_is_a_usage_error", "test_which_candidates_may_autotune"],
    "test_gate.py": ["test_no_path_is_a_no_op", "test_idle_floor_is_the_lowest_exclusive_calibration"],
    "test_gate_file_locks.py": ["test_lock_holders_are_read_from_proc_locks",
                                "test_a_side_holding_a_file_lock_steps_aside_once_it_lets_go"],
    "test_first_call_hold.py": ["test_a_hold_asks_once_at_the_first_benchmark_and_leaves_no_hook",
                                "test_a_hold_with_nothing_to_hook_asks_at_once"],
    "test_off_the_clock.py": ["test_the_ledger_bills_only_what_exceeds_the_references_windows",
                              "test_tree_cpu_counts_threads_and_reaped_children"],
    "test_optimize.py": ["test_run_dir_guards", "test_null_control_raises_the_bar_only_for_a_real_bias"],
    "test_optimize_hf.py": ["test_hf_policy_needs_a_directory"],
    "test_optimize_openai.py": ["test_missing_key_is_a_configuration_error",
                                "test_unreachable_endpoint_fails_fast_naming_its_url"],
    "test_optimize_resume.py": [],  # a search killed and resumed (~35 s): the full suite's
    "test_outcome_integrity.py": ["test_correct_without_the_evidence_is_rejected"],
    "test_pch.py": ["test_header_command_is_main_cpp_minus_the_module_name"],
    "test_pool.py": ["test_bad_options_raise_at_submit_and_close_resolves_the_queue"],
    "test_precision.py": ["test_chunked_comparison_matches_whole_tensor_results", "test_exact_reference_allows_a_few_ulps",
                          "test_fixed_precision_is_the_plain_tolerance_check", "test_small_outputs_widen_the_factor"],
    "test_prompt.py": ["test_prompt_contains_everything_in_order", "test_prompt_without_history_and_on_cpu",
                       "test_templates_are_files"],
    "test_protocol.py": ["test_make_layers_overrides_and_protocols_are_values",
                         "test_bad_values_and_unknown_knobs_name_themselves",
                         "test_device_kinds_have_their_own_defaults"],
    "test_quick_selection.py": ["test_every_quick_name_is_a_test", "test_every_test_file_has_a_quick_entry"],
    "test_recipes.py": ["test_policy_registry", "test_signature_is_preserved_with_defaults",
                        "test_untraceable_reference_still_gets_wrappers"],
    "test_reply.py": ["test_good_reply_takes_the_last_block_that_defines_modelnew",
                      "test_malformed_replies_are_parse_errors_with_a_reason", "test_raw_python_without_fences_is_accepted"],
    "test_report.py": ["test_report_contents", "test_report_of_a_run_in_progress", "test_report_tells_one_story",
                       "test_report_cli_and_errors"],
    "test_reward_load.py": ["test_bad_input_is_a_one_line_error",
                            "test_draws_are_seeded_with_replacement_and_every_text_distinct"],
    "test_row_norms.py": ["test_grouped_channel_and_long_norms_match", "test_near_grouped_norms_are_not_matched",
                          "test_groups_are_for_layernorm_only_and_channels_for_plain_norms"],
    "test_row_scans.py": ["test_scans_are_the_row_template", "test_near_scans_are_not_matched",
                          "test_scan_flags_are_for_scans_only_and_keep_older_keys"],
    "test_rundb.py": ["test_add_dedup_and_lifecycle", "test_in_flight_rows_survive_reopen_and_are_requeued",
                      "test_wal_meta_events_confirmations"],
    "test_sandbox.py": ["test_modes_and_their_errors", "test_secrets_are_scrubbed_from_the_environment"],
    "test_screen.py": ["test_rule_flags", "test_rule_allows", "test_findings_carry_line_numbers",
                       "test_kernel_names_from_cuda_source"],
    "test_service.py": ["test_refuses_to_start_without_a_key", "test_health_is_public_and_everything_else_needs_the_key",
                        "test_malformed_requests_get_4xx_with_a_message"],
    "test_simplify.py": ["test_identities_fire", "test_clamp_chain_merges_and_drops", "test_fuse_activation"],
    "test_stateful.py": ["test_scalar_flags_go_back_with_the_tensors"],
    "test_suite_tasks.py": ["test_suite_shape", "test_tiny_task_runs_and_is_non_degenerate[tiny/level1/relu]",
                            "test_gpu_tier_is_sized_for_a_gpu[gpu/level1/relu]"],
    "test_timing.py": ["test_median_ci_covers_true_median", "test_balanced_ci_covers_and_falls_back",
                       "test_measure_stable_pair_speedup_two", "test_a_ci_that_cannot_resolve_the_speedup_says_host_too_noisy",
                       "test_combine_spans_every_process_interval"],
    "test_train_data.py": ["test_config_errors_name_the_key", "test_held_out_tasks_never_leak_into_train"],
    "test_train_pipeline.py": [],  # one end-to-end pipeline, killed and resumed (~60 s): the full suite's
    "test_train_rewards.py": ["test_percentile_is_nearest_rank", "test_exact_rewards_smoothing_clipping_and_a_reproduced_jump"],
    "test_train_stages.py": ["test_the_package_and_cli_import_without_training_libraries",
                             "test_checkpoints_count_only_when_complete"],
    "test_tune.py": ["test_knob_space_and_masks", "test_reset_step_reward_and_done"],
    "test_tune_costmodel.py": ["test_featurize_is_fixed_width_and_marks_unknown_features",
                               "test_save_load_round_trip_and_refusals"],
    "test_tune_recipe.py": ["test_store_lookup_exact_nearest_default", "test_the_builtin_store_is_valid"],
    "test_warm.py": ["test_gpu_share_prefers_a_waiting_exclusive_holder", "test_idle_judges_are_bounded_and_expire"],
    "test_gpushare.py": ["test_a_job_whose_footprint_does_not_fit_waits_and_later_arrivals_queue_behind_it",
                         "test_footprints_keep_the_largest_peak_and_survive_the_process"],
    "test_weights.py": ["test_match_names_what_differs", "test_perturbation_moves_every_element_and_keeps_what_must_stay",
                        "test_excess_is_the_change_in_units_of_the_bound"],
    "test_zygote.py": ["test_fork_settings_follow_the_sandbox_mode"],
    # GPU files: skipped on a CPU host, a light pass on a GPU one
    "test_gpu_eval.py": ["test_fault_fixture_headers", "test_triton_candidate_correct"],
    "test_gpu_guards.py": ["test_gpu_timing_counts_side_stream_work"],
    "test_recipes_gpu.py": ["test_simplification_rules_on_gpu"],
    "test_tune_gpu.py": ["test_candidate_source_matches_the_fast_path"],
}


def in_quick(item) -> bool:
    names = QUICK.get(Path(str(item.fspath)).name, ())
    return item.name in names or getattr(item, "originalname", item.name) in names


def pytest_collection_modifyitems(config, items):
    quick = pytest.mark.quick
    for item in items:
        if in_quick(item):
            item.add_marker(quick)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One kernelcraft cache for the whole test session (builds are reused across tests)."""
    d = tmp_path_factory.mktemp("kc-cache")
    os.environ["KERNELCRAFT_CACHE"] = str(d)
    return d


@pytest.fixture
def fixture_path():
    return lambda rel: FIXTURES / rel


def run_story(run_dir) -> str:
    """An optimize run's candidates and confirmations in a few lines: what a failed assertion about its outcome
    should show (a timing flake and a real regression read differently)."""
    from kernelcraft.search.rundb import RunDB

    db = RunDB(Path(run_dir))
    lines = [f"#{r.id} {r.status} {r.speedup} ci=[{r.ci_low}, {r.ci_high}] {(r.message or '')[:100]}"
             for r in db.rows()]
    lines += [f"confirm #{i} {c['status']} {c['speedup']} ci=[{c['ci_low']}, {c['ci_high']}]"
              for i, c in db.confirmations().items()]
    return "\n".join(lines)
