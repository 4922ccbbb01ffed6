"""I-PPO: Influence-Guided PPO post-training of an LLM on math word problems.

Shu, Zhang, Hullman, "Learning from the Right Rollouts: Data Attribution for PPO-based LLM
Post-Training", arXiv 2604.01597. One iteration (the algorithm box, `ppo_iteration` below):

    rollout     sample n responses per prompt from pi_theta                 rollout.py
    reward      score_i = exact match of the final answer                  reward.py
    advantages  r_t = -beta (log pi - log pi_ref) + score at the last token;
                A_t, R_t = GAE(gamma, lambda); A whitened over tokens       ppo.py
    influence   s_i = grad L_clip_i . grad L_SFT(val); keep s_i > 0;
                w_i = s_i / mean_kept s                                    influence.py
    update      PPO epochs on the kept episodes D', per minibatch M of D':
                (1/|M|) sum_{i in M} [w_i L_clip_i + c_v L_V_i - c_e H_i]        ppo.py

`--influence off` is plain PPO; `--algo sft` trains the adapters on reference solutions.
Faults: a crash at any moment loses no committed iteration and --resume continues exactly
(see "run directory" below); a NaN/inf stops the run naming the phase, before anything of
that iteration is saved; nonsense flags are refused at start, naming the flag.
Run `python train.py --help` for every flag; the README explains the output.

Public: Config, parse_config(argv), add_config_flags(parser, names), main(argv) -> run directory;
the phases ppo_iteration, compute_advantages, select_episodes, ppo_update, sft_iteration (each
takes `dist`, see distributed.py; tests call them under torchrun).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from distributed import Dist
from distributed import setup as setup_distributed
from evaluate import evaluate
from influence import (binary_filter, detection_auc, episode_gradients, filter_and_reweight, influence_scores,
                       onepass_scores, random_filter, sft_nll, validation_gradient)
from model import (OFFLINE_DEFAULT, ModelInfo, inspect_model, load_adapter, load_policy, load_reference_adapter,
                   save_adapter)
from ppo import (approx_kl, clip_fraction, explained_variance, gae, group_advantages, kl_penalized_rewards, masked_mean,
                 policy_loss, value_loss, whiten)
from report import write_plots, write_report
from reward import ARITH_DIGITS, ARITH_TERMS, TASKS, extract_answer, is_correct, load_task, make_prompt, reward_fn
from rollout import encode_pairs, generate_rollouts, token_logprobs


def flag(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    # what to train
    model: str = flag(OFFLINE_DEFAULT, "hub id (google/gemma-3-1b-it), local directory, or the offline default")
    dataset: str = flag("gsm8k", "task to train and evaluate on", choices=TASKS)
    data_source: str = flag("auto", "auto: the hub if it has the task, unless HF_HUB_OFFLINE=1 or unreachable; "
                            "else data/", choices=("auto", "hub", "local"))
    arith_digits: int = flag(ARITH_DIGITS, "--dataset arith: digits of every number in a problem")
    arith_terms: int = flag(ARITH_TERMS, "--dataset arith: numbers per problem (terms - 1 additions or subtractions)")
    algo: str = flag("ppo", "ppo (with or without influence) or sft (LoRA on reference solutions)", choices=("ppo", "sft"))
    influence: str = flag("on", "on: I-PPO; off: plain PPO", choices=("on", "off"))
    reweight: bool = flag(True, "weight kept episodes by s_i / mean kept s (--no-reweight: binary filter)")
    influence_method: str = flag("onepass", "how scores are computed: onepass (one batched backward per --micro-batch-size episodes, exact) or "
                                 "loop (one backward per episode, the readable reference)", choices=("onepass", "loop"))
    random_filter: bool = flag(False, "control: drop as many episodes as influence would, chosen at random")
    init_adapter: str = flag("", "start from this checkpoint's LoRA adapters (e.g. an --algo sft run)")
    # schedule and sampling
    iterations: int = flag(100, "training iterations (PPO: one rollout buffer each; SFT: one batch each)")
    prompts_per_iter: int = flag(16, "training questions per iteration")
    samples_per_prompt: int = flag(4, "sampled responses per question (N = prompts x samples episodes)")
    max_new_tokens: int = flag(256, "response length limit in tokens; longer responses are truncated")
    temperature: float = flag(1.0, "sampling temperature; log-probs use logits / temperature")
    gen_batch_size: int = flag(16, "episodes per generate() and no-grad forward call")
    # PPO (Schulman et al. 2017) and the KL-penalised reward
    ppo_epochs: int = flag(2, "passes over the kept episodes per iteration")
    minibatch_size: int = flag(16, "episodes per optimizer step")
    micro_batch_size: int = flag(4, "episodes per forward/backward (memory only; does not change the math)")
    lr: float = flag(5e-5, "AdamW learning rate for the LoRA adapters")
    # Our choice: the value head has a learning rate of its own. It starts at V = 0 and is of
    # use as a baseline only once it has caught up with the returns; AdamW at the LoRA rate
    # (5e-5) moves each of its weights by about 5e-5 a step. 1e-3 is what the tiny world's runs
    # used (README, "See PPO learn in minutes", where it made no measurable difference).
    value_lr: float = flag(1e-3, "AdamW learning rate for the value head")
    max_grad_norm: float = flag(1.0, "gradient clipping (global L2 norm)")
    clip_eps: float = flag(0.2, "PPO ratio clip epsilon")
    # Our choice: no value clipping by default. With rewards in [0, 1] a clip of 0.2 lets V
    # move at most 0.2 towards a return per iteration, which holds back a fresh critic.
    value_clip_eps: float = flag(0.0, "value clip epsilon (0: no clipping)")
    vf_coef: float = flag(0.1, "value-loss coefficient c_v")
    ent_coef: float = flag(0.0, "entropy bonus coefficient c_e")
    kl_beta: float = flag(0.05, "per-token KL penalty beta against the reference policy")
    gamma: float = flag(1.0, "discount")
    # Our choice: lambda 1. The reward comes at the last token only; with lambda 0.95 the
    # advantage of token t is about 0.95^(L-1-t) x the reward while V is still near 0, so the
    # first tokens of a long answer get almost no credit. With gamma = lambda = 1,
    # A_t = R - V(s_t): every token sees the episode's outcome, relative to the critic.
    lam: float = flag(1.0, "GAE lambda")
    advantage: str = flag("gae", "gae: PPO's per-token advantages from the value head (GAE); grpo: GRPO's "
                          "(r_i - mean) / (std + eps) over the samples of the same prompt, the same for every "
                          "token, no value loss", choices=("gae", "grpo"))
    adv_std_floor: float = flag(0.1, "advantages are divided by max(std, this) when whitened: a batch with "
                                "(almost) equal rewards keeps small advantages (0: plain whitening)")
    truncation_penalty: float = flag(0.0, "subtracted from the reward of a response cut off at --max-new-tokens")
    reward_noise: float = flag(0.0, "research knob: flip each episode's correctness with this probability before "
                               "the reward (planted noise; episodes.jsonl records which were flipped)")
    # influence
    val_size: int = flag(32, "validation set for g_val: the last K rows of the training split (never trained on)")
    val_batch_size: int = flag(8, "validation examples per forward/backward for g_val")
    stop_below_kept: float = flag(0.0, "optional stop rule: end the run once the kept fraction falls below this (0 = off)")
    # SFT
    sft_batch_size: int = flag(8, "--algo sft: reference solutions per optimizer step")
    # LoRA
    lora_rank: int = flag(8, "LoRA rank r")
    lora_alpha: float = flag(16.0, "LoRA alpha (scale alpha / r)")
    lora_targets: str = flag("q_proj,k_proj,v_proj,o_proj", "comma-separated linear layers that get adapters")
    # evaluation, output, reproducibility
    eval_every: int = flag(10, "greedy exact-match evaluation every K iterations, before the first and after the last (0 = off)")
    eval_limit: int = flag(50, "evaluate on the first K problems of the test split")
    eval_split: str = flag("test", "what --eval-every evaluates: test (the test split) or val (the validation rows, "
                           "for tuning settings without looking at the test split)", choices=("test", "val"))
    eval_max_new_tokens: int = flag(256, "response length limit for evaluation")
    run_dir: str = flag("", "where to write the run (default runs/<date>-<time>-ppo-influence, -ppo-plain or -sft)")
    resume: str = flag("", "continue the run in this directory from its latest checkpoint")
    keep_checkpoints: int = flag(2, "how many most recent checkpoints to keep")
    seed: int = flag(0, "the one seed: data order, sampling, random filter")
    device: str = flag("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps")
    trust_remote_code: bool = flag(False, "allow a hub model to run its own code (off unless asked)")
    progress: bool = flag(True, "tqdm progress bars (--no-progress to hide)")
    plots: bool = flag(True, "write plots.png and report.html into the run directory at the end (--no-plots to skip)")

    def validate(self) -> None:
        """Refuse nonsense at start, naming the flag. (Flags that must fit the model or the data
        are checked in check_against_model and check_against_data, before the model load.)"""
        def need(ok, name, what):
            if not ok:
                raise SystemExit(f"--{name.replace('_', '-')}: {what} (got {getattr(self, name)!r})")
        for f in dataclasses.fields(self):
            if f.type in (float, "float"):
                need(math.isfinite(getattr(self, f.name)), f.name, "must be a finite number")
        for name in ("iterations", "prompts_per_iter", "samples_per_prompt", "max_new_tokens", "gen_batch_size",
                     "ppo_epochs", "minibatch_size", "micro_batch_size", "val_size", "val_batch_size",
                     "sft_batch_size", "lora_rank", "eval_limit", "eval_max_new_tokens", "keep_checkpoints"):
            need(getattr(self, name) > 0, name, "must be a positive integer")
        for name in ("temperature", "lr", "value_lr", "clip_eps", "lora_alpha", "max_grad_norm"):
            need(getattr(self, name) > 0, name, "must be > 0")
        for name in ("vf_coef", "ent_coef", "kl_beta", "truncation_penalty", "eval_every", "value_clip_eps",
                     "adv_std_floor"):
            need(getattr(self, name) >= 0, name, "must be >= 0")
        need(0 <= self.gamma <= 1, "gamma", "must be in [0, 1]")
        need(0 <= self.lam <= 1, "lam", "must be in [0, 1]")
        need(0 <= self.stop_below_kept < 1, "stop_below_kept", "must be in [0, 1)")
        need(0 <= self.reward_noise <= 1, "reward_noise", "must be a probability in [0, 1]")
        need(self.lora_targets.strip() != "", "lora_targets", "must name at least one layer")
        need(all(t.isidentifier() for t in self.targets()), "lora_targets",
             "must be comma-separated layer names such as q_proj,v_proj")
        need(len(set(self.targets())) == len(self.targets()), "lora_targets", "names a layer twice")
        need(re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device), "device", "must be auto, cpu, cuda, cuda:N or mps")
        need(not self.device.startswith("cuda") or torch.cuda.is_available(), "device", "no CUDA GPU is visible to torch")
        need(self.device != "mps" or torch.backends.mps.is_available(), "device", "Apple MPS is not available")
        need(not (self.influence == "off" and self.random_filter), "random_filter",
             "needs --influence on (it drops as many episodes as the scores would)")
        need(not (self.influence == "off" and not self.reweight), "reweight",
             "--no-reweight needs --influence on")

    def targets(self) -> list[str]:
        """--lora-targets as a list of layer names."""
        return [t.strip() for t in self.lora_targets.split(",")]


def check_against_model(cfg: Config, model: ModelInfo) -> None:
    """Flags that must fit the model, checked from its config alone (before the weights load)."""
    for name in ("max_new_tokens", "eval_max_new_tokens"):
        if getattr(cfg, name) >= model.context:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(cfg, name)}: longer than the model's context "
                             f"({model.context} tokens, prompt included)")
    unknown = [t for t in cfg.targets() if t not in model.linear_names]
    if unknown:
        raise SystemExit(f"--lora-targets: {cfg.model} has no linear layer named {unknown}; "
                         f"its linear layers are {model.linear_names}")


def check_against_world(cfg: Config, world: int) -> None:
    """Under torchrun every rank needs at least one prompt, validation row and SFT example."""
    for name in ("prompts_per_iter", "val_size", "sft_batch_size"):
        if getattr(cfg, name) < world:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(cfg, name)}: fewer than the {world} torchrun "
                             "processes; each process needs at least one")


def check_against_data(cfg: Config, n_train_rows: int) -> None:
    if cfg.val_size >= n_train_rows:
        raise SystemExit(f"--val-size {cfg.val_size}: the training split has only {n_train_rows} rows "
                         "(the validation set is taken from it and some must remain to train on)")


def add_config_flags(parser: argparse.ArgumentParser, names=None) -> None:
    """One command-line flag per Config field (or per field in `names`), with its default and help."""
    for f in dataclasses.fields(Config):
        if names is not None and f.name not in names:
            continue
        name = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            parser.add_argument(name, type=kind, default=f.default, choices=f.metadata.get("choices"),
                                help=f.metadata["help"])


def parse_config(argv=None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser)
    args = parser.parse_args(argv)
    cfg = Config(**vars(args))
    if cfg.resume:
        cfg = resumed_config(cfg, parser)
    cfg.validate()
    return cfg


def resumed_config(cfg: Config, parser) -> Config:
    """--resume uses the run's saved config.json; only --iterations may be changed."""
    path = Path(cfg.resume) / "config.json"
    if not path.exists():
        raise SystemExit(f"--resume {cfg.resume}: no config.json there (not a run directory)")
    saved = Config(**read_saved_config(path))
    ignored = [f.name for f in dataclasses.fields(Config) if f.name not in ("resume", "iterations", "progress")
               and getattr(cfg, f.name) != parser.get_default(f.name)]
    if ignored:
        print(f"[resume] ignoring {', '.join('--' + n.replace('_', '-') for n in ignored)}: "
              f"a resumed run keeps its config.json", file=sys.stderr)
    saved.resume, saved.run_dir, saved.progress = cfg.resume, cfg.resume, cfg.progress
    if cfg.iterations != parser.get_default("iterations"):
        saved.iterations = cfg.iterations
    return saved


