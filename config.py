"""The configuration of a run: every flag of train.py, its default and help, and the checks.

`Config` is the one place where a setting is named, given its default and explained; the
choices the paper leaves open that are settings (lambda 1, the value head's learning rate, no
value clipping, the whitening floor) are commented where their default is set. Flags are
checked three times, each before any work it would waste: `Config.validate` at start (ranges
and combinations), `check_against_model` from the model's config alone (before the weights
load), `check_against_data` and `check_against_ranks` once the data and the number of
torchrun processes are known. A refused flag ends the run with one message naming it.

Public:
    Config                              the dataclass of all settings (config.json of a run)
    parse_config(argv) -> Config        the command line, or with --resume the run's config.json
    add_config_flags(parser, names)     Config's fields as argparse flags (compare.py uses it)
    check_against_model(cfg, info), check_against_ranks(cfg, ranks), check_against_data(cfg, n)
    read_saved_config(path) -> dict     a run's config.json, checked field by field
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tasks import ARITH_DIGITS, ARITH_TERMS
from model import ModelInfo
from reward import TASKS

DESCRIPTION = "I-PPO: Influence-Guided PPO post-training of an LLM on math word problems."


def flag(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    # what to train
    model: str = flag("gemma-3-270m", "hub id (google/gemma-3-1b-it), local directory, or an offline model "
                                        "(offline_models.py: gemma-3-270m, tiny-arith)")
    dataset: str = flag("gsm8k", "task to train and evaluate on", choices=TASKS)
    data_source: str = flag("auto", "auto: the hub if it has the task, unless HF_HUB_OFFLINE=1 or unreachable; "
                            "else data/", choices=("auto", "hub", "local"))
    arith_digits: int = flag(ARITH_DIGITS, "--dataset arith: digits of every number in a problem")
    arith_terms: int = flag(ARITH_TERMS, "--dataset arith: numbers per problem (terms - 1 additions or subtractions)")
    algo: str = flag("ppo", "ppo (with or without influence) or sft (LoRA on worked solutions)", choices=("ppo", "sft"))
    influence: str = flag("on", "on: I-PPO; off: plain PPO", choices=("on", "off"))
    reweight: bool = flag(True, "weight kept episodes by s_i / mean kept s (--no-reweight: binary filter)")
    speedups: str = flag("on", "off: every step by its definition (per-episode gradients by a loop of backward "
                         "passes, log-probs by log_softmax and gather, one forward per sequence); on: the same "
                         "numbers from less work (speedups.py: one-pass influence scores, lean log-probs, the "
                         "shared prompt prefix); all: also log pi_old and V_old from a forward at theta_old that "
                         "runs anyway, the influence scoring's or the update's first (its graph is kept for "
                         "every episode: memory grows with prompts x samples, not --micro-batch-size)",
                         choices=("off", "on", "all"))
    random_filter: bool = flag(False, "control: drop as many episodes as influence would, chosen at random")
    shuffle_weights: bool = flag(False, "control: I-PPO's kept set with its weights permuted among the kept episodes "
                                 "(which episodes, not how weighted)")
    selection: str = flag("none", "a rollout-selection rule in place of the influence filter (selection.py; needs "
                          "--influence off): none (every episode), dapo (DAPO's dynamic sampling: keep the prompts whose "
                          "answers' rewards differ, sample more prompts to refill), pods (PODS: sample --pods-samples "
                          "answers a prompt, keep the --samples-per-prompt of largest reward variance), greso (GRESO: "
                          "DAPO's sampling, prompts whose answers were all right or all wrong lately skipped before "
                          "sampling), gradalign (GradAlign: of --gradalign-rounds batches of prompts, keep the "
                          "--prompts-per-iter whose policy gradient is closest in cosine to that of the model's own "
                          "answers to --gradalign-val validation problems)",
                          choices=("none", "dapo", "pods", "greso", "gradalign"))
    dapo_rounds: int = flag(3, "--selection dapo, greso: at most this many further batches of prompts an iteration")
    greso_target: float = flag(0.25, "--selection greso: the share of zero-variance prompts its skip probabilities aim at")
    train_pool: int = flag(0, "train on the first K training rows only (0: all of them): a pool small enough that a run "
                           "meets each prompt many times, as GRESO's history needs")
    gradalign_rounds: int = flag(2, "--selection gradalign: batches of --prompts-per-iter candidate prompts an "
                                 "iteration, of which one batch's worth is kept")
    gradalign_val: int = flag(32, "--selection gradalign: validation problems answered (--samples-per-prompt times "
                              "each) for the validation gradient an iteration, a fresh draw each iteration")
    pods_samples: int = flag(8, "--selection pods: answers sampled per prompt (n), of which --samples-per-prompt are kept")
    score_against: str = flag("validation", "what each episode's gradient g_i is dotted with: validation (I-PPO: g_val, "
                              "the SFT gradient of the validation set); batch (DTV, arXiv 2609.35072: the mean g_j "
                              "of the buffer's episodes); batch-loo (the same mean without episode i). batch and "
                              "batch-loo filter only, as DTV does: keep s_i >= 0, every kept weight 1",
                              choices=("validation", "batch", "batch-loo"))
    # Our choice: the critic learns from every episode of the buffer. The filter is about the
    # policy gradient; fitting V on the kept episodes only would give I-PPO a critic trained on
    # a sign-dependent half of the data, and that critic makes every advantage next iteration.
    critic_episodes: str = flag("all", "which episodes the value loss is taken over: all (the whole buffer) or "
                                "kept (only D', the filter's episodes)", choices=("all", "kept"))
    # Our choice: the value loss trains the value head only (it sits on detached hidden states).
    # With "adapters" c_v grad L_V also moves the LoRA weights: a direction that no influence
    # score accounts for, the same under PPO and I-PPO.
    critic_grad: str = flag("head", "what the value loss trains: head (the value head alone) or adapters (also the "
                            "LoRA weights, through the hidden states the head reads)", choices=("head", "adapters"))
    init_adapter: str = flag("", "start from this checkpoint's LoRA adapters (e.g. an --algo sft run)")
    # The controls of the filter. I-PPO's update, sum_{s_i > 0} s_i g_i = (sum_{s_i > 0} g_i g_i^T) g_val,
    # is a preconditioned step down the validation SFT loss (influence.py): what does the filter
    # add beyond its validation solutions? These train on those solutions directly.
    sft_data: str = flag("train", "--algo sft: which worked solutions it trains on: train (the training rows) or "
                         "val (the --val-size validation solutions behind g_val: the control for I-PPO)",
                         choices=("train", "val"))
    sft_coef: float = flag(0.0, "PPO plus an SFT term (PPO-ptx style): every optimizer step adds this times the mean "
                           "NLL of --sft-batch-size validation solutions to the loss (0: off)")
    rewhiten_kept: bool = flag(False, "I-PPO: after the filter, whiten the advantages again over the kept episodes' "
                               "tokens, each episode weighted by w_i, so that the update's weighted mean advantage "
                               "is 0, as PPO's is over the whole batch")
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
    micro_batch_size: int = flag(4, "episodes per forward/backward (does not change the math). It bounds the "
                                 "memory of every pass, except under --speedups all (see there)")
    lr: float = flag(5e-5, "AdamW learning rate for the LoRA adapters")
    # Our choice: the value head has a learning rate of its own. It starts at V = 0 and is of
    # use as a baseline only once it has caught up with the returns; AdamW at the LoRA rate
    # (5e-5) moves each of its weights by about 5e-5 a step. 1e-3 is what the tiny world's runs
    # used (README, "See PPO learn in minutes", where it made no measurable difference).
    value_lr: float = flag(1e-3, "AdamW learning rate for the value head")
    max_grad_norm: float = flag(1.0, "gradient clipping (global L2 norm; 0: no clipping)")
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
    val_subset: int = flag(0, "not exact, cheaper: g_val over a fresh random K of the --val-size solutions each "
                           "iteration, an unbiased estimate of the whole set's (0: all of them, the method as defined)")
    stop_below_kept: float = flag(0.0, "optional stop rule: end the run once the kept fraction falls below this (0 = off)")
    # SFT
    sft_batch_size: int = flag(8, "--algo sft, and the SFT term of --sft-coef: worked solutions per optimizer step")
    # LoRA
    lora_rank: int = flag(8, "LoRA rank r")
    lora_alpha: float = flag(16.0, "LoRA alpha (scale alpha / r)")
    lora_targets: str = flag("q_proj,k_proj,v_proj,o_proj", "comma-separated linear layers that get adapters")
    # evaluation, output, reproducibility
    eval_every: int = flag(10, "greedy exact-match evaluation every K iterations, before the first and after the last (0 = off)")
    eval_limit: int = flag(50, "evaluate on the first K problems of the test split")
    eval_split: str = flag("test", "what --eval-every evaluates: test (the test split); dev (the --eval-limit "
                           "training rows before the validation rows, then left out of training: for tuning settings "
                           "without looking at the test split, with any method); val (the validation rows themselves: "
                           "only with --influence off, since I-PPO's g_val is computed on them)",
                           choices=("test", "dev", "val"))
    eval_max_new_tokens: int = flag(256, "response length limit for evaluation")
    run_dir: str = flag("", "where to write the run (default runs/<date>-<time>-ppo-influence, -ppo-plain or -sft)")
    resume: str = flag("", "continue the run in this directory from its latest checkpoint")
    recipe: str = flag("", "a recipe file (TOML, e.g. configs/tiny.toml; also accepted as the first argument): its "
                       "settings replace the defaults, and flags on the command line override it")
    overrides: str = flag("", "the flags given on the command line besides the recipe (recorded in config.json)",
                          cli=False)
    keep_checkpoints: int = flag(2, "how many most recent checkpoints to keep")
    seed: int = flag(0, "the one seed: data order, sampling, random filter")
    device: str = flag("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps")
    dtype: str = flag("auto", "base weights: auto (bf16 on a GPU, fp32 on the CPU), fp32 or bf16 (LoRA, value head "
                      "and losses are fp32 in every case)", choices=("auto", "fp32", "bf16"))
    trust_remote_code: bool = flag(False, "allow a hub model to run its own code (off unless asked)")
    progress: bool = flag(True, "tqdm progress bars (--no-progress to hide)")
    plots: bool = flag(True, "write plots.png and report.html into the run directory at the end (--no-plots to skip)")
    tensorboard: bool = flag(True, "write every metric as TensorBoard event files into the run directory "
                             "(tensorboard/) as it is logged, when the optional tensorboard package is installed")

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
        for name in ("temperature", "lr", "value_lr", "clip_eps", "lora_alpha"):
            need(getattr(self, name) > 0, name, "must be > 0")
        for name in ("vf_coef", "ent_coef", "kl_beta", "truncation_penalty", "eval_every", "value_clip_eps",
                     "adv_std_floor", "max_grad_norm", "sft_coef"):
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
        need(not (self.selection != "none" and self.influence == "on"), "selection",
             f"{self.selection} replaces the influence filter: give --influence off too")
        need(not (self.selection != "none" and self.algo != "ppo"), "selection", "selects PPO's rollouts: needs --algo ppo")
        need(self.dapo_rounds >= 0, "dapo_rounds", "must be >= 0")
        need(0 < self.greso_target < 1, "greso_target", "must be a share in (0, 1)")
        need(self.train_pool >= 0, "train_pool", "must be >= 0 (0: every training row)")
        need(self.gradalign_rounds >= 2, "gradalign_rounds", "must be >= 2 (one batch of candidates selects nothing)")
        need(self.selection != "gradalign" or 1 <= self.gradalign_val <= self.val_size, "gradalign_val", f"must be in [1, --val-size {self.val_size}]")
        need(not (self.selection == "pods" and self.pods_samples <= self.samples_per_prompt), "pods_samples",
             f"must be more than --samples-per-prompt {self.samples_per_prompt} (PODS keeps that many of them)")
        need(0 <= self.val_subset <= self.val_size, "val_subset", f"must be in [0, --val-size {self.val_size}]")
        need(not (self.shuffle_weights and (self.influence == "off" or self.random_filter or not self.reweight
                                            or self.score_against != "validation")), "shuffle_weights",
             "permutes I-PPO's weights: needs --influence on and reweighting by the validation scores "
             "(not --random-filter, --no-reweight or --score-against batch)")
        need(not (self.influence == "off" and self.random_filter), "random_filter",
             "needs --influence on (it drops as many episodes as the scores would)")
        need(not (self.influence == "off" and not self.reweight), "reweight",
             "--no-reweight needs --influence on")
        need(not (self.sft_coef > 0 and self.algo != "ppo"), "sft_coef", "is PPO's SFT term; --algo sft is SFT alone")
        need(not (self.rewhiten_kept and (self.influence == "off" or self.advantage != "gae")), "rewhiten_kept",
             "needs --influence on and --advantage gae (it whitens GAE's advantages over the kept episodes)")
        need(not (self.eval_split == "val" and (self.sft_coef > 0 or (self.algo == "sft" and self.sft_data == "val"))),
             "eval_split", "val evaluates on the validation solutions this run trains on; use --eval-split dev")
        need(not (self.eval_split == "val" and self.influence == "on" and self.algo == "ppo"), "eval_split",
             "val evaluates on the rows whose SFT gradient g_val steers I-PPO's filter (a leak); "
             "use --eval-split dev, held-out training rows that neither training nor g_val use")

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


def check_against_ranks(cfg: Config, ranks: int) -> None:
    """Under torchrun every rank needs at least one prompt, validation row and SFT example."""
    if cfg.selection != "none" and ranks > 1:
        raise SystemExit(f"--selection {cfg.selection}: not implemented under torchrun (a rule sees one process's "
                         "groups); run it in one process")
    if cfg.val_subset and ranks > 1:
        raise SystemExit("--val-subset: not implemented under torchrun (the subset is drawn over the whole "
                         "validation set, which the processes split); run it in one process")
    if cfg.sft_coef > 0 and ranks > 1:
        raise SystemExit("--sft-coef: not implemented under torchrun (its batch of validation solutions is drawn "
                         "in one process); run it in one process")
    for name in ("prompts_per_iter", "val_size", "sft_batch_size"):
        if getattr(cfg, name) < ranks:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(cfg, name)}: fewer than the {ranks} torchrun "
                             "processes; each process needs at least one")


def check_against_data(cfg: Config, n_train_rows: int) -> None:
    if cfg.val_size >= n_train_rows:
        raise SystemExit(f"--val-size {cfg.val_size}: the training split has only {n_train_rows} rows "
                         "(the validation set is taken from it and some must remain to train on)")
    if cfg.eval_split == "dev" and cfg.val_size + cfg.eval_limit >= n_train_rows:
        raise SystemExit(f"--eval-split dev --eval-limit {cfg.eval_limit}: with --val-size {cfg.val_size}, the "
                         f"training split's {n_train_rows} rows leave none to train on")


def add_config_flags(parser: argparse.ArgumentParser, names=None) -> None:
    """One command-line flag per Config field (or per field in `names`), with its default and help."""
    for f in dataclasses.fields(Config):
        if names is not None and f.name not in names:
            continue
        if not f.metadata.get("cli", True):
            continue
        name = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            parser.add_argument(name, type=kind, default=f.default, choices=f.metadata.get("choices"),
                                help=f.metadata["help"])


def parse_config(argv=None) -> Config:
    """The command line: `[RECIPE.toml] [--flag value ...]`. A recipe's settings replace the
    defaults and the flags given override them (the convention of nanoGPT's config files and
    TRL's --config). With --resume, the run's own config.json instead."""
    parser = argparse.ArgumentParser(description=DESCRIPTION, epilog="A recipe file may come first: "
                                     "python train.py configs/tiny.toml [--flag value ...]",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--recipe", *argv]           # the recipe file as the first argument
    recipe = parser.parse_args(argv).recipe
    if recipe:
        parser.set_defaults(**load_recipe(Path(recipe)))
    args = parser.parse_args(argv)
    given = given_flags(parser, argv)
    cfg = Config(**vars(args), overrides=" ".join(_without_recipe(argv)))
    if cfg.resume:
        cfg = resumed_config(cfg, given)
    else:
        refuse_inert_flags(cfg, given)
    cfg.validate()
    return cfg


def refuse_inert_flags(cfg: Config, given: set[str]) -> None:
    """A flag given on the command line that the other settings make do nothing is refused,
    naming both flags: a run directory should not record a setting that had no effect."""
    inert = []
    if cfg.advantage == "grpo":   # no critic, no GAE, no whitening
        inert += [(name, "--advantage grpo", "GRPO has no critic and no GAE")
                  for name in ("vf_coef", "gamma", "lam", "adv_std_floor", "value_clip_eps", "value_lr",
                               "critic_episodes", "critic_grad")]
    if cfg.influence == "off":
        inert += [(name, "--influence off", "nothing is scored")
                  for name in ("stop_below_kept", "score_against", "critic_episodes", "val_subset")]
    elif cfg.score_against != "validation":
        inert += [("val_subset", f"--score-against {cfg.score_against}", "DTV's scores use no validation gradient")]
    if cfg.random_filter:
        inert += [("reweight", "--random-filter", "the random control keeps its episodes at weight 1")]
    elif cfg.score_against != "validation":
        inert += [("reweight", f"--score-against {cfg.score_against}", "batch and batch-loo filter only, as DTV does")]
    if cfg.selection not in ("dapo", "greso"):
        inert += [("dapo_rounds", f"--selection {cfg.selection}", "only DAPO and GRESO sample further prompts")]
    if cfg.selection != "greso":
        inert += [("greso_target", f"--selection {cfg.selection}", "only GRESO skips prompts")]
    if cfg.selection != "gradalign":
        inert += [(name, f"--selection {cfg.selection}", "only GradAlign aligns gradients")
                  for name in ("gradalign_rounds", "gradalign_val")]
    if cfg.selection != "pods":
        inert += [("pods_samples", f"--selection {cfg.selection}", "only PODS down-samples")]
    if cfg.algo != "sft":
        inert += [("sft_data", "--algo ppo", "it picks --algo sft's data; --sft-coef always uses the validation "
                   "solutions")]
    for name, other, why in inert:
        if name in given:
            raise SystemExit(f"--{name.replace('_', '-')}: does nothing with {other} ({why}); leave it out")


def _without_recipe(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--recipe":
            skip = True
        elif not arg.startswith("--recipe="):
            out.append(arg)
    return out


# Settings a recipe may not hold: where a run is written and resumed belong to the command line.
NOT_IN_RECIPES = ("recipe", "overrides", "resume", "run_dir")


def load_recipe(path: Path) -> dict:
    """A recipe file's settings, checked: valid TOML, every key a Config field (snake_case, as
    in config.json), every value of the field's type and among its choices. A problem is
    refused naming the file, the line and the key."""
    import tomllib

    if not path.is_file():
        raise SystemExit(f"recipe {path}: no such file")
    text = path.read_text()
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SystemExit(f"recipe {path}: not valid TOML: {err}") from err

    def line_of(key: str) -> str:
        for n, line in enumerate(text.splitlines(), 1):
            if re.match(rf"""\s*["']?{re.escape(key)}["']?\s*[=.]""", line) or re.match(rf"\s*\[\s*{re.escape(key)}\b", line):
                return f"{path}, line {n}"
        return str(path)

    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in NOT_IN_RECIPES}
    for key, value in values.items():
        if key not in fields:
            hint = f" (write {key.replace('-', '_')!r}: keys are snake_case)" if key.replace("-", "_") in fields else ""
            raise SystemExit(f"{line_of(key)}: unknown setting {key!r}{hint}; a recipe sets train.py's flags by their "
                             f"config.json names, e.g. lr, iterations, arith_terms (not {', '.join(NOT_IN_RECIPES)})")
        f = fields[key]
        kind = {"int": int, "float": (int, float), "str": str, "bool": bool}[str(f.type)]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SystemExit(f"{line_of(key)}: {key} should be {f.type}, got {value!r}")
        if f.metadata.get("choices") and value not in f.metadata["choices"]:
            raise SystemExit(f"{line_of(key)}: {key} = {value!r} is not one of {list(f.metadata['choices'])}")
    return {k: float(v) if str(fields[k].type) == "float" else v for k, v in values.items()}


