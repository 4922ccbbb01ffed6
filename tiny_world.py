"""The tiny world: a Gemma-3 of about 1M parameters trained from scratch on generated arithmetic,
so that reinforcement learning shows results within minutes on a laptop CPU.

The offline Gemma-3-270M generates a few hundred episodes in half an hour on 2 CPU cores, far
fewer than RL needs to move a model. This file builds a second offline model, `tiny-arith`: the
same architecture (Gemma3ForCausalLM) at hidden size 128 with 4 layers and a character-level
tokenizer, trained by full-parameter SFT on the reference solutions of the arith training
split (data.generate_arith), and stopped early, while it is still often wrong: RL needs a
model that sometimes finds the right answer when it samples, but not yet when it decodes
greedily. After the build it is an ordinary model directory: load_policy puts LoRA on it and
train.py, evaluate.py and compare.py use it like Gemma.

The stop rule looks only at training rows: every EVAL_EVERY steps, greedy accuracy on the
HOLDOUT_ROWS rows at the end of the training split (never trained on here; train.py takes its
validation rows from the same end), and the build stops at the first check that reaches
STOP_AT, or after MAX_STEPS. The test split is never looked at.

The tests' tiny random model (`make_random_model_dir`) and this model share the tokenizer and
the config (`char_tokenizer`, `gemma3_config`): one definition of each.

Public:
    TINY_MODEL                     "tiny-arith", the name load_policy knows
    char_tokenizer()               a character-level PreTrainedTokenizerFast (pad, eos, bos, unk)
    gemma3_config(tokenizer, size) Gemma3TextConfig: size "test" (2 layers, hidden 32) or "world"
    make_random_model_dir(path, seed=0)   untrained size-"test" model directory (for tests)
    build_tiny_arith(path, seed=..., max_steps=..., stop_at=...) -> build record (dict)
    tiny_arith_dir(cache_dir)      the cached model directory, built on first use (a few minutes)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import string
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from data import generate_arith, make_prompt
from reward import extract_answer, is_correct

TINY_MODEL = "tiny-arith"

# The build recipe. Any change here changes the model: BUILD_VERSION names the cache entry.
BUILD_VERSION = 1
SEED = 0
DIGITS, TERMS = 2, 2      # the arith difficulty the world is built for (why: README, "The tiny world")
BATCH_SIZE = 32           # reference solutions per optimizer step
LR = 1e-3                 # AdamW, constant after a WARMUP-step linear warm-up
WARMUP = 50
MAX_STEPS = 3000
EVAL_EVERY = 50           # steps between checks of the stop rule
HOLDOUT_ROWS = 500        # the last rows of the training split: never trained on here
STOP_ROWS = 200           # the first of them decide the stop rule (greedy, max STOP_TOKENS)
STOP_AT = 0.30            # stop once greedy accuracy on those rows reaches this
STOP_TOKENS = 40

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]

# Two sizes of one architecture. "test": a random model for the test suite (seconds);
# "world": the tiny-arith model (about 1M parameters). query_pre_attn_scalar = head_dim gives
# the usual 1/sqrt(head_dim) attention scale (Gemma-3's default of 256 is for its own heads).
SIZES = {
    "test": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                 max_position_embeddings=1024),
    "world": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=512,
                  max_position_embeddings=512),
}


def char_tokenizer():
    """One token per printable ASCII character, plus <pad> <eos> <bos> <unk>; BOS is prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - {"\x0b", "\x0c"})
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", padding_side="left")


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


# ----------------------------------------------------------------------------- the build

def sft_batch(tokenizer, examples) -> dict[str, torch.Tensor]:
    """Prompt + " " + solution + EOS per example, right-padded, with labels -100 on the prompt
    and padding (so the loss is the mean NLL over solution tokens). The same token sequence as
    rollout.encode_pairs gives for a tokenizer without a chat template."""
    rows, labels = [], []
    for e in examples:
        prompt = tokenizer(make_prompt(e.question, "arith"))["input_ids"]                  # BOS + prompt
        answer = tokenizer(" " + e.solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return {"input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "labels": torch.tensor([r + [-100] * (width - len(r)) for r in labels])}


@torch.no_grad()
def greedy_accuracy(lm, tokenizer, examples, max_new_tokens: int = STOP_TOKENS, batch_size: int = 100) -> float:
    """Share of `examples` whose greedy answer is correct (the build's stop rule). A few lines
    of its own rather than evaluate.evaluate, which works on a Policy and would make model.py,
    which imports this file, import itself."""
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


def build_tiny_arith(path: Path, *, seed: int = SEED, max_steps: int = MAX_STEPS, stop_at: float = STOP_AT,
                     eval_every: int = EVAL_EVERY, progress: bool = True) -> dict:
    """Train the world-size Gemma-3 from random weights on arith reference solutions and save
    it (weights, tokenizer, build.json) into `path`. Deterministic for a given seed and thread
    count. Returns the build record: steps, seconds, the stop-rule accuracy at each check."""
    from transformers import Gemma3ForCausalLM

    t0 = time.time()
    tokenizer = char_tokenizer()
    rows = generate_arith("train", digits=DIGITS, terms=TERMS)
    train, holdout = rows[:-HOLDOUT_ROWS], rows[-HOLDOUT_ROWS:]
    torch.manual_seed(seed)
    lm = Gemma3ForCausalLM(gemma3_config(tokenizer, "world"))   # sdpa attention: building is not PPO
    optimizer = torch.optim.AdamW(lm.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    order = random.Random(seed)
    checks, step, accuracy = [], 0, 0.0
    bar = tqdm(total=max_steps, desc=f"building {TINY_MODEL} (stops at held-out greedy >= {stop_at:.2f})",
               unit="step", disable=not progress)
    while step < max_steps and accuracy < stop_at:
        lm.train()
        batch = sft_batch(tokenizer, order.sample(train, BATCH_SIZE))
        loss = lm(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        if step % eval_every == 0 or step == max_steps:
            lm.eval()
            accuracy = greedy_accuracy(lm, tokenizer, holdout[:STOP_ROWS])
            checks.append({"step": step, "loss": round(loss.item(), 4), "holdout_greedy": accuracy})
            bar.set_postfix(loss=f"{loss.item():.3f}", holdout_greedy=f"{accuracy:.2f}")
    bar.close()
    lm.eval()
    record = {"version": BUILD_VERSION, "seed": seed, "digits": DIGITS, "terms": TERMS, "steps": step,
              "stopped": "stop rule" if accuracy >= stop_at else "max steps", "stop_at": stop_at,
              "seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads(),
              "parameters": sum(p.numel() for p in lm.parameters()), "checks": checks}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "build.json").write_text(json.dumps(record, indent=2))
    return record


def tiny_arith_dir(cache_dir: Path) -> Path:
    """The tiny-arith model directory in `cache_dir`, built on first use and reused after."""
    cached = Path(cache_dir) / f"{TINY_MODEL}-v{BUILD_VERSION}"
    if (cached / "build.json").exists():
        return cached
    print(f"[model] first use: building {TINY_MODEL} from scratch into {cached} "
          f"(full-parameter SFT on arith, a few minutes on 2 cores, once)", file=sys.stderr)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    record = build_tiny_arith(tmp)
    if cached.exists():
        shutil.rmtree(cached)  # an incomplete earlier attempt
    os.replace(tmp, cached)
    print(f"[model] built {TINY_MODEL} in {record['seconds'] / 60:.1f} min: {record['steps']} steps, "
          f"greedy {record['checks'][-1]['holdout_greedy']:.2f} on {STOP_ROWS} held-out training rows",
          file=sys.stderr)
    return cached