def read_saved_config(path: Path) -> dict:
    """config.json of a run, checked field by field (it is a file anyone could have edited)."""
    try:
        values = json.loads(path.read_text())
    except ValueError as err:
        raise SystemExit(f"{path}: not valid JSON ({err})") from err
    if not isinstance(values, dict):
        raise SystemExit(f"{path}: expected a JSON object of flag values")
    fields = {f.name: f for f in dataclasses.fields(Config)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SystemExit(f"{path}: unknown fields {unknown} (not a config.json of this train.py)")
    for name, value in values.items():
        kind = {"int": int, "float": (int, float), "str": str, "bool": bool}[str(fields[name].type)]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SystemExit(f"{path}: field {name!r} should be {fields[name].type}, got {value!r}")
    return values


# ----------------------------------------------------------------------------- helpers

def derived_seed(seed: int, iteration: int, purpose: int, rank: int = 0) -> int:
    """Every random draw of an iteration comes from (seed, iteration, purpose, rank), so a
    resumed run draws exactly what the uninterrupted run would have (rank: the torchrun process)."""
    return (seed * 1_000_003 + iteration * 7_919 + purpose + rank * 104_729) % (2**63)


SINGLE = Dist()  # one process: every collective of distributed.py is the identity


SAMPLING, FILTER, SHUFFLE, MINIBATCHES, NOISE = 1, 2, 3, 4, 5


def planted_flips(cfg: Config, it: int, n: int, rank: int = 0) -> list[bool]:
    """--reward-noise p: which of the iteration's n episodes have their correctness flipped,
    each independently with probability p, from a draw of its own (a resumed run flips the
    same episodes)."""
    noise = torch.Generator().manual_seed(derived_seed(cfg.seed, it, NOISE, rank))
    return (torch.rand(n, generator=noise) < cfg.reward_noise).tolist()


def batch_indices(n_examples: int, iteration: int, batch: int, seed: int) -> list[int]:
    """The training rows of an iteration: consecutive slices of a seeded permutation per epoch."""
    out = []
    for position in range(iteration * batch, (iteration + 1) * batch):
        epoch, offset = divmod(position, n_examples)
        order = torch.randperm(n_examples, generator=torch.Generator().manual_seed(derived_seed(seed, epoch, SHUFFLE)))
        out.append(int(order[offset]))
    return out


class Timer:
    """Seconds per named phase of an iteration."""
    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, name):
        t0 = time.time()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0


