"""The network and what runs it once trained.

config, layers, attention, hooks, gpt  the architecture: ModelConfig, norms/FFN/blocks, the attention paths
                                       (explicit formula, fused SDPA, additive), hook points, GPT
loss                                   the chunked LM-head cross-entropy
kv_cache, inference, text_stream       decoding: the caches, the one sampling chain and the decoders, text out
quantize                               int8 weights for inference
checkpoint, run_data                   checkpoint folders (save, load, load_any) and where their data went
hf_*, nanogpt                          Hugging Face and nanoGPT formats in and out
eval_mode, param_error                 small shared helpers
"""
