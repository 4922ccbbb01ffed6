"""report.py on run directories written by hand: plots.png is a real picture, report.html escapes
model text and lists the lowest and highest scored episodes of each iteration in order, SFT and
unscored runs draw too, and the page renders in headless Chromium (skipped without it)."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from matplotlib.figure import Figure

from report import faithful_accuracy, load_run, panels, write_plots, write_report

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"
# Influence scores of each iteration's episodes, spanning many orders of magnitude.
SCORES = {
    1: [-6.7, 1.2e-2, -3.0e-5, 4.0e-7],                              # 4 episodes: 2 lowest, 2 highest
    2: [-1.0e-3, -2.0e-1, 0.0, -5.0e-6],                             # nothing > 0: update skipped
    3: [3.0e-1, -8.0e-4, 2.5, -1.5e1, 7.0e-9, -2.0e-2, 6.0e-3, 0.0],  # 8 episodes: 3 lowest, 3 highest
}


def response(it, i):
    # The most negative episode of iteration 1 says something a browser would run.
    return f"reply it{it} ep{i}: " + (SCRIPT if (it, i) == (1, 0) else "the answer is 42")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def make_run(root: Path, kind="ippo", iterations=3, with_eval=True, dataset="gsm8k") -> Path:
    """A run directory as train.py writes it: kind is ippo, plain (--influence off) or sft. On
    arith the records have the reasoning metrics: the first eval as written before train.py
    logged eval_faithful_accuracy (faithful accuracy 0.1 x (1 - 0.5) = 0.05), the last one with it."""
    run = root / f"run-{kind}-{dataset}"
    run.mkdir()
    config = {"model": "tiny", "dataset": dataset, "algo": "sft" if kind == "sft" else "ppo",
              "influence": "off" if kind == "plain" else "on", "reweight": True, "random_filter": False,
              "iterations": iterations, "prompts_per_iter": 2, "samples_per_prompt": 4, "seed": 0}
    (run / "config.json").write_text(json.dumps(config, indent=2))
    metrics = [{"iteration": 0, "eval_accuracy": 0.1, "eval_stderr": 0.05, "eval_n": 40}] if with_eval else []
    if with_eval and dataset == "arith":
        metrics[0]["eval_unfaithful_of_correct"] = 0.5
    episodes = []
    for it in range(1, iterations + 1):
        if kind == "sft":
            metrics.append({"iteration": it, "sft_loss": 2.0 / it, "tokens": 300, "seconds": {"update": 1.0}})
            continue
        scores = SCORES[it] if kind == "ippo" else [None] * 4
        kept = [s is None or s > 0 for s in scores]
        total = sum(s for s, k in zip(scores, kept) if k and s is not None)
        weights = [1.0 if s is None else (s / (total / sum(kept)) if k else 0.0) for s, k in zip(scores, kept)]
        row = {"iteration": it, "reward": 0.25 * it, "accuracy": 0.1 * it, "truncated": 0.25, "response_tokens": 60,
               "episodes": len(scores), "kept": sum(kept), "kept_fraction": sum(kept) / len(scores), "kl": 0.001 * it}
        if kind == "ippo":
            row |= {"score_mean": float(np.mean(scores)), "score_min": min(scores), "score_max": max(scores)}
        row |= {"skipped": True} if not any(kept) else {"policy_loss": 0.1 / it, "value_loss": 0.01, "entropy": 2.0}
        if dataset == "arith":
            row |= {"faithful_fraction": 0.05 * it, "unfaithful_fraction": 0.05 * it, "unfaithful_of_correct": 0.5}
        if with_eval and it == iterations:
            row |= {"eval_accuracy": 0.2, "eval_stderr": 0.06, "eval_n": 40}
            if dataset == "arith":
                row |= {"eval_unfaithful_of_correct": 0.25, "eval_faithful_accuracy": 0.15}
        metrics.append(row)
        episodes += [{"iteration": it, "prompt": f"question {it}.{i // 2} & <b>", "gold": "42",
                      "response": response(it, i), "reward": 1.0 if i == 1 else 0.0, "truncated": False,
                      "score": s, "kept": k, "weight": w}
                     for i, (s, k, w) in enumerate(zip(scores, kept, weights))]
    write_jsonl(run / "metrics.jsonl", metrics)
    if kind != "sft":
        write_jsonl(run / "episodes.jsonl", episodes)
    return run


def assert_png(path: Path, min_width=300, min_height=200):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    image = matplotlib.image.imread(path)
    assert image.shape[0] >= min_height and image.shape[1] >= min_width, image.shape
    return image


def section(page: str, it: int) -> str:
    start = page.index(f"id='iteration-{it}'")
    end = page.find("id='iteration-", start + 1)
    return page[start:end if end > 0 else len(page)]


def test_plots_png_is_a_picture(tmp_path):
    run = make_run(tmp_path)
    path = write_plots(run)
    assert path == run / "plots.png"
    image = assert_png(path, min_width=1000, min_height=500)  # 3 x 3 panels of about 420 x 300 px
    assert path.stat().st_size > 20_000
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 16


def test_report_escapes_model_text(tmp_path):
    run = make_run(tmp_path)
    write_plots(run)
    page = write_report(run).read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "question 1.0 &amp; &lt;b&gt;" in page and "<b>" not in page
    assert "src='data:image/png;base64," in page  # plots.png embedded, nothing fetched
    assert "http://" not in page and "https://" not in page


def test_report_lists_lowest_and_highest_scores_per_iteration_in_order(tmp_path):
    page = write_report(make_run(tmp_path)).read_text()
    # (iteration, episode indices expected: lowest ascending, then highest descending)
    expected = {1: [0, 2, 1, 3], 2: [1, 0, 2, 3], 3: [3, 5, 1, 2, 0, 6]}
    for it, order in expected.items():
        text = section(page, it)
        positions = [text.find(f"reply it{it} ep{i}:") for i in order]
        assert all(p > 0 for p in positions), (it, positions)
        assert positions == sorted(positions), (it, positions)
        shown = {i for i in range(len(SCORES[it])) if f"reply it{it} ep{i}:" in text}
        assert shown == set(order), (it, shown)
    assert "kept 0/4" in section(page, 2) and "update skipped" in section(page, 2)
    assert "kept 4/8 episodes (0.50)" in section(page, 3)
    assert "+2.500e+00" in section(page, 3) and "-1.500e+01" in section(page, 3)


@pytest.mark.parametrize("kind, iterations, with_eval", [("sft", 3, True), ("plain", 2, True),
                                                         ("ippo", 1, False), ("plain", 1, False)])
def test_sft_unscored_and_one_iteration_runs(tmp_path, kind, iterations, with_eval):
    run = make_run(tmp_path, kind, iterations, with_eval)
    assert_png(write_plots(run))
    page = write_report(run).read_text()
    assert "<script" not in page.lower()
    if kind == "sft":
        assert "An SFT run" in page and "sft loss" in page
    elif kind == "plain":
        assert "no influence scores" in page and "id='iteration-" not in page
    else:
        assert "reply it1 ep0:" in page


def test_empty_run_directory_and_a_bad_line(tmp_path):
    assert_png(write_plots(tmp_path), min_width=100, min_height=100)
    assert "metrics.jsonl is empty or missing" in write_report(tmp_path).read_text()
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1, "rew\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        write_plots(tmp_path)


def test_cli_writes_both_files(tmp_path):
    run = make_run(tmp_path)
    done = subprocess.run([sys.executable, str(ROOT / "report.py"), str(run)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert (run / "plots.png").exists() and (run / "report.html").exists()
    bad = subprocess.run([sys.executable, str(ROOT / "report.py"), str(tmp_path / "nowhere")], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0 and "not a run directory" in bad.stderr


def test_report_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not on PATH (Debian: apt-get install chromium): report.html rendering not checked")
    run = make_run(tmp_path)
    write_plots(run)
    page = write_report(run)
    shot = tmp_path / "report.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                           "--window-size=1200,1600", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=300)
    assert shot.exists(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}"
    image = assert_png(shot, min_width=1200, min_height=1600)
    colours = np.unique((image[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 16, f"the screenshot is (nearly) blank: {len(colours)} distinct colours"


def test_plots_png_is_redrawn_at_every_evaluation(tiny_dir, tmp_path, monkeypatch):
    """A student who opens plots.png mid-run sees the curve so far: train.main redraws it after
    every evaluation (and once more at the end)."""
    import train
    drawn = []
    real = train.write_plots
    monkeypatch.setattr(train, "write_plots", lambda run_dir: drawn.append(
        sum(1 for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines())) or real(run_dir))
    train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--iterations", "4", "--eval-every", "2",
                "--prompts-per-iter", "2", "--samples-per-prompt", "2", "--max-new-tokens", "4", "--eval-limit", "2",
                "--eval-max-new-tokens", "4", "--val-size", "2", "--no-progress", "--data-source", "local"])
    assert drawn == [3, 5]                  # after iteration 2 (rows 0-2), and at the end (rows 0-4)
    assert (tmp_path / "r" / "plots.png").stat().st_size > 0 and not (tmp_path / "r" / "plots.png.tmp").exists()


def test_filter_signal_figure_is_drawn_from_the_table_it_wrote(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "experiments" / "filter-signal"))
    import filter_signal
    table = tmp_path / "signal.md"
    table.write_text("Some prose.\n\n"
                     "| point | variant | AUC correct vs wrong | AUC faithful vs unfaithful (correct) | AUC not flipped "
                     "(noise 0.2) | kept: faithful / unfaithful / wrong | kept: not flipped / flipped |\n"
                     "|---|---|---|---|---|---|---|\n"
                     "| start | default | 0.62 [0.57, 0.67] | - | 0.61 [0.55, 0.66] | 0.73 / - / 0.55 | 0.58 / 0.41 |\n"
                     "| end | default | 0.46 [0.42, 0.51] | 0.56 [0.48, 0.65] | 0.55 [0.49, 0.61] | 0.60 / 0.49 / 0.57 | 0.56 / 0.48 |\n")
    rows = filter_signal.read_table(table)
    assert [(r["point"], r["variant"]) for r in rows] == [("start", "default"), ("end", "default")]
    assert rows[0]["correct vs wrong"] == (0.62, 0.57, 0.67)
    assert rows[0]["faithful vs unfaithful (among correct)"] is None
    filter_signal.write_figure(rows, tmp_path / "signal.png")
    assert (tmp_path / "signal.png").stat().st_size > 1000
    (tmp_path / "prose.md").write_text("no table here\n")
    with pytest.raises(SystemExit, match="prose.md"):
        filter_signal.read_table(tmp_path / "prose.md")


def test_by_prompt_tells_a_filter_that_keeps_whole_prompts_from_an_independent_one(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "experiments" / "fair-test"))
    import fair_test

    def episodes(keep):   # 4 prompts x 4 samples; prompts 0, 1 all correct, 2 all wrong, 3 mixed
        rewards = [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]
        return [{"iteration": 1, "prompt": f"q{j}", "reward": float(r), "kept": keep(j, i), "score": float(j + 0.1 * i)}
                for j, rs in enumerate(rewards) for i, r in enumerate(rs)]

    whole = fair_test.by_prompt(episodes(lambda j, i: j in (0, 3) if j != 3 else i < 2))
    assert whole["same_all_or_none"] == 1.0
    assert whole["mixed_kept_correct"] == 1.0                 # prompt 3 kept exactly its two correct samples
    p = 6 / 16                                                # prompt 0 and two samples of prompt 3 kept
    assert whole["same_all_or_none_independent"] == pytest.approx(p ** 4 + (1 - p) ** 4)
    assert whole["mixed_kept_correct_independent"] == pytest.approx(p * p * (1 - p) * (1 - p))
    assert whole["score_between_prompts"] > 0.9               # the score is mostly the prompt's index
    mixed = fair_test.by_prompt(episodes(lambda j, i: i % 2 == 0))
    assert mixed["same_all_or_none"] == 0.0 and mixed["mixed_kept_correct"] == 0.0


# ----------------------------------------------------------------------------- faithful accuracy (arith)

@pytest.mark.parametrize("row, expected", [
    ({"eval_accuracy": 0.5, "eval_unfaithful_of_correct": 0.2, "eval_faithful_accuracy": 0.4}, 0.4),  # logged
    ({"eval_accuracy": 0.5, "eval_unfaithful_of_correct": 0.2}, 0.4),          # older record: 0.5 x (1 - 0.2)
    ({"eval_accuracy": 0.3, "eval_unfaithful_of_correct": 1.0}, 0.0),          # every correct answer unfaithful
    ({"eval_accuracy": 0.0, "eval_unfaithful_of_correct": None}, 0.0),         # nothing correct
    ({"eval_accuracy": 0.5}, None),                                            # not arith: no reasoning labels
    ({"iteration": 3, "faithful_fraction": 0.2, "unfaithful_of_correct": 0.5}, None),   # no eval in this record
])
def test_faithful_accuracy_of_a_metrics_record(row, expected):
    assert faithful_accuracy(row) == (None if expected is None else pytest.approx(expected))


def faithful_panel_lines(run):
    """{label: (x, y)} of the faithful accuracy panel, drawn on a figure of its own; None if absent."""
    drawn = [draw for title, draw in panels(load_run(run)) if title.startswith("faithful accuracy")]
    if not drawn:
        return None
    ax = Figure().subplots()
    drawn[0](ax)
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}


def metrics_table_cells(page: str) -> list[dict]:
    """The report's metrics table as one {header: cell text} per row."""
    table = page.split("<h2>Metrics per iteration</h2>")[1].split("</table>")[0]
    head, *rows = table.split("</tr>")[:-1]
    headers = re.findall(r"<th>(.*?)</th>", head)
    return [dict(zip(headers, re.findall(r"<td class='num'>(.*?)</td>", r))) for r in rows]


