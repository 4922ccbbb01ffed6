"""Does the influence score know a good episode from a bad one? A diagnostic with no training run.

Tiny world (the default). At several points of a PPO run (the shipped model, and the adapters of
a run's checkpoints), it samples fresh buffers of the recipe's shape (32 prompts x 4 samples at
the recipe's temperature) from training prompts, BUFFERS of them (at least 1,000 episodes a
point), and scores every episode as train.py would, under each variant of the choices the
paper leaves open, one choice changed at a time:

    default        GAE with the checkpoint's own critic, LoRA on q,k,v,o, 32 validation solutions,
                   scores and g_val at the sampling temperature, the validation reference
    grpo           GRPO's group advantages instead of GAE
    all-linear     LoRA also on gate, up and down (new adapters start at B = 0, as in any run)
    val-256        256 validation solutions for g_val
    temperature-1  buffers sampled, and scores and g_val taken, at temperature 1
    batch          DTV's reference: the mean gradient of the buffer (--score-against batch)
    batch-loo      the same without the episode itself (--score-against batch-loo)

For each, the AUC of the scores (0.5: chance; 95% interval from 400 bootstrap draws of prompts)
for: correct vs wrong episodes; among the correct, faithful vs unfaithful reasoning
(reasoning.py); and, with the rewards of the same buffers flipped with probability 0.2
(train.py --reward-noise 0.2), not flipped vs flipped. And the share of each class that
the filter keeps (s > 0, or s >= 0 for the batch references).

Gemma-3-270M on GSM8K (--gsm8k). True reference solutions of training problems against planted
false positives that reach the same final answer: their reasoning lines shuffled, or the
reasoning of another problem followed by this problem's answer line. Every episode is scored as
a correct one PPO would reinforce (advantage +1 on every token), against g_val of 32 validation
solutions and against the batch reference; the AUC of true vs each kind of planted one.

    HF_HUB_OFFLINE=1 python experiments/filter-signal/filter_signal.py --checkpoints mid=RUN/checkpoints/iter_000075,end=RUN/checkpoints/iter_000150
    HF_HUB_OFFLINE=1 python experiments/filter-signal/filter_signal.py --gsm8k --problems 48

(RUN: a run of python train.py configs/tiny.toml --keep-checkpoints 200, so that its middle
checkpoint is kept.) Writes a markdown table to --out (and prints it). The figure is drawn from
that table, so it shows exactly the numbers written there:

    python experiments/filter-signal/filter_signal.py --figure experiments/filter-signal/README.md \
        --out experiments/filter-signal/filter-signal.png
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import draws  # noqa: E402
import train  # noqa: E402
from config import Config  # noqa: E402
from tasks import load_task, make_prompt  # noqa: E402
from influence import validation_gradient  # noqa: E402
from logbook import detection_auc  # noqa: E402
from model import load_adapter, load_policy, lora_parameters  # noqa: E402
from offline_models import model_source  # noqa: E402
from ppo import policy_loss  # noqa: E402
from reasoning import label as reasoning_label  # noqa: E402
from rollout import Rollouts, encode_pairs, generate_rollouts, old_and_ref_logprobs, token_logprobs  # noqa: E402
from reward import reward_fn  # noqa: E402
import speedups  # noqa: E402
from speedups import onepass_scores  # noqa: E402

RECIPE = str(ROOT / "configs" / "tiny.toml")
BUFFERS = 8
VARIANTS = {
    "default": {},
    "grpo": {"advantage": "grpo"},
    "all-linear": {"lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"},
    "val-256": {"val_size": 256},
    "temperature-1": {"temperature": 1.0},
    "batch": {"score_against": "batch"},
    "batch-loo": {"score_against": "batch-loo"},
}


def recipe_config(**overrides) -> Config:
    from config import parse_config
    # The table's "default" is the fair test's setting, 32 validation solutions (256 is a variant).
    cfg = parse_config([RECIPE, "--influence", "on", "--val-size", "32", "--no-plots", "--no-progress"])
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def bootstrap_auc(scores: torch.Tensor, positive: torch.Tensor, groups: list[int], draws: int = 400,
                  seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """The AUC and its 95% percentile interval from resampling the groups (prompts) with replacement."""
    auc = detection_auc(scores, positive)
    if auc is None:
        return None, None, None
    rng = random.Random(seed)
    by_group = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    keys = list(by_group)
    values = []
    for _ in range(draws):
        index = torch.tensor([i for _ in keys for i in by_group[rng.choice(keys)]])
        a = detection_auc(scores[index], positive[index])
        if a is not None:
            values.append(a)
    values.sort()
    return auc, values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def fmt_auc(a) -> str:
    auc, lo, hi = a
    return "-" if auc is None else f"{auc:.2f} [{lo:.2f}, {hi:.2f}]"


def score_buffers(cfg: Config, policy, tokenizer, train_examples, val_seqs, point: str, noise: float) -> dict:
    """BUFFERS buffers sampled at cfg.temperature, scored as train.select_episodes does; returns
    per episode: score, kept, correct, faithful, flipped, prompt group."""
    cfg.reward_noise = noise
    out = {k: [] for k in ("score", "kept", "correct", "faithful", "flipped", "group")}
    for b in range(BUFFERS):
        it = 10_000 + b                       # buffers of their own: not the iterations of any run
        examples = [train_examples[i] for i in draws.batch_indices(len(train_examples), it, cfg.prompts_per_iter,
                                                                    cfg.seed)]
        rollouts = generate_rollouts(policy, tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                                     n_samples=cfg.samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperature, seed=draws.derived_seed(cfg.seed, it, draws.SAMPLING),
                                     batch_size=cfg.gen_batch_size, progress=False)
        rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
            policy, rollouts, cfg.temperature, cfg.gen_batch_size, ref=False, logprobs=speedups.token_logprobs)
        flipped = draws.planted_flips(cfg, it, len(rollouts))
        golds = [examples[j].gold for j in rollouts.prompt_index]
        rewards = torch.tensor([reward_fn(t, g, cfg.dataset, bool(tr), cfg.truncation_penalty, f)
                                for t, g, tr, f in zip(rollouts.responses, golds, rollouts.truncated, flipped)])
        buf = train.Buffer(examples, rollouts, flipped=flipped, rewards=rewards)
        buf.advantages, _, _, _ = train.compute_advantages(cfg, buf)
        keep, _ = train.select_episodes(it, cfg, policy, buf, val_seqs, train.passes_for(it, cfg))   # scores: buf.scores
        labels = [reasoning_label(t, examples[j].solution, examples[j].gold)
                  for t, j in zip(rollouts.responses, rollouts.prompt_index)]
        out["score"] += buf.scores.tolist()
        out["kept"] += keep.tolist()
        out["correct"] += [lab != "wrong" for lab in labels]
        out["faithful"] += [lab == "faithful" for lab in labels]
        out["flipped"] += flipped
        out["group"] += [b * 1000 + j for j in rollouts.prompt_index]
    return out


def tiny_rows(args) -> list[str]:
    points = [("start", None)] + [tuple(p.split("=", 1)) for p in args.checkpoints.split(",") if p]
    header = ("| point | variant | AUC correct vs wrong | AUC faithful vs unfaithful (correct) | AUC not flipped "
              "(noise 0.2) | kept: faithful / unfaithful / wrong | kept: not flipped / flipped |")
    rows = [header, "|---|---|---|---|---|---|---|"]
    for point, adapter in points:
        for name in args.variants.split(","):
            t0 = time.time()
            cfg = recipe_config(**VARIANTS[name])
            torch.manual_seed(cfg.seed)
            policy, tok = load_policy(model_source(cfg.model), lora_targets=cfg.targets(), lora_rank=cfg.lora_rank,
                                      lora_alpha=cfg.lora_alpha, quiet=True)
            if adapter:
                load_adapter(policy, Path(adapter))
            task = load_task(cfg.dataset, "train", arith_terms=cfg.arith_terms)
            train_examples, val_examples = task.examples[:-cfg.val_size], task.examples[-cfg.val_size:]
            val_seqs = encode_pairs(tok, [make_prompt(e.question, cfg.dataset) for e in val_examples],
                                    [e.solution for e in val_examples])
            clean = score_buffers(cfg, policy, tok, train_examples, val_seqs, point, 0.0)
            noisy = score_buffers(cfg, policy, tok, train_examples, val_seqs, point, 0.2)
            s, c, f = (torch.tensor(clean[k]) for k in ("score", "correct", "faithful"))
            kept = torch.tensor(clean["kept"])
            share = lambda m, k=kept: f"{k[m].float().mean().item():.2f}" if bool(m.any()) else "-"   # noqa: E731
            ns, nf, nk = (torch.tensor(noisy[k]) for k in ("score", "flipped", "kept"))
            groups_c = [g for g, x in zip(clean["group"], c.tolist()) if x]
            rows.append(f"| {point} | {name} | {fmt_auc(bootstrap_auc(s, c, clean['group']))} | "
                        f"{fmt_auc(bootstrap_auc(s[c], f[c], groups_c))} | "
                        f"{fmt_auc(bootstrap_auc(ns, ~nf, noisy['group']))} | "
                        f"{share(f)} / {share(c & ~f)} / {share(~c)} | {share(~nf, nk)} / {share(nf, nk)} |")
            print(rows[-1], f"({len(clean['score'])} episodes, {time.time() - t0:.0f} s)", file=sys.stderr)
    return rows


def planted(solutions: list[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """For each GSM8K solution (reasoning lines, then '#### N'): its reasoning lines shuffled,
    and another problem's reasoning lines followed by its own answer line."""
    shuffled, other = [], []
    for i, sol in enumerate(solutions):
        lines = sol.strip().splitlines()
        body, answer = lines[:-1], lines[-1]
        mixed = body[:]
        for _ in range(10):
            rng.shuffle(mixed)
            if mixed != body or len(body) < 2:
                break
        shuffled.append("\n".join(mixed + [answer]))
        donor = solutions[(i + 1 + rng.randrange(len(solutions) - 1)) % len(solutions)].strip().splitlines()[:-1]
        other.append("\n".join(donor + [answer]))
    return shuffled, other


