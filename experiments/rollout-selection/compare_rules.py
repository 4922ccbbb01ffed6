"""Rollout selection, side by side: every rule of selection.py and influence.py under one protocol.

The design (arms, seeds, budgets, the numbers each claim is judged on) is fixed in README.md,
beside this file, before the first run. Phases:

    tune    on held-out training rows (--eval-split dev, 400 rows): DAPO's, PODS's, DTV's and
            GradAlign's learning rate; seeds 0-1; the rule: highest mean dev em over iterations 50-150
    test    the test split (500 problems): every arm, seeds 0-4, reward noise 0
    noise   PPO, I-PPO and the better of DAPO and PODS at noise 0, at --reward-noise 0.2
    pool    GRESO beside PPO, I-PPO and DAPO on the first 480 training prompts (--train-pool 480)
    cost    each arm alone on one core, 8 iterations: seconds per iteration (costs.json)

Every run is train.py on configs/tiny.toml in a process of its own, one thread, PARALLEL at a
time (experiments/runner.py); a finished run is kept, a started one resumes. Each finished run
is summarised into records.jsonl (its curves with the generated tokens, the machine and the
code version); once PPO's run of the same seed and noise is recorded, a run's record gets its
result at the matched token budget (and maj@8 there). --report writes report.md and rules.png
from records.jsonl and costs.json (--phase cost) alone:

    HF_HUB_OFFLINE=1 python experiments/rollout-selection/compare_rules.py --out runs/selection --phase tune
    HF_HUB_OFFLINE=1 python experiments/rollout-selection/compare_rules.py --out runs/selection --phase test
    HF_HUB_OFFLINE=1 python experiments/rollout-selection/compare_rules.py --out runs/selection --phase noise
    HF_HUB_OFFLINE=1 python experiments/rollout-selection/compare_rules.py --out runs/selection --phase cost   # alone
    python experiments/rollout-selection/compare_rules.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

from compare import half_width_95  # noqa: E402
from runner import code_version, machine, run_all  # noqa: E402

RECORDS, COSTS = HERE / "records.jsonl", HERE / "costs.json"
ITERATIONS = 150
RECIPE = [str(ROOT / "configs" / "tiny.toml"), "--eval-every", "10", "--no-plots", "--no-progress", "--speedups", "all",
          "--keep-checkpoints", "200"]   # every checkpoint: maj@8 is taken at each budget's end
DEV = ["--eval-split", "dev", "--eval-limit", "400"]
TEST = ["--eval-limit", "500"]
SCORED = range(50, ITERATIONS + 1, 10)     # the evaluations the tune rule averages
TUNE_SEEDS, TEST_SEEDS = [0, 1], [0, 1, 2, 3, 4]
LRS = ("5e-4", "1e-3", "2e-3")

# {arm: (words, flags)}; the flags on top of RECIPE. "tuned" arms get the tune phase's --lr.
ARMS = {
    "ppo": ("PPO", ["--influence", "off"]),
    "ippo": ("I-PPO", ["--influence", "on"]),
    "binary": ("I-PPO, binary filter", ["--influence", "on", "--no-reweight"]),
    "random": ("random filter (control)", ["--influence", "on", "--random-filter"]),
    "shuffled": ("shuffled weights (control)", ["--influence", "on", "--shuffle-weights"]),
    "dtv": ("DTV", ["--influence", "on", "--score-against", "batch"]),
    "dapo": ("DAPO dynamic sampling", ["--influence", "off", "--selection", "dapo"]),
    "pods": ("PODS max-variance down-sampling", ["--influence", "off", "--selection", "pods"]),
    "ppo-sft": ("PPO + SFT term on the validation solutions", ["--influence", "off", "--sft-coef", "1",
                                                               "--sft-batch-size", "32"]),
    "greso": ("GRESO selective rollouts", ["--influence", "off", "--selection", "greso"]),
    "gradalign": ("GradAlign", ["--influence", "off", "--selection", "gradalign"]),
}
RECIPE_ARMS = [arm for arm in ARMS if arm != "greso"]      # GRESO runs on the small pool only
POOL, POOL_ARMS = ["--train-pool", "480"], ["ppo", "ippo", "dapo", "greso"]
TUNED = ("dapo", "pods", "dtv", "gradalign")
VALIDATION_ARMS = ("ippo", "binary", "random", "shuffled", "gradalign")   # judged against PPO + SFT too
NOISE = 0.2
FINAL_EVAL = ["--dataset", "arith", "--arith-terms", "3", "--metrics", "em,maj@8", "--samples", "8",
              "--temperature", "1.0", "--max-new-tokens", "40", "--limit", "0", "--batch-size", "128", "--seed", "0",
              "--no-progress"]


# ----------------------------------------------------------------------------- the runs

def job(out: Path, phase: str, arm: str, seed: int, flags: list[str], setting: str = "", noise: float = 0.0) -> dict:
    """One train.py run; `phase` names its folder and its records (tune, test or pool)."""
    name = f"{phase}-{arm}{'-' + setting if setting else ''}{f'-noise{noise}' if noise else ''}-seed{seed}"
    noisy = ["--reward-noise", str(noise)] if noise else []
    return {"name": name, "arm": arm, "seed": seed, "phase": phase, "setting": setting, "noise": noise,
            "run_dir": out / phase / name, "iterations": ITERATIONS,
            "argv": [*RECIPE, *flags, *noisy, *(DEV if phase == "tune" else TEST), "--seed", str(seed)]}


def tune_jobs(out: Path) -> list[dict]:
    return [job(out, "tune", arm, s, [*ARMS[arm][1], "--lr", lr], setting=f"lr{lr}")
            for arm in TUNED for lr in LRS for s in TUNE_SEEDS]


def chosen_lr(records: list[dict]) -> dict[str, str]:
    """{arm: the --lr the tune rule picks}, for the arms whose tune runs are all recorded."""
    picks = {}
    for arm in TUNED:
        scores = {}
        for lr in LRS:
            runs = [r for r in records if r["phase"] == "tune" and r["arm"] == arm and r["setting"] == f"lr{lr}"]
            if len(runs) == len(TUNE_SEEDS):
                scores[lr] = statistics.mean(r["scored_mean"] for r in runs)
        if len(scores) == len(LRS):
            picks[arm] = max(LRS, key=lambda lr: scores[lr])           # ties: the first listed
    return picks


def test_jobs(out: Path, records: list[dict], noise: float = 0.0, phase: str = "test") -> list[dict]:
    """The test-split runs of every arm whose settings are known, seed by seed (phase "pool":
    the pool's arms on --train-pool 480; GRESO takes DAPO's learning rate)."""
    picks = chosen_lr(records)
    picks |= {"greso": picks["dapo"]} if "dapo" in picks else {}
    arms = POOL_ARMS if phase == "pool" else RECIPE_ARMS if not noise else ["ppo", "ippo", best_new_rule(records)]
    jobs = []
    for s in TEST_SEEDS:
        for arm in arms:
            if arm in (*TUNED, "greso") and arm not in picks:
                continue
            lr = ["--lr", picks[arm]] if arm in picks else []
            jobs.append(job(out, phase, arm, s, [*ARMS[arm][1], *lr, *(POOL if phase == "pool" else [])], noise=noise))
    return jobs


def best_new_rule(records: list[dict]) -> str:
    """The one of DAPO and PODS with the highest mean final em at noise 0, over all test seeds."""
    means = {}
    for arm in ("dapo", "pods"):
        runs = [r for r in records if r["phase"] == "test" and r["arm"] == arm and not r["noise"]]
        if len(runs) < len(TEST_SEEDS):
            raise SystemExit(f"--phase noise: {ARMS[arm][0]} has {len(runs)} of {len(TEST_SEEDS)} test runs at "
                             "noise 0; finish --phase test first")
        means[arm] = statistics.mean(r["steps"]["em"] for r in runs)
    return max(("dapo", "pods"), key=lambda arm: means[arm])


def finished(job: dict) -> bool:
    if any(r["name"] == job["name"] for r in read_records()):
        return True
    path = job["run_dir"] / "metrics.jsonl"
    return path.exists() and any(json.loads(line).get("iteration") == ITERATIONS
                                 for line in path.read_text().splitlines() if line)


def measure_costs(out: Path, records: list[dict], iterations: int = 8) -> dict:
    """Seconds per iteration of each arm alone on one core: train.py for `iterations`
    iterations (no evaluation, seed 0, the test phase's settings), the median over iterations
    2.. of the phases' sum. Run it with nothing else on the machine."""
    picks, costs = chosen_lr(records), {}
    picks |= {"greso": picks["dapo"]} if "dapo" in picks else {}
    for arm, (_, flags) in ARMS.items():
        lr = ["--lr", picks[arm]] if arm in picks else []
        run_dir = out / "cost" / arm
        argv = [*RECIPE, *flags, *lr, *TEST, "--eval-every", "0", "--seed", "0", "--iterations", str(iterations),
                "--run-dir", str(run_dir)]
        if not (run_dir / "metrics.jsonl").exists():
            subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], cwd=ROOT, check=True, capture_output=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        costs[arm] = statistics.median(sum(r["seconds"].values()) for r in rows[1:])
        print(f"[cost] {arm}: {costs[arm]:.2f} s an iteration", flush=True)
    result = {"seconds_per_iteration": costs, "machine": machine(), "code": code_version(), "iterations": iterations,
              "threads": 1}
    COSTS.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------- the records

