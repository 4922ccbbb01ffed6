"""Sampling episodes from the policy and recording what PPO needs.

An episode is one sampled response to one prompt. A batch of N episodes is stored as
left-padded prompts (N, P) followed by right-padded responses (N, T); every per-token
tensor is (N, T) over the response positions, with `response_mask` 1.0 on generated
tokens (the EOS token included, so the model is trained to stop) and 0.0 on padding.

Public functions:
    encode_prompts(tokenizer, texts)                 -> (ids, mask), chat template if any
    encode_pairs(tokenizer, prompts, responses)      -> Sequences (reference solutions, for SFT)
    generate_rollouts(policy, tokenizer, prompts, ...) -> Rollouts
    sample(lm, prompt_ids, prompt_mask, ...)         -> (tokens, sampler log-probs): temperature sampling
    plain_generate(lm, ids, mask, config)            generate() with no logits processor but `config`'s
    token_logprobs(policy, seqs, temperature)        -> (logprobs, values, entropy or None), (N, T)
    old_and_ref_logprobs(policy, seqs, ...)    -> log pi_old, V_old, log pi_ref in no-grad batches
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from tqdm import tqdm
from transformers import DynamicCache, GenerationConfig

from model import adapters_disabled, eos_token_ids


@dataclass
class Sequences:
    """Prompt + response token batches in the layout described above."""
    prompt_ids: torch.Tensor     # (N, P) long, left-padded
    prompt_mask: torch.Tensor    # (N, P) long, 1 on prompt tokens
    response_ids: torch.Tensor   # (N, T) long, right-padded with the pad token
    response_mask: torch.Tensor  # (N, T) float, 1.0 on response tokens (EOS included)

    @property
    def input_ids(self) -> torch.Tensor:           # (N, P + T)
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:      # (N, P + T)
        return torch.cat([self.prompt_mask, self.response_mask.long()], dim=1)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def select(self, index):
        """The episodes at `index` (a list or tensor of row numbers), same type."""
        index = torch.as_tensor(index, dtype=torch.long)
        return type(self)(**{f.name: _rows(getattr(self, f.name), index) for f in fields(self)})


def _rows(value, index: torch.Tensor):
    """The rows `index` of a per-episode field (a tensor or a list; None stays None)."""
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)]
    return value if value is None else [value[i] for i in index.tolist()]


@dataclass
class Rollouts(Sequences):
    """Sampled episodes with what the PPO update needs, all recorded at theta_old."""
    old_logprobs: torch.Tensor = None   # (N, T) log pi_old(a_t | s_t), logits / temperature
    ref_logprobs: torch.Tensor = None   # (N, T) log pi_ref(a_t | s_t), adapters off, same temperature
    values: torch.Tensor = None         # (N, T) V_old(s_t)
    sampler_logprobs: torch.Tensor = None  # (N, T) log-prob of each token as the sampler drew it (KV cache)
    truncated: torch.Tensor = None      # (N,) bool: hit max_new_tokens without EOS
    prompt_index: list = None           # (N,) which prompt of the batch each episode answers
    responses: list = None              # (N,) decoded response text (without EOS)


def encode_prompts(tokenizer, texts: list[str]):
    """Tokenise prompts, left-padded. With a chat template (e.g. gemma-3-1b-it) each text is
    one user turn followed by the start of the model's turn; otherwise BOS + the plain text."""
    if tokenizer.chat_template:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    else:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=True)
    return enc["input_ids"], enc["attention_mask"]


