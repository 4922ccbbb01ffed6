"""Recipes as files: every file in configs/ loads, the README's commands parse, the tiny recipe is
the one the learning runs used, and a bad file is refused naming the file, the line and the key."""
import dataclasses
import re
import shlex
import sys
from pathlib import Path

import pytest

from config import Config, parse_config

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "configs").glob("*.toml"))
RECORDED = ("recipe", "overrides")           # fields that say how a config was given, not what it is


def settings(cfg: Config) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RECORDED}


def test_there_are_recipes():
    assert {p.name for p in RECIPES} >= {"tiny.toml", "gsm8k-270m.toml", "paper.toml"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_loads(path):
    cfg = parse_config([str(path)])
    assert cfg.recipe == str(path) and cfg.overrides == ""


# The flags the learning runs carried before they read the recipe files: today's world, and the
# first world's (the learning runs, the comparison and the cost pairs measured in it).
LEARNING_RUNS = {
    "tiny.toml": ["--model", "tiny-arith", "--dataset", "arith", "--arith-terms", "3", "--prompts-per-iter", "32",
                  "--samples-per-prompt", "4", "--temperature", "0.5", "--max-new-tokens", "40", "--lr", "1e-3",
                  "--kl-beta", "0", "--val-size", "256", "--val-batch-size", "64", "--minibatch-size", "128",
                  "--micro-batch-size", "128", "--gen-batch-size", "128", "--eval-every", "10", "--eval-limit", "500",
                  "--eval-max-new-tokens", "40"],
    "tiny-v1.toml": ["--model", "tiny-arith-v1", "--dataset", "arith", "--prompts-per-iter", "32",
                     "--samples-per-prompt", "4", "--temperature", "0.5", "--max-new-tokens", "40", "--lr", "1e-3",
                     "--kl-beta", "0", "--minibatch-size", "128", "--micro-batch-size", "32", "--gen-batch-size", "64",
                     "--eval-every", "10", "--eval-limit", "500", "--eval-max-new-tokens", "40"],
}


@pytest.mark.parametrize("name", LEARNING_RUNS)
def test_the_tiny_recipes_are_the_learning_runs_recipes(name):
    import importlib.util
    script = ROOT / "experiments" / "tiny-learns" / "tiny_learns.py"
    spec = importlib.util.spec_from_file_location("tiny_learns_experiment", script)
    tiny_learns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_learns)
    assert tiny_learns.RECIPE == ROOT / "configs" / "tiny.toml"      # the runs read the file, no copy of it
    flags = [*LEARNING_RUNS[name], "--iterations", str(tiny_learns.ITERATIONS), *tiny_learns.METHODS["ppo"]]
    assert settings(parse_config([str(ROOT / "configs" / name)])) == settings(parse_config(flags))


def test_the_paper_recipe_is_the_mission_command():
    assert settings(parse_config([str(ROOT / "configs/paper.toml")])) == \
        settings(parse_config(["--model", "google/gemma-3-1b-it", "--dataset", "gsm8k"]))


def readme_train_commands() -> list[list[str]]:
    """The arguments of every `train.py` command in the README's bash blocks."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            words = shlex.split(line) if "train.py" in line else []
            if words:
                commands.append(words[words.index("train.py") + 1:])
    return commands


def test_every_readme_train_command_parses(monkeypatch):
    monkeypatch.chdir(ROOT)
    commands = readme_train_commands()
    assert len(commands) >= 3 and ["configs/tiny.toml"] in commands
    for argv in commands:
        if "--resume" in argv:
            continue                         # needs a run directory
        parse_config(argv)


def test_the_first_command_is_short():
    first = readme_train_commands()[0]
    assert len(first) <= 3, first


def test_flags_override_the_recipe_and_are_recorded():
    cfg = parse_config([str(ROOT / "configs/tiny.toml"), "--influence", "on", "--seed", "2"])
    assert cfg.influence == "on" and cfg.seed == 2 and cfg.lr == 1e-3 and cfg.iterations == 150
    assert cfg.overrides == "--influence on --seed 2"
    same = parse_config(["--recipe", str(ROOT / "configs/tiny.toml"), "--influence", "on", "--seed", "2"])
    assert same == cfg


def test_recipe_values_are_not_flags_given(tmp_path):
    """A recipe that sets a flag the other settings make inert is the recipe's business; the
    same flag typed on the command line is refused (config.refuse_inert_flags)."""
    path = tmp_path / "r.toml"
    path.write_text('advantage = "grpo"\n')
    parse_config([str(path)])
    with pytest.raises(SystemExit, match="--vf-coef"):
        parse_config([str(path), "--vf-coef", "0.5"])


@pytest.mark.parametrize("content,message", [
    ('lr = 1e-3\nlearning_rate = 3\n', r"r\.toml, line 2: unknown setting 'learning_rate'"),
    ('lr = 1e-3\n\narith-terms = 3\n', r"line 3: unknown setting 'arith-terms' \(write 'arith_terms'"),
    ('iterations = "ten"\n', r"line 1: iterations should be int"),
    ('iterations = true\n', r"line 1: iterations should be int"),
    ('influence = "maybe"\n', r"line 1: influence = 'maybe' is not one of \['on', 'off'\]"),
    ('lr = \n', r"r\.toml: not valid TOML: .*line 1"),
    ('run_dir = "x"\n', r"line 1: unknown setting 'run_dir'"),
    ('[schedule]\nlr = 1\n', r"line 1: unknown setting 'schedule'"),
])
def test_a_bad_recipe_is_refused_naming_file_line_and_key(tmp_path, content, message):
    path = tmp_path / "r.toml"
    path.write_text(content)
    with pytest.raises(SystemExit, match=message):
        parse_config([str(path)])


def test_a_missing_recipe_is_refused():
    with pytest.raises(SystemExit, match="no such file"):
        parse_config(["configs/nope.toml"])


def test_the_gsm8k_recipe_is_the_cost_benchmarks():
    sys.path.insert(0, str(ROOT / "bench"))
    from ippo_cost import GSM8K_270M
    flags = [a for a in GSM8K_270M if a not in ("--no-progress", "--no-plots")]
    expected = settings(parse_config(flags + ["--iterations", "5", "--eval-every", "5", "--eval-limit", "10",
                                              "--eval-max-new-tokens", "128"]))
    assert settings(parse_config([str(ROOT / "configs/gsm8k-270m.toml")])) == expected
