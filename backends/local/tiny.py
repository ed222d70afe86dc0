"""A tiny model the project builds itself, for tests: a random-init Qwen2 with a byte-level
BPE tokenizer trained on the spot and a ChatML template that renders tools and tool calls.

    from backends.local.tiny import build_tiny
    path = build_tiny("/tmp/tiny")      # about a second; cached by folder
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

# A ChatML template with tools, in the Hermes / Qwen style: tools are listed in the system
# turn, tool calls are <tool_call>{json}</tool_call> lines, tool results come back as
# <tool_response> blocks in a user turn.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these tools. For each call answer with <tool_call>{\"name\": ..., "
    "\"arguments\": {...}}</tool_call>.\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content or '' }}"
    "{% for tc in message.tool_calls or [] %}<tool_call>{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {{ tc.function.arguments if tc.function.arguments is string else "
    "tc.function.arguments | tojson }}}</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "You are a helpful assistant. Answer the question in one word.",
    "The quick brown fox jumps over the lazy dog. yes no maybe hello world",
    "tic tac toe board move X O A1 A2 A3 B1 B2 B3 C1 C2 C3 up down left right",
    '{"name": "search", "arguments": {"q": "invoice"}} <tool_call> </tool_call> <tool_response>',
    "Alice Bob Carol Dave kitchen library garden 9pm 10pm knife rope candlestick",
    "From: To: Subject: Date: meeting tomorrow budget report project deadline",
    "0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048",
]


def build_tiny(folder: Union[str, Path], *, hidden: int = 128, layers: int = 2, vocab: int = 512,
               seed: int = 0) -> Path:
    """Build (once) and save the tiny model and tokenizer in ``folder``; returns the folder."""
    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    # initializer_range 0.1 (not 0.02): behind the final norm, embeddings that small cap
    # how far any logit can rise, and the model could never learn to prefer one answer
    config = Qwen2Config(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, initializer_range=0.1, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id, bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    import os

    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    fast.save_pretrained(tmp)
    (tmp / "artsdk_tiny.json").write_text(json.dumps({"hidden": hidden, "layers": layers, "seed": seed}))
    try:
        tmp.replace(folder)
    except OSError:  # another process built it first: theirs is the same model
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder
