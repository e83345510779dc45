"""Experiments about attention itself, run by `python -m scripts.ablate`; not part of training.

Modules: variants (the three attention variants trained on one budget; the list of variants lives there),
saturation (softmax with and without the 1/sqrt(d_k) scale), attention_cost (time and peak memory of the explicit
formula against the fused kernel), report (tables, figures, results.md/json).
"""
