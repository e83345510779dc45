"""Cross-entropy of the LM head without materialising all logits: fused linear + loss, chunk by chunk.

At GPT-2 size one sequence of 1024 tokens has 1024 x 50304 fp32 logits (206 MB), and autograd keeps them plus
their gradient. Here each chunk's logits are made, turned into the loss and straight into the gradients of the
hidden states and of the head weight, then dropped. Same FLOPs as forward + backward, a fraction of the memory.
It is the training path on CPU only (`chunked_loss_pays`); CUDA takes full logits and the fused cross-entropy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int, softcap: float):
        x2 = x.reshape(-1, x.size(-1))
        t = targets.reshape(-1)
        valid = t != -1
        count = valid.sum().clamp(min=1)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_x = torch.empty_like(x2) if need_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for start in range(0, x2.size(0), chunk):
            xc, tc = x2[start:start + chunk], t[start:start + chunk]
            z = (xc @ weight.t()).float()
            logits = softcap * torch.tanh(z / softcap) if softcap else z
            lse = torch.logsumexp(logits, dim=-1)
            vc = tc != -1
            tgt = logits.gather(1, tc.clamp(min=0).unsqueeze(1)).squeeze(1)
            total += ((lse - tgt) * vc).sum()
            if need_grad:
                g = torch.softmax(logits, dim=-1)  # d(loss_sum)/d(logits) = softmax - onehot on valid rows
                g[torch.arange(g.size(0), device=g.device), tc.clamp(min=0)] -= 1.0
                g *= vc.unsqueeze(1)
                if softcap:
                    g *= 1.0 - (logits / softcap) ** 2
                g = g.to(weight.dtype)
                grad_x[start:start + chunk] = g @ weight
                grad_w += (g.t() @ xc).float()
        ctx.save_for_backward(grad_x, grad_w, count)
        ctx.x_shape = x.shape
        ctx.w_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_x, grad_w, count = ctx.saved_tensors
        scale = grad_out / count
        gx = (grad_x * scale.to(grad_x.dtype)).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        gw = (grad_w * scale).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None


def logits_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of full [..., vocab] logits in fp32 (torch's fused log-softmax + NLL); -1 targets ignored."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def chunked_loss_pays(x: torch.Tensor) -> bool:
    """Whether the training step takes the chunked loss for hidden states `x`: on CPU only, where it was measured
    faster (1024 x 50304 fp32 logits fault in fresh pages every step) and its small chunks suit the caches.

    On CUDA, full logits and torch's fused cross-entropy kernel do the same work as large matrix products, where the
    128-row chunks sized for a CPU would re-cast the 154 MB head and re-read its fp32 gradient once per chunk. Under
    torch.compile the graph fuses the head and the loss itself, so the eager chunk loop would only break it up.
    """
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


CHUNK_BYTES = 32 * 2 ** 20  # fp32 logits per chunk: small enough that allocators recycle it without page faults


def chunked_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 0,
                          softcap: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy of logits = x @ weight.T (optionally soft-capped) against targets; -1 targets ignored.

    `chunk` rows per piece; 0 picks a multiple of 64 rows whose logits fit in CHUNK_BYTES.
    """
    if chunk <= 0:
        chunk = max(64, CHUNK_BYTES // (4 * weight.size(0)) // 64 * 64)
    return _ChunkedLinearCrossEntropy.apply(x, weight, targets, chunk, softcap)
