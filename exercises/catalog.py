"""The exercises: which functions a student writes, what they are told, and which of the
project's own oracle tests grade each.

Each exercise blanks one or more functions of a concept file (handout.py) and is graded by
tests from tests/ (grade.py), the same tests the project runs on itself, in the order listed:
the first that fails gives the student its message, so the tests that name a classic mistake
come first. Fixtures the tests may ask for: tiny_dir, buffer, tmp_path (grade.py makes them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    name: str             # what the student and the grades call it
    file: str             # the concept file, relative to the project root
    functions: tuple      # the blanked functions: "name" or "Class.method"
    title: str
    equation: str         # written above the blank, as comments
    hint: str
    tests: tuple          # "tests/test_x.py::test_name", graded in this order


EXERCISES = [
    Exercise("kl_reward", "ppo.py", ("kl_penalized_rewards",), "The KL-penalised reward",
             "r_t = -beta (log pi(a_t) - log pi_ref(a_t)), plus R_i at the episode's last response token",
             "the last response token of episode i is at index mask[i].sum() - 1; an episode with no tokens gets "
             "no task reward",
             ("tests/test_ppo.py::test_kl_penalty_lowers_the_reward_where_the_policy_is_more_likely_than_the_reference",
              "tests/test_ppo.py::test_kl_penalized_rewards_put_score_on_last_token")),
    Exercise("gae", "ppo.py", ("gae",), "Generalised advantage estimation",
             "delta_t = r_t + gamma V_(t+1) - V_t;  A_t = delta_t + gamma lam A_(t+1);  R_t = A_t + V_t",
             "loop t from T - 1 down to 0 over the whole batch at once; a position outside the mask ends the "
             "episode: after it, V and A count as 0",
             ("tests/test_ppo.py::test_gae_is_zero_outside_the_mask",
              "tests/test_ppo.py::test_gae_ignores_values_beyond_the_mask",
              "tests/test_ppo.py::test_gae_matches_discounted_sums")),
    Exercise("whiten", "ppo.py", ("whiten", "batch_mean_var"), "Whitening the advantages",
             "mean = sum(mask x) / sum(mask);  var = sum(mask (x - mean)^2) / sum(mask);  "
             "out = (x - mean) / max(sqrt(var + eps), std_floor), times the mask",
             "batch_mean_var computes the two statistics over every masked token of every episode; whiten uses "
             "it (with mask * weights when weights are given)",
             ("tests/test_ppo.py::test_whiten_uses_all_masked_tokens",
              "tests/test_ppo.py::test_whiten_floor_keeps_a_flat_batch_small",
              "tests/test_filter_controls.py::test_rewhitening_gives_the_kept_set_a_weighted_mean_advantage_of_zero",
              "tests/test_ppo.py::test_explained_variance_against_numbers")),
    Exercise("policy_loss", "ppo.py", ("policy_loss",), "The clipped policy loss",
             "L_i = mean_t max(-A_t r_t, -A_t clip(r_t, 1 - eps, 1 + eps)),  r_t = exp(log pi - log pi_old)",
             "masked_mean(x, mask) is the per-episode mean over response tokens",
             ("tests/test_ppo.py::test_policy_loss_is_each_episodes_mean_over_its_own_tokens",
              "tests/test_ppo.py::test_policy_loss_clip_is_pessimistic_on_both_sides",
              "tests/test_ppo.py::test_policy_loss_hand_worked",
              "tests/test_ppo.py::test_policy_loss_gradient_at_ratio_one_is_minus_advantage_times_score")),
    Exercise("value_loss", "ppo.py", ("value_loss",), "The clipped value loss",
             "L_V_i = mean_t 0.5 max((V - R)^2, (V_clip - R)^2),  V_clip = V_old + clip(V - V_old, -eps, eps); "
             "at eps = 0: mean_t 0.5 (V - R)^2",
             "the same shape of answer as policy_loss: one number per episode",
             ("tests/test_ppo.py::test_value_loss_takes_the_larger_of_the_two_errors",
              "tests/test_ppo.py::test_value_loss_hand_worked",
              "tests/test_ppo.py::test_value_loss_without_clipping")),
    Exercise("grpo", "ppo.py", ("group_advantages",), "GRPO's group advantages",
             "A_i = (r_i - mean_g r) / (std_g r + eps) over the samples g of i's prompt (population std)",
             "groups.unique() lists the prompts; a boolean mask selects one prompt's samples",
             ("tests/test_ppo.py::test_group_advantages_hand_worked",)),
    Exercise("lora", "model.py", ("LoRALinear.forward",), "The LoRA forward",
             "y = W0 x + b0 + (alpha / rank) B (A x); with the adapters disabled, the reference adapter "
             "(ref_A, ref_B) in their place, or the base layer alone when there is none",
             "self.base(x) is W0 x + b0; self.scale is alpha / rank; compute the update in A's dtype (fp32) and "
             "cast it to y's",
             ("tests/test_model.py::test_lora_linear_math",
              "tests/test_model.py::test_fresh_adapters_equal_base_model",
              "tests/test_model.py::test_adapters_off_is_the_base_model_after_training",
              "tests/test_model.py::test_reference_adapter_is_the_starting_policy")),
    Exercise("episode_gradients", "influence.py", ("episode_gradients", "group_gradients"),
             "The per-episode gradient loop",
             "g_i = grad_theta L_i(theta), L_i = ppo.policy_loss of episode i alone, theta the LoRA parameters; "
             "group_gradients: the same for the mean of L_i over each prompt's episodes (GradAlign's)",
             "rollouts.select([i]) is episode i; token_logprobs gives its log-probs; torch.autograd.grad and "
             "model.flat_gradient give one flat vector",
             ("tests/test_influence.py::test_each_episode_gradient_equals_torch_func_gradient",
              "tests/test_influence.py::test_episode_gradients_sum_to_gradient_of_summed_loss",
              "tests/test_selection.py::test_each_prompts_gradient_is_the_mean_of_its_episodes_gradients")),
    Exercise("influence_scores", "influence.py", ("influence_scores",), "The influence scores",
             "s_i = g_i . g_val",
             "one matrix-vector product; accumulate in float64 and return float32",
             ("tests/test_influence.py::test_scores_are_explicit_dot_products",)),
    Exercise("filter", "influence.py", ("filter_and_reweight",), "Filter and reweight",
             "keep = s > 0;  w_i = s_i / mean_(j kept) s_j on the kept episodes, 0 elsewhere",
             "when nothing is kept, every weight is 0",
             ("tests/test_influence.py::test_nothing_kept_and_zero_scores_dropped",
              "tests/test_influence.py::test_filter_and_reweight_invariants")),
]

BY_NAME = {e.name: e for e in EXERCISES}

# After the last exercise a student's copy runs this, with every exercise on its path (GAE, not
# GRPO: --advantage grpo runs the GRPO exercise): I-PPO by the per-episode loop, with a KL penalty.
STUDENT_FLAGS = ["--influence", "on", "--speedups", "off", "--kl-beta", "0.05"]
STUDENT_RUN = f"python train.py configs/tiny.toml {' '.join(STUDENT_FLAGS)} --iterations 50 --run-dir runs/exercises"


def chosen(names: str | None) -> list[Exercise]:
    """The exercises named (comma-separated), in catalogue order; all of them for None."""
    if not names:
        return list(EXERCISES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"--exercises: no exercise named {unknown}; they are {', '.join(BY_NAME)}")
    return [e for e in EXERCISES if e.name in wanted]
