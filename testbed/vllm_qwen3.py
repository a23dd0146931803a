"""A real architecture for the vLLM bench: Qwen3-0.6B's published configuration (28 layers,
hidden 1024, 16 query and 8 KV heads of 128, intermediate 3072, vocabulary 151,936, tied
embeddings) with random bf16 weights from a fixed seed, 596M parameters, 1.2 GB: what vLLM's
docs time a start with (vllm#49782), and what compiles 28 layers, not the tiny model's 2.

Run INSIDE the vLLM image (hack/images.sh --vllm), which has torch and transformers and no
model hub: ``python3 vllm_qwen3.py OUT``. The tokenizer is the image's tiny model's (smaller
than the vocabulary, which vLLM allows: the bench's prompt and token ids need no more). Made
once on the real node by testbed/vllm.py (ensure_real_model), not in the image: the image
stays the one the e2e tests use, and this machine's disk does not hold two ~7 GB images.
Deterministic: two runs write the same bytes.
"""

import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

TOKENIZER = "/models/tiny-llama"
SEED = 1234


def main(out: str) -> None:
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(TOKENIZER, name)):
            shutil.copy(os.path.join(TOKENIZER, name), tmp)
    with open(os.path.join(TOKENIZER, "config.json")) as f:
        tiny = json.load(f)
    torch.manual_seed(SEED)
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tiny.get("bos_token_id"),
        eos_token_id=tiny.get("eos_token_id"),
        pad_token_id=tiny.get("pad_token_id"),
    )
    cfg.dtype = torch.bfloat16
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    model.save_pretrained(tmp, safe_serialization=True)
    model.generation_config.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)  # whole or not at all: a half-written model is never served
    print(f"saved to {out}: {sum(p.numel() for p in model.parameters())} parameters, bf16")


if __name__ == "__main__":
    main(sys.argv[1])
