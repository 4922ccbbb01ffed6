"""The fair test of the influence filter: does I-PPO beat PPO on the tiny world, and why or why not?

Everything below was fixed before any run of this script was looked at:

  world and recipe  configs/tiny.toml (tiny-arith, 3-number problems with planted shortcut
                    solutions, 32 prompts x 4 samples, temperature 0.5, one minibatch, 2 epochs),
                    ITERATIONS iterations: PPO gained 17.8 to 19.4 points by iteration 150 in the
                    three seeds of the learning runs, so 150 clears the 15 points asked of it
  methods           METHODS: PPO, I-PPO (filter + reweight), I-PPO with the binary filter, the
                    random-filter control (drops as many episodes as I-PPO, at random), GRPO,
                    and DTV's validation-free reference (leave-one-out batch mean, filter only)
  confounds         none left between them: the critic learns from every episode, the value loss
                    trains the value head alone, every method takes the same optimizer steps,
                    g_val and g_i at one temperature (README, "Choices the paper leaves open")
  learning rates    each method's own, chosen by one rule from LR_GRID on held-out training rows
                    (phase "tune": --eval-split dev --eval-limit 400, seed TUNE_SEED, noise 0,
                    TUNE_ITERATIONS iterations, evaluated every 25; the lr with the highest mean
                    dev accuracy over the evaluations at iterations 50, 75 and 100; a tie goes
                    to the smaller lr). The test split is never used to choose anything.
  seeds and noise   SEEDS x NOISE (reward noise: each episode's correctness flipped with
                    probability 0.2 before the reward; episodes.jsonl records which)
  measured          greedy exact match on all 500 test problems every 10 iterations, with the
                    unfaithful share of the correct answers (reasoning.py)

The 60 runs ran with configs/tiny.toml's --micro-batch-size 64 and a forward per episode in
the log-prob passes (the code of 2026-12-05); both change only how the sums are batched, not the
math: today's recipe puts all 128 episodes in one micro-batch and lets the samples of a prompt
share its forward, which changes the floats' rounding, so a rerun reproduces the runs within
their spread rather than bit for bit.

Added after the grid had started, before any of it was computed, because the claims ask for
it: maj@8 of each finished run's final adapters and of the start model (FINAL_EVAL: evaluate.py
on all 500 test problems, 8 samples at temperature 1, seed 0), written to final-eval.json in the
run directory (start-eval.json for the start); and the claims' table compares I-PPO also with
the start, with the binary filter, with the random filter, and across noise levels.

Phase "grid" runs PPO without noise for every seed first (configs/tiny.toml with --seed: the
README's learning runs), then seed by seed (every other method and noise level of seed 0, then
seed 1, ...), so that an interrupted grid holds whole seeds. It resumes: a finished run is left as it is, a
started one continues from its last checkpoint (train.py --resume). Two runs at a time, one
thread each, is the default on 2 cores.

    HF_HUB_OFFLINE=1 python experiments/fair-test/fair_test.py               # tune, then the grid; again to resume
    HF_HUB_OFFLINE=1 python experiments/fair-test/fair_test.py --hours 2     # start no run after 2 hours
    python experiments/fair-test/fair_test.py --report                       # report.md and fair-test.png from the records

Writes runs/fair-test/ (tune/, grid/, tuned.json). After the runs, the finished ones are
summarised into the records beside this file (first running the final evaluations that are
missing, about a minute each): results.json (one run a line, with its curves), tuned.json (the
tuning runs' dev accuracies and the chosen learning rates) and start.json (the start model's
maj@8 and fit); report.md and fair-test.png are then written from those records alone, which is
all that --report does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from compare import finished, half_width_95  # noqa: E402
from logbook import detection_auc  # noqa: E402
from runner import run_all  # noqa: E402

import torch  # noqa: E402

RECIPE = "configs/tiny.toml"            # relative to ROOT, where every run starts
RESULTS, TUNED, START = HERE / "results.json", HERE / "tuned.json", HERE / "start.json"   # the records
# Every run shares pi_old's forward with the scoring or the update: --passes shared (today --speedups all) when the grid
# ran, --speedups all today (the same numbers as --speedups on up to float rounding, tests/test_passes.py).
PASSES = ["--speedups", "all"]
# The design's validation set: 32 solutions, the recipe's when the grid ran (256 today).
VAL_SIZE = ["--val-size", "32"]
ITERATIONS = 150
SEEDS = [0, 1, 2, 3, 4]
NOISE = [0.0, 0.2]
METHODS = {   # slug: (label, train.py flags)
    "ppo": ("PPO", ["--influence", "off"]),
    "ippo": ("I-PPO", ["--influence", "on"]),
    "ippo-binary": ("I-PPO, binary filter", ["--influence", "on", "--no-reweight"]),
    "random-filter": ("random filter", ["--influence", "on", "--random-filter"]),
    "grpo": ("GRPO", ["--influence", "off", "--advantage", "grpo"]),
    "dtv": ("DTV (batch reference)", ["--influence", "on", "--score-against", "batch-loo"]),
}
LR_GRID = [5e-4, 1e-3, 2e-3]
TUNE_SEED = 100
TUNE_ITERATIONS = 100
TUNE_EVALS = (50, 75, 100)
WINDOW = 10          # iterations per point of the kept-fraction and seconds curves
FINAL_EVAL = ["--dataset", "arith", "--arith-terms", "3", "--metrics", "em,maj@8", "--samples", "8",
              "--temperature", "1.0", "--max-new-tokens", "40", "--limit", "0", "--batch-size", "128", "--seed", "0",
              "--no-progress"]


def tune_jobs(out: Path) -> list[dict]:
    return [{"name": f"{m}-lr{lr:g}", "method": m, "lr": lr, "iterations": TUNE_ITERATIONS,
             "run_dir": out / "tune" / f"{m}-lr{lr:g}",
             "argv": [RECIPE, *METHODS[m][1], *PASSES, *VAL_SIZE, "--lr", f"{lr:g}", "--seed", str(TUNE_SEED), "--eval-split", "dev",
                      "--eval-limit", "400", "--eval-every", "25", "--no-plots", "--no-progress"]}
            for m in METHODS for lr in LR_GRID]


def tuned_lrs(out: Path) -> dict[str, dict]:
    """Per method whose tuning runs have all finished: the chosen lr and the dev accuracies."""
    chosen = {}
    for m in METHODS:
        jobs = [j for j in tune_jobs(out) if j["method"] == m]
        if not all(finished(j) for j in jobs):
            continue
        table = {}
        for j in jobs:
            evals = {r["iteration"]: r["eval_accuracy"] for r in read_metrics(j["run_dir"]) if "eval_accuracy" in r}
            table[j["lr"]] = {"dev": evals, "score": statistics.mean(evals[i] for i in TUNE_EVALS)}
        best = max(sorted(table), key=lambda lr: table[lr]["score"])     # sorted: a tie keeps the smaller lr
        chosen[m] = {"lr": best, "table": table}
    return chosen


def grid_jobs(out: Path, lrs: dict[str, dict]) -> list[dict]:
    """PPO without noise for every seed first (they are also the README's learning runs:
    configs/tiny.toml with --seed), then seed by seed everything else."""
    jobs = []
    order = [(s, 0.0, "ppo") for s in SEEDS] + [(s, p, m) for s in SEEDS for p in NOISE for m in METHODS
                                                 if (p, m) != (0.0, "ppo")]
    for seed, noise, m in order:
        if m not in lrs:
            continue
        jobs.append({"name": f"{m}-noise{noise:g}-seed{seed}", "method": m, "seed": seed, "noise": noise,
                     "iterations": ITERATIONS, "run_dir": out / "grid" / f"{m}-noise{noise:g}-seed{seed}",
                     "argv": [RECIPE, *METHODS[m][1], *PASSES, *VAL_SIZE, "--lr", f"{lrs[m]['lr']:g}", "--seed", str(seed),
                              "--reward-noise", f"{noise:g}", "--eval-every", "10", "--eval-limit", "500",
                              "--no-plots", "--no-progress"]})
    return jobs


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def final_eval(path: Path, adapter: Path | None) -> dict:
    """evaluate.py's FINAL_EVAL of the adapters (None: the start model), run once and kept in `path`."""
    if not path.exists():
        print(f"[fair-test] {time.strftime('%H:%M')} final evaluation -> {path}", file=sys.stderr)
        subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny-arith", *FINAL_EVAL,
                        *(["--adapter", str(adapter)] if adapter else []), "--out", str(path)],
                       cwd=ROOT, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    metrics = json.loads(path.read_text())["metrics"]
    return {"em": metrics["em"]["value"], "maj8": metrics["maj@8"]["value"]}


