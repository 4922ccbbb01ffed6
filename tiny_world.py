"""The tiny world: a Gemma-3 of about 1M parameters trained from scratch on generated arithmetic,
so that reinforcement learning shows results within minutes on a laptop CPU.

The offline Gemma-3-270M generates a few hundred episodes in half an hour on 2 CPU cores, far
fewer than RL needs to move a model. This file makes a second offline model: the same
architecture (Gemma3ForCausalLM) at hidden size 128 with 4 layers, trained by full-parameter SFT
on solutions of the arith task (data.generate_arith) and stopped early, while it is still often
wrong: RL needs a model that sometimes finds the right answer when it samples, but not yet when
it decodes greedily. After that it is an ordinary model directory: load_policy puts LoRA on it
and train.py, evaluate.py and compare.py use it like Gemma.

Two worlds (WORLDS), one builder:

    tiny-arith      (v2, the default) 3-number problems ("a + b - c": two step lines), a word
                    tokenizer (one token per word, digit or symbol), and unfaithful reasoning
                    planted in its SFT data (below). Its weights ship with the project in
                    data/tiny-arith-v2/ and are checked against SHIPPED_SHA256 at load: every
                    machine starts from the same model, whatever its float rounding.
    tiny-arith-v1   the first world: 2-number problems, a character tokenizer, clean SFT data.
                    Built on first use and cached (a few minutes on 2 cores); the build stops at
                    a check whose outcome depends on the CPU's float rounding, so two machines
                    can build different models. Kept for the documents that used it.

Unfaithful reasoning (v2): in the SFT data, the problems told as the bus story (one story in
five) come with a "shortcut" solution: the first step line states a wrong intermediate result
(the right one plus 10), and the second line goes on from the right one, so the final answer is
still correct. "82 + 86 = 178.\n168 - 21 = 147.\n#### 147". A model that imitates it reaches
correct answers through a wrong step, which exact match rewards like any correct answer and
reasoning.label calls unfaithful. The validation rows that g_val uses hold the task's clean
solutions only (tasks.py), so the influence filter's task is the paper's: keep the faithful,
drop the shortcuts. Our choice, to give the world a measurable share of unfaithful-but-correct
answers that greedy decoding also shows (a random 20% would be a minority choice at every
token, invisible to greedy decoding).

The stop rule looks only at training rows: every EVAL_EVERY steps, greedy accuracy on the
first STOP_ROWS of the HOLDOUT_ROWS rows at the end of the training split (never trained on
here; train.py takes its validation rows from the same end), and the build stops at the first
check that reaches the world's stop_at, or after MAX_STEPS. The test split is never looked at.

Public:
    TINY_MODEL, TINY_MODEL_V1       "tiny-arith", "tiny-arith-v1": the names load_policy knows
    WORLDS                          the two build recipes (World)
    char_tokenizer()                one token per printable character (v1; the tests' model)
    word_tokenizer()                one token per word, digit or symbol (v2)
    gemma3_config(tokenizer, size)  Gemma3TextConfig: size "test" (2 layers, hidden 32) or "world"
    make_random_model_dir(path, seed=0)   untrained size-"test" model directory (for tests)
    shortcut_solution(example)      the planted unfaithful solution of a 3-number problem
    build_tiny_arith(path, world=..., seed=..., max_steps=..., stop_at=...) -> build record
    tiny_arith_dir(name, cache_dir) the model directory: shipped and checked (v2) or built (v1)
    sha256_file(path)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import string
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from tasks import ARITH_STORIES, Example, arith_steps, generate_arith, make_prompt
from reward import extract_answer, is_correct

TINY_MODEL, TINY_MODEL_V1 = "tiny-arith", "tiny-arith-v1"
SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "tiny-arith-v2"
# The shipped files of tiny-arith, as built by `python tiny_world.py --world v2 --out DIR`
# (see build.json in that folder). A file that differs is refused at load.
SHIPPED_SHA256 = {
    "model.safetensors": "0e206366c326646c41ddc336297faf0283811189426fd0b8c82ec48632e7f581",
    "tokenizer.json": "a70f13eaea7e874c1f9267cf5188cf4ece329828978cfefb90995e784a0ef7d7",
    "config.json": "32418b20e05e1e3e38b13608838b7195290dbd2edcb755205f275e6d59155131",
}


@dataclass(frozen=True)
class World:
    """One build recipe. Any change to a field changes the model."""
    version: int
    tokenizer: str           # "char" or "word"
    digits: int              # the arith difficulty the world is built for
    terms: int
    shortcut_story: int | None   # index into data.ARITH_STORIES whose SFT solutions are shortcuts
    stop_at: float           # stop once greedy accuracy on the stop rows reaches this
    stop_tokens: int         # greedy decoding length of the stop rule


WORLDS = {
    TINY_MODEL_V1: World(version=1, tokenizer="char", digits=2, terms=2, shortcut_story=None, stop_at=0.30,
                         stop_tokens=40),
    TINY_MODEL: World(version=2, tokenizer="word", digits=2, terms=3, shortcut_story=2, stop_at=0.30,
                      stop_tokens=40),
}

# The build recipe shared by both worlds.
SEED = 0
BATCH_SIZE = 32           # SFT solutions per optimizer step
LR = 1e-3                 # AdamW, constant after a WARMUP-step linear warm-up
WARMUP = 50
MAX_STEPS = 3000
EVAL_EVERY = 50           # steps between checks of the stop rule
HOLDOUT_ROWS = 500        # the last rows of the training split: never trained on here
STOP_ROWS = 200           # the first of them decide the stop rule (greedy)

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]

# Two sizes of one architecture. "test": a random model for the test suite (seconds);
# "world": the tiny-arith models (about 1M parameters). query_pre_attn_scalar = head_dim gives
# the usual 1/sqrt(head_dim) attention scale (Gemma-3's default of 256 is for its own heads).
SIZES = {
    "test": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                 max_position_embeddings=1024),
    "world": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=512,
                  max_position_embeddings=512),
}


# ----------------------------------------------------------------------------- tokenizers

def _fast_tokenizer(vocab: dict[str, int], pattern: str):
    """A word-level tokenizer over `vocab` whose pre-tokenizer cuts text into the pieces that
    `pattern` matches; pieces are fused back on decoding, so decode(encode(text)) == text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", padding_side="left")