def test_faithful_accuracy_panel_and_columns_on_arith(tmp_path):
    run = make_run(tmp_path, dataset="arith")
    lines = faithful_panel_lines(run)
    eval_x, eval_y = lines["faithful accuracy (greedy eval)"]
    assert eval_x == [0, 3] and eval_y == pytest.approx([0.05, 0.15])        # the old record's, computed
    sampled_x, sampled_y = lines["faithful accuracy (sampled episodes)"]
    assert sampled_x == [1, 2, 3] and sampled_y == pytest.approx([0.05, 0.10, 0.15])
    assert lines["greedy eval accuracy (all correct)"][1] == pytest.approx([0.1, 0.2])
    assert_png(write_plots(run), min_width=1000, min_height=700)            # 9 panels: 3 rows of 3
    page = write_report(run).read_text()
    assert "<th>faithful acc (sampled episodes)</th>" in page and "<th>eval faithful acc</th>" in page
    table = metrics_table_cells(page)
    assert [r["eval faithful acc"] for r in table] == ["0.050", "-", "-", "0.150"]   # iterations 0 to 3
    assert [r["faithful acc (sampled episodes)"] for r in table] == ["-", "0.050", "0.100", "0.150"]
    assert "eval faithful accuracy 0.150" in section(page, 3)


def test_no_faithful_accuracy_off_arith(tmp_path):
    run = make_run(tmp_path)
    assert faithful_panel_lines(run) is None
    assert "faithful" not in write_report(run).read_text()