def mean_episode_gradient(policy, rollouts: Rollouts, advantages: torch.Tensor, *, clip_eps: float,
                          temperature: float, batch_size: int = 4) -> torch.Tensor:
    """(1/N) sum_i g_i over the LoRA parameters, g_i the gradient of episode i's policy loss at
    the current parameters: accumulated batch by batch, one graph alive at a time. (P,) fp32."""
    params = lora_parameters(policy)
    total = torch.zeros(sum(p.numel() for p in params))
    for s in range(0, len(rollouts), batch_size):
        part = rollouts.select(range(s, min(s + batch_size, len(rollouts))))
        logprobs, _, _ = token_logprobs(policy, part, temperature)
        loss = policy_loss(logprobs, part.old_logprobs, advantages[s:s + len(part)], part.response_mask, clip_eps).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        # one fp32 vector over the LoRA parameters, zeros for an unused one (influence.py flattens so)
        total += torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                            for g, p in zip(grads, params)])
    return total / len(rollouts)


def gsm8k_rows(args) -> list[str]:
    torch.manual_seed(0)
    policy, tok = load_policy(model_source("gemma-3-270m"), quiet=True)
    task = load_task("gsm8k", "train", source="local")
    val, pool = task.examples[-32:], task.examples[:-32]
    rng = random.Random(0)
    chosen = [e for e in rng.sample(pool, 4 * args.problems) if len(e.solution.splitlines()) >= 3][:args.problems]
    shuffled, other = planted([e.solution for e in chosen], rng)
    prompts = [make_prompt(e.question, "gsm8k") for e in chosen] * 3
    kinds = ["true"] * len(chosen) + ["shuffled"] * len(chosen) + ["other"] * len(chosen)
    seqs = encode_pairs(tok, prompts, [e.solution for e in chosen] + shuffled + other)
    rollouts = Rollouts(seqs.prompt_ids, seqs.prompt_mask, seqs.response_ids, seqs.response_mask)
    with torch.no_grad():
        rollouts.old_logprobs, rollouts.values, _ = token_logprobs(policy, rollouts, 1.0)
    advantages = rollouts.response_mask.clone()                      # +1 on every token: reinforce it
    val_seqs = encode_pairs(tok, [make_prompt(e.question, "gsm8k") for e in val], [e.solution for e in val])
    t0 = time.time()
    g_val = validation_gradient(policy, val_seqs, batch_size=2, temperature=1.0)
    scores = {"validation": onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=1.0,
                                           batch_size=4)}
    # DTV's batch reference, s_i = g_i . (1/N) sum_j g_j, in two passes: first the mean gradient,
    # then the one-pass contraction with it as the reference. onepass_batch_scores gives the
    # same numbers in one pass but keeps every episode's scoring forward alive until the sum is
    # complete, which for 144 GSM8K episodes of the 270M is more than this 24 GiB machine holds.
    mean_g = mean_episode_gradient(policy, rollouts, advantages, clip_eps=0.2, temperature=1.0)
    scores["batch"] = onepass_scores(policy, rollouts, advantages, mean_g, clip_eps=0.2, temperature=1.0, batch_size=4)
    print(f"[gsm8k] scored {len(rollouts)} episodes in {time.time() - t0:.0f} s", file=sys.stderr)
    groups = list(range(len(chosen))) * 3
    rows = ["| reference | AUC true vs shuffled lines | AUC true vs another problem's reasoning | kept: true / shuffled / other |",
            "|---|---|---|---|"]
    for ref, s in scores.items():
        cells = []
        for kind in ("shuffled", "other"):
            m = torch.tensor([k in ("true", kind) for k in kinds])
            pos = torch.tensor([k == "true" for k in kinds])
            cells.append(fmt_auc(bootstrap_auc(s[m], pos[m], [g for g, x in zip(groups, m.tolist()) if x])))
        keep = s > 0 if ref == "validation" else s >= 0
        kept = " / ".join(f"{keep[torch.tensor([k == kind for k in kinds])].float().mean().item():.2f}"
                          for kind in ("true", "shuffled", "other"))
        rows.append(f"| {ref} | {cells[0]} | {cells[1]} | {kept} |")
    return rows


