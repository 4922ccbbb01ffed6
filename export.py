"""Export a trained adapter for the tools people already use.

    python export.py RUN_DIR_OR_CHECKPOINT --out DIR            # a PEFT LoRA adapter
    python export.py RUN_DIR_OR_CHECKPOINT --out DIR --merge    # a full model, adapters merged in

A run directory means its latest checkpoint; the checkpoint's checksums are verified first.

PEFT (`peft.PeftModel.from_pretrained(base, DIR)`): DIR gets adapter_config.json (LORA,
CAUSAL_LM, r, lora_alpha, target_modules, no dropout, no bias) and adapter_model.safetensors,
whose tensor names are PEFT's: `base_model.model.<module>.lora_A.weight` (r, in) and
`...lora_B.weight` (out, r). PEFT scales by lora_alpha / r, as model.LoRALinear does, so the
exported adapter computes the same function.

--merge: DIR is a model directory that `AutoModelForCausalLM.from_pretrained(DIR)` loads with
no LoRA code at all: every adapted weight becomes W0 + (alpha / r) B A (computed in fp32, saved
in --dtype), everything else is the base model's, and the base model's tokenizer is copied.

The value head is part of neither: it is PPO's critic, needed only to go on training, not to
generate. It stays in the checkpoint's adapter.safetensors (value_head.weight, value_head.bias),
which `train.py --resume` and `--init-adapter` read.

Public functions: peft_tensors(tensors), peft_config(lora, base), merge_into(lm, tensors, scale).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from evaluate import resolve_adapter
from model import ADAPTER_FILE, read_adapter_config
from offline_models import model_source

PREFIX = "lm."                        # our Policy keeps the causal LM as `lm`
PEFT_PREFIX = "base_model.model."     # PeftModel wraps the causal LM as base_model.model
PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def lora_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module path inside the LM: (A, B)} from a checkpoint's tensors (the value head dropped)."""
    pairs = {}
    for name, value in tensors.items():
        if name.startswith(PREFIX) and name.endswith(".lora_A"):
            module = name[len(PREFIX):-len(".lora_A")]
            pairs[module] = (value, tensors[f"{PREFIX}{module}.lora_B"])
    return pairs


def peft_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names (lm.<module>.lora_A) -> PEFT's (base_model.model.<module>.lora_A.weight)."""
    out = {}
    for module, (A, B) in lora_tensors(tensors).items():
        out[f"{PEFT_PREFIX}{module}.lora_A.weight"] = A.contiguous()
        out[f"{PEFT_PREFIX}{module}.lora_B.weight"] = B.contiguous()
    return out


def peft_config(lora: dict, base: str) -> dict:
    """adapter_config.json as PEFT writes it for a plain LoRA (the fields PEFT reads)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
            "r": lora["rank"], "lora_alpha": lora["alpha"], "target_modules": sorted(lora["targets"]),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


@torch.no_grad()
def merge_into(lm: torch.nn.Module, tensors: dict[str, torch.Tensor], scale: float) -> int:
    """W <- W + scale * B A for each adapted linear layer of `lm` (in fp32). Returns the count."""
    pairs = lora_tensors(tensors)
    for module, (A, B) in pairs.items():
        weight = lm.get_submodule(module).weight
        weight.copy_((weight.float() + scale * (B.float() @ A.float())).to(weight.dtype))
    return len(pairs)


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a checkpoint directory")
    parser.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    parser.add_argument("--merge", action="store_true", help="write a full model with the adapters merged in")
    parser.add_argument("--model", default=None, help="the base model (default: the one the adapter was trained on)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="--merge: dtype of the saved weights")
    args = parser.parse_args(argv)
    from safetensors.torch import load_file, save_file

    checkpoint = resolve_adapter(args.checkpoint)
    lora = read_adapter_config(checkpoint)
    model = args.model or lora["model"]
    base = str(model_source(model))        # the hub id, or the local directory of an offline model
    tensors = load_file(checkpoint / ADAPTER_FILE)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"--out {out}: exists and is not an empty directory; choose a new one")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")   # written whole, then renamed
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if args.merge:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
        lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        n = merge_into(lm, tensors, lora["alpha"] / lora["rank"])
        lm.to(dtype).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
        what = f"{base} with {n} LoRA layers merged ({args.dtype})"
    else:
        save_file(peft_tensors(tensors), tmp / PEFT_WEIGHTS, metadata={"format": "pt"})
        (tmp / PEFT_CONFIG).write_text(json.dumps(peft_config(lora, base), indent=2))
        what = f"PEFT LoRA adapter (r={lora['rank']}, alpha={lora['alpha']}, {','.join(lora['targets'])}) for {base}"
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    print(f"[export] {checkpoint} -> {out}: {what}; the value head stays in {checkpoint / ADAPTER_FILE}",
          file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
