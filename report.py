"""Pictures and a page for one run directory: plots.png and report.html.

Reads what `train.py` writes (config.json, metrics.jsonl, episodes.jsonl; see the README,
"What you will see") and writes two files beside them:

    plots.png    small panels against iteration: reward and train accuracy, greedy eval
                 accuracy (+- its standard error), on arith the faithful accuracy (greedy eval
                 and sampled episodes) and the unfaithful share of the correct answers, kept
                 fraction, the influence scores s_i of every episode (symlog scale, kept /
                 dropped coloured), KL to the reference policy, policy and value losses, SFT loss. A panel appears only when the run
                 has its data, so SFT runs, --influence off runs, skipped updates, runs of
                 one iteration and runs without eval all draw.
    report.html  one static, self-contained page (inline CSS, the plots embedded as base64,
                 no script): the config, a table of the metrics per iteration (on arith with
                 the faithful accuracy of the sampled episodes and of the eval), and per
                 iteration the kept fraction and the K episodes with the lowest scores (the
                 most anti-aligned with the validation gradient, s_i = g_i . g_val < 0) and the
                 K with the highest, each with prompt, response, gold, reward, score, weight.
                 All model text is escaped: model output is untrusted.

Faithful accuracy (arith): the share of problems, or episodes, whose answer is correct AND
faithful (reasoning.py), em x (1 - the unfaithful share of the correct). Accuracy counts a right
answer reached by a wrong step; this does not. For the sampled episodes it is metrics.jsonl's
faithful_fraction; for the greedy eval, eval_faithful_accuracy, or for records written before
train.py logged that key, what `faithful_accuracy` computes from eval_accuracy and
eval_unfaithful_of_correct (compare.py reads it the same way).

Public functions: `write_plots(run_dir) -> Path`, `write_report(run_dir, top_k=3) -> Path`,
`load_run(run_dir) -> Run`, `faithful_accuracy(metrics_row) -> float | None`.
CLI: `python report.py RUN_DIR` (re)writes both files.
"""

import argparse
import base64
import html
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend
from matplotlib.ticker import MaxNLocator


# ----------------------------------------------------------------------------- reading a run

@dataclass
class Run:
    """What a run directory holds. Lists are empty and config is {} where a file is missing."""
    path: Path
    config: dict
    metrics: list[dict]   # one record per iteration; iteration 0 is the eval before training
    episodes: list[dict]  # one record per episode of every PPO iteration (none for SFT)
    data: dict            # data.json: where the data came from


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file, [] if it does not exist. A bad line fails with its file and line."""
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not a JSON record ({err.msg})") from err
    return records


def read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err


def load_run(run_dir) -> Run:
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    return Run(path=path, config=read_json(path / "config.json"), metrics=read_jsonl(path / "metrics.jsonl"),
               episodes=read_jsonl(path / "episodes.jsonl"), data=read_json(path / "data.json"))


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(iterations, values) of the metric records that have a finite number under `key`."""
    rows = [m for m in metrics if is_number(m.get(key))]
    return [m["iteration"] for m in rows], [float(m[key]) for m in rows]


def faithful_accuracy(row: dict) -> float | None:
    """The greedy eval's faithful accuracy in one metrics.jsonl record: the share of the evaluated
    problems whose answer is correct and faithful. train.py logs it as eval_faithful_accuracy;
    a record written before it did still holds the two numbers it is made of, so it is computed
    from them, eval_accuracy x (1 - eval_unfaithful_of_correct), and is 0 when no answer was
    correct (the unfaithful share is then None). None when the record has no evaluation or the
    task is not arith (train.py writes eval_unfaithful_of_correct on arith only)."""
    if "eval_faithful_accuracy" in row:
        return row["eval_faithful_accuracy"]
    accuracy = row.get("eval_accuracy")
    if accuracy is None or "eval_unfaithful_of_correct" not in row:
        return None
    unfaithful = row["eval_unfaithful_of_correct"]
    if unfaithful is None:           # no correct answer: nothing can be correct and faithful
        return 0.0 if accuracy == 0 else None
    return accuracy * (1 - unfaithful)


def with_faithful_accuracy(metrics: list[dict]) -> list[dict]:
    """The records, each with eval_faithful_accuracy filled in where faithful_accuracy() gives
    one, so that old and new run directories plot and tabulate from the same key."""
    out = []
    for m in metrics:
        value = faithful_accuracy(m)
        out.append(m if value is None else m | {"eval_faithful_accuracy": value})
    return out


