"""The generated arith task: deterministic, splits that never overlap, golds and reference
solutions checked against arithmetic redone here from the question text, difficulty knobs,
bad knobs refused naming the flag, and a tiny end-to-end run."""
import json
import re

import pytest

import train
from tasks import generate_arith, load_task, make_prompt
from reward import reward_fn

# The oracle's own reading of a question: the word before each number says what it does.
# Written here, not taken from reward.py, so a generator that mixed up a verb would fail.
START_WORDS = {"has", "holds", "with"}
ADD_WORDS = {"buys", "finds", "given", "in", "adds", "up", "earns", "paid", "back"}
SUB_WORDS = {"away", "loses", "sells", "out", "removes", "off", "spends"}
VAL_SIZE = 32   # train.py's default --val-size: the validation rows are the last 32 train rows


def parse_question(question: str) -> list[int]:
    """The signed numbers of a question, in order: [23, 45, -12] for 23 + 45 - 12."""
    pairs = re.findall(r"([A-Za-z]+) (\d+)\b", question)
    assert len(pairs) == len(re.findall(r"\d+", question)), f"a number without a word before it: {question}"
    (first_word, first), *steps = pairs
    assert first_word in START_WORDS, question
    signed = [int(first)]
    for word, n in steps:
        assert word in ADD_WORDS | SUB_WORDS, f"unknown verb {word!r} in: {question}"
        signed.append(int(n) if word in ADD_WORDS else -int(n))
    return signed


def key(example) -> tuple[int, ...]:
    return tuple(parse_question(example.question))


def splits(**knobs):
    train_rows = load_task("arith", "train", **knobs).examples
    return {"train": train_rows[:-VAL_SIZE], "validation": train_rows[-VAL_SIZE:],
            "test": load_task("arith", "test", **knobs).examples}


def test_same_seed_same_rows_other_seed_other_rows():
    a = generate_arith("train", seed=0, n=300)
    assert a == generate_arith("train", seed=0, n=300)
    b = generate_arith("train", seed=1, n=300)
    assert len({e.question for e in a} & {e.question for e in b}) < 30   # of ~12000 problems: chance overlap
    assert [e.question for e in a] != [e.question for e in b]
    assert load_task("arith", "test").examples == load_task("arith", "test").examples


