"""The policy: a causal LM (Gemma-3 first), hand-written LoRA adapters and a value head.

I-PPO (Shu, Zhang, Hullman, arXiv 2604.01597) fine-tunes the LM with PPO. We train only
low-rank adapters (LoRA, Hu et al. 2021, eq. 3: h = W0 x + (alpha / r) B A x) and a scalar
value head; the frozen base weights with the adapters switched off are the reference
policy pi_ref, so no second copy of the model is kept. A run that starts from an SFT adapter
(--init-adapter) keeps a frozen copy of that adapter as the reference instead
(load_reference_adapter), so the KL penalty holds the policy near the SFT model, not the base.

Public functions:
    load_policy(source, ...)       -> (Policy, tokenizer) from a hub id or a local directory
                                      (an offline model's name becomes a directory by
                                      offline_models.model_source)
    inspect_model(source, ...)     -> ModelInfo (context length, linear layer names) from the
                                      config alone, so bad flags are refused before the load
    LoRALinear                      a frozen nn.Linear plus a trainable low-rank update
    add_lora(model, targets, rank, alpha) -> list of the LoRALinear layers it inserted
    adapters_disabled(model)        context manager: the reference policy pi_ref
    load_reference_adapter(policy, dir) a checkpoint's LoRA tensors as a frozen reference adapter
    lora_parameters(model)          the LoRA tensors in a fixed order (what influence scores use)
    flat_gradient(grads, params)    their gradients as one flat fp32 vector
    Policy                          LM + value head: hidden_states, response_hidden_states,
                                      logits, token_logprobs (log_softmax and gather), value
    save_adapter(policy, dir, lora), load_adapter(policy, dir, with_value_head=True),
    read_adapter_config(dir)        checkpoints of the trainable tensors (safetensors + JSON)
    eos_token_ids(tokenizer)        the token ids that end a response
    pick_device_and_dtype(device, dtype) cuda > mps > cpu; --dtype auto: bf16 on GPU, fp32 on CPU
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn


class LoRALinear(nn.Module):
    """y = W0 x + b0 + (alpha / rank) * B (A x), with W0, b0 frozen.

    A starts random and B at zero, so a fresh adapter leaves the model unchanged.
    The adapter weights are fp32 whatever the base dtype (the weights that scores and optimizer
    state are computed from stay in full precision).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank = rank
        self.scale = alpha / rank
        self.enabled = True
        # The frozen reference adapter used while `enabled` is False (None: the base model).
        self.ref_A: torch.Tensor | None = None
        self.ref_B: torch.Tensor | None = None
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        # Same initialisation as microsoft/LoRA: kaiming-uniform A, zero B.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        A, B = (self.lora_A, self.lora_B) if self.enabled else (self.ref_A, self.ref_B)
        if A is None:
            return y
        update = (x.to(A.dtype) @ A.T) @ B.T
        return y + (self.scale * update).to(y.dtype)


def add_lora(model: nn.Module, targets: list[str], rank: int, alpha: float) -> list[LoRALinear]:
    """Freeze every parameter of `model`, then wrap each nn.Linear whose name ends in one of
    `targets` (e.g. "q_proj") with a LoRALinear. Returns the inserted layers in module order."""
    for p in model.parameters():
        p.requires_grad_(False)
    found = {t: 0 for t in targets}
    layers = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in found and isinstance(module, nn.Linear):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            lora = LoRALinear(module, rank, alpha)
            setattr(parent, leaf, lora)
            layers.append(lora)
            found[leaf] += 1
    missing = [t for t, n in found.items() if n == 0]
    if missing:
        linear_names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"--lora-targets: no nn.Linear named {missing} in this model; "
                         f"its linear layers are {linear_names}")
    return layers


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Within this block the model is the reference policy: the frozen base model, or the base
    plus the frozen adapter given to load_reference_adapter."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    previous = [m.enabled for m in layers]
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m, was in zip(layers, previous):
            m.enabled = was