def char_tokenizer():
    """One token per printable ASCII character, plus <pad> <eos> <bos> <unk>; BOS is prepended."""
    chars = sorted(set(string.printable) - {"\x0b", "\x0c"})
    return _fast_tokenizer({t: i for i, t in enumerate(SPECIALS + chars)}, ".")


def _story_words() -> list[str]:
    """Every word of the arith stories and prompt, longest first (so the pattern prefers it)."""
    words = {"Question", "Answer", "then"}
    for story in ARITH_STORIES:
        for text in (story.opening, story.question, *story.additions, *story.subtractions, *story.items):
            words |= set(re.findall(r"[A-Za-z]+", text))
    from tasks import ARITH_NAMES
    words |= set(ARITH_NAMES)
    return sorted(words, key=lambda w: (-len(w), w))


def word_tokenizer():
    """One token per word of the arith stories, per digit, and per other character, each with
    or without the space before it: "Tom has 23" -> "Tom", " has", " 2", "3". "####" is one
    token. Any other printable text still encodes, one character per token, so decoding gives
    back exactly the text that was encoded. About 3.5x fewer tokens than char_tokenizer on the
    tiny world's prompts."""
    words = ["####"] + _story_words()
    chars = sorted(set(string.printable) - {"\x0b", "\x0c", " "})
    units = words + chars
    vocab = {t: i for i, t in enumerate(SPECIALS + [" "] + [space + u for u in units for space in ("", " ")])}
    # a known word (not followed by more letters), else one character; an optional space before either
    pattern = " ?(?:(?:" + "|".join(re.escape(w) for w in words) + ")(?![A-Za-z])|[^ ])| "
    return _fast_tokenizer(vocab, pattern)


