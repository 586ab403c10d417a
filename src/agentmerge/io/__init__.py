"""Checkpoints in and out, in four floors (each imports only the floors below it; ``tests/test_layers.py``):

- ``guards``: what keeps hostile input out and broken output from being written: files read within bounds
  (``bounded``), strict JSON in (``strict_json``) and out (``jsontext``), users' regular expressions with a time
  limit (``userregex``), sizes and dtype names (``units``), which paths are inputs and outputs and what may be
  replaced (``pathargs``, ``safety``), the finiteness rules (``finite``).
- ``cache``: agentmerge's cache folder (``store``) and the input digests merge.json records (``digests``).
- ``formats``: every input format read as one tensor surface (``checkpoint.Readable``): safetensors
  (``tensorfile``, ``checkpoint``), Hub references (``hubref``, ``localpath``), PEFT LoRA adapters (``lora``,
  ``lora_config``, ``peft_layout``), verl and DCP trainer folders (``trainer_files``, ``verl``, ``dcp``,
  ``dcp_layout``), GGUF (``gguf_read``, ``gguf_names``), resized vocabularies (``vocab``), what a file is for
  (``roles``: Fisher files, tokenizer sources). ``open.open_model`` is the one way in: any model reference,
  opened with the reader its layout calls for.
- ``output``: what is written: the shard plan (``shards``) and writer (``writer``), the atomic output folder
  (``atomic``), GGUF export (``gguf_write``, ``gguf_kquant``).

Nothing here knows a method.
"""