def make_optimizer(cfg: Config, policy) -> torch.optim.AdamW:
    """AdamW without weight decay: the LoRA tensors at --lr, the value head at --value-lr."""
    value_head = list(policy.value_head.parameters())
    lora = [p for p in policy.parameters() if p.requires_grad and all(p is not v for v in value_head)]
    return torch.optim.AdamW([{"params": lora, "lr": cfg.lr}, {"params": value_head, "lr": cfg.value_lr}],
                             weight_decay=0.0)


def chunks(index: torch.Tensor, size: int):
    return [index[s:s + size] for s in range(0, len(index), size)]


def require_finite(it: int, phase: str, **tensors: torch.Tensor) -> None:
    """Stop the run on a NaN or inf, naming the iteration, the phase and the tensor. Raised
    before anything of the iteration is saved, so checkpoints/latest stays the last good one."""
    for name, t in tensors.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise FloatingPointError(f"iteration {it + 1}: {name} contains NaN/inf ({bad} of {t.numel()} values) "
                                     f"(phase: {phase})")


def batch_warnings(cfg: Config, rewards: torch.Tensor, truncated: torch.Tensor, n_kept: int) -> dict[str, str]:
    """Degenerate iterations: handled (the run goes on) but logged, {name: explanation}.
    rewards, truncated: (N,) over all episodes of the iteration (all ranks)."""
    warnings = {}
    if bool((rewards == rewards[0]).all()):
        warnings["rewards_equal"] = (f"all {len(rewards)} rewards are {rewards[0].item():g}: no reward signal, "
                                     "the advantages carry only the KL penalty and the value error")
    if bool(truncated.all()):
        warnings["all_truncated"] = (f"every response hit --max-new-tokens {cfg.max_new_tokens} without EOS "
                                     "(consider a larger limit or --truncation-penalty)")
    if n_kept == 0:
        warnings["nothing_kept"] = "every episode scored <= 0: update skipped"
    return warnings


# ----------------------------------------------------------------------------- the algorithm
#
# Under torchrun (distributed.py) each rank runs these functions on its share of the prompts;
# every sum, mean or selection that the algorithm box defines over the whole batch goes through
# `dist`, so K ranks compute the update of one process holding all K shares. In one process
# `dist` is SINGLE and those calls do nothing.

def ppo_iteration(it: int, cfg: Config, policy, tokenizer, optimizer, train_examples, val_seqs, timer,
                  dist: Dist = SINGLE) -> tuple[dict, list]:
    """One I-PPO iteration, the algorithm box of the paper. Returns (metrics, episode records),
    both over all ranks' episodes."""
    examples = [train_examples[i] for i in batch_indices(len(train_examples), it, cfg.prompts_per_iter, cfg.seed)]
    examples = examples[slice(*dist.share(len(examples)))]  # this rank's prompts (all of them in one process)

    with timer("rollout"):
        rollouts = generate_rollouts(policy, tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                                     n_samples=cfg.samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperature, seed=derived_seed(cfg.seed, it, SAMPLING, dist.rank),
                                     batch_size=cfg.gen_batch_size, progress=cfg.progress)
        golds = [examples[j].gold for j in rollouts.prompt_index]
        require_finite(it, "rollout", old_logprobs=rollouts.old_logprobs, ref_logprobs=rollouts.ref_logprobs,
                       values=rollouts.values)

    with timer("reward"):
        flipped = planted_flips(cfg, it, len(rollouts), dist.rank)                        # (N,) bools
        scores = torch.tensor([reward_fn(text, gold, cfg.dataset, bool(trunc), cfg.truncation_penalty, flip)
                               for text, gold, trunc, flip in zip(rollouts.responses, golds, rollouts.truncated,
                                                                  flipped)],
                              device=rollouts.response_mask.device)                      # (N,)
        require_finite(it, "reward", scores=scores)

    with timer("advantages"):
        advantages, returns, kl, critic = compute_advantages(cfg, rollouts, scores, dist)  # (N, T) each

    with timer("influence"):
        keep, weights, influence = select_episodes(it, cfg, policy, rollouts, advantages, val_seqs, dist)
        n_kept = int(dist.sum(keep.sum()))                                               # |D'| over all ranks

    with timer("update"):
        if n_kept > 0:
            update = ppo_update(it, cfg, policy, optimizer, rollouts, advantages, returns, keep, weights, dist)
        else:
            update = {"skipped": True}

    return iteration_records(it, cfg, examples, rollouts, scores, flipped, kl, keep, weights, n_kept,
                             influence | critic, update, dist)


