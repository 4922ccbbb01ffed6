"""Compare the SFT start, PPO, GRPO, I-PPO and its controls over seeds, everything else equal.

The paper's comparison (arXiv 2604.01597), with the statistics a claim needs. Every method runs
once per seed (and per reward-noise level), with the same train.py flags otherwise, so the
same number of episodes:

    SFT start      the policy the others start from: train.py --algo sft (its adapters start
                   the runs below), or, with --sft-iterations 0, the model itself (e.g. the
                   tiny world's tiny-arith, which is already a supervised model)
    ppo            PPO                 train.py --influence off
    grpo           GRPO                train.py --influence off --advantage grpo
    ippo           I-PPO               train.py --influence on            (filter + reweight)
    ippo-binary    I-PPO, binary       train.py --influence on --no-reweight
    random-filter  random filter       train.py --influence on --random-filter  (drops as many
                                       episodes as I-PPO would, chosen at random)
    igrpo          I-GRPO              train.py --influence on --advantage grpo

Each final checkpoint is evaluated by evaluate.py: greedy em on the first --final-limit test
problems, the sampled metrics of --metrics (maj@k, pass@k) on the first --sampled-limit.
With --parallel K, the runs and the evaluations go K processes at a time. Written into --out:
    compare.md           per noise level and method: every final metric as mean +- the
                         half-width of its 95% t-interval over seeds; the paired difference to
                         PPO over the same seeds (em) with its interval; kept fraction; training
                         minutes; with reward noise the detection metrics (flip AUC, the share
                         of flipped episodes among the dropped and the kept); on arith the final
                         faithful accuracy beside em, in every table that has em
    compare-noise<p>.png eval accuracy against iteration and against training minutes, eval
                         faithful accuracy (arith) against iteration, kept fraction and seconds
                         per iteration against iteration, flip AUC
    results.json         the numbers of every run;  runs/<method>-noise<p>-seed<s>/  the runs
Faithful accuracy (arith only): the share of problems whose greedy answer is correct AND
faithful (reasoning.py), em x (1 - the unfaithful share of the correct): accuracy without the
right answers reached by a wrong step, which exact match rewards as much as a correct chain.
An interrupted comparison continues where it stopped: a started run is resumed (train.py
--resume), a finished one is left as it is, and a final evaluation already written
(final_eval.json, final_sampled.json in the run directory; start/ for the model itself) is
read back.

CLI:
    python compare.py --seeds 0,1 --iterations 20 --out runs/compare [--train-args "--lr 1e-5"]
    python compare.py --model tiny-arith --dataset arith --sft-iterations 0 --reward-noise 0,0.2 \\
        --methods ppo,grpo,ippo,ippo-binary,random-filter --seeds 0,1,2,3,4 --parallel 2 ...
    (experiments/tiny-compare/tiny_compare.py pins the first tiny world's comparison.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import train
from config import add_config_flags
from tasks import load_task
from accuracy import metric_name, parse_metrics
from evaluate import main as evaluate_main
from offline_models import model_source
from report import faithful_accuracy

ROOT = Path(__file__).resolve().parent
# slug: (label, train.py flags). The SFT start is not a run of its own (see the docstring).
METHODS = {
    "ppo": ("PPO", ["--influence", "off"]),
    "grpo": ("GRPO", ["--influence", "off", "--advantage", "grpo"]),
    "ippo": ("I-PPO", ["--influence", "on"]),
    "ippo-binary": ("I-PPO, binary filter", ["--influence", "on", "--no-reweight"]),
    "random-filter": ("random filter", ["--influence", "on", "--random-filter"]),
    "igrpo": ("I-GRPO", ["--influence", "on", "--advantage", "grpo"]),
}
START = "SFT start"
# train.py flags set through compare.py's own flags (same names, defaults and help as train.py).
PASSTHROUGH = ("model", "dataset", "data_source", "arith_digits", "arith_terms", "prompts_per_iter",
               "samples_per_prompt", "max_new_tokens", "eval_every", "eval_limit", "eval_max_new_tokens",
               "gen_batch_size", "device", "progress")
# Flags compare.py sets per run; --train-args may not override them.
OWNED = ("--algo", "--influence", "--random-filter", "--no-random-filter", "--init-adapter", "--run-dir", "--seed",
         "--resume", "--iterations", "--advantage", "--reweight", "--no-reweight", "--reward-noise")
# Two-sided 95% Student t quantiles by degrees of freedom (no scipy); 1.96 beyond 30.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}
FAITHFUL = "faithful"   # a run's final faithful accuracy, in its "final" beside the metric names (arith)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser, ("iterations", *PASSTHROUGH))
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds; every method runs once per seed")
    parser.add_argument("--methods", default="ppo,ippo,random-filter",
                        help=f"comma-separated, of {', '.join(METHODS)} (the SFT start is always there)")
    parser.add_argument("--reward-noise", default="0", help="comma-separated train.py --reward-noise levels; every "
                        "method and seed runs at each")
    parser.add_argument("--sft-iterations", type=int, default=None,
                        help="SFT batches (None: --iterations; 0: no SFT stage, the model itself is the start)")
    parser.add_argument("--metrics", default="em", help="final evaluation metrics (see evaluate.py)")
    parser.add_argument("--final-limit", type=int, default=0, help="final greedy em on the first K test problems (0 = all)")
    parser.add_argument("--sampled-limit", type=int, default=None, help="final maj@k / pass@k on the first K test "
                        "problems (None: --final-limit; 0 = all)")
    parser.add_argument("--train-args", default="", help="more train.py flags for every run, e.g. \"--lr 1e-5 --kl-beta 0.1\"")
    parser.add_argument("--parallel", type=int, default=1, help="train.py runs at a time, each in a process of its "
                        "own with the CPU threads split between them (1: in this process)")
    parser.add_argument("--out", default="runs/compare", help="output directory")
    args = parser.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
        args.noise_list = [float(p) for p in args.reward_noise.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r} / --reward-noise {args.reward_noise!r}: expected comma-separated "
                     "integers (seeds) and numbers (noise levels), e.g. --seeds 0,1 --reward-noise 0,0.2")
    for name, values in (("--seeds", args.seed_list), ("--reward-noise", args.noise_list)):
        if len(set(values)) != len(values):
            parser.error(f"{name}: a value is repeated")
    if not all(0 <= p <= 1 for p in args.noise_list):
        parser.error(f"--reward-noise {args.reward_noise!r}: each level must be a probability in [0, 1]")
    args.method_list = args.methods.split(",")
    unknown = [m for m in args.method_list if m not in METHODS]
    if unknown or len(set(args.method_list)) != len(args.method_list):
        parser.error(f"--methods {args.methods!r}: each once, of {', '.join(METHODS)}")
    try:
        args.metric_list = parse_metrics(args.metrics)
    except ValueError as err:
        parser.error(f"--metrics: {err}")
    if args.sft_iterations is None:
        args.sft_iterations = args.iterations
    if args.sampled_limit is None:
        args.sampled_limit = args.final_limit
    if min(args.sft_iterations, args.final_limit, args.sampled_limit) < 0 or args.parallel < 1:
        parser.error("--sft-iterations, --final-limit and --sampled-limit must be >= 0, --parallel >= 1")
    args.extra = shlex.split(args.train_args)
    owned = [a for a in args.extra if a.split("=")[0] in OWNED]
    if owned:
        parser.error(f"--train-args: {', '.join(owned)} is set by compare.py for each run")
    return args


def train_argv(args) -> list[str]:
    """The train.py flags every run shares (each run adds --iterations, --seed and its method's flags)."""
    argv = []
    for name in PASSTHROUGH:
        flag, value = "--" + name.replace("_", "-"), getattr(args, name)
        argv += ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
    return argv + args.extra


def noise_tag(p: float) -> str:
    return f"noise{p:g}"


def plan(args, out: Path) -> tuple[list[dict], list[dict]]:
    """The SFT runs (one per seed; none with --sft-iterations 0) and the RL runs (method x noise
    x seed), each {"method", "seed", "noise", "run_dir", "argv", "iterations"}."""
    shared = train_argv(args)
    sft, rl = [], []
    for seed in args.seed_list:
        init = []
        if args.sft_iterations > 0:
            sft_dir = out / "runs" / f"sft-seed{seed}"
            sft.append({"method": START, "seed": seed, "noise": None, "run_dir": sft_dir,
                        "iterations": args.sft_iterations,
                        "argv": ["--algo", "sft", *shared, "--seed", str(seed)]})
            init = ["--init-adapter", str(sft_dir)]
        for noise in args.noise_list:
            for slug in args.method_list:
                rl.append({"method": slug, "seed": seed, "noise": noise, "iterations": args.iterations,
                           "run_dir": out / "runs" / f"{slug}-{noise_tag(noise)}-seed{seed}",
                           "argv": [*shared, *METHODS[slug][1], "--reward-noise", str(noise), "--seed", str(seed),
                                    *init]})
    return sft, rl


def finished(job: dict) -> bool:
    path = job["run_dir"] / "metrics.jsonl"
    return path.exists() and any(json.loads(l).get("iteration") == job["iterations"]
                                 for l in path.read_text().splitlines() if l)


def train_command(job: dict, progress: bool) -> list[str]:
    """train.py's flags for this run: a fresh start, or --resume if train.py already started it
    (config.json; without a checkpoint yet it starts over)."""
    if (job["run_dir"] / "config.json").exists():
        return ["--resume", str(job["run_dir"]), "--iterations", str(job["iterations"]),
                "--progress" if progress else "--no-progress"]
    return [*job["argv"], "--iterations", str(job["iterations"]), "--run-dir", str(job["run_dir"])]


def eval_commands(args, adapter: Path | None, seed: int, where: Path) -> list[tuple[Path, list[str]]]:
    """evaluate.py's flags for the final evaluation of one policy (adapter None: the model
    itself), as (output file, flags): greedy em on the first --final-limit test problems, and
    the sampled metrics (maj@k, pass@k) on the first --sampled-limit, each with the run's seed."""
    common = ["--model", args.model, "--dataset", args.dataset, "--data-source", args.data_source,
              "--arith-digits", str(args.arith_digits), "--arith-terms", str(args.arith_terms),
              "--max-new-tokens", str(args.eval_max_new_tokens), "--batch-size", str(args.gen_batch_size),
              "--seed", str(seed), "--device", args.device, "--no-progress",
              *(["--adapter", str(adapter)] if adapter else [])]
    greedy = [metric_name(m) for m in args.metric_list if m[0] == "em"]
    sampled = [metric_name(m) for m in args.metric_list if m[0] != "em"]
    commands = []
    if greedy:
        commands.append((where / "final_eval.json", [*common, "--metrics", "em", "--limit", str(args.final_limit)]))
    if sampled:
        commands.append((where / "final_sampled.json", [*common, "--metrics", ",".join(sampled),
                                                        "--limit", str(args.sampled_limit)]))
    return commands


def run_jobs(jobs: list[dict], parallel: int) -> None:
    """Run each job {"name", "script" (train or evaluate), "argv", "done"} that is not done:
    with --parallel 1 its main() in this process, else --parallel processes at a time, each
    on its share of the CPU threads, with its output in <name>.log."""
    pending = [j for j in jobs if not j["done"]]
    if len(pending) < len(jobs):
        print(f"[compare] {len(jobs) - len(pending)} of {len(jobs)} jobs done before, left as they are", file=sys.stderr)
    mains = {"train": train.main, "evaluate": evaluate_main}
    if parallel == 1:
        for j in pending:
            print(f"[compare] {j['name']}: {j['script']}.py {' '.join(j['argv'])}", file=sys.stderr)
            mains[j["script"]](j["argv"])
        return
    threads = max(1, (os.cpu_count() or 1) // parallel)
    running = []
    while pending or running:
        while pending and len(running) < parallel:
            j = pending.pop(0)
            print(f"[compare] {j['name']}: {j['script']}.py {' '.join(j['argv'])} (log: {j['log']})", file=sys.stderr)
            log = open(j["log"], "a")
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            running.append((j, subprocess.Popen([sys.executable, str(ROOT / f"{j['script']}.py"), *j["argv"]],
                                                stdout=log, stderr=subprocess.STDOUT, env=env), log))
        time.sleep(0.5)
        for item in list(running):
            j, proc, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            if proc.returncode != 0:
                for _, other, _ in running:
                    other.terminate()
                raise SystemExit(f"[compare] {j['name']} failed (exit {proc.returncode}); see {j['log']}; "
                                 "run the same command again to resume")


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def final_faithful_accuracy(result: dict) -> float | None:
    """The faithful accuracy of a final evaluation (evaluate.py's output): the share of problems
    whose greedy answer is correct and faithful. None without greedy labels (not arith, or em not
    asked). Files written before evaluate.py reported it give it from their label counts."""
    greedy = result.get("reasoning", {}).get("greedy")
    if greedy is None:
        return None
    if "faithful_accuracy" in greedy:
        return greedy["faithful_accuracy"]
    return greedy["faithful"] / (greedy["faithful"] + greedy["unfaithful"] + greedy["wrong"])


def summarize_run(job: dict, eval_files: list[Path]) -> dict:
    """What the table and the plots need of one run (eval_files: its final evaluations)."""
    evals = [json.loads(path.read_text()) for path in eval_files]
    final = {name: m["value"] for result in evals for name, m in result["metrics"].items()}
    for result in evals:   # only the greedy evaluation has greedy labels
        if final_faithful_accuracy(result) is not None:
            final[FAITHFUL] = final_faithful_accuracy(result)
    rows = read_metrics(job["run_dir"]) if job["run_dir"] else []
    train_s, curve = 0.0, []            # (iteration, training minutes so far, eval accuracy)
    per_iteration = {}
    for r in rows:
        spent = sum(v for k, v in r.get("seconds", {}).items() if k != "eval")
        train_s += spent
        if spent:
            per_iteration[r["iteration"]] = spent
        if "eval_accuracy" in r:
            curve.append((r["iteration"], train_s / 60, r["eval_accuracy"]))
    series = lambda key: {r["iteration"]: r[key] for r in rows if r.get(key) is not None}   # noqa: E731
    kept = series("kept_fraction")
    faithful_curve = {r["iteration"]: faithful_accuracy(r) for r in rows if faithful_accuracy(r) is not None}
    return {"method": job["method"], "seed": job["seed"], "noise": job["noise"],
            "run_dir": str(job["run_dir"]) if job["run_dir"] else None,
            "final": final,
            "train_minutes": train_s / 60, "curve": curve, "faithful_curve": faithful_curve,
            "seconds": per_iteration,
            "kept": kept, "kept_fraction": statistics.mean(kept.values()) if kept else None,
            "weight_ess": series("weight_ess"), "flip_auc": series("flip_auc"), "flipped_share_dropped": series("flipped_share_dropped"),
            "flipped_share_kept": series("flipped_share_kept")}


def interval(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """'mean ± h' with h the half-width of the 95% t-interval over the values; one value: the
    value alone (no interval)."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "n/a"
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half_width_95(values):.{digits}f}"


def half_width_95(values: list[float]) -> float:
    """Half-width of the 95% Student t-interval of the mean of two or more values."""
    df = len(values) - 1
    t = T_975.get(df) or (T_975[max(k for k in T_975 if k < df)] if df < 30 else 1.96)
    return t * statistics.stdev(values) / len(values) ** 0.5


def label(method: str) -> str:
    return START if method == START else METHODS[method][0]


# The final metrics compared between methods (paired differences, a table per run), by key of
# a run's "final", with the words the tables print for them.
PAIRED = {"em": "em", FAITHFUL: "faithful acc"}


def paired_keys(args) -> list[str]:
    """em, and on arith with em asked its faithful accuracy: an em lead made of right answers
    reached by wrong steps shows as no lead in faithful accuracy."""
    with_faithful = args.dataset == "arith" and any(name == "em" for name, _ in args.metric_list)
    return ["em", FAITHFUL] if with_faithful else ["em"]


def difference_to_ppo(runs: list[dict], results: list[dict], noise: float, key: str) -> str:
    """The final `key` of each run minus PPO's of the same seed at this noise level, in points,
    as mean ± 95% interval; '-' for PPO itself or where no run has a PPO pair."""
    ppo = {r["seed"]: r["final"].get(key) for r in results if r["method"] == "ppo" and r["noise"] == noise}
    diffs = [r["final"][key] - ppo[r["seed"]] for r in runs
             if r["method"] != "ppo" and ppo.get(r["seed"]) is not None and r["final"].get(key) is not None]
    return interval(diffs, 100, 1) if diffs else "-"


def write_table(path: Path, results: list[dict], args) -> None:
    names = [metric_name(m) for m in args.metric_list]
    keys = paired_keys(args)
    finals = names + [k for k in keys if k not in names]   # the faithful accuracy after the asked metrics
    count = lambda k: f"the first {k}" if k else "all the"   # noqa: E731
    start = "its SFT run's final checkpoint" if args.sft_iterations else f"the model itself ({args.model})"
    lines = [f"# SFT start, {', '.join(METHODS[m][0] for m in args.method_list)} on {args.dataset}", "",
             f"Seeds {args.seeds}; every cell is the mean over seeds ± the half-width of its 95% t-interval. "
             f"Final metrics (evaluate.py, {args.metrics}) of the final checkpoint: greedy em on "
             f"{count(args.final_limit)} test problems, sampled metrics on {count(args.sampled_limit)}; "
             f"the SFT start is {start}. em - PPO: the difference to PPO of the same seed, then mean ± interval "
             "(in points). Kept: the mean over iterations of kept / all episodes; ess: the mean over "
             "iterations of the effective number of episodes behind an update, (sum w)^2 / sum w^2 (n/a "
             "without influence, where it is all of them). Training minutes exclude evaluation. With reward noise: flip AUC, the AUC of the influence scores for \"reward not "
             "flipped\" (0.5 = chance), and the share of flipped episodes among the dropped and the kept "
             "(means over iterations)." + (
                 " faithful acc: the faithful accuracy, the share of problems whose greedy answer is correct "
                 "and faithful (reasoning.py), em x (1 - the unfaithful share of the correct); it is em without "
                 "the right answers reached by a wrong step." if FAITHFUL in keys else ""), ""]
    for noise in args.noise_list:
        lines += [f"## Reward noise {noise:g}", "",
                  "| method | " + " | ".join(f"final {PAIRED.get(n, n)}" for n in finals) + " | "
                  + " | ".join(f"{PAIRED[k]} - PPO (pt)" for k in keys) + " | kept | ess | "
                  "training min |" + (" flip AUC | flipped among dropped | flipped among kept |" if noise > 0 else ""),
                  "|---|" + "---|" * (len(finals) + len(keys) + 3) + ("---|---|---|" if noise > 0 else "")]
        for method in [START, *args.method_list]:
            runs = [r for r in results if r["method"] == method and r["noise"] in (noise, None)]
            if not runs:
                continue
            # The model itself as the start: one evaluation, shown once (no interval over seeds).
            shown = runs[:1] if method == START and not runs[0]["run_dir"] else runs
            cells = [interval([r["final"].get(n) for r in shown]) for n in finals]
            cells += [difference_to_ppo(runs, results, noise, k) for k in keys]
            row = (f"| {label(method)} | " + " | ".join(cells) + " | "
                   f"{interval([r['kept_fraction'] for r in runs], digits=2)} | "
                   f"{interval([statistics.mean(r['weight_ess'].values()) if r['weight_ess'] else None for r in runs], digits=0)} | "
                   f"{interval([r['train_minutes'] for r in runs if r['run_dir']], digits=1)} |")
            if noise > 0:
                mean_of = lambda r, key: statistics.mean(r[key].values()) if r[key] else None   # noqa: E731
                row += "".join(f" {interval([mean_of(r, k) for r in runs], digits=2)} |" for k in
                               ("flip_auc", "flipped_share_dropped", "flipped_share_kept"))
            lines.append(row)
        lines.append("")
    for key in keys:
        lines += paired_tables(results, args, key)
    for key in keys:
        lines += final_per_run(results, args, key)
    lines += [f"Shared train.py flags: `{' '.join(train_argv(args))}`; RL runs `--iterations {args.iterations}`"
              + (f", SFT `--iterations {args.sft_iterations}`." if args.sft_iterations else "."), ""]
    path.write_text("\n".join(lines))


def final_per_run(results: list[dict], args, key: str = "em") -> list[str]:
    """The final `key` (em, or the faithful accuracy) of every RL run: a row per method and
    noise level, a column per seed."""
    lines = [f"## Final {PAIRED[key]} of every run", "",
             "| method | noise | " + " | ".join(f"seed {x}" for x in args.seed_list) + " |",
             "|---|---|" + "---|" * len(args.seed_list)]
    for noise in args.noise_list:
        for method in args.method_list:
            value = {r["seed"]: r["final"].get(key) for r in results if r["method"] == method and r["noise"] == noise}
            lines.append(f"| {label(method)} | {noise:g} | " + " | ".join(
                "-" if value.get(x) is None else f"{value[x]:.3f}" for x in args.seed_list) + " |")
    lines.append("")
    return lines


# (a, b, what a - b measures): the paper's claims as paired contrasts of final em (and faithful accuracy).
CONTRASTS = (("ippo", "ppo", "I-PPO vs PPO"), ("ippo", "grpo", "I-PPO vs GRPO"),
             ("ippo", "ippo-binary", "reweighting vs the binary filter (I-PPO minus binary)"),
             ("ippo", "random-filter", "influence vs the random filter (I-PPO minus random)"),
             ("ippo-binary", "random-filter", "influence vs random, both unweighted (binary minus random)"),
             ("igrpo", "grpo", "the filter on GRPO (I-GRPO minus GRPO)"))


def paired_tables(results: list[dict], args, key: str = "em") -> list[str]:
    """Final `key` (em, or the faithful accuracy) of a minus b, paired by seed (points, mean ± 95%
    interval), per noise level; and with more than one noise level, each method's `key` at every
    level minus its `key` without noise."""
    final = {(r["method"], r["noise"], r["seed"]): r["final"].get(key) for r in results}
    what_of = PAIRED[key]

    def paired(a, noise_a, b, noise_b):
        diffs = [100 * (final[a, noise_a, s] - final[b, noise_b, s]) for s in args.seed_list
                 if final.get((a, noise_a, s)) is not None and final.get((b, noise_b, s)) is not None]
        return interval(diffs, digits=1) if diffs else "-"

    present = set(args.method_list)
    rows = [c for c in CONTRASTS if c[0] in present and c[1] in present]
    lines = []
    if rows:
        lines += [f"## Paired differences in final {what_of} (points: same seed, then mean ± 95% interval)", "",
                  "| contrast | " + " | ".join(f"noise {p:g}" for p in args.noise_list) + " |",
                  "|---|" + "---|" * len(args.noise_list)]
        lines += [f"| {what} | " + " | ".join(paired(a, p, b, p) for p in args.noise_list) + " |" for a, b, what in rows]
        lines.append("")
    noisy = [p for p in args.noise_list if p > 0]
    if noisy and 0 in args.noise_list:
        lines += [f"## What the noise costs: final {what_of} at each noise level minus without noise "
                  "(points, paired by seed)",
                  "", "| method | " + " | ".join(f"noise {p:g}" for p in noisy) + " |", "|---|" + "---|" * len(noisy)]
        lines += [f"| {label(m)} | " + " | ".join(paired(m, p, m, 0.0) for p in noisy) + " |" for m in args.method_list]
        lines.append("")
    return lines


def mean_series(runs: list[dict], pick) -> tuple[list, list]:
    """Mean over runs of pick(run) -> {x: y}, at the x every run has."""
    per_run = [pick(r) for r in runs]
    xs = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    return xs, [statistics.mean(p[x] for p in per_run) for x in xs]


def draw_faithful(ax, runs: list[dict], color: str, name: str) -> None:
    """One method's eval faithful accuracy against iteration: a faint line per seed, the mean
    over seeds bold (nothing off arith, where the runs have no faithful_curve)."""
    for r in runs:
        its = sorted(r["faithful_curve"])
        if its:
            ax.plot(its, [r["faithful_curve"][i] for i in its], color=color, alpha=0.25, linewidth=0.8)
    x, y = mean_series(runs, lambda r: r["faithful_curve"])
    if x:
        ax.plot(x, y, color=color, marker="o", markersize=3, label=f"{name} (mean)")


def write_plot(path: Path, results: list[dict], noise: float, methods: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(21, 8.5))
    (acc_it, faithful_ax, acc_min, kept_ax), (sec_ax, auc_ax, share_ax, spare) = axes
    faithful_ax.sharey(acc_it)   # one scale: the drop from accuracy to faithful accuracy reads off directly
    for i, method in enumerate(methods):
        runs = [r for r in results if r["method"] == method and r["noise"] == noise]
        if not runs:
            continue
        color, name = f"C{i}", label(method)
        for r in runs:   # one faint line per seed
            its, mins, acc = zip(*r["curve"]) if r["curve"] else ((), (), ())
            acc_it.plot(its, acc, color=color, alpha=0.25, linewidth=0.8)
            acc_min.plot(mins, acc, color=color, alpha=0.25, linewidth=0.8)
        x, y = mean_series(runs, lambda r: {c[0]: c[2] for c in r["curve"]})
        acc_it.plot(x, y, color=color, marker="o", markersize=3, label=f"{name} (mean)")
        x, y = mean_series(runs, lambda r: {c[0]: c[1] for c in r["curve"]})
        _, acc = mean_series(runs, lambda r: {c[0]: c[2] for c in r["curve"]})
        acc_min.plot(y, acc, color=color, marker="o", markersize=3, label=name)
        draw_faithful(faithful_ax, runs, color, name)
        for ax, key in ((kept_ax, "kept"), (sec_ax, "seconds"), (auc_ax, "flip_auc")):
            x, y = mean_series(runs, lambda r: r[key])
            if x:
                ax.plot(x, y, color=color, marker=".", label=name)
        x, y = mean_series(runs, lambda r: r["flipped_share_dropped"])
        if x:
            share_ax.plot(x, y, color=color, marker=".", label=f"{name}: among dropped")
            x, y = mean_series(runs, lambda r: r["flipped_share_kept"])
            share_ax.plot(x, y, color=color, marker=".", linestyle=":", label=f"{name}: among kept")
    # Iteration 0 of every curve is the start (train.py evaluates before the first iteration).
    acc_it.set(xlabel="iteration", ylabel="greedy exact match (eval)", title="eval accuracy (faint: one seed)")
    acc_min.set(xlabel="training minutes (evaluation excluded)", ylabel="greedy exact match (eval)",
                title="eval accuracy against training time")
    faithful_ax.set(xlabel="iteration", ylabel="correct and faithful / all problems (eval)",
                    title="eval faithful accuracy (faint: one seed)")
    if not faithful_ax.lines:
        faithful_ax.text(0.5, 0.5, "arith only", ha="center", va="center", transform=faithful_ax.transAxes)
    kept_ax.set(xlabel="iteration", ylabel="kept / all episodes", title="kept fraction", ylim=(0, 1.05))
    sec_ax.set(xlabel="iteration", ylabel="seconds", title="training seconds per iteration")
    auc_ax.set(xlabel="iteration", ylabel="AUC", title="flip AUC: influence scores for 'not flipped'")
    share_ax.set(xlabel="iteration", ylabel="share flipped", title="flipped episodes among dropped / kept")
    if noise == 0:
        for ax in (auc_ax, share_ax):
            ax.text(0.5, 0.5, "no reward noise", ha="center", va="center", transform=ax.transAxes)
    else:
        auc_ax.axhline(0.5, color="k", linestyle="--", linewidth=0.8)
        share_ax.axhline(noise, color="k", linestyle="--", linewidth=0.8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    spare.set_axis_off()
    fig.suptitle(f"mean over seeds, reward noise {noise:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    load_task(args.dataset, "test", args.data_source, arith_digits=args.arith_digits,
              arith_terms=args.arith_terms)                    # first: a data error fails fast
    if args.parallel > 1:
        model_source(args.model)   # an offline model is converted or built once, here, not by each process
    sft, rl = plan(args, out)
    for runs in (sft, rl):                                      # the RL runs start from the SFT runs
        run_jobs([{"name": r["run_dir"].name, "script": "train", "argv": train_command(r, args.progress),
                   "log": f"{r['run_dir']}.log", "done": finished(r)} for r in runs], args.parallel)

    # Final evaluations: the start (the model itself, once, when there is no SFT stage) and
    # every run's final checkpoint.
    start = [] if sft else [{"method": START, "seed": None, "noise": None, "run_dir": None}]
    (out / "start").mkdir(exist_ok=True)
    targets = [(r, r["run_dir"], r["seed"] or 0, r["run_dir"] or out / "start") for r in start + sft + rl]
    evals = {id(r): eval_commands(args, adapter, seed, where) for r, adapter, seed, where in targets}
    run_jobs([{"name": f"{path.parent.name}/{path.name}", "script": "evaluate", "argv": [*argv_, "--out", str(path)],
               "log": f"{path}.log", "done": path.exists()}
              for commands in evals.values() for path, argv_ in commands], args.parallel)

    results = []
    for r in start:   # one evaluation serves every seed
        results += [summarize_run(r | {"seed": s}, [p for p, _ in evals[id(r)]]) for s in args.seed_list]
    results += [summarize_run(r, [p for p, _ in evals[id(r)]]) for r in sft + rl]
    write_table(out / "compare.md", results, args)
    for noise in args.noise_list:
        write_plot(out / f"compare-{noise_tag(noise)}.png", results, noise, args.method_list)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print((out / "compare.md").read_text())
    print(f"[compare] wrote {out / 'compare.md'}, compare-noise*.png and results.json in {out}")
    return out


if __name__ == "__main__":
    main()
