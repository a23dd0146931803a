#!/usr/bin/env python3
"""A tiny random-weight Llama and a byte-level BPE tokenizer, made offline at the vLLM image's
build (hack/images/vllm-cpu/Containerfile): this machine reaches no model hub, and vLLM's
compile cache needs a real architecture to compile, not real weights.

Usage: python make_model.py [OUTPUT_DIR]   (default: ./model)
Deterministic: fixed seeds, a generated corpus; two runs write the same bytes.
"""

import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = sys.argv[1] if len(sys.argv) > 1 else "model"
SEED = 1234
VOCAB_SIZE = 1024
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"


def corpus(n_lines=4000, seed=SEED):
    rng = random.Random(seed)
    words = [
        *[
            "the",
            "a",
            "an",
            "cache",
            "compile",
            "kernel",
            "graph",
            "pod",
            "node",
            "cluster",
            "tune",
            "fleet",
            "model",
            "token",
        ],
        *[
            "inference",
            "warm",
            "cold",
            "build",
            "image",
            "layer",
            "shape",
            "dynamic",
            "static",
            "hash",
            "key",
            "load",
        ],
        *[
            "server",
            "request",
            "reply",
            "fast",
            "slow",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
        ],
        *[
            "hello",
            "world",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "and",
            "or",
            "not",
            "is",
            "was",
            "will",
            "be",
        ],
    ]
    for _ in range(n_lines):
        n = rng.randint(4, 16)
        s = " ".join(rng.choice(words) for _ in range(n))
        s = s.capitalize() + rng.choice([".", "!", "?", ","]) + " " + str(rng.randint(0, 9999))
        yield s


def build_tokenizer(out):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS, UNK, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=2048,
    )
    fast.save_pretrained(out)
    return fast


def build_model(out, tok):
    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tok),
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    cfg.dtype = torch.bfloat16  # written as "dtype" (transformers>=5) in config.json
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    return model


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = build_tokenizer(OUT)
    model = build_model(OUT, tok)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved to {OUT}: vocab={len(tok)} params={n} dtype={next(model.parameters()).dtype}")
    print("example ids:", tok("Hello world, the cache is warm.")["input_ids"])


if __name__ == "__main__":
    main()