def iteration_records(it, cfg: Config, examples, rollouts, scores, flipped, kl, keep, weights, n_kept: int,
                      influence: dict, update: dict, dist: Dist = SINGLE) -> tuple[dict, list]:
    """Bookkeeping of ppo_iteration: the metrics of the iteration (means over all ranks'
    episodes, each with its denominator) and one record per episode (all ranks', rank order)."""
    mask = rollouts.response_mask
    golds = [examples[j].gold for j in rollouts.prompt_index]
    answers = [extract_answer(t, cfg.dataset) for t in rollouts.responses]
    correct = [is_correct(a, g, cfg.dataset) for a, g in zip(answers, golds)]
    warnings = batch_warnings(cfg, dist.cat(scores), dist.cat(rollouts.truncated.to(mask.device, torch.float32)).bool(),
                              n_kept)
    for what in warnings.values():
        if dist.is_main:
            print(f"[it {it + 1}] warning: {what}", file=sys.stderr)
    # Sums and counts over all ranks first, then the means.
    total = dict(zip(("reward", "correct", "unparsed", "truncated", "tokens", "episodes", "kl"), dist.sum(torch.tensor(
        [scores.sum().item(), sum(correct), sum(a is None for a in answers), rollouts.truncated.sum().item(),
         mask.sum().item(), len(rollouts), kl.sum().item()], dtype=torch.float64, device=mask.device)).tolist()))
    per_episode = {k: total[k] / total["episodes"] for k in ("reward", "correct", "unparsed", "truncated", "tokens")}
    metrics = {
        "reward": per_episode["reward"], "accuracy": per_episode["correct"], "unparsed": per_episode["unparsed"],
        "truncated": per_episode["truncated"], "response_tokens": per_episode["tokens"],
        "episodes": int(total["episodes"]), "kept": n_kept, "kept_fraction": n_kept / total["episodes"],
        "kl": total["kl"] / max(total["tokens"], 1.0),  # mean over all response tokens
        **{k: v for k, v in influence.items() if k != "scores"}, **update,
    }
    if cfg.reward_noise > 0:
        metrics |= noise_metrics(dist.cat(torch.tensor(flipped, dtype=torch.float32, device=mask.device)).bool(),
                                 dist.cat(keep.float()).bool(),
                                 dist.cat(torch.tensor(influence["scores"], device=mask.device))
                                 if "scores" in influence else None)
    if warnings:
        metrics["warnings"] = list(warnings)
    episodes = [{"iteration": it + 1, "prompt": examples[j].question, "gold": golds[i], "response": rollouts.responses[i],
                 "answer": answers[i], "reward": scores[i].item(), "truncated": bool(rollouts.truncated[i]),
                 "score": influence["scores"][i] if "scores" in influence else None,
                 "kept": bool(keep[i]), "weight": weights[i].item(), "flipped": flipped[i]}
                for i, j in enumerate(rollouts.prompt_index)]
    return metrics, dist.gather_objects(episodes)


def noise_metrics(flipped: torch.Tensor, keep: torch.Tensor, scores: torch.Tensor | None) -> dict:
    """With --reward-noise: the share of flipped rewards, and how well the filter finds them:
    flip_auc, the AUC of the influence scores for "not flipped" (influence.detection_auc; 0.5 is
    chance), and the share of flipped episodes among the dropped and among the kept. All (N,)
    over all ranks' episodes; scores None without influence."""
    share = lambda sel: flipped[sel].float().mean().item() if bool(sel.any()) else None   # noqa: E731
    metrics = {"flipped_fraction": flipped.float().mean().item()}
    if scores is not None:
        metrics |= {"flip_auc": detection_auc(scores, ~flipped), "flipped_share_dropped": share(~keep),
                    "flipped_share_kept": share(keep)}
    return metrics


def compute_advantages(cfg: Config, rollouts, scores: torch.Tensor, dist: Dist = SINGLE):
    """r_t = -beta (log pi_old - log pi_ref) + score at the last token (ppo.kl_penalized_rewards);
    A_t, R_t = GAE(gamma, lambda) (ppo.gae); A whitened over the response tokens of the whole
    batch, all ranks', its std floored at --adv-std-floor (ppo.whiten). Returns (advantages,
    returns, kl), each (N, T), and the critic's health: the mean advantage before whitening
    (over all response tokens) and the explained variance of V_old against the returns.
    With --advantage grpo: ppo.group_advantages of the episodes' summed rewards on every token,
    not whitened, no returns (zeros) and no critic."""
    mask = rollouts.response_mask
    rewards, kl = kl_penalized_rewards(scores, rollouts.old_logprobs, rollouts.ref_logprobs, mask, cfg.kl_beta)
    if cfg.advantage == "grpo":
        # Our choice: the KL penalty enters GRPO as the episode's summed per-token reward (the
        # same total as PPO's), before the group normalisation.
        group_adv = group_advantages(rewards.sum(-1), torch.as_tensor(rollouts.prompt_index, device=mask.device))
        advantages, returns = group_adv[:, None] * mask, torch.zeros_like(mask)              # (N, T)
        ev = float("nan")                                                                 # no critic
    else:
        advantages, returns = gae(rewards, rollouts.values, mask, cfg.gamma, cfg.lam)
        ev = explained_variance(rollouts.values, returns, mask, reduce_sum=dist.sum)
    n_tokens = dist.sum(mask.sum()).clamp(min=1.0)
    critic = {"advantage_mean": (dist.sum((advantages * mask).sum()) / n_tokens).item(),
              "explained_variance": None if math.isnan(ev) else ev}     # None: no critic, or constant returns
    if cfg.advantage == "gae":
        advantages = whiten(advantages, mask, reduce_sum=dist.sum, std_floor=cfg.adv_std_floor)
    return advantages, returns, kl, critic