def encode_pairs(tokenizer, prompts: list[str], responses: list[str], device="cpu") -> Sequences:
    """Prompts with given responses (reference solutions) + EOS, as a Sequences batch."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    eos = eos_token_ids(tokenizer)[-1]  # <end_of_turn> for chat models, <eos> otherwise
    rows = [tokenizer(" " + r if not tokenizer.chat_template else r, add_special_tokens=False)["input_ids"] + [eos]
            for r in responses]
    T = max(len(r) for r in rows)
    response_ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        response_ids[i, :len(r)] = torch.tensor(r)
        response_mask[i, :len(r)] = 1.0
    return Sequences(prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device), response_mask.to(device))


def token_logprobs(policy, seqs: Sequences, temperature: float = 1.0, with_entropy: bool = False):
    """log pi(a_t | s_t) of each response token, the value V(s_t) of the state before it, and
    (if `with_entropy`, else None) the entropy of pi(. | s_t); logits are divided by
    `temperature` (that is the distribution the tokens were sampled from). Returns (N, T) fp32
    tensors, zero outside the mask. Gradients flow if called with grad enabled.
    As defined: one forward per sequence, then log_softmax and gather over the full logits.
    (speedups.token_logprobs gives the same numbers from less work: the samples of a prompt
    share its forward, and the LM head runs only at response tokens.)"""
    mask = seqs.response_mask
    hidden = policy.response_hidden_states(seqs.prompt_ids, seqs.prompt_mask, seqs.response_ids, mask)  # (N, T, H)
    values = policy.value(hidden) * mask                                                               # (N, T)
    logprobs, entropy = policy.token_logprobs(hidden, seqs.response_ids, temperature, with_entropy)    # (N, T)
    return logprobs * mask, values, None if entropy is None else entropy * mask


def plain_generate(lm, input_ids, attention_mask, config: GenerationConfig) -> torch.Tensor:
    """lm.generate(...) with `config` alone deciding the distribution. generate() fills every
    field of `config` left at None from the model's own generation_config (transformers'
    _prepare_generation_config), then from transformers' defaults: a hub model whose config
    sets repetition_penalty, min_p, typical_p or no_repeat_ngram_size would otherwise sample
    from another distribution than the one whose log-probs PPO uses. So the model's
    generation_config is set aside for the call; transformers' defaults switch every logits
    processor off except top_k (50), which a sampling `config` must set (to 0) itself."""
    own = lm.generation_config
    lm.generation_config = GenerationConfig()
    try:
        return lm.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    finally:
        lm.generation_config = own


@torch.no_grad()
def sample(lm, prompt_ids, prompt_mask, *, n_samples: int, max_new_tokens: int, temperature: float,
           eos_ids: list[int], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n_samples responses to each of B left-padded prompts (B, P) by pure temperature sampling,
    a_t ~ softmax(logits_t / temperature): no top-k, top-p or any other logits processor (our
    choice), so pi_old is exactly the distribution the tokens came from, and nothing in the
    model's own generation_config can change it. With a KV cache; each prompt's forward (its
    prefill) runs once and its cache is shared by its n samples, which changes no probability.
    After its EOS a response is padded with `pad`; sampling stops when every response has
    ended or after max_new_tokens.
    Returns (tokens (B * n, L), logprobs (B * n, L)): the responses in prompt order, n per
    prompt, and the log-probability of each sampled token under the distribution it was drawn
    from, as the sampler computed it (0 after EOS)."""
    position = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)                    # left padding: real tokens only
    cache = DynamicCache()
    out = lm(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position, cache=cache,
             use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(n_samples)                                       # B prompts -> B * n rows
    logits = out.logits[:, -1].float().repeat_interleave(n_samples, 0)            # (B * n, V)
    mask = prompt_mask.repeat_interleave(n_samples, 0)
    position = position[:, -1:].repeat_interleave(n_samples, 0)
    eos = torch.tensor(eos_ids, device=prompt_ids.device)
    done = torch.zeros(len(mask), dtype=torch.bool, device=prompt_ids.device)
    tokens, logprobs = [], []
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits / temperature, dim=-1)                     # (B * n, V)
        token = torch.multinomial(logp.exp(), 1).squeeze(-1)                       # a_t ~ pi(. | s_t)
        token = torch.where(done, torch.full_like(token, pad), token)
        tokens.append(token)
        logprobs.append(torch.where(done, 0.0, logp.gather(-1, token[:, None]).squeeze(-1)))
        done = done | torch.isin(token, eos)
        if bool(done.all()):
            break
        mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1), position + 1
        out = lm(input_ids=token[:, None], attention_mask=mask, position_ids=position, cache=cache, use_cache=True)
        logits = out.logits[:, -1].float()
    return torch.stack(tokens, 1), torch.stack(logprobs, 1)


