"""Benchmark: loop vs one-pass influence scores, and peak memory of lean vs plain log-probs.

    python bench/influence_bench.py                      # tiny model and offline Gemma-3-270M
    python bench/influence_bench.py --models tiny --sizes 8,16
    python bench/influence_bench.py --device cuda --dtypes bf16,fp32 --sizes 8,16,32,64   # on a GPU

Scoring part, per model and N (synthetic buffer: random prompt/response tokens, left-padded
prompts of 32-64 tokens, responses of 32-64 tokens): seconds for the loop (one backward per
episode), the one-pass method, and one plain batched forward+backward of the summed loss of
the same buffer (each the fastest of --repeats calls, the three taking turns); the
loop/one-pass ratio; the max difference of the scores relative to the largest loop score,
against the loop and against per-episode gradients taken from the same batched forward pass
as one-pass (which separates the method's exactness from fp32 rounding of a batched forward
pass).

Memory part (270M only, unless --no-memory): peak memory of one PPO update step (forward +
backward, 16 episodes of 256 response tokens) with the plain log_softmax path and with the lean
path, each in a fresh subprocess: on the CPU the peak resident memory (ru_maxrss) minus the RSS
after loading; on a GPU torch.cuda.max_memory_allocated, minus what was allocated after loading.

--device and --dtypes (the base weights' dtype, as train.py --dtype) repeat everything per
dtype; on a GPU every timed call ends with torch.cuda.synchronize().
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from influence import episode_gradients, influence_scores, validation_gradient  # noqa: E402
from model import load_policy, lora_parameters  # noqa: E402
from offline_models import model_source  # noqa: E402
from ppo import policy_loss, value_loss  # noqa: E402
from rollout import Rollouts, old_and_ref_logprobs, token_logprobs  # noqa: E402
import speedups  # noqa: E402
from speedups import onepass_scores  # noqa: E402


def synthetic_buffer(policy, vocab: int, N: int, P: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)   # drawn on the CPU (the same buffer on every device)
    prompt_ids = torch.randint(4, vocab, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    response_ids = torch.randint(4, vocab, (N, T), generator=g)
    response_mask = torch.zeros(N, T)
    for i in range(N):
        pad = int(torch.randint(0, P // 2 + 1, (1,), generator=g))
        prompt_mask[i, :pad] = 0
        prompt_ids[i, :pad] = 0
        length = int(torch.randint(T // 2, T + 1, (1,), generator=g))
        response_mask[i, :length] = 1
        response_ids[i, length:] = 0
    dev = policy.device
    r = Rollouts(prompt_ids.to(dev), prompt_mask.to(dev), response_ids.to(dev), response_mask.to(dev))
    r.old_logprobs, r.values, r.ref_logprobs = old_and_ref_logprobs(policy, r, 1.0, 16)
    advantages = (torch.randn(N, T, generator=g) * response_mask).to(dev)
    return r, advantages


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fns: dict, repeats: int = 1) -> tuple[dict, dict]:
    """Fastest wall seconds of `repeats` calls of each function, and each one's last output.
    The functions take turns within every repeat (after one untimed warm-up round), so a busy
    moment of the machine slows all of them alike rather than one; the minimum is reported
    because scheduler noise only ever adds time (tiny-model steps take 10-50 ms)."""
    for fn in fns.values():
        fn()
    sync()
    seconds = {name: [] for name in fns}
    outs = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            sync()
            seconds[name].append(time.perf_counter() - t0)
    return {name: min(s) for name, s in seconds.items()}, outs


def same_forward_scores(policy, buf, adv, g_val, micro: int) -> torch.Tensor:
    """The loop's per-episode gradients, but each taken from the same batched forward pass
    that one-pass uses (one backward of L_i per episode, retain_graph). Comparing one-pass to
    this isolates the method: both see identical fp32 activations, whereas the plain loop runs
    each episode alone and its forward pass rounds differently from a batch's."""
    params = lora_parameters(policy)
    rows = []
    for s in range(0, len(buf), micro):
        part = buf.select(range(s, min(s + micro, len(buf))))
        lp, _, _ = token_logprobs(policy, part, 1.0)
        losses = policy_loss(lp, part.old_logprobs, adv[s:s + micro], part.response_mask, 0.2)   # (n,)
        for i in range(len(part)):
            grads = torch.autograd.grad(losses[i], params, retain_graph=True, allow_unused=True)
            # one fp32 vector over the LoRA parameters, zeros for an unused one (influence.py flattens so)
            rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                                   for g, p in zip(grads, params)]))
    return influence_scores(torch.stack(rows), g_val)


