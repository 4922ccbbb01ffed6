"""See PPO learn in minutes: the tiny world's learning runs, with their table and curves.

The question, fixed before the runs: starting from the shipped tiny-arith model (tiny_world.py),
does PPO raise greedy exact match on all 500 arith test problems (3 numbers each) by at least 15
points within 15 minutes of training on a 2-core CPU, in each of seeds 0, 1 and 2? The recipe
(configs/tiny.toml, read as it is) was chosen on held-out training rows (--eval-split dev), never
on the test split. Beside accuracy, each evaluation logs the unfaithful share of the correct
greedy answers (reasoning.py).

    python experiments/tiny-learns/tiny_learns.py                        # PPO, seeds 0-2, two runs at a time; resumable
    python experiments/tiny-learns/tiny_learns.py --methods ppo,ippo     # I-PPO beside it, same settings
    python experiments/tiny-learns/tiny_learns.py --summary-only --records RUN_OUT/records.json --out DIR
                                                                         # the table and curves from the records alone
    python experiments/tiny-learns/tiny_learns.py --recipe configs/tiny-v1.toml --out runs/tiny-learns-v1
                                                                         # the first world's runs

Writes into --out: start.json (the model's starting point on the test split: greedy em, pass@8
and the unfaithful shares), <variant>-<method>-s<seed>/ (train.py run directories), records.json
(the start and each run's evaluations, times and filter summary: everything the tables and the
figure are drawn from, so that --summary-only --records redraws them without the runs), summary.md
(the tables: per run the start, best, final em and em within BUDGET_MIN training minutes; means
with intervals; for I-PPO what its filter kept) and learning.png (eval accuracy against
iteration and against training minutes). A run that finished is kept (or extended, with a
larger --iterations); one that was interrupted is resumed; the summary is rebuilt every time.
Two runs at a time (--parallel 2), one thread each: on 2 cores that finishes the set sooner than
one run at a time on two threads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from config import load_recipe  # noqa: E402

# The recipe file, chosen on held-out training rows (docs/tiny-world.md, "How the recipe was
# chosen"); --recipe configs/tiny-v1.toml gives the first world's runs.
RECIPE = ROOT / "configs" / "tiny.toml"
# 150 iterations: about 7 minutes of training for each of two runs sharing 2 cores.
ITERATIONS = 150
BUDGET_MIN = 15   # the question's budget: the table also gives em at the last evaluation within it
METHODS = {"ppo": ["--influence", "off"], "ippo": ["--influence", "on"]}
# The critic settings before this change (the value head still starts at zero in both; the old
# value learning rate was the recipe's own --lr, added in main).
VARIANTS = {"new": [], "old": ["--lam", "0.95", "--value-clip-eps", "0.2", "--adv-std-floor", "0"]}
LABELS = {"ppo": "PPO", "ippo": "I-PPO", "new": "critic as now", "old": "old critic"}


def start_point(out: Path, recipe: dict) -> dict:
    """Greedy em, pass@8 and the unfaithful share of the correct answers (8 samples at T = 1) of
    the recipe's untrained model on all 500 test problems."""
    path = out / "start.json"
    if not path.exists():
        terms = ["--arith-terms", str(recipe["arith_terms"])] if "arith_terms" in recipe else []
        cmd = [sys.executable, "evaluate.py", "--model", recipe["model"], "--dataset", recipe["dataset"], *terms,
               "--metrics", "em,pass@1,pass@8,maj@8", "--samples", "8",
               "--max-new-tokens", "40", "--limit", "0", "--batch-size", "128", "--no-progress", "--out", str(path)]
        print("[start]", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads(path.read_text())


def completed(run_dir: Path) -> int:
    """Iterations the run has finished (0 when it has not started)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(l)["iteration"] for l in path.read_text().splitlines()), default=0)


def launch(run_dir: Path, argv: list[str], threads: int, iterations: int) -> subprocess.Popen:
    if (run_dir / "done").exists() and completed(run_dir) >= iterations:
        return None
    if (run_dir / "config.json").exists():
        # An interrupted run resumes; a finished shorter one is extended (the learning rate is
        # constant, so going on from its last checkpoint is the same as a longer run).
        argv = ["--resume", str(run_dir), "--iterations", str(iterations)]
    log = open(run_dir.with_suffix(".log"), "a")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    print(f"[run] {run_dir.name}: train.py {' '.join(argv)}", flush=True)
    return subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=env)


def run_all(out: Path, jobs: list[tuple[Path, list[str]]], parallel: int, iterations: int) -> None:
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < parallel:
            run_dir, argv = pending.pop(0)
            proc = launch(run_dir, argv, max(1, (os.cpu_count() or 1) // parallel), iterations)
            if proc is not None:
                running.append((run_dir, proc))
        time.sleep(2)
        for run_dir, proc in list(running):
            if proc.poll() is not None:
                running.remove((run_dir, proc))
                if proc.returncode != 0:
                    raise SystemExit(f"{run_dir.name} failed (exit {proc.returncode}); see {run_dir.with_suffix('.log')}")
                (run_dir / "done").write_text(f"finished {completed(run_dir)} iterations\n")
                print(f"[run] {run_dir.name}: finished", flush=True)


def read_run(run_dir: Path) -> dict:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals, unfaithful, train_s = [], [], 0.0
    for r in rows:
        train_s += sum(v for k, v in r.get("seconds", {}).items() if k != "eval")
        if "eval_accuracy" in r:
            evals.append((r["iteration"], train_s / 60, r["eval_accuracy"]))
            unfaithful.append(r.get("eval_unfaithful_of_correct"))
    total_s = sum(sum(r.get("seconds", {}).values()) for r in rows)
    return {"evals": evals, "unfaithful": unfaithful, "train_minutes": train_s / 60, "wall_minutes": total_s / 60,
            "kept": [r["kept_fraction"] for r in rows if "kept_fraction" in r], "filter": what_was_kept(run_dir)}


def what_was_kept(run_dir: Path) -> dict | None:
    """For a run with influence on (episodes.jsonl has scores): the share of rewarded (correct)
    and unrewarded episodes the filter kept, the rewarded episodes' share of all episodes and of
    the update's total weight, and the mean over iterations of the kept count and of the
    effective number of episodes behind the update, (sum w)^2 / sum w^2."""
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    if not episodes or episodes[0]["score"] is None:
        return None
    share = lambda sel: sum(e["kept"] for e in sel) / max(len(sel), 1)   # noqa: E731
    right = [e for e in episodes if e["reward"] > 0]
    wrong = [e for e in episodes if e["reward"] <= 0]
    by_iteration = {}
    for e in episodes:
        by_iteration.setdefault(e["iteration"], []).append(e["weight"])
    ess = [sum(w) ** 2 / sum(x * x for x in w) if any(w) else 0.0 for w in by_iteration.values()]
    total = sum(e["weight"] for e in episodes)
    return {"kept_right": share(right), "kept_wrong": share(wrong), "right": len(right) / len(episodes),
            "weight_right": sum(e["weight"] for e in right) / total if total else 0.0,
            "kept": sum(e["kept"] for e in episodes) / len(by_iteration), "ess": sum(ess) / len(ess),
            "episodes": len(episodes) / len(by_iteration)}


T_975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57}   # Student t quantiles by degrees of freedom


def mean_interval(values: list[float]) -> str:
    """'+12.3 +- 4.5 pt' (mean and the half-width of its 95% t-interval); one value: no interval."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return f"{mean:+.1f} pt (one seed, no interval)"
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return f"{mean:+.1f} +- {T_975[n - 1] * sd / n ** 0.5:.1f} pt"


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def summarize(out: Path, start: dict, parallel: int, runs: dict, model: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    em = start["metrics"]["em"]
    lines = [f"Start ({model}, all {start['n']} test problems): greedy em {em['value']:.3f} +- {em['stderr']:.3f}, "
             f"pass@8 {start['metrics']['pass@8']['value']:.3f}, maj@8 {start['metrics']['maj@8']['value']:.3f}"
             + "".join(f"; unfaithful share of the correct {kind} answers {r['unfaithful_of_correct']:.3f} +- "
                       f"{r['unfaithful_of_correct_stderr']:.3f} ({r['unfaithful']}/{r['n_correct']})"
                       for kind, r in start.get("reasoning", {}).items()), "",
             f"| critic | method | seed | start em | best em (iteration) | final em | change | em at {BUDGET_MIN} "
             "training min (iteration) | change by then | unfaithful of correct greedy, start -> final | "
             "training min | wall min |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (variant, method, seed), r in sorted(runs.items()):
        if not r["evals"]:
            continue
        first, last = r["evals"][0][2], r["evals"][-1][2]
        best = max(r["evals"], key=lambda e: e[2])
        by_then = [e for e in r["evals"] if e[1] <= BUDGET_MIN][-1]   # the last evaluation within the budget
        lines.append(f"| {LABELS[variant]} | {LABELS[method]} | {seed} | {first:.3f} | {best[2]:.3f} ({best[0]}) | "
                     f"{last:.3f} | {100 * (last - first):+.1f} pt | {by_then[2]:.3f} ({by_then[0]}) | "
                     f"{100 * (by_then[2] - first):+.1f} pt | {fmt(r['unfaithful'][0])} -> {fmt(r['unfaithful'][-1])} | "
                     f"{r['train_minutes']:.1f} | {r['wall_minutes']:.1f} |")
    lines += ["", "Mean change in final greedy em over seeds, with a 95% t-interval (t = 4.30 for 3 seeds):", ""]
    changes = {}
    for (variant, method, seed), r in runs.items():
        if r["evals"]:
            changes.setdefault((variant, method), {})[seed] = 100 * (r["evals"][-1][2] - r["evals"][0][2])
    by_budget = {}
    for (variant, method, seed), r in runs.items():
        if r["evals"]:
            by_then = [e for e in r["evals"] if e[1] <= BUDGET_MIN][-1]
            by_budget.setdefault((variant, method), []).append(100 * (by_then[2] - r["evals"][0][2]))
    for (variant, method), by_seed in sorted(changes.items()):
        lines.append(f"- {LABELS[method]}, {LABELS[variant]}: {mean_interval(list(by_seed.values()))} "
                     f"(seeds {sorted(by_seed)}); at the last evaluation within {BUDGET_MIN} training minutes: "
                     f"{mean_interval(by_budget[variant, method])}")
    for method in sorted({m for _, m in changes}):
        new, old = changes.get(("new", method), {}), changes.get(("old", method), {})
        paired = [new[s] - old[s] for s in sorted(set(new) & set(old))]
        if paired:
            lines.append(f"- {LABELS[method]}, critic as now minus old critic, paired by seed: {mean_interval(paired)}")
    kept = [(key, r["filter"]) for key, r in sorted(runs.items()) if r.get("filter")]
    if kept:
        lines += ["", "What the influence filter kept (all iterations of the run; rewarded = a correct answer):", "",
                  "| critic | method | seed | kept of rewarded | kept of unrewarded | rewarded share of episodes | "
                  "rewarded share of the update's weight | kept per iteration | effective episodes (ess) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for (variant, method, seed), f in kept:
            lines.append(f"| {LABELS[variant]} | {LABELS[method]} | {seed} | {f['kept_right']:.2f} | "
                         f"{f['kept_wrong']:.2f} | {f['right']:.2f} | {f['weight_right']:.2f} | "
                         f"{f['kept']:.1f} of {f['episodes']:.0f} | {f['ess']:.1f} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {("new", "ppo"): "tab:blue", ("new", "ippo"): "tab:orange", ("old", "ppo"): "tab:gray",
              ("old", "ippo"): "tab:brown"}
    for (variant, method, seed), r in sorted(runs.items()):
        if not r["evals"]:
            continue
        its, mins, acc = zip(*r["evals"])
        label = f"{LABELS[method]}, {LABELS[variant]}" if seed == min(s for v, m, s in runs if (v, m) == (variant, method)) else None
        style = dict(color=colors[(variant, method)], alpha=0.8, marker=".", label=label,
                     linestyle="-" if variant == "new" else ":")
        axes[0].plot(its, acc, **style)
        axes[1].plot(mins, acc, **style)
    sharing = "one run at a time on 2 cores" if parallel == 1 else f"{parallel} runs sharing 2 cores"
    for ax, xlabel in zip(axes, ("iteration (128 episodes each)", f"training minutes (evaluation excluded; {sharing})")):
        ax.axhline(em["value"], color="k", linewidth=0.8, linestyle="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("greedy exact match, 500 arith test problems")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].axvline(BUDGET_MIN, color="k", linewidth=0.8, linestyle=":")
    shown = sorted({LABELS[m] for _, m, _ in runs})
    fig.suptitle(f"{model}: {' and '.join(shown)}, one line per seed (dashed: the starting model; "
                 f"dotted: {BUDGET_MIN} training minutes)")
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=str(RECIPE), help="the recipe file every run starts from")
    parser.add_argument("--out", default="runs/tiny-learns-v2")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default="ppo")
    parser.add_argument("--variants", default="new")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="iterations per run; a finished "
                        "run with fewer is extended from its last checkpoint")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (the cores are split between them)")
    parser.add_argument("--summary-only", action="store_true", help="rebuild summary.md and learning.png from the "
                        "run directories that exist (or from --records), running nothing")
    parser.add_argument("--records", help="with --summary-only: the records.json of an earlier run of this script")
    args = parser.parse_args(argv)
    out = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.records:
        if not args.summary_only:
            raise SystemExit("--records: only with --summary-only (it redraws, it runs nothing)")
        rec = json.loads(Path(args.records).read_text())
        runs = {(r["variant"], r["method"], r["seed"]): dict(r["run"], evals=[tuple(e) for e in r["run"]["evals"]])
                for r in rec["runs"]}
        summarize(out, rec["start"], rec["parallel"], runs, rec["model"])
        return
    recipe = load_recipe(Path(args.recipe))
    flags = [str(Path(args.recipe).resolve()), "--no-progress", "--no-plots"]
    variants = dict(VARIANTS, old=[*VARIANTS["old"], "--value-lr", str(recipe["lr"])])
    start = start_point(out, recipe)
    jobs, keys = [], []
    # Order: PPO with both critics first, then I-PPO (so an interrupted session has the main
    # comparison first).
    for method in args.methods.split(","):
        for variant in args.variants.split(","):
            for seed in args.seeds.split(","):
                run_dir = out / f"{variant}-{method}-s{seed}"
                if not args.summary_only:
                    run_dir.mkdir(exist_ok=True)
                jobs.append((run_dir, [*flags, "--iterations", str(args.iterations), *METHODS[method], *variants[variant], "--seed", seed,
                                       "--run-dir", str(run_dir)]))
                keys.append(((variant, method, int(seed)), run_dir))
    if not args.summary_only:
        run_all(out, jobs, args.parallel, args.iterations)
    runs = {key: read_run(run_dir) for key, run_dir in keys if (run_dir / "metrics.jsonl").exists()}
    recipe_path = Path(args.recipe).resolve()
    records = {"recipe": str(recipe_path.relative_to(ROOT) if recipe_path.is_relative_to(ROOT) else recipe_path),
               "model": recipe["model"], "parallel": args.parallel,
               "start": {k: start[k] for k in ("n", "metrics", "reasoning") if k in start},   # what the summary reads
               "runs": [{"variant": v, "method": m, "seed": s, "run": r} for (v, m, s), r in sorted(runs.items())]}
    (out / "records.json").write_text(json.dumps(records, indent=1) + "\n")
    summarize(out, start, args.parallel, runs, recipe["model"])


if __name__ == "__main__":
    main()