HELD_OUT_SOLUTIONS = 256   # clean solutions of the first test problems, for fit_of_solutions


def fit_of_solutions(path: Path, adapter: Path | None) -> dict:
    """What the adapters (None: the start model) fit, computed once and kept in `path`: the mean
    per-token NLL of the validation solutions that g_val is the gradient of (the recipe's last
    --val-size training rows, at its sampling temperature, as train.py scores them), and of the
    clean solutions of HELD_OUT_SOLUTIONS test problems at temperature 1."""
    if not path.exists():
        from config import parse_config
        from tasks import load_task, make_prompt
        from influence import sft_nll
        from model import load_adapter, load_policy
        from offline_models import model_source
        from rollout import encode_pairs
        cfg = parse_config([str(ROOT / RECIPE), *VAL_SIZE])
        policy, tok = load_policy(model_source(cfg.model), lora_targets=cfg.targets(), lora_rank=cfg.lora_rank,
                                  lora_alpha=cfg.lora_alpha, quiet=True)
        if adapter:
            load_adapter(policy, adapter)

        def nll(examples, temperature: float) -> float:
            seqs = encode_pairs(tok, [make_prompt(e.question, cfg.dataset) for e in examples],
                                [e.solution for e in examples])
            with torch.no_grad():
                total, _ = sft_nll(policy, seqs, temperature)
            return (total.sum() / seqs.response_mask.sum()).item()

        train_rows = load_task(cfg.dataset, "train", arith_terms=cfg.arith_terms).examples
        test_rows = load_task(cfg.dataset, "test", arith_terms=cfg.arith_terms).examples
        path.write_text(json.dumps({"validation_nll": nll(train_rows[-cfg.val_size:], cfg.temperature),
                                    "held_out_nll": nll(test_rows[:HELD_OUT_SOLUTIONS], 1.0)}))
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- the report

