"""The data pipeline: text source -> tokenizer -> uint16/uint32 token shards + meta.json -> random-window loader.

Modules: config (DataConfig), sources / shakespeare / hf (where text comes from), tokenizers / bpe_train,
corpus / encode / shards (staging, chunked tokenization, shard files), meta (meta.json), prepare (the whole build),
loader (ShardLoader). Import the module you need; this package imports nothing heavy on its own.
"""