@pytest.mark.parametrize("knobs", [{}, {"arith_digits": 1, "arith_terms": 3}, {"arith_digits": 3, "arith_terms": 4}])
def test_splits_are_pairwise_disjoint_by_text_and_by_numbers(knobs):
    parts = splits(**knobs)
    for name, rows in parts.items():
        assert rows, name
        assert len({e.question for e in rows}) == len(rows), f"{name}: a question twice"
        assert len({key(e) for e in rows}) == len(rows), f"{name}: the same numbers twice"
    names = list(parts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not {e.question for e in parts[a]} & {e.question for e in parts[b]}, (a, b)
            assert not {key(e) for e in parts[a]} & {key(e) for e in parts[b]}, (a, b)


def test_no_test_problem_is_in_a_train_split_of_another_seed():
    train_keys = {key(e) for seed in (0, 1, 2) for e in generate_arith("train", seed=seed)}
    test_keys = {key(e) for seed in (0, 3) for e in generate_arith("test", seed=seed)}
    assert len(train_keys) > 8000 and len(test_keys) > 500   # most of the ~11000 train-side problems
    assert not train_keys & test_keys


def test_default_sizes_and_source():
    train_task, test_task = load_task("arith", "train"), load_task("arith", "test", "local")
    assert (len(train_task.examples), len(test_task.examples)) == (5000, 500)
    assert train_task.source.startswith("generated: arith(seed=0, digits=2, terms=2)")
    assert train_task.examples[7].where == "generated:arith(seed=0,digits=2,terms=2)/train[7]"


@pytest.mark.parametrize("knobs", [{}, {"arith_digits": 4, "arith_terms": 5}])
def test_every_gold_is_the_arithmetic_of_the_question(knobs):
    for split in ("train", "test"):
        for e in load_task("arith", split, **knobs).examples:
            signed = parse_question(e.question)
            running = 0
            for n in signed:          # nobody gives away more than there is
                running += n
                assert running >= 0, e.question
            assert e.gold == str(sum(signed)), e.question


def test_every_reference_solution_earns_reward_one_and_shows_correct_steps():
    for e in splits()["validation"] + splits(arith_digits=3, arith_terms=4)["validation"] + \
            load_task("arith", "train").examples[:500]:
        assert reward_fn(e.solution, e.gold, "arith") == 1.0
        assert reward_fn(e.solution.replace(f"#### {e.gold}", f"#### {int(e.gold) + 1}"), e.gold, "arith") == 0.0
        *steps, final = e.solution.splitlines()
        assert final == f"#### {e.gold}"
        numbers = [abs(n) for n in parse_question(e.question)]
        total = numbers[0]
        assert len(steps) == len(numbers) - 1
        for step, n in zip(steps, numbers[1:]):
            a, sign, b, result = re.fullmatch(r"(\d+) ([+-]) (\d+) = (\d+)\.", step).groups()
            assert (int(a), int(b)) == (total, n)
            total = int(a) + int(b) if sign == "+" else int(a) - int(b)
            assert int(result) == total
        assert str(total) == e.gold


def test_wrong_and_missing_answers_earn_nothing():
    e = load_task("arith", "test").examples[0]
    assert reward_fn(f"#### {e.gold}", e.gold, "arith") == 1.0
    assert reward_fn("I am not sure.", e.gold, "arith") == 0.0
    assert reward_fn(f"#### {int(e.gold) + 10}", e.gold, "arith") == 0.0
    prompt = make_prompt(e.question, "arith")
    assert prompt == f"Question: {e.question}\nAnswer:"   # no instruction: the tiny world is trained on this


@pytest.mark.parametrize("digits,terms", [(1, 2), (2, 2), (3, 3), (5, 2), (2, 6), (12, 8)])
def test_knobs_set_digits_and_terms(digits, terms):
    rows = generate_arith("train", digits=digits, terms=terms, n=200)
    assert len(rows) == 200 or digits == 1 and len(rows) > 50
    for e in rows:
        numbers = [abs(n) for n in parse_question(e.question)]
        assert len(numbers) == terms, e.question
        assert all(len(str(n)) == digits for n in numbers), e.question


def test_a_small_difficulty_gives_every_problem_it_has_and_says_so():
    train_task = load_task("arith", "train", arith_digits=1, arith_terms=2)
    test_task = load_task("arith", "test", arith_digits=1, arith_terms=2)
    # 1-digit problems: 9 x 9 additions and 45 subtractions a - b with 1 <= b <= a <= 9.
    assert len(train_task.examples) + len(test_task.examples) == 9 * 9 + 45
    assert "only" in train_task.source and "few problems at this difficulty" in train_task.source


@pytest.mark.parametrize("knobs,flag", [
    ({"arith_digits": 0}, "--arith-digits 0"), ({"arith_digits": -2}, "--arith-digits -2"),
    ({"arith_digits": 13}, "--arith-digits 13"), ({"arith_terms": 1}, "--arith-terms 1"),
    ({"arith_terms": 0}, "--arith-terms 0"), ({"arith_terms": -3}, "--arith-terms -3"),
    ({"arith_terms": 9}, "--arith-terms 9"),
])
def test_bad_knobs_are_refused_naming_the_flag(knobs, flag):
    with pytest.raises(SystemExit, match=flag):
        load_task("arith", "train", **knobs)
    with pytest.raises(SystemExit, match=flag):
        generate_arith("test", digits=knobs.get("arith_digits", 2), terms=knobs.get("arith_terms", 2))


def test_arith_is_not_on_the_hub():
    with pytest.raises(SystemExit, match="--data-source hub: task arith is generated"):
        load_task("arith", "train", "hub")


def test_train_refuses_a_bad_knob_before_writing_anything(tiny_dir, tmp_path):
    with pytest.raises(SystemExit, match="--arith-terms 1"):
        train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--dataset", "arith", "--arith-terms", "1"])
    assert not (tmp_path / "r").exists()


def test_tiny_run_on_arith_writes_its_run_dir(tiny_dir, tmp_path, one_thread):
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--dataset", "arith",
                          "--arith-digits", "3", "--arith-terms", "3", "--iterations", "1", "--eval-every", "1",
                          "--prompts-per-iter", "2", "--samples-per-prompt", "2", "--max-new-tokens", "6",
                          "--val-size", "4", "--eval-limit", "2", "--eval-max-new-tokens", "4",
                          "--truncation-penalty", "1", "--minibatch-size", "4", "--micro-batch-size", "2",
                          "--no-progress", "--no-plots"])
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["dataset"], config["arith_digits"], config["arith_terms"]) == ("arith", 3, 3)
    data = json.loads((run_dir / "data.json").read_text())
    assert data["train"].startswith("generated: arith(seed=0, digits=3, terms=3)")
    assert data["val_rows"] == [f"generated:arith(seed=0,digits=3,terms=3)/train[{i}]" for i in range(4996, 5000)]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and "eval_accuracy" in rows[1]
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    for ep in episodes:   # "prompt" is the question
        assert ep["gold"] == str(sum(parse_question(ep["prompt"])))
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000001"