def select_episodes(it, cfg: Config, policy, rollouts, advantages, val_seqs, dist: Dist = SINGLE):
    """Influence scores at theta_old and the kept set D' with its weights.
    Returns (keep (N,) bool, weights (N,), metrics dict) for this rank's episodes; the filter
    and the weight normalisation (mean score over the kept episodes) see all ranks' scores."""
    N = len(rollouts)
    if cfg.influence == "off":  # plain PPO: every episode, weight 1
        return torch.ones(N, dtype=torch.bool, device=advantages.device), torch.ones(N, device=advantages.device), {}
    # g_val over the whole validation set: each rank's share divided by the token count of all shares, summed.
    n_val_tokens = dist.sum(val_seqs.response_mask.sum())
    g_val = dist.sum(validation_gradient(policy, val_seqs, cfg.val_batch_size, progress=cfg.progress,
                                         n_tokens=n_val_tokens))                                      # (P,)
    require_finite(it, "influence", g_val=g_val)
    if cfg.influence_method == "loop":
        grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps,
                                  temperature=cfg.temperature, progress=cfg.progress)                # (N, P)
        scores = influence_scores(grads, g_val)                                                       # (N,)
    else:
        scores = onepass_scores(policy, rollouts, advantages, g_val, clip_eps=cfg.clip_eps,
                                temperature=cfg.temperature, batch_size=cfg.micro_batch_size)         # (N,)
    all_scores = dist.cat(scores)                                                                     # (N_all,)
    require_finite(it, "influence", scores=all_scores)
    if cfg.random_filter:
        keep, weights = random_filter(all_scores, torch.Generator().manual_seed(derived_seed(cfg.seed, it, FILTER)))
    elif cfg.reweight:
        keep, weights = filter_and_reweight(all_scores)
    else:
        keep, weights = binary_filter(all_scores)
    mine = slice(dist.offset(N), dist.offset(N) + N)  # this rank's episodes within all_scores
    # The effective number of episodes behind the update (Kish): (sum w)^2 / sum w^2, |D'| when
    # every kept weight is 1, fewer when a few large scores carry the weight.
    ess = (weights.sum() ** 2 / (weights ** 2).sum()).item() if bool(keep.any()) else 0.0
    return keep[mine], weights[mine], {"weight_ess": ess,
        "score_mean": all_scores.mean().item(), "score_min": all_scores.min().item(),
        "score_max": all_scores.max().item(), "positive_fraction": (all_scores > 0).float().mean().item(),
        "g_val_norm": g_val.norm().item(), "scores": scores.tolist()}


def ppo_update(it, cfg: Config, policy, optimizer, rollouts, advantages, returns, keep, weights,
               dist: Dist = SINGLE) -> dict:
    """PPO epochs over the kept episodes D'. Per optimizer step on a minibatch M of D':
        loss = (1/|M|) sum_{i in M} [ w_i L_clip_i + c_v L_V_i - c_e H_i ]
    (per-episode losses are token means; the value loss is unweighted, our choice). Each epoch
    shuffles D' and splits it into ceil(|D'| / --minibatch-size) minibatches of balanced sizes
    (our choice), so with --minibatch-size >= |D'| this is exactly the objective of the
    algorithm box. Under torchrun D' spans the ranks: every rank draws the same shuffle of all
    kept episodes, works on its own episodes of each minibatch, and the gradients are summed
    over ranks before the step, so K ranks take the steps one process would."""
    device = advantages.device
    # D' as indices into all ranks' episodes (rank order); the shuffle and the split into
    # minibatches are the same in every rank and for any number of ranks.
    kept_all = dist.cat(keep.float()).nonzero().squeeze(-1).cpu()
    first = dist.offset(len(keep))                    # this rank's episodes are [first, first + N)
    n_minibatches = math.ceil(len(kept_all) / cfg.minibatch_size)
    generator = torch.Generator().manual_seed(derived_seed(cfg.seed, it, MINIBATCHES))
    params = [p for p in policy.parameters() if p.requires_grad]
    sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0,
            "visits": 0.0}
    # pi_theta / pi_old over the tokens of the first minibatch, before any step: 1 up to rounding
    # (anything else means the old log-probs are not those of the policy being updated).
    ratio_sum, ratio_count, ratio_max = 0.0, 0.0, 0.0
    steps = [(e, mb) for e in range(cfg.ppo_epochs)
             for mb in kept_all[torch.randperm(len(kept_all), generator=generator)].tensor_split(n_minibatches)]
    for step, (epoch, global_minibatch) in enumerate(tqdm(steps, desc="updating", unit="step",
                                                          disable=not cfg.progress, leave=False)):
        optimizer.zero_grad(set_to_none=True)
        size = len(global_minibatch)                                                     # |M|, all ranks
        mine = global_minibatch[(global_minibatch >= first) & (global_minibatch < first + len(keep))]
        minibatch = mine - first                                                         # this rank's part
        for micro in chunks(minibatch, cfg.micro_batch_size):
            part = rollouts.select(micro)
            logprobs, values, entropy = token_logprobs(policy, part, cfg.temperature, with_entropy=True)  # (n, T)
            pg = policy_loss(logprobs, part.old_logprobs, advantages[micro], part.response_mask, cfg.clip_eps)  # (n,)
            vf = value_loss(values, part.values, returns[micro], part.response_mask, cfg.value_clip_eps)       # (n,)
            ent = masked_mean(entropy, part.response_mask)                                    # (n,)
            vf_coef = cfg.vf_coef if cfg.advantage == "gae" else 0.0                      # GRPO: no critic
            loss = ((weights[micro] * pg).sum() + vf_coef * vf.sum() - cfg.ent_coef * ent.sum()) / size
            require_finite(it, f"update, epoch {epoch + 1}", loss=loss)
            loss.backward()
            sums["policy_loss"] += pg.sum().item()
            sums["value_loss"] += vf.sum().item()
            sums["entropy"] += ent.sum().item()
            sums["clip_fraction"] += clip_fraction(logprobs, part.old_logprobs, part.response_mask, cfg.clip_eps).sum().item()
            sums["approx_kl"] += approx_kl(logprobs.detach(), part.old_logprobs, part.response_mask).sum().item()
            sums["visits"] += len(micro)
            if step == 0:
                ratio = torch.exp(logprobs.detach() - part.old_logprobs)[part.response_mask.bool()]
                ratio_sum, ratio_count = ratio_sum + ratio.sum().item(), ratio_count + ratio.numel()
                ratio_max = max(ratio_max, ratio.max().item() if ratio.numel() else 0.0)
        dist.sum_grads(params)
        clip_and_step(it, cfg, policy, optimizer)
    # Reported: unweighted means over every episode visit of every epoch, all ranks.
    total = dict(zip(sums, dist.sum(torch.tensor(list(sums.values()), dtype=torch.float64, device=device)).tolist()))
    visits = total.pop("visits")
    as_tensor = lambda *xs: torch.tensor(xs, dtype=torch.float64, device=device)  # noqa: E731
    ratio_sum, ratio_count = dist.sum(as_tensor(ratio_sum, ratio_count)).tolist()
    ratio_max = dist.cat(as_tensor(ratio_max)).max().item()                              # over ranks
    return {k: v / visits for k, v in total.items()} | {
        "optimizer_steps": len(steps), "ratio_first_mean": ratio_sum / max(ratio_count, 1.0),
        "ratio_first_max": ratio_max}