def scores_by_iteration(episodes: list[dict]) -> dict[int, list[dict]]:
    """Episodes that carry an influence score, grouped by iteration (in file order)."""
    out: dict[int, list[dict]] = {}
    for e in episodes:
        if is_number(e.get("score")):
            out.setdefault(e["iteration"], []).append(e)
    return out


# ----------------------------------------------------------------------------- plots.png

def symlog_linthresh(values: list[float]) -> float:
    """Width of the linear band of the symlog axis: the power of ten at or below the 10th
    percentile of the non-zero |s_i|, so most scores fall on the log part whatever their scale."""
    magnitudes = sorted(abs(v) for v in values if v != 0)
    if not magnitudes:
        return 1.0
    return 10.0 ** math.floor(math.log10(magnitudes[len(magnitudes) // 10]))


def symlog_ticks(values: list[float], linthresh: float) -> list[float]:
    """0 and +-10^d for at most about five decades d from linthresh up to max |s_i| (every
    decade would crowd a small panel when the scores span ten orders of magnitude)."""
    low = round(math.log10(linthresh))
    high = max(low, math.ceil(math.log10(max([abs(v) for v in values] + [linthresh]))))
    decades = range(low, high + 1, max(1, math.ceil((high - low) / 4)))
    return [-(10.0 ** d) for d in reversed(decades)] + [0.0] + [10.0 ** d for d in decades]


def draw_lines(ax, metrics, keys_labels, ylabel):
    for key, label in keys_labels:
        x, y = series(metrics, key)
        if x:
            ax.plot(x, y, marker="o", markersize=3, label=label)
    ax.set_ylabel(ylabel)
    if len(keys_labels) > 1:
        ax.legend(fontsize=7)


def draw_eval(ax, metrics):
    rows = [m for m in metrics if is_number(m.get("eval_accuracy"))]
    x = [m["iteration"] for m in rows]
    y = [m["eval_accuracy"] for m in rows]
    err = [m["eval_stderr"] if is_number(m.get("eval_stderr")) else 0.0 for m in rows]
    ax.errorbar(x, y, yerr=err, marker="o", markersize=3, capsize=3)
    n = {m.get("eval_n") for m in rows}
    ax.set_ylabel("exact match" + (f" ({n.pop()} problems)" if len(n) == 1 else ""))
    ax.set_ylim(-0.05, 1.05)


def draw_faithful(ax, metrics):
    """Faithful accuracy of the greedy eval and of the sampled episodes, with the greedy eval
    accuracy dotted behind them: the gap between the two greedy curves is the share of problems
    answered right by a wrong step (metrics with eval_faithful_accuracy filled in)."""
    x, y = series(metrics, "eval_accuracy")
    if x:
        ax.plot(x, y, color="gray", linestyle=":", marker="o", markersize=2, label="greedy eval accuracy (all correct)")
    for key, label in (("eval_faithful_accuracy", "faithful accuracy (greedy eval)"),
                       ("faithful_fraction", "faithful accuracy (sampled episodes)")):
        x, y = series(metrics, key)
        if x:
            ax.plot(x, y, marker="o", markersize=3, label=label)
    ax.set_ylabel("correct and faithful / all")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)


def draw_kept(ax, metrics):
    x, y = series(metrics, "kept_fraction")
    ax.plot(x, y, marker="o", markersize=3)
    ax.set_ylabel("kept / all episodes")
    ax.set_ylim(-0.05, 1.05)


def draw_scores(ax, episodes):
    """Every episode's s_i as a dot at its iteration (spread sideways in file order, no
    randomness), kept ones (s_i > 0) and dropped ones in two colours."""
    groups = scores_by_iteration(episodes)
    kept_x, kept_y, dropped_x, dropped_y = [], [], [], []
    for it, group in groups.items():
        for k, e in enumerate(group):
            dx = 0.0 if len(group) == 1 else 0.6 * (k / (len(group) - 1) - 0.5)
            xs, ys = (kept_x, kept_y) if e.get("kept") else (dropped_x, dropped_y)
            xs.append(it + dx)
            ys.append(e["score"])
    ax.scatter(kept_x, kept_y, s=8, color="tab:green")
    ax.scatter(dropped_x, dropped_y, s=8, color="tab:red")
    linthresh = symlog_linthresh(kept_y + dropped_y)
    ax.set_yscale("symlog", linthresh=linthresh)
    ax.set_yticks(symlog_ticks(kept_y + dropped_y, linthresh))
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"s_i (symlog, linear within ±{linthresh:.0e})")


def draw_policy_loss(ax, metrics):
    x, y = series(metrics, "policy_loss")
    ax.plot(x, y, marker="o", markersize=3)
    skipped = [m["iteration"] for m in metrics if m.get("skipped")]
    for k, it in enumerate(skipped):
        ax.axvline(it, color="gray", linestyle=":", label="update skipped" if k == 0 else None)
    ax.set_ylabel("mean L_clip per episode")
    if skipped:
        ax.legend(fontsize=7)


def panels(run: Run) -> list[tuple[str, Callable]]:
    """(title, draw(ax)) for each panel the run has data for, in reading order."""
    m = with_faithful_accuracy(run.metrics)

    def has(key):
        return bool(series(m, key)[0])

    out = []
    if has("reward") or has("accuracy"):
        out.append(("reward and train accuracy",
                    lambda ax: draw_lines(ax, m, [("reward", "reward"), ("accuracy", "accuracy")], "mean per episode")))
    if has("eval_accuracy"):
        out.append(("greedy eval accuracy (± stderr)", lambda ax: draw_eval(ax, m)))
    if has("eval_faithful_accuracy") or has("faithful_fraction"):
        out.append(("faithful accuracy (correct and faithful)", lambda ax: draw_faithful(ax, m)))
    if has("unfaithful_of_correct") or has("eval_unfaithful_of_correct"):
        out.append(("unfaithful share of the correct answers",
                    lambda ax: draw_lines(ax, m, [("unfaithful_of_correct", "sampled episodes"),
                                                  ("eval_unfaithful_of_correct", "greedy eval")], "share")))
    if has("kept_fraction"):
        out.append(("kept fraction (s_i > 0)", lambda ax: draw_kept(ax, m)))
    if scores_by_iteration(run.episodes):
        out.append(("scores s_i per episode (green kept, red dropped)", lambda ax: draw_scores(ax, run.episodes)))
    if has("kl"):
        out.append(("KL to the reference", lambda ax: draw_lines(ax, m, [("kl", "kl")], "nats per response token")))
    if has("policy_loss") or any(r.get("skipped") for r in m):
        out.append(("policy loss (clipped surrogate)", lambda ax: draw_policy_loss(ax, m)))
    if has("value_loss"):
        out.append(("value loss", lambda ax: draw_lines(ax, m, [("value_loss", "value")], "mean L_V per episode")))
    if has("sft_loss"):
        out.append(("SFT loss", lambda ax: draw_lines(ax, m, [("sft_loss", "sft")], "NLL per reference token")))
    return out


def write_plots(run_dir) -> Path:
    """Draw plots.png in the run directory and return its path."""
    run = load_run(run_dir)
    todo = panels(run)
    columns = 3 if len(todo) > 2 else max(len(todo), 1)
    rows = max(1, math.ceil(len(todo) / columns))
    fig = Figure(figsize=(4.2 * columns, 3.0 * rows + 0.4), dpi=100, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, (title, draw) in zip(axes, todo):
        draw(ax)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in axes[len(todo):]:
        ax.set_axis_off()
    if not todo:
        axes[0].text(0.5, 0.5, "no metrics in this run yet", ha="center", va="center")
    fig.suptitle(f"{run.path.name}  ({run_kind(run.config)})", fontsize=11)
    out = run.path / "plots.png"
    tmp = run.path / "plots.png.tmp"      # whole, then renamed: a reader never sees half a picture
    fig.savefig(tmp, format="png")
    os.replace(tmp, out)
    return out


# ----------------------------------------------------------------------------- report.html

CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 1em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; } h3 { font-size: 1em; }
table { border-collapse: collapse; font-size: 0.85em; } td, th { border: 1px solid #ddd; padding: 2px 6px; }
th { background: #f3f3f3; } td.num { text-align: right; font-family: monospace; }
img { max-width: 100%; }
.episode { border: 1px solid #ccc; border-radius: 4px; margin: 0.5em 0; padding: 0.4em 0.6em; }
.episode.dropped { border-left: 6px solid #c0392b; } .episode.kept { border-left: 6px solid #27ae60; }
.facts { font-family: monospace; font-size: 0.85em; } .label { font-size: 0.7em; color: #888; margin-top: 0.3em; }
pre { white-space: pre-wrap; word-break: break-word; background: #f7f7f7; padding: 0.4em; margin: 0.2em 0;
      font-size: 0.85em; max-height: 20em; overflow: auto; }
pre.prompt { color: #555; max-height: 8em; }
.note { color: #666; font-style: italic; }
"""

TABLE_COLUMNS = [  # (metrics key, header, format)
    ("reward", "reward", "{:.3f}"), ("accuracy", "train acc", "{:.3f}"),
    ("faithful_fraction", "faithful acc (sampled episodes)", "{:.3f}"), ("kept_fraction", "kept frac", "{:.2f}"),
    ("score_mean", "score mean", "{:+.2e}"), ("score_min", "score min", "{:+.2e}"),
    ("score_max", "score max", "{:+.2e}"), ("kl", "kl", "{:.4f}"), ("policy_loss", "pg", "{:+.4f}"),
    ("value_loss", "vf", "{:.4f}"), ("sft_loss", "sft loss", "{:.4f}"), ("eval_accuracy", "eval acc", "{:.3f}"),
    ("eval_stderr", "± stderr", "{:.3f}"), ("eval_faithful_accuracy", "eval faithful acc", "{:.3f}"),
]


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def fmt(x, spec: str = "{}") -> str:
    return esc(spec.format(x)) if is_number(x) else esc("-" if x is None else x)


def run_kind(config: dict) -> str:
    if not config:
        return "no config.json"
    if config.get("algo") == "sft":
        return "SFT"
    if config.get("influence") == "off":
        return "plain PPO (--influence off)"
    kind = "I-PPO"
    if config.get("random_filter"):
        kind += ", random-filter control"
    elif config.get("reweight") is False:
        kind += ", binary filter"
    return kind


def config_section(run: Run) -> str:
    c = run.config
    summary = [("run", run_kind(c))] + [(k, c[k]) for k in (
        "model", "dataset", "iterations", "prompts_per_iter", "samples_per_prompt", "max_new_tokens",
        "lr", "clip_eps", "kl_beta", "val_size", "seed") if k in c]
    if run.data:
        summary += [("data", f"train: {run.data.get('train', '?')}; test: {run.data.get('test', '?')}")]
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary)
    full = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in c.items())
    return (f"<h2>Config</h2><table>{rows}</table>"
            f"<details><summary>every setting (config.json)</summary><table>{full}</table></details>")


def metrics_table(metrics: list[dict]) -> str:
    columns = [c for c in TABLE_COLUMNS if any(c[0] in m for m in metrics)]
    if not metrics:
        return "<h2>Metrics</h2><p class='note'>metrics.jsonl is empty or missing.</p>"
    head = "<tr><th>iteration</th><th>kept</th>" + "".join(f"<th>{esc(h)}</th>" for _, h, _ in columns) + "</tr>"
    body = ""
    for m in metrics:
        kept = f"{m['kept']}/{m['episodes']}" if "kept" in m and "episodes" in m else "-"
        if m.get("skipped"):
            kept += " (update skipped)"
        cells = "".join(f"<td class='num'>{fmt(m.get(k), spec)}</td>" for k, _, spec in columns)
        body += f"<tr><td class='num'>{fmt(m.get('iteration'))}</td><td class='num'>{esc(kept)}</td>{cells}</tr>"
    return f"<h2>Metrics per iteration</h2><table>{head}{body}</table>"


def plots_section(run: Run) -> str:
    png = run.path / "plots.png"
    if not png.exists():
        return ("<h2>Plots</h2><p class='note'>no plots.png in this run directory "
                "(<code>python report.py RUN_DIR</code> draws it).</p>")
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f"<h2>Plots</h2><img alt='plots.png' src='data:image/png;base64,{data}'>"


def episode_card(e: dict) -> str:
    """One episode: its numbers, the prompt and the response (both escaped), red if dropped."""
    facts = (f"score {fmt(e.get('score'), '{:+.3e}')} | reward {fmt(e.get('reward'), '{:.3f}')} | "
             f"weight {fmt(e.get('weight'), '{:.3g}')} | {'kept' if e.get('kept') else 'dropped'}"
             f"{' | truncated' if e.get('truncated') else ''} | gold {fmt(e.get('gold'))}")
    return (f"<div class='episode {'kept' if e.get('kept') else 'dropped'}'><div class='facts'>{facts}</div>"
            f"<div class='label'>prompt</div><pre class='prompt'>{esc(e.get('prompt', ''))}</pre>"
            f"<div class='label'>response</div><pre class='response'>{esc(e.get('response', ''))}</pre></div>")


def lowest_and_highest(group: list[dict], k: int) -> tuple[list[dict], list[dict]]:
    """The k lowest-scored episodes (ascending) and the k highest (descending), no episode in
    both: with fewer than 2k episodes the lower half goes to the first list. Ties keep file order."""
    order = sorted(range(len(group)), key=lambda i: group[i]["score"])
    n_low, n_high = min(k, (len(group) + 1) // 2), min(k, len(group) // 2)
    low = [group[i] for i in order[:n_low]]
    high = [group[i] for i in reversed(order[len(order) - n_high:])] if n_high else []
    return low, high


def iteration_section(it: int, m: dict, group: list[dict], k: int) -> str:
    head = f"<h2 id='iteration-{it}'>Iteration {it}</h2>"
    facts = []
    if "kept" in m and "episodes" in m:
        facts.append(f"kept {m['kept']}/{m['episodes']} episodes ({fmt(m.get('kept_fraction'), '{:.2f}')})")
    elif group:
        kept = sum(bool(e.get("kept")) for e in group)
        facts.append(f"kept {kept}/{len(group)} episodes ({kept / len(group):.2f})")
    if m.get("skipped"):
        facts.append("every episode scored &lt;= 0: update skipped")
    if is_number(m.get("eval_accuracy")):
        facts.append(f"eval accuracy {fmt(m['eval_accuracy'], '{:.3f}')}")
    if is_number(m.get("eval_faithful_accuracy")):   # m: with_faithful_accuracy filled it in for old runs
        facts.append(f"eval faithful accuracy {fmt(m['eval_faithful_accuracy'], '{:.3f}')}")
    body = f"<p>{'; '.join(facts)}</p>" if facts else ""
    if not group:
        return head + body + "<p class='note'>no scored episodes in this iteration.</p>"
    low, high = lowest_and_highest(group, k)
    body += f"<h3>Lowest scores (most anti-aligned with the validation gradient), {len(low)} of {len(group)}</h3>"
    body += "".join(episode_card(e) for e in low)
    if high:
        body += f"<h3>Highest scores, {len(high)} of {len(group)}</h3>"
        body += "".join(episode_card(e) for e in high)
    return head + body


def write_report(run_dir, top_k: int = 3) -> Path:
    """Write report.html in the run directory (embedding plots.png if present); return its path."""
    if top_k < 1:
        raise ValueError(f"top_k: must be >= 1 (got {top_k})")
    run = load_run(run_dir)
    groups = scores_by_iteration(run.episodes)
    metrics = with_faithful_accuracy(run.metrics)
    by_iteration = {m["iteration"]: m for m in metrics if "iteration" in m}
    iterations = sorted((set(by_iteration) - {0}) | set(groups) | {e["iteration"] for e in run.episodes})
    if groups:
        intro = (f"<p>Per iteration, the {top_k} episodes with the lowest influence scores "
                 "s<sub>i</sub> = g<sub>i</sub> · g<sub>val</sub> (s<sub>i</sub> &lt; 0: the PPO step on this "
                 "episode would raise the validation loss) and the "
                 f"{top_k} with the highest. Green: kept for the update (s<sub>i</sub> &gt; 0, unless "
                 "--random-filter), with the weight shown; red: dropped (weight 0).</p>")
    elif run.config.get("algo") == "sft":
        intro = "<p class='note'>An SFT run: no rollouts, so no episodes and no influence scores.</p>"
    else:
        intro = ("<p class='note'>This run has no influence scores (--influence off, or no episodes yet): "
                 "every episode was kept with weight 1, so there are no anti-aligned episodes to show.</p>")
    # Without scores there is nothing per iteration beyond the metrics table.
    sections = "".join(iteration_section(it, by_iteration.get(it, {}), groups.get(it, []), top_k)
                       for it in iterations) if groups else ""
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(run.path.name)}: I-PPO run report</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(run.path.name)}: {esc(run_kind(run.config))}</h1>"
            f"{config_section(run)}{metrics_table(metrics)}{plots_section(run)}"
            f"<h2>Episodes</h2>{intro}{sections}</body></html>\n")
    out = run.path / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="(Re)write plots.png and report.html of a run directory.")
    parser.add_argument("run_dir", help="a directory written by train.py (config.json, metrics.jsonl, episodes.jsonl)")
    parser.add_argument("--top-k", type=int, default=3, help="lowest and highest scored episodes shown per iteration")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.json").exists():
        raise SystemExit(f"{run_dir}: no metrics.jsonl or config.json there (not a run directory written by train.py)")
    if args.top_k < 1:
        raise SystemExit(f"--top-k: must be >= 1 (got {args.top_k})")
    print(f"[report] {write_plots(run_dir)}")
    print(f"[report] {write_report(run_dir, args.top_k)}")


if __name__ == "__main__":
    main()
