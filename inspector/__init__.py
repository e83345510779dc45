"""Look inside a trained model's attention.

capture  - hooks on `blocks.{i}.attn.hook_pattern`, one forward, no hooks left behind
stats    - per-head scores (entropy, distance, previous-token, first-token, self, induction) and heuristic labels
plots    - matplotlib PNGs (Agg, no pyplot): layers x heads grid, one figure per layer, head-score heatmaps
viewer   - the self-contained HTML viewer (viewer_page holds its CSS and JavaScript)
curves   - loss curves from metrics.jsonl (scripts.plot)
report   - inspect_attention (scripts.attention writes everything) and probe_attention (the trainer, each eval)
"""