def clip_and_step(it: int, cfg: Config, policy, optimizer) -> None:
    """Clip the global gradient norm and take the optimizer step, unless a gradient is NaN/inf."""
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], cfg.max_grad_norm)
    require_finite(it, "update", gradient_norm=grad_norm)
    optimizer.step()


def sft_iteration(it: int, cfg: Config, policy, tokenizer, optimizer, train_examples, timer,
                  dist: Dist = SINGLE) -> tuple[dict, list]:
    """One SFT step: loss = (sum of NLL over the batch's reference tokens) / (their count),
    with the batch (and the count) spread over the ranks under torchrun."""
    examples = [train_examples[i] for i in batch_indices(len(train_examples), it, cfg.sft_batch_size, cfg.seed)]
    examples = examples[slice(*dist.share(len(examples)))]
    with timer("update"):
        seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                            [e.solution for e in examples], device=policy.device)
        n_tokens = dist.sum(seqs.response_mask.sum())                                     # all ranks
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=n_tokens.device)
        for micro in chunks(torch.arange(len(seqs)), cfg.micro_batch_size):
            nll, _ = sft_nll(policy, seqs.select(micro))
            loss = nll.sum() / n_tokens
            require_finite(it, "update", sft_loss=loss)
            loss.backward()
            total += loss.item()
        dist.sum_grads([p for p in policy.parameters() if p.requires_grad])
        clip_and_step(it, cfg, policy, optimizer)
    return {"sft_loss": dist.sum(total).item(), "tokens": int(n_tokens)}, []


# ----------------------------------------------------------------------------- run directory
#
# A run directory holds config.json, data.json, metrics.jsonl, episodes.jsonl and checkpoints/.
# commit_iteration writes an iteration in this order:
#   1. its records are appended to episodes.jsonl and metrics.jsonl, and fsynced;
#   2. its checkpoint is written into checkpoints/.tmp_iter_N, every file fsynced;
#   3. that directory is renamed to checkpoints/iter_N (atomic) and checkpoints/ is fsynced;
#   4. checkpoints/latest is replaced (latest.tmp, fsync, rename: atomic) to name iter_N;
#   5. checkpoints older than the newest --keep-checkpoints are renamed away, then deleted.
# Step 4 is the commit point. A crash (SIGKILL, power loss) before it leaves the previous
# checkpoint as `latest`, and --resume drops the records of step 1 (a half-written last line
# included); a crash after it leaves the new one. Every iter_* directory is complete: one
# appears and disappears only by a rename. Either way the resumed run continues exactly.

CHECKPOINT_FILES = ("adapter.safetensors", "adapter.json", "optimizer.safetensors", "optimizer.json",
                    "rng.safetensors", "state.json")

# Tests set this to a function of the step's name (one that SIGKILLs the process at the k-th
# step, say) to check that a crash between any two filesystem steps of a commit leaves a run
# that resumes exactly. None in normal use.
crash_hook = None


def fs_step(name: str) -> None:
    """A point between two filesystem steps of commit_iteration (see crash_hook)."""
    if crash_hook is not None:
        crash_hook(name)


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's list of names (so that a rename in it survives power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text`: a crash leaves the old content or the new, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def append_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())  # on disk before the checkpoint that covers these records


def truncate_jsonl(path: Path, last_iteration: int) -> None:
    """Keep the records of iterations <= last_iteration: later ones were appended after the
    checkpoint we resume from, by a run that crashed before committing them. Text after the
    last newline is a write that such a crash cut short, dropped too. A line before it that is
    not JSON was not written by a crash: the resume stops there, naming it."""
    if not path.exists():
        return
    complete, _, torn = path.read_bytes().rpartition(b"\n")
    if torn:
        print(f"[resume] {path}: dropping a half-written last line ({len(torn)} bytes)", file=sys.stderr)
    kept = []
    for line_no, line in enumerate(complete.split(b"\n") if complete else [], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise SystemExit(f"{path}:{line_no}: not a JSON record ({err}); fix or remove that line") from err
        if record.get("iteration", 0) <= last_iteration:
            kept.append(line.decode() + "\n")
    write_atomic(path, "".join(kept))


def lora_settings(cfg: Config) -> dict:
    return {"model": cfg.model, "targets": cfg.targets(), "rank": cfg.lora_rank, "alpha": cfg.lora_alpha}


def save_optimizer(optimizer, directory: Path) -> None:
    """AdamW state: its tensors as safetensors, its hyper-parameters as JSON (no pickle)."""
    from safetensors.torch import save_file

    state = optimizer.state_dict()
    tensors = {f"{index}.{name}": value for index, per_param in state["state"].items()
               for name, value in per_param.items()}
    not_tensors = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise TypeError(f"optimizer state {not_tensors[:3]} is not a tensor: save_optimizer stores tensors only")
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "optimizer.safetensors")
    (directory / "optimizer.json").write_text(json.dumps({"param_groups": state["param_groups"]}, indent=2))


def load_optimizer(optimizer, directory: Path) -> None:
    from safetensors.torch import load_file

    state = {}
    for key, value in load_file(directory / "optimizer.safetensors").items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = json.loads((directory / "optimizer.json").read_text())["param_groups"]
    for group in groups:  # JSON turned tuples such as betas into lists
        group.update({k: tuple(v) for k, v in group.items() if isinstance(v, list) and k != "params"})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def discard(directory: Path) -> None:
    """Remove a directory by renaming it away first, so no iter_* directory is ever partial."""
    trash = directory.with_name(".trash_" + directory.name)
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(directory, trash)
    fs_step(f"renamed {directory.name} away")
    shutil.rmtree(trash)
    fs_step(f"deleted {directory.name}")


def save_checkpoint(run_dir: Path, iteration: int, cfg: Config, policy, optimizer) -> Path:
    """checkpoints/iter_NNNNNN/: adapter and value head, optimizer state, RNG state (safetensors)
    and the iteration (JSON), committed by switching checkpoints/latest (steps 2-5 above)."""
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    final, tmp = root / f"iter_{iteration:06d}", root / f".tmp_iter_{iteration:06d}"
    tidy_checkpoints(root, cfg.keep_checkpoints)
    tmp.mkdir(parents=True)
    save_adapter(policy, tmp, lora_settings(cfg))
    fs_step("wrote adapter")
    save_optimizer(optimizer, tmp)
    fs_step("wrote optimizer")
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, tmp / "rng.safetensors")
    fs_step("wrote rng")
    (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "config": dataclasses.asdict(cfg)}, indent=2))
    for f in [*tmp.iterdir(), tmp]:
        fsync_path(f)
    fs_step("wrote state.json")
    if final.exists():  # written by a run that crashed before `latest` named it: never committed
        discard(final)
    os.replace(tmp, final)
    fsync_path(root)
    fsync_path(run_dir)  # checkpoints/ itself is new at the first commit
    fs_step(f"renamed to {final.name}")
    write_atomic(root / "latest", final.name + "\n")
    fs_step("switched latest")
    tidy_checkpoints(root, cfg.keep_checkpoints)
    return final


