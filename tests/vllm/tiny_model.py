"""A tiny random-weight Llama as a model folder vLLM can load: no hub, no download.

``build(path)`` saves ``LlamaForCausalLM(LlamaConfig(...tiny...))`` in bfloat16 with a
``PreTrainedTokenizerFast`` built from a ``tokenizers`` WordLevel vocabulary (one word per id),
so prompts can be given as token ids of known lengths and outputs decode to words.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 128


def build(path: str | Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                         torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