def bench_scores(name: str, source: str, sizes: list[int], micro: int, repeats: int, device: str = "cpu",
                 dtype: str = "fp32") -> list[dict]:
    policy, tok = load_policy(source, device=device, dtype=dtype, quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B, as after some training (B = 0 makes half the terms vanish)
        for p in lora_parameters(policy)[1::2]:
            p.copy_(torch.randn(p.shape, generator=g) * 1e-3)
    vocab = policy.lm.get_output_embeddings().weight.shape[0]
    val, _ = synthetic_buffer(policy, vocab, 4, 48, 48, seed=99)
    g_val = validation_gradient(policy, val)
    rows = []
    for N in sizes:
        buf, adv = synthetic_buffer(policy, vocab, N, 64, 64, seed=N)
        params = lora_parameters(policy)

        def batched():
            for s in range(0, N, micro):  # same micro-batching as one-pass
                part = buf.select(range(s, min(s + micro, N)))
                lp, _, _ = token_logprobs(policy, part, 1.0)
                loss = policy_loss(lp, part.old_logprobs, adv[s:s + micro], part.response_mask, 0.2).sum()
                torch.autograd.grad(loss, params)

        t, out = timed({
            "loop": lambda: influence_scores(episode_gradients(policy, buf, adv, clip_eps=0.2, temperature=1.0), g_val),
            "onepass": lambda: onepass_scores(policy, buf, adv, g_val, clip_eps=0.2, temperature=1.0, batch_size=micro),
            "fwd_bwd": batched,
        }, repeats)
        t_loop, t_one, t_fb, loop, one = t["loop"], t["onepass"], t["fwd_bwd"], out["loop"], out["onepass"]
        same = same_forward_scores(policy, buf, adv, g_val, micro)
        rel = ((one - loop).abs().max() / loop.abs().max()).item()
        rel_same = ((one - same).abs().max() / same.abs().max()).item()
        row = {"model": name, "device": str(policy.device), "dtype": dtype, "N": N, "repeats": repeats, "loop_s": t_loop, "onepass_s": t_one, "fwd_bwd_s": t_fb,
               "loop_over_onepass": t_loop / t_one, "onepass_over_fwd_bwd": t_one / t_fb, "max_rel_diff": rel,
               "max_rel_diff_same_forward": rel_same}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def memory_step(model: str, lean: bool, N: int, T: int, device: str, dtype: str) -> None:
    """Child process: one PPO update step; prints the peak memory growth in MB (RSS on the CPU,
    allocated GPU memory on a GPU)."""
    policy, tok = load_policy(model, device=device, dtype=dtype, quiet=True)
    gpu = policy.device.type == "cuda"
    vocab = policy.lm.get_output_embeddings().weight.shape[0]
    buf, adv = synthetic_buffer(policy, vocab, N, 64, T, seed=0)
    buf.response_mask[:] = 1  # exactly N x T response tokens
    if gpu:
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    logprobs = speedups.token_logprobs if lean else token_logprobs   # the lean log-probs (speedups.py), or the plain
    lp, values, _ = logprobs(policy, buf, 1.0)
    loss = (policy_loss(lp, buf.old_logprobs, adv, buf.response_mask, 0.2)
            + 0.1 * value_loss(values, buf.values, adv, buf.response_mask, 0.2)).mean()
    loss.backward()
    sync()
    peak = torch.cuda.max_memory_allocated() / 2**20 if gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"memory": "gpu_allocated" if gpu else "cpu_rss", "model": model, "dtype": dtype, "lean": lean,
                      "N": N, "T": T, "peak_growth_mb": peak - base, "peak_mb": peak}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,gemma-3-270m", help="comma-separated: tiny, gemma-3-270m")
    parser.add_argument("--sizes", default="8,16,32", help="episode counts N")
    parser.add_argument("--micro", type=int, default=8, help="episodes per forward/backward in one-pass and batched")
    parser.add_argument("--repeats", type=int, default=0,
                        help="timed calls per measurement, fastest reported (0: 31 for tiny, 1 for 270M)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (as train.py --device)")
    parser.add_argument("--dtypes", default="fp32", help="comma-separated base-weight dtypes: fp32, bf16")
    parser.add_argument("--memory-models", default="gemma-3-270m", help="models of the memory part (tiny too for a smoke run)")
    parser.add_argument("--memory-shape", default="16,256", help="episodes,response tokens of the memory part's PPO step")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    if args.memory_child:
        source, lean, N, T, dtype = args.memory_child.split(",")
        return memory_step(source, lean == "lean", int(N), int(T), args.device, dtype)
    torch.manual_seed(0)
    sizes = [int(n) for n in args.sizes.split(",")]
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() and args.device != "cpu" else ""), flush=True)
    sources = {}
    for name in args.models.split(","):
        if name == "tiny":
            from tiny_world import make_random_model_dir
            sources[name] = str(make_random_model_dir(Path(tempfile.mkdtemp())))
        else:
            sources[name] = str(model_source(name))
        repeats = args.repeats or (31 if name == "tiny" else 1)
        for dtype in dtypes:
            bench_scores(name, sources[name], sizes, args.micro, repeats, args.device, dtype)
    for name in args.memory_models.split(",") if not args.no_memory else []:
        if name not in sources:
            continue
        for dtype in dtypes:
            for mode in ("plain", "lean"):
                subprocess.run([sys.executable, __file__, "--device", args.device,
                                "--memory-child", f"{sources[name]},{mode},{args.memory_shape},{dtype}"], check=True)


if __name__ == "__main__":
    main()
