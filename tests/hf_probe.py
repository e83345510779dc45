"""Run by the interop tests in a fresh interpreter: load an export folder as a transformers user would, with
attngpt's own packages made unimportable, and write the logits of some ids and a greedy pipeline continuation.

  python tests/hf_probe.py FOLDER IDS_JSON PROMPT MAX_NEW_TOKENS OUT.safetensors   (prints the continuation as JSON)
"""
import json
import sys

for _name in ("model", "data", "train", "inspector", "scripts", "tests"):
    sys.modules[_name] = None  # an import of any of them now fails: the folder must stand on its own

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

folder, ids, prompt, max_new = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
generate = transformers.pipeline("text-generation", model=folder, trust_remote_code=True)
with torch.no_grad():
    logits = generate.model(torch.tensor(ids)).logits
save_file({"logits": logits.contiguous()}, sys.argv[5])
text = generate(prompt, max_new_tokens=max_new, do_sample=False)[0]["generated_text"]
print(json.dumps({"class": type(generate.model).__name__, "text": text}))