def maj8(run_dir: Path, iteration: int) -> float | None:
    """maj@8 of the adapters after `iteration`, by evaluate.py (cached in the run directory)."""
    adapter = run_dir / "checkpoints" / f"iter_{iteration:06d}"
    path = run_dir / f"maj8-{iteration}.json"
    if not adapter.exists():
        return None
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny-arith", *FINAL_EVAL,
                        "--adapter", str(adapter), "--out", str(path)], cwd=ROOT, check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(path.read_text())["metrics"]["maj@8"]["value"]


def at(evaluation: dict) -> dict:
    """The judged and reported numbers of one evaluation row of metrics.jsonl."""
    return {"iteration": evaluation["iteration"], "em": evaluation["eval_accuracy"],
            "faithful": evaluation.get("eval_faithful_accuracy"), "unfaithful": evaluation.get("eval_unfaithful_of_correct")}


def summarize(job: dict) -> dict:
    """One finished run: its curve (em, faithful accuracy, unfaithful share, generated tokens so
    far at each evaluation) and its numbers at matched optimizer steps."""
    rows = [json.loads(line) for line in (job["run_dir"] / "metrics.jsonl").read_text().splitlines() if line]
    tokens, curve = 0, {}
    for r in rows:
        tokens += r.get("generated_tokens", 0)
        if "eval_accuracy" in r:
            e = at(r)
            curve[str(r["iteration"])] = [e["em"], e["faithful"], e["unfaithful"], tokens]
    evals = [r for r in rows if "eval_accuracy" in r]
    steps = at(evals[-1]) | {"maj8": maj8(job["run_dir"], ITERATIONS) if job["phase"] != "tune" else None}
    latest = (job["run_dir"] / "checkpoints" / "latest")
    rule = json.loads((latest.parent / latest.read_text().strip() / "state.json").read_text()).get("selection", {})
    saved = rule["skipped"] / (rule["skipped"] + rule["sampled"]) if rule.get("sampled") else None   # GRESO's
    return {"name": job["name"], "arm": job["arm"], "seed": job["seed"], "phase": job["phase"],
            "setting": job["setting"], "noise": job["noise"], "machine": machine(), "code": code_version(),
            "run_dir": str(job["run_dir"]), "steps": steps, "tokens": None, "generated_tokens": tokens,
            "scored_mean": statistics.mean(r["eval_accuracy"] for r in evals if r["iteration"] in SCORED),
            "saved": saved, "curve": curve}