def tidy_checkpoints(root: Path, keep: int) -> None:
    """Remove what a crash or a commit leaves behind: unfinished .tmp_ and .trash_ directories,
    checkpoints after `latest` (written, never committed) and all but the newest `keep` up to it."""
    for leftover in [*root.glob(".tmp_iter_*"), *root.glob(".trash_*")]:
        shutil.rmtree(leftover)
    latest = latest_checkpoint(root.parent)
    if latest is None:
        return
    newest_first = sorted(root.glob("iter_*"), reverse=True)   # zero-padded names sort by iteration
    committed = [p for p in newest_first if p.name <= latest.name]
    for old in [p for p in newest_first if p.name > latest.name] + committed[keep:]:
        discard(old)


def commit_iteration(run_dir: Path, it: int, cfg: Config, metrics: dict, episodes: list, policy, optimizer) -> Path:
    """Log iteration `it`, then checkpoint it, in the order described above."""
    append_jsonl(run_dir / "episodes.jsonl", episodes)
    fs_step("appended episodes.jsonl")
    append_jsonl(run_dir / "metrics.jsonl", [{"iteration": it + 1, **metrics}])
    fs_step("appended metrics.jsonl")
    return save_checkpoint(run_dir, it + 1, cfg, policy, optimizer)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint checkpoints/latest names, or None before the first commit."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    ckpt = pointer.parent / pointer.read_text().strip()
    missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
    if missing:
        raise SystemExit(f"{pointer} names {ckpt.name}, which lacks {', '.join(missing)}: "
                         "the checkpoint was changed outside train.py")
    return ckpt


def resolve_checkpoint(path: str, flag: str = "") -> Path:
    """A checkpoint directory, or a run directory (its latest checkpoint). `flag` names the
    command-line flag that gave `path`, for the error message."""
    p, where = Path(path), f"{flag} {path}".strip()
    if (p / "checkpoints").is_dir():
        latest = latest_checkpoint(p)
        if latest is None:
            raise SystemExit(f"{where}: a run directory without a complete checkpoint yet")
        return latest
    if not (p / "adapter.safetensors").exists():
        raise SystemExit(f"{where}: neither a checkpoint directory nor a run directory with checkpoints")
    return p