def summarize(job: dict) -> dict:
    """One finished run: start and final greedy em, unfaithful share of the correct greedy
    answers, mean accuracy over the evaluations (area under the curve), kept fraction early
    and late, training minutes, flip AUC; and the filter's signal from its episodes."""
    rows = read_metrics(job["run_dir"])
    evals = {r["iteration"]: r for r in rows if "eval_accuracy" in r}
    kept = [r["kept_fraction"] for r in rows if "kept_fraction" in r]
    train_seconds = [sum(v for k, v in r.get("seconds", {}).items() if k != "eval") for r in rows if r["iteration"] > 0]
    final = final_eval(job["run_dir"] / "final-eval.json", job["run_dir"] / "checkpoints" / f"iter_{ITERATIONS:06d}")
    aucs = [r["flip_auc"] for r in rows if r.get("flip_auc") is not None]
    signal = filter_signal(job["run_dir"])
    fit = fit_of_solutions(job["run_dir"] / "fit.json", job["run_dir"] / "checkpoints" / f"iter_{ITERATIONS:06d}")
    return {"method": job["method"], "seed": job["seed"], "noise": job["noise"],
            "start": evals[0]["eval_accuracy"], "final": evals[ITERATIONS]["eval_accuracy"],
            "auc_curve": statistics.mean(e["eval_accuracy"] for i, e in evals.items() if i > 0),
            "unfaithful": evals[ITERATIONS].get("eval_unfaithful_of_correct"),
            "maj8": final["maj8"], "curve": {i: e["eval_accuracy"] for i, e in sorted(evals.items())},
            "kept_early": statistics.mean(kept[:10]), "kept_late": statistics.mean(kept[-10:]),
            # medians: robust to an iteration that a busy machine (or a paused process) stretched
            "seconds_early": statistics.median(train_seconds[:10]), "seconds_late": statistics.median(train_seconds[-10:]),
            "minutes": sum(sum(v for k, v in r.get("seconds", {}).items() if k != "eval") for r in rows) / 60,
            "validation_nll": fit["validation_nll"], "held_out_nll": fit["held_out_nll"],
            "kept_curve": kept, "seconds_curve": train_seconds,
            "flip_auc": statistics.mean(aucs) if aucs else None,
            "by_prompt": signal.pop("by_prompt") if signal else None, "signal": signal}


