"""One I-PPO update (advantages, influence filter and reweighting, PPO epochs) on a fixed
buffer of episodes, run by tests/test_distributed.py under torchrun with 1 or 2 processes.
Each process takes its share of the same episodes and of the validation set; rank 0 writes
the trainable parameters after the update, and the kept set and weights of all episodes.

    torchrun --nproc_per_node 2 tests/dist_worker.py TINY_MODEL_DIR OUT.safetensors
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from safetensors.torch import save_file  # noqa: E402

import optim  # noqa: E402
import train  # noqa: E402
from config import Config  # noqa: E402
from tasks import load_task, make_prompt  # noqa: E402
from distributed import setup  # noqa: E402
from model import load_policy, lora_parameters  # noqa: E402
from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs  # noqa: E402


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dist = setup()
    # minibatch_size 2 < the kept episodes: several optimizer steps per epoch, each minibatch
    # drawn from all ranks' kept episodes.
    cfg = Config(model=model_dir, ppo_epochs=2, minibatch_size=2, micro_batch_size=2, lr=1e-2,
                       val_batch_size=2, progress=False)
    torch.manual_seed(0)
    policy, tok = load_policy(model_dir, quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B, so that scores and their signs are not trivial
        for p in lora_parameters(policy)[1::2]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    examples = load_task("gsm8k", "train", "local").examples[:8]
    # The same 8 episodes in every process (same seed), then each process keeps its share.
    everything = generate_rollouts(policy, tok, [make_prompt(e.question) for e in examples[:4]], n_samples=2,
                                   max_new_tokens=8, temperature=1.0, seed=0, progress=False)
    everything.old_logprobs, everything.values, everything.ref_logprobs = old_and_ref_logprobs(policy, everything, 1.0, 16)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    val = examples[4:8]
    mine = list(range(*dist.span(len(everything))))
    rollouts, rewards = everything.select(mine), rewards[mine]
    val_mine = val[slice(*dist.span(len(val)))]
    val_seqs = encode_pairs(tok, [make_prompt(e.question) for e in val_mine], [e.solution for e in val_mine])
    optimizer = optim.make_optimizer(cfg, policy)

    buf = train.Buffer(examples[:4], rollouts, rewards=rewards)
    buf.advantages, buf.returns, _, _ = train.compute_advantages(cfg, buf, dist)
    buf.keep, buf.weights = train.select_episodes(0, cfg, policy, buf, val_seqs, train.passes_for(0, cfg, dist), dist)
    train.ppo_update(0, cfg, policy, optimizer, buf, train.passes_for(0, cfg, dist), dist)

    all_keep, all_weights = dist.cat(buf.keep.float()), dist.cat(buf.weights)
    if dist.is_main:
        save_file({**policy.trainable_state(), "keep": all_keep, "weights": all_weights}, out)
    dist.close()  # without it gloo can abort the process at exit (SIGABRT), after a correct run


if __name__ == "__main__":
    main(*sys.argv[1:])