def load_checkpoint(run_dir: Path, policy, optimizer) -> int:
    """Restore adapters, value head, optimizer and RNG; returns the completed iteration count."""
    from safetensors.torch import load_file

    ckpt = resolve_checkpoint(str(run_dir))
    load_adapter(policy, ckpt)
    load_optimizer(optimizer, ckpt)
    rng = load_file(ckpt / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((ckpt / "state.json").read_text())["iteration"]


def restore_run(run_dir: Path, keep: int, policy, optimizer, writer: bool = True) -> int:
    """--resume: load the latest checkpoint, drop the log records written after it and what a
    crash left in checkpoints/. A run that crashed before its first checkpoint starts over
    (its first evaluation included). Returns the number of completed iterations. Under
    torchrun every rank loads; only the writer (rank 0) tidies the run directory."""
    if latest_checkpoint(run_dir) is None:
        start, keep_through = 0, -1
        message = f"[resume] {run_dir}: no checkpoint yet, starting from iteration 0"
    else:
        start = keep_through = load_checkpoint(run_dir, policy, optimizer)
        message = f"[resume] {run_dir}: continuing after iteration {start}"
    if writer:
        print(message, file=sys.stderr)
        if start:
            tidy_checkpoints(run_dir / "checkpoints", keep)
        for name in ("metrics.jsonl", "episodes.jsonl"):
            truncate_jsonl(run_dir / name, keep_through)
    return start


def open_run_dir(cfg: Config) -> Path:
    """Create (or, with --resume, reopen) the run directory and write config.json."""
    run_dir = Path(cfg.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.algo}"
                   f"{'' if cfg.algo == 'sft' else ('-influence' if cfg.influence == 'on' else '-plain')}")
    if run_dir.exists() and not run_dir.is_dir():
        raise SystemExit(f"--run-dir {run_dir}: exists and is not a directory")
    if not cfg.resume and ((run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists()):
        raise SystemExit(f"--run-dir {run_dir}: already holds a run; use --resume {run_dir} or another directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2))
    return run_dir


@contextmanager
def last_good_checkpoint_on_fault(run_dir: Path):
    """A NaN/inf (FloatingPointError) stops the run before anything of its iteration is saved;
    add where the last good checkpoint is and how to continue from it."""
    try:
        yield
    except FloatingPointError as err:
        latest = latest_checkpoint(run_dir)
        kept = f"{latest} is the last good checkpoint" if latest else "no checkpoint had been written yet"
        raise FloatingPointError(f"{err}. Nothing of that iteration was saved; {kept}; "
                                 f"--resume {run_dir} continues from it") from err


def log_line(it: int, cfg: Config, m: dict, seconds: dict) -> str:
    phases = " ".join(f"{k} {v:.1f}" for k, v in seconds.items())
    if cfg.algo == "sft":
        body = f"sft loss {m['sft_loss']:.4f} ({m['tokens']} tokens)"
    else:
        body = (f"reward {m['reward']:.3f} acc {m['accuracy']:.3f} trunc {m['truncated']:.2f} len {m['response_tokens']:.0f} | "
                f"kept {m['kept']}/{m['episodes']}")
        if "score_mean" in m:
            body += (f" (ess {m['weight_ess']:.0f}) score {m['score_mean']:+.2e} "
                     f"[{m['score_min']:+.2e}, {m['score_max']:+.2e}]")
        body += f" | kl {m['kl']:.4f}"
        if not m.get("skipped"):
            body += (f" pg {m['policy_loss']:+.4f} vf {m['value_loss']:.4f} ent {m['entropy']:.3f} "
                     f"clip {m['clip_fraction']:.3f} akl {m['approx_kl']:.4f} ratio0 {m['ratio_first_max']:.3f}")
        ev = m["explained_variance"]
        body += f" | adv {m['advantage_mean']:+.3f} ev " + ("n/a" if ev is None else f"{ev:+.2f}")
        if "flipped_fraction" in m:  # --reward-noise
            body += f" | flipped {m['flipped_fraction']:.2f}"
            if m.get("flip_auc") is not None:
                body += f" auc {m['flip_auc']:.2f}"
    line = f"[it {it + 1:>3}/{cfg.iterations}] {body} | s: {phases}"
    if m.get("warnings"):
        line += f" | warnings: {','.join(m['warnings'])}"
    if "eval_accuracy" in m:
        line += f" | eval acc {m['eval_accuracy']:.3f} ({m['eval_n']} problems)"
    return line


def run_eval(cfg, policy, tokenizer, eval_examples, dist: Dist = SINGLE) -> dict:
    """Greedy exact match on eval_examples (under torchrun each rank takes its share and the
    counts are summed)."""
    mine = eval_examples[slice(*dist.share(len(eval_examples)))]
    counts = torch.zeros(4, dtype=torch.float64, device=policy.device)   # correct, n, unparsed, truncated
    if mine:
        r = evaluate(policy, tokenizer, mine, cfg.dataset, max_new_tokens=cfg.eval_max_new_tokens,
                     batch_size=cfg.gen_batch_size, progress=cfg.progress)
        counts += torch.tensor([r["n_correct"], r["n"], r["n_unparsed"], r["n_truncated"]],
                               dtype=torch.float64, device=counts.device)
    n_correct, n, n_unparsed, n_truncated = dist.sum(counts).tolist()
    accuracy = n_correct / max(n, 1)
    return {"eval_accuracy": accuracy, "eval_stderr": math.sqrt(accuracy * (1 - accuracy) / max(n, 1)),
            "eval_n": int(n), "eval_unparsed": int(n_unparsed), "eval_truncated": int(n_truncated)}


# ----------------------------------------------------------------------------- main

def main(argv=None) -> Path:
    """Train; returns the run directory. Bad flags raise SystemExit naming the flag, before the
    model is loaded where the model's config or the data suffice to tell. A NaN or inf raises
    FloatingPointError naming the iteration and the phase (rollout, reward, influence, update);
    nothing of that iteration is saved, so checkpoints/latest is the last good iteration and
    --resume continues from it. (On the command line it ends with that message, exit status 1.)
    Under torchrun every rank runs main(); only rank 0 prints, writes the run directory and
    checkpoints."""
    dist = setup_distributed()
    cfg = parse_config(argv)
    check_against_world(cfg, dist.world)
    torch.manual_seed(cfg.seed)
    if not dist.is_main:
        dist.barrier()  # rank 0 first: on first use it converts the offline model, once
    check_against_model(cfg, inspect_model(cfg.model, cfg.trust_remote_code))
    if dist.is_main:
        dist.barrier()
    difficulty = {"arith_digits": cfg.arith_digits, "arith_terms": cfg.arith_terms}
    train_task = load_task(cfg.dataset, "train", cfg.data_source, **difficulty)
    test_task = load_task(cfg.dataset, "test", cfg.data_source, **difficulty)
    check_against_data(cfg, len(train_task.examples))
    init_adapter = resolve_checkpoint(cfg.init_adapter, "--init-adapter") if cfg.init_adapter else None
    run_dir = Path(dist.broadcast(str(open_run_dir(cfg)) if dist.is_main else None))
    say = print if dist.is_main else (lambda *args, **kwargs: None)  # rank 0 speaks for all
    cfg.progress = cfg.progress and dist.is_main
    say("[config] " + " ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()), file=sys.stderr)
    if dist.active:
        say(f"[torchrun] {dist.world} processes, backend {dist.backend}", file=sys.stderr)

    policy, tokenizer = load_policy(cfg.model, device=cfg.device, lora_targets=cfg.targets(),
                                    lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                    trust_remote_code=cfg.trust_remote_code, quiet=not dist.is_main)
    optimizer = make_optimizer(cfg, policy)

    # Our choice: the validation set is the last val_size rows of the training split, the same
    # for every seed, and never used as a training prompt.
    train_examples, val_examples = train_task.examples[:-cfg.val_size], train_task.examples[-cfg.val_size:]
    eval_examples = (test_task.examples if cfg.eval_split == "test" else val_examples)[:cfg.eval_limit]
    say(f"[data] train {len(train_examples)} + validation {len(val_examples)} rows from {train_task.source}; "
        f"eval {len(eval_examples)} rows from " + (test_task.source if cfg.eval_split == "test" else
                                                   "the validation rows"), file=sys.stderr)
    val_share = val_examples[slice(*dist.share(len(val_examples)))]   # all of them in one process
    val_seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in val_share],
                            [e.solution for e in val_share], device=policy.device)

    start = restore_run(run_dir, cfg.keep_checkpoints, policy, optimizer, writer=dist.is_main) if cfg.resume else 0
    if start == 0 and init_adapter:
        # SFT trains no value head: only the LoRA tensors are taken.
        load_adapter(policy, init_adapter, with_value_head=False)
        say(f"[init] LoRA adapters from {init_adapter}", file=sys.stderr)
    if init_adapter:
        # Our choice: the KL reference is the policy the run started from (base + init adapter),
        # as in RLHF's SFT reference; the base model would pull the policy back from what SFT learnt.
        load_reference_adapter(policy, init_adapter)
    if dist.is_main:
        write_atomic(run_dir / "data.json", json.dumps({"train": train_task.source, "test": test_task.source,
                                                        "val_rows": [e.where for e in val_examples]}, indent=2))

    if start == 0 and cfg.eval_every:
        m = run_eval(cfg, policy, tokenizer, eval_examples, dist)
        if dist.is_main:
            append_jsonl(run_dir / "metrics.jsonl", [{"iteration": 0, **m}])
        say(f"[it   0/{cfg.iterations}] eval acc {m['eval_accuracy']:.3f} ({m['eval_n']} problems, before training)")

    with last_good_checkpoint_on_fault(run_dir):
        for it in range(start, cfg.iterations):
            timer = Timer()
            if cfg.algo == "sft":
                metrics, episodes = sft_iteration(it, cfg, policy, tokenizer, optimizer, train_examples, timer, dist)
            else:
                metrics, episodes = ppo_iteration(it, cfg, policy, tokenizer, optimizer, train_examples, val_seqs,
                                                  timer, dist)
            last = it + 1 == cfg.iterations
            stop = cfg.stop_below_kept > 0 and metrics.get("kept_fraction", 1.0) < cfg.stop_below_kept
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or last or stop):
                with timer("eval"):
                    metrics |= run_eval(cfg, policy, tokenizer, eval_examples, dist)
            metrics["seconds"] = dict(timer.seconds)   # rank 0's
            say(log_line(it, cfg, metrics, timer.seconds), flush=True)
            if dist.is_main:
                commit_iteration(run_dir, it, cfg, metrics, episodes, policy, optimizer)
            if stop:
                say(f"[stop] kept fraction {metrics['kept_fraction']:.2f} < --stop-below-kept {cfg.stop_below_kept}")
                break
    if dist.is_main and cfg.plots:
        say(f"[report] {write_plots(run_dir)}, {write_report(run_dir)}", file=sys.stderr)
    dist.barrier()
    say(f"[done] run directory: {run_dir}")
    return run_dir


if __name__ == "__main__":
    try:
        main()
    except FloatingPointError as err:
        raise SystemExit(f"[error] {err}") from err
