"""Generation with a masked diffusion LM: unmask a fully masked continuation over S steps.

LLaDA's sampler (Nie et al. 2025, Sec. 2.4 and Algorithm 5, "lowest-confidence remasking"):
the continuation of a prompt starts as G mask tokens; at step s the model predicts every masked
position at once, and the ``k_s`` predictions with the highest confidence (the probability the
model gives its own prediction) are kept while the rest stay masked. ``k_s`` follows LLaDA's
schedule: ``G // S`` tokens per step, the remainder ``G mod S`` spread one each over the first
steps (:func:`unmask_schedule`), so after S steps nothing is masked.

Positions are 0-based; the prompt occupies positions ``0 .. P - 1`` and is never changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from sinklab.errors import InputError

__all__ = ["DenoiseTrace", "unmask_schedule", "sample"]


def unmask_schedule(gen_len: int, steps: int) -> list[int]:
    """Tokens unmasked at each of ``steps`` steps: ``gen_len // steps`` each, plus one for the first
    ``gen_len % steps`` steps (LLaDA's ``get_num_transfer_tokens`` for one block). Sums to ``gen_len``.

    Raises:
        InputError: ``steps < 1``, ``gen_len < 1`` or ``steps > gen_len`` (a step would unmask nothing).
    """
    if gen_len < 1 or steps < 1:
        raise InputError(f"need gen_len >= 1 and steps >= 1, got gen_len={gen_len}, steps={steps}")
    if steps > gen_len:
        raise InputError(f"steps={steps} is more than the {gen_len} tokens to generate: every step must unmask at "
                         "least one token; use at most gen_len steps")
    base, extra = divmod(gen_len, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


@dataclass
class DenoiseTrace:
    """What :func:`sample` returns.

    Attributes:
        tokens: (B, P + G) int64 final sequence (prompt + generated, nothing masked).
        states: S + 1 tensors (B, P + G) int64: ``states[s]`` is the input of step s (``states[0]``
            = prompt + G mask tokens), ``states[S]`` the final sequence.
        unmasked: S tensors (B, k_s) int64: the 0-based positions unmasked at step s.
        confidence: S tensors (B, k_s) float32: the probability of the kept prediction at those positions.
        schedule: ``k_s`` per step. prompt_len: P. mask_id: the mask token id.
    """

    tokens: Tensor
    states: list[Tensor]
    unmasked: list[Tensor] = field(default_factory=list)
    confidence: list[Tensor] = field(default_factory=list)
    schedule: list[int] = field(default_factory=list)
    prompt_len: int = 0
    mask_id: int = -1


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt: Tensor,
    *,
    gen_len: int,
    steps: int,
    mask_id: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> DenoiseTrace:
    """Generate ``gen_len`` tokens after ``prompt`` in ``steps`` denoising steps, lowest-confidence remasking.

    Args:
        model: a bidirectional :class:`sinklab.nn.SinkLM` (``config.causal = False``; a masked
            diffusion run's ``final/``), eval mode.
        prompt: (B, P) int64 prompt ids, P >= 1 (position 0 first; BOS if the model was trained with it).
        gen_len: G, tokens to generate. steps: S, 1 <= S <= G.
        mask_id: the mask token's id (``<|mask|>`` of the run's tokenizer).
        temperature: 0 = greedy (argmax); > 0 = sample from softmax(logits / temperature) (Gumbel-max,
            seeded with ``seed``). Confidence is always the softmax probability at temperature 1 of the
            chosen token.

    The model is never asked to predict the mask token (its logit is set to -inf).

    Returns:
        :class:`DenoiseTrace`.

    Raises:
        InputError: a causal model, a bad prompt, ``mask_id`` outside the vocabulary, a bad schedule
            (see :func:`unmask_schedule`), P + G past the model's positional limit, temperature < 0.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "causal", True):
        raise InputError("the diffusion sampler needs a bidirectional masked diffusion model (model.causal = false, "
                         "trained with train.objective = 'masked_diffusion'); this model is causal")
    if prompt.dim() != 2 or prompt.shape[1] < 1 or prompt.dtype not in (torch.int64, torch.int32):
        raise InputError(f"prompt must be a (B, P) integer tensor with P >= 1, got {prompt.dtype} {tuple(prompt.shape)}")
    if not 0 <= mask_id < cfg.vocab_size:
        raise InputError(f"mask_id {mask_id} is outside the model's vocabulary of {cfg.vocab_size}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0, got {temperature}")
    schedule = unmask_schedule(gen_len, steps)
    B, P = prompt.shape
    device = next(model.parameters()).device
    x = torch.cat([prompt.to(device, torch.int64), torch.full((B, gen_len), mask_id, dtype=torch.int64, device=device)], 1)
    model.positional.check_length(x.shape[1])
    g = torch.Generator(device=device).manual_seed(seed)
    trace = DenoiseTrace(tokens=x, states=[x.clone()], schedule=schedule, prompt_len=P, mask_id=mask_id)
    rows = torch.arange(B, device=device)[:, None]
    for k in schedule:
        logits = model(x).logits.float()  # (B, T, V)
        logits[..., mask_id] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        if temperature > 0:
            u = torch.rand(logits.shape, generator=g, device=device).clamp_min(1e-20)
            pred = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max sample
        else:
            pred = logits.argmax(-1)  # (B, T)
        conf = probs.gather(-1, pred[..., None]).squeeze(-1)  # (B, T)
        still = x == mask_id
        still[:, :P] = False  # the prompt is never changed, even if it holds a mask token
        conf = torch.where(still, conf, torch.full_like(conf, -1.0))
        pos = conf.topk(k, dim=-1).indices  # (B, k): highest confidence among the masked positions
        x = x.clone()
        x[rows, pos] = pred[rows, pos]
        trace.unmasked.append(pos)
        trace.confidence.append(conf[rows, pos])
        trace.states.append(x.clone())
    trace.tokens = x
    return trace