def filter_signal(run_dir: Path) -> dict | None:
    """From a scored run's episodes.jsonl: per third of the run (iterations 1-50, 51-100, 101-150),
    the AUC of the scores for correct vs wrong and, among the correct, faithful vs unfaithful,
    with the kept share of each class; and under "by_prompt", by_prompt() of all its episodes.
    None when the run has no scores."""
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        return None
    thirds = {}
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("score") is None:
                return None
            thirds.setdefault(min((e["iteration"] - 1) * 3 // ITERATIONS, 2), []).append(e)
    out = {"by_prompt": by_prompt([e for eps in thirds.values() for e in eps])}
    for third, eps in sorted(thirds.items()):
        scores = torch.tensor([e["score"] for e in eps], dtype=torch.float64)
        correct = torch.tensor([e["reasoning"] in ("faithful", "unfaithful") for e in eps])
        faithful = torch.tensor([e["reasoning"] == "faithful" for e in eps])
        kept = torch.tensor([e["kept"] for e in eps])
        share = lambda m: kept[m].double().mean().item() if bool(m.any()) else None   # noqa: E731
        out[third] = {"episodes": len(eps),
                      "auc_correct": detection_auc(scores, correct),
                      "auc_faithful": detection_auc(scores[correct], faithful[correct]),
                      "kept_faithful": share(faithful), "kept_unfaithful": share(correct & ~faithful),
                      "kept_wrong": share(~correct)}
    return out


def by_prompt(episodes: list[dict]) -> dict:
    """Does the filter choose answers, or prompts? Over a run's episodes, grouped by (iteration,
    prompt): among the prompts whose samples all got the same reward, the share whose samples were
    all kept or all dropped; among the prompts with both rewards, the share whose kept samples are
    exactly the correct ones. Each next to its value if every episode were kept independently with
    the run's kept fraction. And the share of the scores' variance that lies between prompts."""
    groups = {}
    for e in episodes:
        groups.setdefault((e["iteration"], e["prompt"]), []).append(e)
    p = statistics.mean(e["kept"] for e in episodes)
    same = [g for g in groups.values() if len({e["reward"] for e in g}) == 1]
    mixed = [g for g in groups.values() if len({e["reward"] for e in g}) > 1]
    all_or_none = lambda g: len({e["kept"] for e in g}) == 1                           # noqa: E731
    scores = [e["score"] for e in episodes]
    mean = statistics.fmean(scores)
    total = sum((x - mean) ** 2 for x in scores)
    between = sum(len(g) * (statistics.fmean(e["score"] for e in g) - mean) ** 2 for g in groups.values())
    return {"same_all_or_none": statistics.mean(map(all_or_none, same)) if same else None,
            "same_all_or_none_independent": statistics.mean(p ** len(g) + (1 - p) ** len(g) for g in same) if same else None,
            "mixed_kept_correct": statistics.mean(all(e["kept"] == (e["reward"] > 0) for e in g) for g in mixed) if mixed else None,
            "mixed_kept_correct_independent": statistics.mean(
                math.prod(p if e["reward"] > 0 else 1 - p for e in g) for g in mixed) if mixed else None,
            "score_between_prompts": between / total if total > 0 else None}


def cell(values: list, digits: int = 3, scale: float = 1.0) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {half_width_95(values):.{digits}f}"


def paired(results: list[dict], method: str, noise: float, key: str, against: str = "ppo") -> list[float]:
    """method minus `against` (PPO), seed by seed, over the seeds both finished."""
    base = {r["seed"]: r[key] for r in results if r["method"] == against and r["noise"] == noise}
    return [r[key] - base[r["seed"]] for r in results if r["method"] == method and r["noise"] == noise
            and r["seed"] in base and r[key] is not None and base[r["seed"]] is not None]


def verdict(diffs: list[float], better: int) -> str:
    """'held' when the 95% interval of the mean paired difference lies on the side `better`
    (+1: above 0, -1: below), 'reversed' when it lies on the other side, else 'not shown'."""
    if len(diffs) < 2:
        return "too few seeds"
    mean, h = statistics.mean(diffs), half_width_95(diffs)
    if mean - h > 0:
        return "held" if better > 0 else "reversed"
    if mean + h < 0:
        return "held" if better < 0 else "reversed"
    return "not shown (the interval holds 0)"


def seed_table(results: list[dict], start: dict) -> list[str]:
    """Every run's own figures, one row per method, noise level and seed: what the tables of
    means are made of."""
    lines = ["", "## Every run", "",
             "Final greedy em, final maj@8, the unfaithful share of the correct greedy answers, the mean "
             f"kept fraction over the run and training minutes, per seed (the start: greedy em {start['em']:.3f}, "
             f"maj@8 {start['maj8']:.3f}).", "",
             "| method | noise | seed | final em | change (pt) | final maj@8 | unfaithful share | kept fraction | training min |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = list(METHODS)
    for r in sorted(results, key=lambda r: (r["noise"], order.index(r["method"]), r["seed"])):
        kept = r.get("kept_curve") or []
        lines.append(f"| {METHODS[r['method']][0]} | {r['noise']:g} | {r['seed']} | {r['final']:.3f} | "
                     f"{100 * (r['final'] - r['start']):+.1f} | {r['maj8']:.3f} | {r['unfaithful']:.2f} | "
                     f"{statistics.mean(kept) if kept else 1:.2f} | {r['minutes']:.1f} |")
    return lines


def claims(results: list[dict], start: dict) -> list[str]:
    """The table of the paper's claims: each a paired difference over seeds with its verdict."""
    def by_seed(method: str, noise: float, key: str) -> dict:
        return {r["seed"]: r[key] for r in results if r["method"] == method and r["noise"] == noise}

    def change(method: str, noise: float, key: str) -> dict:   # last 10 iterations - first 10, seed by seed
        late, early = by_seed(method, noise, f"{key}_late"), by_seed(method, noise, f"{key}_early")
        return {s: late[s] - early[s] for s in late}

    def drop(method: str, key: str) -> dict:   # what 20% noise costs, seed by seed
        clean, noisy = by_seed(method, 0.0, key), by_seed(method, 0.2, key)
        return {s: noisy[s] - clean[s] for s in clean if s in noisy}

    rows = []   # (claim, noise, differences, better side, scale, digits)
    for noise in NOISE:
        for key, what, scale, d in (("final", "final greedy em (pt)", 100.0, 1), ("maj8", "final maj@8 (pt)", 100.0, 1),
                                    ("auc_curve", "mean em over all evaluations (pt)", 100.0, 1)):
            rows.append((f"I-PPO beats PPO: {what}", noise, paired(results, "ippo", noise, key), 1, scale, d))
        for key, what in (("final", "final greedy em (pt)"), ("maj8", "final maj@8 (pt)")):
            base = start["em"] if key == "final" else start["maj8"]
            rows.append((f"I-PPO beats the start: {what}", noise,
                         [v - base for v in by_seed("ippo", noise, key).values()], 1, 100.0, 1))
        rows.append(("I-PPO reduces unfaithful reasoning: unfaithful share of correct greedy answers, - PPO", noise,
                     paired(results, "ippo", noise, "unfaithful"), -1, 1.0, 2))
        rows.append(("the kept fraction falls as training converges: last - first 10 iterations", noise,
                     list(change("ippo", noise, "kept").values()), -1, 1.0, 2))
        ippo_change, ppo_change = change("ippo", noise, "seconds"), change("ppo", noise, "seconds")
        rows.append(("iterations get cheaper: median training s/iteration, last - first 10 iterations, - PPO's", noise,
                     [ippo_change[s] - ppo_change[s] for s in ippo_change if s in ppo_change], -1, 1.0, 2))
        rows.append(("reweighting beats the binary filter: final em, I-PPO - binary (pt)", noise,
                     paired(results, "ippo", noise, "final", against="ippo-binary"), 1, 100.0, 1))
        rows.append(("influence beats the random filter: final em, I-PPO - random (pt)", noise,
                     paired(results, "ippo", noise, "final", against="random-filter"), 1, 100.0, 1))
    ippo_drop, ppo_drop = drop("ippo", "final"), drop("ppo", "final")
    rows.append(("robust to 20% reward noise: final em lost to noise, I-PPO's - PPO's (pt)", "0 -> 0.2",
                 [ippo_drop[s] - ppo_drop[s] for s in ippo_drop if s in ppo_drop], 1, 100.0, 1))
    lines = ["", "## The paper's claims, tested", "",
             "Each claim as a difference paired by seed (mean ± half-width of the 95% t-interval over the seeds "
             "both runs finished). It held when the interval excludes 0 on the claimed side, was reversed when it "
             "excludes 0 on the other side. Seconds are wall time of runs that shared 2 cores with other work; "
             "the difference to PPO's own change cancels what drifts alike for both. "
             f"The start model: greedy em {start['em']:.3f}, maj@8 {start['maj8']:.3f}.", "",
             "| claim | noise | seeds | difference | verdict |", "|---|---|---|---|---|"]
    for what, noise, diffs, better, scale, d in rows:
        if diffs:
            lines.append(f"| {what} | {noise if isinstance(noise, str) else f'{noise:g}'} | {len(diffs)} | "
                         f"{cell(diffs, d, scale)} | {verdict(diffs, better)} |")
    return lines


def plot_band(ax, xs: list, ys: list[list[float]], method: str, seeds: int) -> None:
    """One method's line: at each x the mean over seeds of ys[x], with the band of its 95% interval."""
    mean = [statistics.mean(y) for y in ys]
    h = [half_width_95(y) if len(y) > 1 else 0.0 for y in ys]
    line, = ax.plot(xs, mean, label=f"{METHODS[method][0]} ({seeds} seeds)", color=f"C{list(METHODS).index(method)}")
    ax.fill_between(xs, [a - b for a, b in zip(mean, h)], [a + b for a, b in zip(mean, h)], color=line.get_color(),
                    alpha=0.15)


def write_figure(results: list[dict], path: Path) -> None:
    """Four panels: greedy em against iteration per method at noise 0 (mean over seeds with the
    band of the 95% interval); the AUC of each filter's scores for correct vs wrong and faithful
    vs unfaithful per third of the run (mean and interval over seeds and noise levels); and, at
    noise 0, the kept fraction and the training seconds of an iteration against iteration (means
    (seconds: medians) over windows of WINDOW iterations, then means over seeds, with the band of the
    95% interval)."""
    from matplotlib.figure import Figure   # no pyplot: no global state, no GUI backend
    fig = Figure(figsize=(12, 8.4))
    (curves, signal), (kept_ax, seconds_ax) = fig.subplots(2, 2)
    # seconds: the window's median, robust to an iteration that a busy machine (or a paused process) stretched
    for ax, key, methods, center in ((kept_ax, "kept_curve", ("ippo", "ippo-binary", "random-filter", "dtv"),
                                      statistics.mean),
                                     (seconds_ax, "seconds_curve", tuple(METHODS), statistics.median)):
        for m in methods:
            rs = [r[key] for r in results if r["method"] == m and r["noise"] == 0.0 and r.get(key)]
            if not rs:
                continue
            n = min(map(len, rs)) // WINDOW
            ys = [[center(r[w * WINDOW:(w + 1) * WINDOW]) for r in rs] for w in range(n)]
            plot_band(ax, [w * WINDOW + (WINDOW + 1) / 2 for w in range(n)], ys, m, len(rs))
        ax.legend(fontsize=8)
    kept_ax.set(xlabel="iteration", ylabel="kept fraction of the episodes",
                title="intrinsic early stopping? kept fraction, noise 0")
    seconds_ax.set(xlabel="iteration", ylabel="training seconds per iteration (shared cores)",
                   title="do iterations get cheaper? noise 0")
    for m in METHODS:
        rs = [r for r in results if r["method"] == m and r["noise"] == 0.0]
        if not rs:
            continue
        its = sorted(set.intersection(*(set(int(i) for i in r["curve"]) for r in rs)))
        plot_band(curves, its, [[r["curve"][i] if i in r["curve"] else r["curve"][str(i)] for r in rs] for i in its],
                  m, len(rs))
    curves.set(xlabel="iteration", ylabel="greedy exact match, 500 test problems", title="learning, reward noise 0")
    curves.legend(fontsize=8)
    filters = [m for m in ("ippo", "ippo-binary", "random-filter", "dtv") if any(r["signal"] for r in results
                                                                               if r["method"] == m)]
    for k, (key, what) in enumerate((("auc_correct", "correct vs wrong"), ("auc_faithful", "faithful vs unfaithful"))):
        for j, m in enumerate(filters):
            for third in range(3):
                vals = [r["signal"][third][key] for r in results if r["method"] == m and r["signal"]
                        and third in r["signal"] and r["signal"][third][key] is not None]
                if not vals:
                    continue
                x = k * (len(filters) + 1) + j + (third - 1) * 0.25
                h = half_width_95(vals) if len(vals) > 1 else 0.0
                signal.errorbar(x, statistics.mean(vals), yerr=h, fmt="o", color=f"C{third}", ms=4,
                                label=f"iterations {third * ITERATIONS // 3 + 1}-{(third + 1) * ITERATIONS // 3}"
                                if (k, j) == (0, 0) else None)
    short = {"ippo": "I-PPO", "ippo-binary": "binary", "random-filter": "random", "dtv": "DTV"}
    ticks = [(k * (len(filters) + 1) + j, f"{short[m]}\n{what}") for k, what in enumerate(("correct", "faithful"))
             for j, m in enumerate(filters)]
    signal.set_xticks([t for t, _ in ticks], [name for _, name in ticks], fontsize=8)
    signal.axhline(0.5, color="grey", lw=0.8, ls="--")
    signal.set(ylabel="AUC of the scores (0.5: chance)", title="does the score know a good episode? (runs' own episodes)")
    signal.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_records(out: Path) -> None:
    """Summarise the finished runs under `out` into the records beside this file: results.json
    (one run a line: the per-iteration curves would otherwise take a line per number), tuned.json
    (per method whose tuning finished: the chosen lr and the dev accuracies of every lr) and
    start.json (the start model's final evaluation and fit)."""
    lrs = tuned_lrs(out)
    results = [summarize(j) for j in grid_jobs(out, lrs) if finished(j)]
    RESULTS.write_text("[\n" + ",\n".join(json.dumps(r) for r in results) + "\n]\n")
    TUNED.write_text(json.dumps({"lr": {m: t["lr"] for m, t in lrs.items()},
                                 "dev": {m: {f"{lr:g}": t["table"][lr]["dev"] for lr in LR_GRID} for m, t in lrs.items()}},
                                indent=1) + "\n")
    START.write_text(json.dumps({"eval": final_eval(out / "start-eval.json", None),
                                 "fit": fit_of_solutions(out / "start-fit.json", None)}, indent=1) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"[fair-test] wrote {RESULTS.name}, {TUNED.name}, {START.name} ({len(results)} runs)", file=sys.stderr)


def read_records() -> tuple[dict, list[dict], dict]:
    """tuned.json, results.json and start.json, as write_records wrote them (JSON keeps the
    thirds of a run's signal as strings: they come back as the numbers summarize gave them)."""
    tuned, results, start = (json.loads(path.read_text()) for path in (TUNED, RESULTS, START))
    for r in results:
        if r["signal"]:
            r["signal"] = {int(third): s for third, s in r["signal"].items()}
    return tuned, results, start


def write_report(path: Path) -> None:
    """report.md at `path` and fair-test.png beside it, from the records alone."""
    tuned, results, start_record = read_records()
    start = start_record["eval"]
    lines = ["# The fair test of the influence filter (tiny world)", "",
             "Produced by `HF_HUB_OFFLINE=1 python experiments/fair-test/fair_test.py` from the records beside it "
             "(per run: `results.json`; learning rates: `tuned.json`; the start model: `start.json`) (the design, "
             "fixed before any run, is its docstring and README.md); `--report` rewrites this page from those "
             f"records alone. {len(results)} of {len(SEEDS) * len(NOISE) * len(METHODS)} runs are done. Every cell is "
             "the mean over the finished seeds ± the half-width of its 95% t-interval; differences to PPO are paired "
             "by seed.", "",
             "## Learning rates, chosen on held-out training rows", "",
             f"Seed {TUNE_SEED}, {TUNE_ITERATIONS} iterations, noise 0; dev accuracy (400 held-out training rows) at "
             f"iterations {', '.join(map(str, TUNE_EVALS))}, and their mean (the rule's score):", "",
             "| method | " + " | ".join(f"lr {lr:g}" for lr in LR_GRID) + " | chosen |",
             "|---|" + "---|" * (len(LR_GRID) + 1)]
    for m, chosen in tuned["lr"].items():
        dev = {lr: [tuned["dev"][m][f"{lr:g}"][str(i)] for i in TUNE_EVALS] for lr in LR_GRID}
        cells = [" / ".join(f"{a:.3f}" for a in dev[lr]) + f" (**{statistics.mean(dev[lr]):.3f}**)" for lr in LR_GRID]
        lines.append(f"| {METHODS[m][0]} | " + " | ".join(cells) + f" | {chosen:g} |")
    missing = [METHODS[m][0] for m in METHODS if m not in tuned["lr"]]
    if missing:
        lines += ["", f"Not tuned yet: {', '.join(missing)}."]
    for noise in NOISE:
        rows = [r for r in results if r["noise"] == noise]
        if not rows:
            continue
        lines += ["", f"## Reward noise {noise:g}", "",
                  "| method | seeds | final em | change (pt) | - PPO (pt, paired) | mean em over evaluations - PPO (pt) "
                  "| final maj@8 | - PPO (pt, paired) "
                  "| unfaithful share of correct greedy answers | - PPO (paired) | kept fraction, first -> last 10 "
                  "iterations | flip AUC | training min |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in METHODS:
            rs = [r for r in rows if r["method"] == m]
            if not rs:
                continue
            seeds = ",".join(str(r["seed"]) for r in rs)
            kept = (f"{cell([r['kept_early'] for r in rs], 2)} -> {cell([r['kept_late'] for r in rs], 2)}"
                    if m in ("ippo", "ippo-binary", "random-filter", "dtv") else "1")
            minus = lambda key, scale=100.0, d=1: "-" if m == "ppo" else cell(paired(results, m, noise, key), d, scale)  # noqa: E731
            lines.append(f"| {METHODS[m][0]} | {seeds} | {cell([r['final'] for r in rs])} | "
                         f"{cell([r['final'] - r['start'] for r in rs], 1, 100)} | {minus('final')} | "
                         f"{minus('auc_curve')} | {cell([r['maj8'] for r in rs])} | {minus('maj8')} | "
                         f"{cell([r['unfaithful'] for r in rs], 2)} | "
                         f"{minus('unfaithful', 1.0, 2)} | {kept} | {cell([r['flip_auc'] for r in rs], 2)} | "
                         f"{cell([r['minutes'] for r in rs], 1)} |")
    if results:
        lines += claims(results, start)
        lines += seed_table(results, start)
        signal = [(r, third, s) for r in results if r["signal"] for third, s in r["signal"].items()]
        if signal:
            lines += ["", "## Where the filter has signal: the scores of the runs' own episodes", "",
                      "AUC of the influence scores (0.5: chance) for telling correct from wrong episodes, and among "
                      "the correct ones faithful from unfaithful reasoning, with the share of each class kept; per "
                      "third of the run (each third about 6,400 episodes a run), over seeds and noise levels.", "",
                      "| method | noise | iterations | AUC correct vs wrong | AUC faithful vs unfaithful "
                      "| kept: faithful | unfaithful | wrong |", "|---|---|---|---|---|---|---|---|"]
            for m in ("ippo", "ippo-binary", "random-filter", "dtv"):
                for noise in NOISE:
                    for third in range(3):
                        ss = [s for r, t, s in signal if r["method"] == m and r["noise"] == noise and t == third]
                        if ss:
                            span = f"{third * ITERATIONS // 3 + 1}-{(third + 1) * ITERATIONS // 3}"
                            lines.append(f"| {METHODS[m][0]} | {noise:g} | {span} | "
                                         f"{cell([s['auc_correct'] for s in ss], 2)} | "
                                         f"{cell([s['auc_faithful'] for s in ss], 2)} | "
                                         f"{cell([s['kept_faithful'] for s in ss], 2)} | "
                                         f"{cell([s['kept_unfaithful'] for s in ss], 2)} | "
                                         f"{cell([s['kept_wrong'] for s in ss], 2)} |")
        start_fit = start_record["fit"]
        lines += ["", "## What the filter fits: the likelihood of the validation solutions", "",
                  "Mean per-token NLL of the final adapters on the validation solutions that g_val is the gradient "
                  "of (the recipe's last --val-size training rows, at its sampling temperature, as the scores use it) "
                  f"and on the clean solutions of {HELD_OUT_SOLUTIONS} test problems (temperature 1). The start model: "
                  f"{start_fit['validation_nll']:.3f} and {start_fit['held_out_nll']:.3f}. Mean ± 95% t-interval "
                  "over seeds; the difference to PPO paired by seed.", "",
                  "| method | noise | seeds | validation NLL | - PPO (paired) | held-out NLL | - PPO (paired) |",
                  "|---|---|---|---|---|---|---|"]
        for noise in NOISE:
            for m in METHODS:
                rs = [r for r in results if r["method"] == m and r["noise"] == noise]
                if rs:
                    minus = lambda key: "-" if m == "ppo" else cell(paired(results, m, noise, key), 3)  # noqa: E731
                    lines.append(f"| {METHODS[m][0]} | {noise:g} | {len(rs)} | {cell([r['validation_nll'] for r in rs])} "
                                 f"| {minus('validation_nll')} | {cell([r['held_out_nll'] for r in rs])} "
                                 f"| {minus('held_out_nll')} |")
        clustered = [r for r in results if r.get("by_prompt")]
        if clustered:
            lines += ["", "## Does the filter choose answers or prompts?", "",
                      "Each iteration's episodes grouped by prompt (4 samples each), over the whole run. Among the "
                      "prompts whose samples all got the same reward: the share whose samples were all kept or all "
                      "dropped. Among the prompts with both rewards: the share whose kept samples are exactly the "
                      "correct ones. Each next to what keeping every episode independently, at the run's kept "
                      "fraction, would give (\"if independent\"). Last column: the share of the scores' variance "
                      "that lies between prompts (the rest is between the samples of one prompt; scores that ignore the "
                      "prompt would give about 1/4, the share of (groups - 1) in (episodes - 1)). Mean ± 95% "
                      "t-interval over seeds.", "",
                      "| method | noise | seeds | same reward: all or none kept | if independent "
                      "| both rewards: kept = correct | if independent | score variance between prompts |",
                      "|---|---|---|---|---|---|---|---|"]
            for m in ("ippo", "ippo-binary", "random-filter", "dtv"):
                for noise in NOISE:
                    bs = [r["by_prompt"] for r in clustered if r["method"] == m and r["noise"] == noise]
                    if bs:
                        lines.append(f"| {METHODS[m][0]} | {noise:g} | {len(bs)} | "
                                     + " | ".join(cell([b[k] for b in bs], 2) for k in (
                                         "same_all_or_none", "same_all_or_none_independent", "mixed_kept_correct",
                                         "mixed_kept_correct_independent", "score_between_prompts")) + " |")
    path.write_text("\n".join(lines) + "\n")
    if results:
        write_figure(results, path.with_name("fair-test.png"))
    print(f"[fair-test] wrote {path} ({len(results)} runs)", file=sys.stderr)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "fair-test"))
    parser.add_argument("--report-to", default=str(HERE / "report.md"))
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--hours", type=float, default=float("inf"), help="start no run after this many hours")
    parser.add_argument("--report", action="store_true", help="only write the report and figure from the records")
    args = parser.parse_args(argv)
    out = Path(args.out)
    deadline = time.time() + args.hours * 3600
    if not args.report:
        failed = run_all(tune_jobs(out), args.parallel, deadline, "fair-test")
        lrs = tuned_lrs(out)
        (out / "tuned.json").write_text(json.dumps({m: t["lr"] for m, t in lrs.items()}, indent=1))
        failed += run_all(grid_jobs(out, lrs), args.parallel, deadline, "fair-test")
        if failed:
            print(f"[fair-test] failed: {', '.join(failed)}", file=sys.stderr)
        write_records(out)
    write_report(Path(args.report_to))


if __name__ == "__main__":
    main()
