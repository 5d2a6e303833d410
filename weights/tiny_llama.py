"""A tiny random Llama with a given tokenizer: what weights/gpu_heads.sh's smoke run trains on.

    python weights/tiny_llama.py TOKENIZER_JSON OUT_DIR
"""

import shutil
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM


def main(tokenizer: str, out: str) -> None:
    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|im_end|>")
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True,
                         bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    shutil.copy(tokenizer, Path(out) / "tokenizer.json")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