def read_records(path: Path = RECORDS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def write_records(records: list[dict], path: Path = RECORDS) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def record(job: dict) -> None:
    """Add the run's summary to records.jsonl, once, and the token-budget numbers of every
    record whose PPO run is now there (so a phase stopped halfway still has both budgets)."""
    records = read_records()
    if not any(r["name"] == job["name"] for r in records):
        write_records(token_budget_results([*records, summarize(job)]))


def token_budget_results(records: list[dict]) -> list[dict]:
    """Each test run's numbers at the matched token budget, once PPO's run of its seed and noise
    is recorded: its last evaluation whose generated tokens are at most PPO's 150 iterations'."""
    for r in records:
        if r["phase"] == "tune" or r["tokens"] is not None:
            continue
        ppo = [p for p in records if p["phase"] == r["phase"] and p["arm"] == "ppo" and p["seed"] == r["seed"]
               and p["noise"] == r["noise"]]
        if not ppo:
            continue
        budget = ppo[0]["generated_tokens"]
        under = [int(i) for i, point in r["curve"].items() if point[3] <= budget]
        i = max(under)
        em, faithful, unfaithful, tokens = r["curve"][str(i)]
        r["tokens"] = {"iteration": i, "em": em, "faithful": faithful, "unfaithful": unfaithful, "budget": budget,
                       "maj8": maj8(Path(r["run_dir"]), i) if Path(r["run_dir"]).exists() else None}
    return records


# ----------------------------------------------------------------------------- the report

BUDGETS = {"steps": "matched optimizer steps (150 iterations)", "tokens": "matched generated tokens (PPO's 150 iterations')"}
JUDGED = {"em": "final greedy em", "faithful": "final faithful accuracy"}


def mean_ci(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return "n/a" if not values else f"{values[0]:.3f} (1 seed)"
    return f"{statistics.mean(values):.3f} ± {half_width_95(values):.3f}"


def verdict(diffs: list[float]) -> str:
    """The judged words of paired differences: only once every seed of the design is there (a
    phase under way shows its numbers, not a verdict on a part of its seeds)."""
    if len(diffs) < len(TEST_SEEDS):
        return f"{len(diffs)} of {len(TEST_SEEDS)} seeds, not judged"
    mean, half = statistics.mean(diffs), half_width_95(diffs)
    return "ahead" if mean - half > 0 else "behind" if mean + half < 0 else "no difference shown"


def seconds_to_reach(runs: list[dict], arm: str, target: float, costs: dict) -> float | None:
    """The arm's mean curve over its seeds in `runs`: the first evaluation at which it reaches
    `target`, times the arm's seconds per iteration alone; None if never or no cost measured."""
    runs = [r for r in runs if r["arm"] == arm]
    if not runs or arm not in costs:
        return None
    for i in sorted({int(k) for r in runs for k in r["curve"]}):
        points = [r["curve"][str(i)][0] for r in runs if str(i) in r["curve"]]
        if i > 0 and statistics.mean(points) >= target:
            return i * costs[arm]
    return None


CLAIMS = {   # {claim: (arm, against, reward noise)}: the README's claims table at 256 validation solutions
    "reweighting beats the binary filter: final em, I-PPO - binary": ("ippo", "binary", 0.0),
    "influence beats the random filter: final em, I-PPO - random": ("ippo", "random", 0.0),
    "I-PPO beats PPO under 20% reward noise: final em, I-PPO - PPO": ("ippo", "ppo", NOISE),
}


def claims(records: list[dict]) -> list[str]:
    """The paper's claims that the test and noise phases decide, as the README's claims table
    states them: each a difference of final greedy em (matched optimizer steps) paired by seed,
    in points; *held* when its 95% interval lies on the claimed side of 0, *reversed* on the
    other, *not shown* when it holds 0."""
    def final(arm: str, noise: float) -> dict:
        return {r["seed"]: r["steps"]["em"] for r in records if r["phase"] == "test" and r["arm"] == arm
                and r["noise"] == noise}

    def judged(diffs: list[float]) -> str:   # verdict()'s words, as the claims table says them
        if not diffs:
            return "n/a"
        value = f"{statistics.mean(diffs):+.1f}" + (f" ± {half_width_95(diffs):.1f}" if len(diffs) > 1 else "")
        word = verdict(diffs)
        return f"{value} pt, {({'ahead': 'held', 'behind': 'reversed', 'no difference shown': 'not shown'}).get(word, word)}"

    rows = []
    for claim, (arm, against, noise) in CLAIMS.items():
        a, b = final(arm, noise), final(against, noise)
        rows.append((claim, [100 * (a[s] - b[s]) for s in sorted(a) if s in b]))
    lost = {}   # {arm: {seed: final em at noise 0.2 - at noise 0}}
    for arm in ("ippo", "ppo"):
        clean, noisy = final(arm, 0.0), final(arm, NOISE)
        lost[arm] = {s: noisy[s] - clean[s] for s in clean if s in noisy}
    rows.append(("robust to 20% noise: final em lost to noise (noisy - clean), I-PPO's - PPO's",
                 [100 * (lost["ippo"][s] - lost["ppo"][s]) for s in sorted(lost["ippo"]) if s in lost["ppo"]]))
    lines = ["", "## The paper's claims at 256 validation solutions (the README's claims table)", "",
             "| claim | seeds | difference, mean ± 95% t half-width |", "|---|---|---|"]
    return lines + [f"| {claim} | {len(diffs)} | {judged(diffs)} |" for claim, diffs in rows]


def report(records: list[dict], costs: dict) -> str:
    tune = [r for r in records if r["phase"] == "tune"]
    lines = ["## Tune phase (dev split, 400 held-out training rows)", "",
             "| arm | setting | seed | mean dev em, iterations 50-150 |", "|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['setting']} | {r['seed']} | {r['scored_mean']:.3f} |"
              for r in sorted(tune, key=lambda r: (r["arm"], r["setting"], r["seed"]))]
    lines += ["", "Chosen: " + (", ".join(f"{arm} --lr {lr}" for arm, lr in chosen_lr(records).items()) or "none yet")]
    groups = sorted({(r["phase"], r["noise"]) for r in records if r["phase"] != "tune"}, key=lambda g: (g[0] != "test", g))
    for phase, noise in groups:
        test = [r for r in records if r["phase"] == phase and r["noise"] == noise]
        where = "the first 480 training prompts (--train-pool 480)" if phase == "pool" else "the recipe's prompts"
        ppo_final = [r["steps"]["em"] for r in test if r["arm"] == "ppo"]
        for budget, words in BUDGETS.items():
            lines += ["", f"## Test split (500 problems), {where}, reward noise {noise}, {words}", "",
                      "| arm | seeds | em | faithful accuracy | unfaithful share | maj@8 | s/iteration alone | "
                      "time to PPO's final em, over PPO's | rollouts saved |", "|---|---|---|---|---|---|---|---|---|"]
            ppo_time = seconds_to_reach(test, "ppo", statistics.mean(ppo_final), costs) if ppo_final else None
            for arm, (name, _) in ARMS.items():
                runs = [r for r in test if r["arm"] == arm and r[budget] is not None]
                if not runs:
                    continue
                reach = seconds_to_reach(test, arm, statistics.mean(ppo_final), costs) if ppo_time else None
                ratio = "n/a" if not ppo_time else "not reached" if reach is None else f"{reach / ppo_time:.2f}"
                cost = f"{costs[arm]:.2f}" if arm in costs else "n/a"
                lines.append(f"| {name} | {', '.join(str(r['seed']) for r in runs)} | "
                             + " | ".join(mean_ci([r[budget][k] for r in runs]) for k in ("em", "faithful", "unfaithful", "maj8"))
                             + f" | {cost} | {ratio} | {mean_ci([r.get('saved') for r in runs])} |")
            for against in ("ppo", "ppo-sft"):
                base = {r["seed"]: r for r in test if r["arm"] == against and r[budget] is not None}
                arms = [a for a in ARMS if a != against and (against == "ppo" or a in VALIDATION_ARMS)]
                rows = []
                for arm in arms:
                    runs = {r["seed"]: r for r in test if r["arm"] == arm and r[budget] is not None}
                    seeds = sorted(set(runs) & set(base))
                    if not seeds:
                        continue
                    cells = []
                    for key in JUDGED:
                        diffs = [100 * (runs[s][budget][key] - base[s][budget][key]) for s in seeds]
                        cells.append(f"{diffs[0]:+.3f} ({verdict(diffs)})" if len(diffs) == 1
                                     else f"{mean_ci(diffs)} ({verdict(diffs)})")
                    rows.append(f"| {ARMS[arm][0]} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
                if rows:
                    lines += ["", f"Each arm minus {ARMS[against][0]}, paired by seed (points, mean ± 95% t half-width):",
                              "", "| arm | seeds | " + " | ".join(JUDGED.values()) + " |", "|---|---|---|---|", *rows]
    lines += claims(records)
    lines += ["", "Every run:", "", "| run | machine | code | em (150) | faithful (150) | tokens budget: iteration, em |",
              "|---|---|---|---|---|---|"]
    for r in [r for r in records if r["phase"] != "tune"]:
        t = r["tokens"]
        budget = "n/a" if t is None else f"{t['iteration']}, {t['em']:.3f}"
        lines.append(f"| {r['name']} | {r['machine']} | {r['code']} | {r['steps']['em']:.3f} | "
                     f"{r['steps']['faithful']:.3f} | {budget} |")
    return "\n".join(lines) + "\n"


def figure(records: list[dict], path: Path) -> None:
    """Greedy em against iteration and against generated tokens, one line per arm (noise 0,
    mean over seeds) with its 95% band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    test = [r for r in records if r["phase"] == "test" and not r["noise"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for arm, (name, _) in ARMS.items():
        runs = [r for r in test if r["arm"] == arm]
        if not runs:
            continue
        its = sorted({int(k) for r in runs for k in r["curve"]})
        ys = [[r["curve"][str(i)][0] for r in runs if str(i) in r["curve"]] for i in its]
        xs_tokens = [statistics.mean(r["curve"][str(i)][3] for r in runs if str(i) in r["curve"]) / 1e6 for i in its]
        mean = [statistics.mean(y) for y in ys]
        half = [half_width_95(y) if len(y) > 1 else 0.0 for y in ys]
        for ax, xs in zip(axes, (its, xs_tokens)):
            line, = ax.plot(xs, mean, label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(xs, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                            color=line.get_color(), alpha=0.12)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("generated tokens (millions)")
    axes[0].set_ylabel("greedy exact match, 500 test problems")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("rollout selection rules, configs/tiny.toml, reward noise 0; bands: 95% t over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/selection"), help="where the runs go")
    parser.add_argument("--phase", choices=("tune", "test", "noise", "pool", "cost"), help="run this phase's unfinished runs "
                        "(cost: each arm alone on one core, into costs.json)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hours", type=float, default=24.0, help="start no run after this many hours")
    parser.add_argument("--report", action="store_true", help="write report.md and rules.png from the records")
    args = parser.parse_args(argv)
    if args.phase == "cost":
        measure_costs(args.out, read_records())
    elif args.phase:
        records = read_records()
        jobs = {"tune": lambda: tune_jobs(args.out), "test": lambda: test_jobs(args.out, records),
                "noise": lambda: test_jobs(args.out, records, noise=NOISE),
                "pool": lambda: test_jobs(args.out, records, phase="pool")}[args.phase]()
        run_all(jobs, args.parallel, time.time() + 3600 * args.hours, "selection", done=finished, on_finish=record)
        write_records(token_budget_results(read_records()))
    if args.report or not args.phase:
        records = read_records()
        costs = json.loads(COSTS.read_text())["seconds_per_iteration"] if COSTS.exists() else {}
        (HERE / "report.md").write_text(report(records, costs))
        if any(r["phase"] == "test" for r in records):
            figure(records, HERE / "rules.png")
        print(report(records, costs))


if __name__ == "__main__":
    main()