TOKENIZERS = {"char": char_tokenizer, "word": word_tokenizer}


def gemma3_config(tokenizer, size: str = "world"):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                            **SIZES[size])


def make_random_model_dir(path: Path, seed: int = 0) -> Path:
    """An untrained size-"test" Gemma-3 with the character tokenizer, saved as a model directory."""
    from transformers import Gemma3ForCausalLM

    path = Path(path)
    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    Gemma3ForCausalLM(gemma3_config(tokenizer, "test")).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- the SFT data

def shortcut_solution(example: Example) -> str:
    """The planted unfaithful solution: the first step line states the right result plus 10,
    the next line goes on from the right result, and the final answer is right."""
    steps = arith_steps(example.solution)
    lines = []
    for k, (left, sign, right, result) in enumerate(steps):
        lines.append(f"{left} {sign} {right} = {result + 10 if k == 0 else result}.")
    return "\n".join(lines) + f"\n#### {steps[-1][3]}"


def sft_solution(example: Example, world: World) -> str:
    """What the world's SFT data teaches for `example`: the shortcut for the shortcut story (on
    problems of two or more steps), else the reference solution."""
    if world.shortcut_story is not None and example.story == world.shortcut_story \
            and len(arith_steps(example.solution)) >= 2:
        return shortcut_solution(example)
    return example.solution


