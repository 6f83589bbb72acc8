"""A tiny, deterministic Llama model for a real `vllm serve` on a CPU, made locally.

Run with the python of a serving venv (`install-vllm.sh --serve VERSION`), which has
`transformers`, `tokenizers` and torch; the sidecar's own install has none of them:

    VENV/bin/python -m wedgewatch.lab.real.tiny_model DIR

It writes a random-weight `LlamaForCausalLM` (2 layers, hidden size 128, 4 heads / 2 KV
heads, vocab 512, bfloat16: about 0.8 MB) with a byte-level BPE tokenizer trained on a fixed
local text, and a one-line chat template. Nothing comes from the network and nothing binary
is in the repository: the same seed gives the same files (`model.sha256` records a digest of
them, so a cached model that no longer matches the recipe is made again).

The text it generates is noise; the scheduler, the metrics, the process tree and the hangs
are vLLM's own (docs/real-vllm.md). Prompts may be token ids (`"prompt": [1, 20, 30]`), which
gives exact lengths in tokens.
"""

# ruff: noqa: PLC0415, S106, SIM905
# (torch, transformers and tokenizers exist only in a serving venv: imported where used, so
# the sidecar's install can still ask `is_current`; "<unk>" and friends are token names.)
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 512
SEED = 20261203
RECIPE = {
    "architecture": "LlamaForCausalLM",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "dtype": "bfloat16",
    "seed": SEED,
    "tokenizer": "byte-level BPE, corpus v1",
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
STAMP = "model.sha256"


def _corpus() -> list[str]:
    """A fixed training text: the same every run, so the tokenizer is the same."""
    words = (
        "the engine scheduler waits runs prefill decode token block cache queue request "
        "wedge watchdog metric counter gauge histogram restart evidence stack worker "
        "deferred capacity offload load store step batch sequence prompt output model"
    ).split()
    lines = []
    for i in range(400):
        picked = [words[(i * 7 + j * 13) % len(words)] for j in range(12)]
        lines.append(" ".join(picked) + f" {i} {i * 31 % 97}.")
    return lines


def recipe_digest() -> str:
    """What the model's files depend on: change the recipe and the digest changes."""
    text = json.dumps(RECIPE, sort_keys=True) + CHAT_TEMPLATE + "".join(_corpus())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_current(out: Path) -> bool:
    """Whether `out` holds a complete model made from this recipe."""
    stamp = out / STAMP
    try:
        return stamp.read_text().strip() == recipe_digest()
    except OSError:
        return False


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 64,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    missing = VOCAB_SIZE - len(fast)
    if missing > 0:  # pad so that len(tokenizer) == the model's vocab size (vLLM checks)
        fast.add_tokens([f"<|extra_{i}|>" for i in range(missing)])
    if len(fast) != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {len(fast)} tokens, the model {VOCAB_SIZE}")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _model(out: Path, tokenizer_ids: dict[str, int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=RECIPE["max_position_embeddings"],
        bos_token_id=tokenizer_ids["<s>"],
        eos_token_id=tokenizer_ids["</s>"],
        pad_token_id=tokenizer_ids["<pad>"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def make(out: Path) -> Path:
    """Make the model in `out` unless it is already there from this recipe; returns `out`."""
    if is_current(out):
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    _tokenizer(out)
    from transformers import AutoTokenizer

    loaded: Any = AutoTokenizer.from_pretrained(out)
    ids = {name: int(loaded.convert_tokens_to_ids(name)) for name in ("<s>", "</s>", "<pad>")}
    _model(out, ids)
    (out / STAMP).write_text(recipe_digest() + "\n")  # last: a complete model
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m wedgewatch.lab.real.tiny_model DIR", file=sys.stderr)
        return 2
    out = make(Path(argv[0]))
    print(f"{out}: tiny Llama ready ({recipe_digest()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