@torch.no_grad()
def generate_rollouts(policy, tokenizer, prompts: list[str], *, n_samples: int, max_new_tokens: int,
                      temperature: float, seed: int, batch_size: int = 16, progress: bool = True) -> Rollouts:
    """Sample `n_samples` responses to each prompt (pure temperature sampling, KV cache). The
    log-probs of pi_old and pi_ref and the values are a pass of their own, old_and_ref_logprobs:
    until it runs they are None.

    Sampling draws from torch's global RNG inside a forked RNG state seeded by `seed`, so a
    given (seed, policy) always gives the same episodes, and the caller's RNG is untouched."""
    device, eos_ids, pad = policy.device, eos_token_ids(tokenizer), tokenizer.pad_token_id
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    prompt_ids = prompt_ids.repeat_interleave(n_samples, 0).to(device)        # (N, P)
    prompt_mask = prompt_mask.repeat_interleave(n_samples, 0).to(device)      # (N, P)
    N, P = prompt_ids.shape
    generated, sampler_lp = [], []
    per_call = max(1, batch_size // n_samples)                               # prompts per sampling call
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for s in tqdm(range(0, N, per_call * n_samples), desc="sampling", unit="batch", disable=not progress,
                      leave=False):
            rows = slice(s, s + per_call * n_samples, n_samples)             # each prompt once
            tokens, logprobs = sample(policy.lm, prompt_ids[rows], prompt_mask[rows], n_samples=n_samples,
                                      max_new_tokens=max_new_tokens, temperature=temperature, eos_ids=eos_ids, pad=pad)
            generated, sampler_lp = generated + list(tokens.cpu()), sampler_lp + list(logprobs.cpu())
    T = max(1, max(len(g) for g in generated))
    response_ids, truncated = torch.full((N, T), pad, dtype=torch.long), torch.zeros(N, dtype=torch.bool)
    response_mask, sampler_logprobs = torch.zeros(N, T), torch.zeros(N, T)
    texts = []
    for i, (g, lp) in enumerate(zip(generated, sampler_lp)):   # each response up to its EOS (included)
        is_eos = torch.isin(g, torch.tensor(eos_ids))
        truncated[i] = not bool(is_eos.any())
        length = len(g) if truncated[i] else int(is_eos.long().argmax()) + 1
        response_ids[i, :length], response_mask[i, :length], sampler_logprobs[i, :len(lp)] = g[:length], 1.0, lp
        texts.append(tokenizer.decode(g[:length], skip_special_tokens=True))
    return Rollouts(prompt_ids, prompt_mask, response_ids.to(device), response_mask.to(device),
                    truncated=truncated, prompt_index=[i // n_samples for i in range(N)], responses=texts,
                    sampler_logprobs=(sampler_logprobs.to(device) * response_mask.to(device)))


@torch.no_grad()
def old_and_ref_logprobs(policy, seqs: Sequences, temperature: float, batch_size: int, ref: bool = True,
                         old: bool = True, logprobs=token_logprobs):
    """If `old`, log pi_old and V_old (adapters on); if `ref`, log pi_ref (adapters off), by
    `logprobs` (token_logprobs; speedups.token_logprobs gives the same numbers faster).
    Batched; what is not computed is None."""
    olds, values, refs = [], [], []
    for s in range(0, len(seqs), batch_size):
        part = seqs.select(range(s, min(s + batch_size, len(seqs))))
        if old:
            lp, v, _ = logprobs(policy, part, temperature)
            olds.append(lp), values.append(v)
        if ref:
            with adapters_disabled(policy):
                refs.append(logprobs(policy, part, temperature)[0])
    cat = lambda xs: torch.cat(xs) if xs else None   # noqa: E731
    return cat(olds), cat(values), cat(refs)