AUC_COLUMNS = {2: "correct vs wrong", 3: "faithful vs unfaithful (among correct)", 4: "not flipped vs flipped (noise 0.2)"}


def read_table(path: Path) -> list[dict]:
    """The tiny-world rows of a table this script wrote (also inside a longer markdown file):
    point, variant, and for each AUC column (auc, low, high), None where the cell is '-'."""
    rows = []
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("point", "") or cells[0].startswith("-"):
            continue
        row = {"point": cells[0], "variant": cells[1]}
        for col, name in AUC_COLUMNS.items():
            if cells[col] == "-":
                row[name] = None
                continue
            auc, interval = cells[col].split(" ", 1)
            low, high = interval.strip("[]").split(", ")
            row[name] = (float(auc), float(low), float(high))
        rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no rows of a filter_signal.py table (| point | variant | AUC ... |) found")
    return rows


def write_figure(rows: list[dict], out: Path) -> None:
    """One panel per AUC column: the AUC with its 95% interval against the point of the run, a
    line per variant, and the chance level 0.5."""
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    points = list(dict.fromkeys(r["point"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig = Figure(figsize=(13, 4.2))
    axes = fig.subplots(1, len(AUC_COLUMNS), sharey=True)
    for ax, name in zip(axes, AUC_COLUMNS.values()):
        for k, variant in enumerate(variants):
            offset = (k - (len(variants) - 1) / 2) * 0.06     # side by side, so the bars do not overlap
            xs, ys, err = [], [], [[], []]
            for x, point in enumerate(points):
                cell = next((r[name] for r in rows if r["point"] == point and r["variant"] == variant), None)
                if cell is None:
                    continue
                xs.append(x + offset)
                ys.append(cell[0])
                err[0].append(cell[0] - cell[1])
                err[1].append(cell[2] - cell[0])
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=2, label=variant,
                        linewidth=2.5 if variant == "default" else 1, color="black" if variant == "default" else None)
        ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(points)), points)
        ax.set_title(f"AUC {name}", fontsize=10)
        ax.set_xlabel("point of the PPO run")
    axes[0].set_ylabel("AUC of the influence score (95% interval)")
    axes[-1].legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", default="", help="name=checkpoint directory,... (the start is always there)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--gsm8k", action="store_true", help="the Gemma-3-270M GSM8K probe instead")
    parser.add_argument("--problems", type=int, default=48, help="--gsm8k: true solutions (and as many of each planted kind)")
    parser.add_argument("--figure", default="", help="draw the figure of a table written before (markdown) to --out")
    parser.add_argument("--out", default=None, help="write the table here (markdown), or the figure (png) with --figure")
    args = parser.parse_args()
    if args.figure:
        write_figure(read_table(Path(args.figure)), Path(args.out or "filter-signal.png"))
        return
    rows = gsm8k_rows(args) if args.gsm8k else tiny_rows(args)
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(vars(args), indent=1))


if __name__ == "__main__":
    main()
