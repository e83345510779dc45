"""Look inside a trained model's attention.

capture  - hooks on `blocks.{i}.attn.hook_pattern`, one forward, no hooks left behind
stats    - per-head scores (entropy, distance, previous-token, first-token, self, induction) and heuristic labels
plots    - matplotlib PNGs (Agg, no pyplot): layers x heads grid, one figure per layer, head-score heatmaps
viewer   - the self-contained HTML viewer (its CSS and JavaScript are files in inspector/assets/)
film     - the attention film: frames saved at each eval, one page with a slider across the run
curves   - loss curves from metrics.jsonl (scripts.plot)
report   - inspect_attention (scripts.attention writes everything) and probe_attention (the trainer, each eval)
"""