def given_flags(parser: argparse.ArgumentParser, argv=None) -> set[str]:
    """The fields whose flags `argv` actually names, whatever their values (a flag given with
    its default value counts as given): argv parsed again with every default suppressed."""
    defaults, recipe_defaults = {action: action.default for action in parser._actions}, parser._defaults
    try:
        parser._defaults = {}                   # what a recipe set (set_defaults) is not "given" either
        for action in defaults:
            action.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        parser._defaults = recipe_defaults
        for action, default in defaults.items():
            action.default = default


def resumed_config(cfg: Config, given: set[str]) -> Config:
    """--resume uses the run's saved config.json; only --iterations (and --progress) given on
    the command line change it. Every other flag given is named as ignored."""
    path = Path(cfg.resume) / "config.json"
    if not path.exists():
        raise SystemExit(f"--resume {cfg.resume}: no config.json there (not a run directory)")
    saved = Config(**read_saved_config(path))
    ignored = sorted(given - {"resume", "iterations", "progress"})
    if ignored:
        print(f"[resume] ignoring {', '.join('--' + n.replace('_', '-') for n in ignored)}: "
              f"a resumed run keeps its config.json (only --iterations and --progress are taken)", file=sys.stderr)
    saved.resume, saved.run_dir = cfg.resume, cfg.resume
    if "progress" in given:
        saved.progress = cfg.progress
    if "iterations" in given:
        saved.iterations = cfg.iterations
    return saved