def trim_left_padding(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Drop the prompt columns that are padding in every row (left padding): less work, the
    same numbers, since positions and attention come from the mask."""
    start = int(prompt_mask.any(0).long().argmax())
    return prompt_ids[:, start:], prompt_mask[:, start:]


def flat_gradient(grads, params) -> torch.Tensor:
    """Per-parameter gradients (in the order of `params`) as one flat fp32 vector, zeros for a
    parameter the loss does not use: the layout g_val and every g_i share."""
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                      for g, p in zip(grads, params)])


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The LoRA tensors (A then B of each layer, in module order): the parameters theta over
    which gradients are dotted for influence scores (our choice: adapters only)."""
    params = []
    for m in model.modules():
        if isinstance(m, LoRALinear):
            params += [m.lora_A, m.lora_B]
    return params


class Policy(nn.Module):
    """A causal LM with LoRA adapters and a scalar value head on the last hidden state.

    forward(input_ids, attention_mask, n_last) returns, for the last `n_last` positions,
    the next-token logits (N, n_last, V) and the values (N, n_last), both fp32.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        hidden = lm.config.get_text_config().hidden_size
        device = next(lm.parameters()).device
        self.value_head = nn.Linear(hidden, 1, device=device)
        # Our choice: the value head starts at V = 0 everywhere, so that with gamma = lambda = 1
        # (the defaults) the first advantages are the returns themselves rather than noise from a
        # random head. (With lambda < 1 a zero critic discounts the reward towards the first
        # tokens instead: lambda^(L-1-t) of it reaches token t.)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    # Whether the value loss reaches the LoRA weights through the hidden states the head reads.
    # Our choice is no (train.py sets it from --critic-grad, default head): the value head
    # reads detached hidden states and the value loss trains the head alone.
    value_through_adapters = False

    def value(self, hidden: torch.Tensor) -> torch.Tensor:
        """V(s) from hidden states (..., H): (...), fp32."""
        if not self.value_through_adapters:
            hidden = hidden.detach()
        return self.value_head(hidden.float()).squeeze(-1)

    def hidden_states(self, input_ids, attention_mask, n_last: int) -> torch.Tensor:
        """The final hidden states of the last `n_last` positions, (N, n_last, H)."""
        # Left padding: positions count real tokens only, as generate() does.
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids, use_cache=False)
        return out.last_hidden_state[:, -n_last:]

    def response_hidden_states(self, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
        """The final hidden states that predict each response token, (N, T, H): position P-1+t
        of prompt + response for token t (prompts left-padded, responses right-padded), one
        forward per row. (speedups.shared_prompt_hidden_states: the samples of one prompt share
        its forward, the same numbers.)"""
        prompt_ids, prompt_mask = trim_left_padding(prompt_ids, prompt_mask)
        input_ids = torch.cat([prompt_ids, response_ids], dim=1)
        attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
        return self.hidden_states(input_ids, attention_mask, n_last=response_ids.shape[1] + 1)[:, :-1]

    def token_logprobs(self, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                       with_entropy: bool = False):
        """log pi(a_t | s_t) = log_softmax(logits_t / temperature)[a_t] of the tokens (N, T) from
        the hidden states before them (N, T, H), and the entropy of pi(. | s_t) if asked (else
        None); (N, T) fp32 each."""
        logp_all = torch.log_softmax(self.logits(hidden) / temperature, dim=-1)        # (N, T, V)
        logprobs = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)               # (N, T)
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None       # (N, T)
        return logprobs, entropy

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits from hidden states, fp32, with Gemma's soft-capping if configured."""
        logits = self.lm.get_output_embeddings()(hidden).float()
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits

    @property
    def softcap(self):
        return getattr(self.lm.config.get_text_config(), "final_logit_softcapping", None)

    def forward(self, input_ids, attention_mask, n_last: int):
        hidden = self.hidden_states(input_ids, attention_mask, n_last)     # (N, n_last, H)
        return self.logits(hidden), self.value(hidden)                     # (N, n_last, V), (N, n_last)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """LoRA and value-head tensors by name: what a checkpoint stores."""
        return {n: p.detach().cpu().contiguous() for n, p in self.named_parameters() if p.requires_grad}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def pick_device_and_dtype(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype, str]:
    """cuda > mps > cpu; dtype "auto" is bf16 on a GPU and fp32 on the CPU (--dtype bf16 runs the
    GPU's dtype path on a CPU); never fp16 (Gemma-3 overflows in fp16). Only the frozen base
    weights take this dtype: LoRA tensors and the value head stay fp32, and log-probs and
    losses are computed in fp32 from the (bf16) logits."""
    if device == "auto":
        if torch.cuda.is_available():
            device, why = "cuda", "a CUDA GPU is available"
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            device, why = "mps", "Apple MPS is available"
        else:
            device, why = "cpu", "no GPU found"
    else:
        why = "asked for with --device"
    if dtype == "auto":
        chosen = torch.float32 if device == "cpu" else torch.bfloat16
    elif dtype in DTYPES:
        chosen, why = DTYPES[dtype], why + f"; --dtype {dtype}"
    else:
        raise SystemExit(f"--dtype: one of auto, {', '.join(DTYPES)} (got {dtype!r})")
    return torch.device(device), chosen, f"{why}; base weights in {str(chosen).replace('torch.', '')}"


def _refuse_unloadable(name: str, err: Exception) -> SystemExit:
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    return SystemExit(f"--model {name!r}: could not load it ({first_line}). Without a reachable model hub, "
                      f"use a local directory written by save_pretrained or one of the offline models: "
                      f"--model gemma-3-270m or --model tiny-arith")


@dataclass
class ModelInfo:
    context: int                 # max_position_embeddings: prompt + response must fit
    linear_names: list[str]      # leaf names of the nn.Linear layers (what --lora-targets may name)


def inspect_model(source: str | Path, trust_remote_code: bool = False, *, name: str | None = None) -> ModelInfo:
    """Read the config at `source` and build the model on the meta device (no weights, no memory, no
    RNG draws: well under a second), so that flags that do not fit the model are refused
    before the slow load. An id or path that cannot be loaded is refused naming --model `name`
    (default: `source`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:  # OSError: not found or no hub; ValueError: not a causal LM config
        raise _refuse_unloadable(name or str(source), err) from err
    names = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, nn.Linear)})
    return ModelInfo(context=config.get_text_config().max_position_embeddings, linear_names=names)


def load_policy(source: str | Path, *, name: str | None = None, device: str = "auto", dtype: str = "auto", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                lora_rank: int = 8, lora_alpha: float = 16.0, trust_remote_code: bool = False, quiet: bool = False):
    """Load a causal LM and tokenizer, add LoRA adapters and a value head.

    `source` is a hub id (e.g. google/gemma-3-1b-it) or a local directory written by
    save_pretrained (offline_models.model_source turns the offline models' names into one);
    `name` is what errors and the log call it (default: `source`).
    Returns (policy, tokenizer); policy.device and policy.dtype say where it lives.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev, dtype, why = pick_device_and_dtype(device, dtype)
    name = name or str(source)
    if not quiet:
        print(f"[model] {name} on {dev}: {why}", file=sys.stderr)
    t0 = time.time()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        # Eager attention: the implementation Gemma-3 is trained with; transformers recommends it
        # over sdpa for training Gemma-3.
        lm = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="eager",
                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise _refuse_unloadable(name, err) from err
    lm.to(dev)
    lm.eval()  # no dropout anywhere: rollouts and updates see the same function
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id in eos_token_ids(tokenizer):
        raise SystemExit(f"--model {name!r}: its tokenizer has no pad token distinct from EOS; "
                         "I-PPO needs them distinct so the model learns to stop.")
    tokenizer.padding_side = "left"
    add_lora(lm, list(lora_targets), lora_rank, lora_alpha)
    policy = Policy(lm)
    policy.device, policy.dtype = dev, dtype
    if not quiet:
        n_train = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in policy.parameters())
        print(f"[model] loaded in {time.time() - t0:.1f}s; trainable {n_train:,} of {n_all:,} parameters "
              f"(LoRA r={lora_rank} on {','.join(lora_targets)} + value head)", file=sys.stderr)
    return policy, tokenizer


def eos_token_ids(tokenizer) -> list[int]:
    """Token ids that end a response: <eos>, plus <end_of_turn> for chat-tuned Gemma."""
    ids = [tokenizer.eos_token_id]
    if tokenizer.chat_template:
        end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
        if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
            ids.append(end_of_turn)
    return ids


ADAPTER_FILE = "adapter.safetensors"   # LoRA and value-head tensors
ADAPTER_CONFIG = "adapter.json"        # model id, LoRA targets, rank, alpha


def save_adapter(policy: Policy, directory: Path, lora: dict) -> None:
    """Write the trainable tensors (safetensors, no pickle) and the LoRA settings (JSON)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(policy.trainable_state(), directory / ADAPTER_FILE)
    (directory / ADAPTER_CONFIG).write_text(json.dumps(lora, indent=2))


def read_adapter_config(directory: Path) -> dict:
    path = Path(directory) / ADAPTER_CONFIG
    if not path.exists():
        raise SystemExit(f"{directory}: not an adapter checkpoint (no {ADAPTER_CONFIG})")
    return json.loads(path.read_text())


def _read_adapter_tensors(directory: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The tensors save_adapter wrote into `directory`, and the file they came from."""
    from safetensors.torch import load_file

    path = Path(directory) / ADAPTER_FILE
    if not path.exists():
        raise SystemExit(f"{directory}: no {ADAPTER_FILE} (expected a checkpoint directory)")
    return path, load_file(path)


def load_reference_adapter(policy: Policy, directory: Path) -> None:
    """Make the LoRA tensors of checkpoint `directory` the reference policy's adapter (frozen
    copies, not parameters, never saved): adapters_disabled() then gives base + that adapter."""
    path, tensors = _read_adapter_tensors(directory)
    for name, module in policy.named_modules():
        if isinstance(module, LoRALinear):
            A, B = tensors.get(f"{name}.lora_A"), tensors.get(f"{name}.lora_B")
            if A is None or B is None or A.shape != module.lora_A.shape or B.shape != module.lora_B.shape:
                raise SystemExit(f"{path}: no LoRA tensors for {name} of this shape (see {ADAPTER_CONFIG} "
                                 "for the rank and targets it was trained with)")
            module.ref_A = A.to(module.lora_A.device, module.lora_A.dtype)
            module.ref_B = B.to(module.lora_B.device, module.lora_B.dtype)


def load_adapter(policy: Policy, directory: Path, with_value_head: bool = True) -> None:
    """Load tensors written by save_adapter into `policy` (whose LoRA layout must match)."""
    path, tensors = _read_adapter_tensors(directory)
    own = dict(policy.named_parameters())
    if not with_value_head:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("value_head.")}
    unknown = [k for k in tensors if k not in own or own[k].shape != tensors[k].shape]
    if unknown:
        raise SystemExit(f"{path}: tensors {unknown[:3]} do not fit this model's LoRA layout "
                         f"(see {ADAPTER_CONFIG} for the rank and targets it was trained with)")
    with torch.no_grad():
        for name, value in tensors.items():
            own[name].copy_(value)