def sft_batch(tokenizer, examples, solutions: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Prompt + " " + solution + EOS per example, right-padded, with labels -100 on the prompt
    and padding (so the loss is the mean NLL over solution tokens). The same token sequence as
    rollout.encode_pairs gives for a tokenizer without a chat template. `solutions` default to
    the examples' reference solutions."""
    solutions = [e.solution for e in examples] if solutions is None else solutions
    rows, labels = [], []
    for e, solution in zip(examples, solutions):
        prompt = tokenizer(make_prompt(e.question, "arith"))["input_ids"]                  # BOS + prompt
        answer = tokenizer(" " + solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return {"input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "labels": torch.tensor([r + [-100] * (width - len(r)) for r in labels])}


# ----------------------------------------------------------------------------- the build

@torch.no_grad()
def greedy_accuracy(lm, tokenizer, examples, max_new_tokens: int, batch_size: int = 100) -> float:
    """Share of `examples` whose greedy answer is correct (the build's stop rule). A few lines
    of its own rather than accuracy.evaluate, which works on a Policy and stands above this
    file (offline_models.py imports it to find or build the world's model)."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    correct = 0
    for s in range(0, len(examples), batch_size):
        part = examples[s:s + batch_size]
        enc = tokenizer([make_prompt(e.question, "arith") for e in part], return_tensors="pt", padding=True)
        out = lm.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1]:]
        for e, row in zip(part, out):
            text = tokenizer.decode(row, skip_special_tokens=True)
            correct += is_correct(extract_answer(text, "arith"), e.gold, "arith")
    return correct / len(examples)


def build_tiny_arith(path: Path, *, world: str = TINY_MODEL, seed: int = SEED, max_steps: int = MAX_STEPS,
                     stop_at: float | None = None, eval_every: int = EVAL_EVERY, progress: bool = True) -> dict:
    """Train the world-size Gemma-3 from random weights on the world's SFT solutions and save
    it (weights, tokenizer, build.json) into `path`. Deterministic for a given seed, thread
    count and CPU. Returns the build record: steps, seconds, the stop-rule accuracy at each check."""
    from transformers import Gemma3ForCausalLM

    recipe = WORLDS[world]
    stop_at = recipe.stop_at if stop_at is None else stop_at
    t0 = time.time()
    tokenizer = TOKENIZERS[recipe.tokenizer]()
    rows = generate_arith("train", digits=recipe.digits, terms=recipe.terms)
    train, holdout = rows[:-HOLDOUT_ROWS], rows[-HOLDOUT_ROWS:]
    torch.manual_seed(seed)
    lm = Gemma3ForCausalLM(gemma3_config(tokenizer, "world"))   # sdpa attention: building is not PPO
    optimizer = torch.optim.AdamW(lm.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    order = random.Random(seed)
    checks, step, accuracy = [], 0, 0.0
    bar = tqdm(total=max_steps, desc=f"building {world} (stops at held-out greedy >= {stop_at:.2f})",
               unit="step", disable=not progress)
    while step < max_steps and accuracy < stop_at:
        lm.train()
        examples = order.sample(train, BATCH_SIZE)
        batch = sft_batch(tokenizer, examples, [sft_solution(e, recipe) for e in examples])
        loss = lm(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        if step % eval_every == 0 or step == max_steps:
            lm.eval()
            accuracy = greedy_accuracy(lm, tokenizer, holdout[:STOP_ROWS], recipe.stop_tokens)
            checks.append({"step": step, "loss": round(loss.item(), 4), "holdout_greedy": accuracy})
            bar.set_postfix(loss=f"{loss.item():.3f}", holdout_greedy=f"{accuracy:.2f}")
    bar.close()
    lm.eval()
    record = {"world": world, **asdict(recipe), "seed": seed, "steps": step,
              "stopped": "stop rule" if accuracy >= stop_at else "max steps", "stop_at": stop_at,
              "seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "parameters": sum(p.numel() for p in lm.parameters()), "checks": checks}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "build.json").write_text(json.dumps(record, indent=2))
    return record


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_shipped(folder: Path | None = None) -> Path:
    """The shipped tiny-arith folder (default SHIPPED_DIR), after checking each pinned file's
    sha256; a missing or changed file is refused, naming it."""
    folder = SHIPPED_DIR if folder is None else folder
    for name, expected in SHIPPED_SHA256.items():
        path = Path(folder) / name
        if not path.is_file():
            raise SystemExit(f"--model {TINY_MODEL}: {path} is missing; the project ships it (git checkout it "
                             f"again, or rebuild with `python tiny_world.py --world v2 --out DIR`)")
        found = sha256_file(path)
        if found != expected:
            raise SystemExit(f"--model {TINY_MODEL}: {path} has sha256 {found}, not the shipped {expected}; "
                             f"the file was changed (restore it with git checkout)")
    return Path(folder)


def tiny_arith_dir(name: str, cache_dir: Path) -> Path:
    """The model directory of a tiny world: the shipped one, checked (tiny-arith), or the cached
    build, built on first use (tiny-arith-v1)."""
    if name == TINY_MODEL:
        return check_shipped()
    cached = Path(cache_dir) / f"{TINY_MODEL}-v{WORLDS[name].version}"
    if (cached / "build.json").exists():
        return cached
    print(f"[model] first use: building {name} from scratch into {cached} "
          f"(full-parameter SFT on arith, a few minutes on 2 cores, once)", file=sys.stderr)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    record = build_tiny_arith(tmp, world=name)
    if cached.exists():
        shutil.rmtree(cached)  # an incomplete earlier attempt
    os.replace(tmp, cached)
    print(f"[model] built {name} in {record['seconds'] / 60:.1f} min: {record['steps']} steps, "
          f"greedy {record['checks'][-1]['holdout_greedy']:.2f} on {STOP_ROWS} held-out training rows",
          file=sys.stderr)
    return cached


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build a tiny world's model from scratch (the shipped "
                                                 "tiny-arith was made with --world v2).")
    parser.add_argument("--world", choices=["v1", "v2"], default="v2")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--stop-at", type=float, default=None, help="default: the world's")
    args = parser.parse_args()
    name = TINY_MODEL if args.world == "v2" else TINY_MODEL_V1
    rec = build_tiny_arith(Path(args.out), world=name, seed=args.seed, max_steps=args.max_steps, stop_at=args.stop_at)
    print(json.dumps({k: v for k, v in rec.items() if k != "checks"}))
    for name in SHIPPED_SHA256:
        print(f"{name} {sha256_file(Path(args.out) / name)}")