def renamed_settings(path: Path, values: dict) -> dict:
    """A config.json written before --reference became --score-against (renamed), or before
    --influence-method and --passes became --speedups: the
    settings that mean the same run are renamed (onepass with separate passes is --speedups on,
    with shared passes --speedups all); the per-episode loop is refused, since --speedups off
    also changes how the log-probs are computed (the same numbers up to rounding), so the
    resumed run would not continue the saved one exactly."""
    values = dict(values)
    if "reference" in values:     # --reference became --score-against: the same setting
        values["score_against"] = values.pop("reference")
    if "influence_method" not in values and "passes" not in values:
        return values
    method, passes = values.pop("influence_method", "onepass"), values.pop("passes", "separate")
    if method == "loop":
        raise SystemExit(f"{path}: this run used --influence-method loop, which is now --speedups off; it cannot be "
                         "resumed exactly (--speedups off also computes the log-probs by their definition): "
                         "start it again with --speedups off")
    values["speedups"] = "all" if passes == "shared" else "on"
    return values


def read_saved_config(path: Path) -> dict:
    """config.json of a run, checked field by field (it is a file anyone could have edited)."""
    try:
        values = json.loads(path.read_text())
    except ValueError as err:
        raise SystemExit(f"{path}: not valid JSON ({err})") from err
    if not isinstance(values, dict):
        raise SystemExit(f"{path}: expected a JSON object of flag values")
    values = renamed_settings(path, values)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SystemExit(f"{path}: unknown fields {unknown} (not a config.json of this train.py)")
    for name, value in values.items():
        kind = {"int": int, "float": (int, float), "str": str, "bool": bool}[str(fields[name].type)]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SystemExit(f"{path}: field {name!r} should be {fields[name].type}, got {value!r}")
    return values
