"""Checkpoints in and out: every input format read as one tensor surface, shards and atomic folders written.

Reading: safetensors headers and chunk reads (``headers``, ``checkpoint``), PEFT LoRA adapters (``lora``),
RL-trainer folders (``trainer``), resized vocabularies (``vocab``), Hub references (``hubref``, ``localpath``),
the tokenizer / chat-template source (``sources``). Writing: the shard plan and writer and the atomic output
folder (``checkpoint``), guarded by ``safety``. Around them: input digests (``digests``), the statistics cache
(``cache``), sizes and dtype names (``units``) and input checks (``validate``). Nothing here knows a method.
"""
