"""Traceable decoder-only translators (HY-MT / Hunyuan dense, Qwen3, Gemma 3 and TranslateGemma's text decoder):
one graph that prefills a prompt and then takes single steps, with a cache buffer per layer that the runtime owns.

Inputs: `input_ids` (rows, new_len), right-padded; `input_length` (rows,), how many of a row's new_len positions are
its own (a prompt's length at prefill, 1 at a step); `past_length` (rows,), each row's cache length (its first new
token's position); per layer `past_key.i` / `past_value.i` buffers (rows, kv_heads, capacity, head_dim), read up to
each row's past_length. Outputs: `logits` (rows, vocab) at each row's last own position, and per layer `new_key.i` /
`new_value.i` (rows, kv_heads, new_len, head_dim), which the runtime writes into its buffers at the row's
past_length (only the row's own input_length of them). Rows of different prompt and cache lengths share one call, as
the encoder-decoder graphs' rows do (format 4): a padded position writes nothing the row will read, and no own
position attends to one (the causal mask).

Each family's arithmetic, as transformers computes it (modeling_hunyuan_v1_dense.py, modeling_qwen3.py,
modeling_gemma3.py), written out rather than traced through transformers' Cache classes:

- rotary embeddings from the model's own `inv_freq` buffers (Hunyuan's "dynamic" NTK-alpha rope is a static base,
  already in its buffer; Gemma 3 has one table for its sliding layers and one, linearly scaled, for its global ones);
- q/k norms per head: Qwen3 and Gemma 3 before the rotation, Hunyuan after it;
- grouped-query attention without repeating the keys: a key head's query heads are stacked along the query axis;
- Gemma 3: `(1 + w)` RMSNorm, four norms per layer, the embedding times sqrt(hidden) rounded to the weights' dtype,
  `query_pre_attn_scalar ** -0.5` as the score scale, sliding-window layers, the final logits' soft-capping where
  transformers applies it (Gemma3ForCausalLM only; no attention soft-capping);
- RMSNorm's mean of squares as ReduceSum / width (export/t5.py `_rms_norm` says why), tied embeddings stored once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .marian import load_eager


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """Llama's RMSNorm (`w * x / rms`), or Gemma's (`x / rms * (1 + w)`). The width is the weight's length, a
    constant in the graph: `x.shape[-1]` would be traced as Shape, Gather and Cast before every norm (four a layer)."""
    width = float(weight.shape[0])
    normed = x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / width + eps)
    return normed * (1.0 + weight) if gemma else weight * normed


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on (rows, new_len, heads, head_dim), cos/sin (rows, new_len, 1, head_dim)."""
    half = head_dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _project(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """`linear(x)` as a MatMul (plus Add for a bias): the int8 quantizer quantizes layer MatMuls per channel."""
    out = torch.matmul(x, linear.weight.t())
    return out if linear.bias is None else out + linear.bias


class DecoderOnlyExport(nn.Module):
    """The graph described in the module docstring, for a transformers causal LM of one of the three families."""

    buffered = True

    def __init__(self, model: Any) -> None:
        super().__init__()
        config = model.config.get_text_config()
        self.family = config.model_type  # hunyuan_v1_dense, qwen3, gemma3_text
        self.gemma = self.family.startswith("gemma3")
        inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * len(self.layers))
        self.window = getattr(config, "sliding_window", None)
        if self.gemma:
            self.scaling = float(config.query_pre_attn_scalar) ** -0.5
            # transformers multiplies by sqrt(hidden) cast to the weights' dtype (bf16: 50.596 -> 50.5).
            self.embed_scale = float(torch.tensor(self.hidden**0.5).to(self.embed_tokens.weight.dtype))
            # As transformers 5: Gemma3ForCausalLM caps the final logits, the multimodal wrapper does not, and no
            # Gemma 3 attention passes `attn_logit_softcapping` on (a config field with no effect).
            capped = model.config.model_type == "gemma3_text"
            self.final_softcap = getattr(config, "final_logit_softcapping", None) if capped else None
        else:
            self.scaling = self.head_dim**-0.5
            self.embed_scale = 1.0
            self.final_softcap = None
        rotary = inner.rotary_emb
        kinds = sorted(set(self.layer_types)) if self.gemma else ["full_attention"]
        for kind in kinds:
            inv_freq = getattr(rotary, f"{kind}_inv_freq") if self.gemma else rotary.inv_freq
            scaling = getattr(rotary, f"{kind}_attention_scaling") if self.gemma else rotary.attention_scaling
            self.register_buffer(f"inv_freq_{kind}", inv_freq.detach().clone().float(), persistent=False)
            setattr(self, f"rope_scaling_{kind}", float(scaling))

    def forward(
        self, input_ids: torch.Tensor, input_length: torch.Tensor, past_length: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        rows, new_len = input_ids.shape
        hidden = F.embedding(input_ids, self.embed_tokens.weight)  # (rows, new_len, hidden)
        if self.gemma:
            hidden = hidden * self.embed_scale
        hidden = hidden.reshape(-1, self.hidden)  # (rows * new_len, hidden)
        steps = torch.arange(new_len, device=input_ids.device)
        positions = past_length[:, None] + steps[None, :]  # (rows, new_len)
        # Gemma 3's sliding and global layers have rotary tables of their own; the others one for every layer.
        tables = {kind: kind if self.gemma else "full_attention" for kind in set(self.layer_types)}
        rope = {kind: self._rope(positions, table) for kind, table in tables.items()}
        masks = {kind: self._mask(positions, past_length, past[0].shape[2], kind) for kind in set(self.layer_types)}
        outputs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            kind = self.layer_types[i]
            hidden, key, value = self._layer(layer, hidden, rows, rope[kind], masks[kind], past[2 * i : 2 * i + 2])
            outputs += [key, value]
        # Only each row's last own position leaves the graph: (rows, hidden), then the head.
        last = hidden.reshape(rows, new_len, self.hidden)[torch.arange(rows), input_length - 1]
        logits = F.linear(_rms(last, self.norm.weight, self.eps, self.gemma), self.lm_head.weight)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return (logits, *outputs)

    def _rope(self, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (rows, new_len, 1, head_dim) as transformers' rotary modules compute them."""
        freqs = positions[..., None].float() * getattr(self, f"inv_freq_{kind}")  # (rows, new_len, head_dim / 2)
        angles = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
        scaling = getattr(self, f"rope_scaling_{kind}")
        cos, sin = angles.cos(), angles.sin()
        return (cos, sin) if scaling == 1.0 else (cos * scaling, sin * scaling)

    def _mask(self, positions: torch.Tensor, past_length: torch.Tensor, capacity: Any, kind: str) -> torch.Tensor:
        """The additive mask (rows, 1, 1, new_len, new_len + capacity): the new keys first (causal among
        themselves), then the buffer's positions below the row's past_length; a sliding layer also drops keys
        `window` or more positions behind the query (transformers' `kv_idx > q_idx - window`)."""
        new_len = positions.shape[1]
        steps = torch.arange(new_len, device=positions.device)
        buffer_pos = torch.arange(capacity, device=positions.device)
        new_keys = steps[None, None, :] > steps[None, :, None]  # (1, new_len, new_len): a later key
        old_keys = buffer_pos[None, None, :] >= past_length[:, None, None]  # (rows, 1, capacity): beyond the cache
        if kind == "sliding_attention" and self.window is not None:
            new_keys = new_keys | (steps[None, None, :] <= steps[None, :, None] - self.window)
            old_keys = old_keys | (buffer_pos[None, None, :] <= positions[:, :, None] - self.window)
        blocked = torch.cat([new_keys.expand(positions.shape[0], -1, -1), old_keys.expand(-1, new_len, -1)], dim=-1)
        return (blocked.to(torch.float32) * torch.finfo(torch.float32).min)[:, None, None]

    def _layer(self, layer, hidden, rows, rope, mask, past):
        eps, gemma = self.eps, self.gemma
        attended, key, value = self._attention(
            layer.self_attn, _rms(hidden, layer.input_layernorm.weight, eps, gemma), rows, rope, mask, past
        )
        if gemma:
            hidden = hidden + _rms(attended, layer.post_attention_layernorm.weight, eps, gemma)
            mlp = self._mlp(layer.mlp, _rms(hidden, layer.pre_feedforward_layernorm.weight, eps, gemma))
            hidden = hidden + _rms(mlp, layer.post_feedforward_layernorm.weight, eps, gemma)
        else:
            hidden = hidden + attended
            hidden = hidden + self._mlp(layer.mlp, _rms(hidden, layer.post_attention_layernorm.weight, eps, gemma))
        return hidden, key, value

    def _mlp(self, mlp, x):
        # gate and up as one MatMul on their weights side by side (the same dot products per column), split once:
        # one kernel, and in int8 one quantization of x, instead of two.
        inter = mlp.gate_proj.weight.shape[0]
        gate_up = torch.matmul(x, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t())
        return _project(mlp.act_fn(gate_up[:, :inter]) * gate_up[:, inter:], mlp.down_proj)

    def _attention(self, attn, x, rows, rope, mask, past):
        """Self-attention of `x` (rows * new_len, hidden) over the buffers and the new positions, out-projected;
        and the new positions' keys and values (rows, kv_heads, new_len, head_dim)."""
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        groups = heads // kv_heads
        # Query, key and value as one MatMul on the three weights side by side (the same dot products per column),
        # split once: one kernel (and in int8 one quantization of x) instead of three.
        if attn.q_proj.bias is not None:
            raise ValueError("decoder-only export: attention projections with a bias are not supported")
        qkv = torch.matmul(x, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t())
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        q = qkv[:, :q_width].reshape(rows, -1, heads, head_dim)  # (rows, new_len, heads, hd)
        k = qkv[:, q_width : q_width + kv_width].reshape(rows, -1, kv_heads, head_dim)
        v = qkv[:, q_width + kv_width :].reshape(rows, -1, kv_heads, head_dim)
        cos, sin = rope
        if self.family == "hunyuan_v1_dense":  # its q/k norms come after the rotation
            q = _rms(_rotate(q, cos, sin, head_dim), attn.query_layernorm.weight, self.eps, False)
            k = _rms(_rotate(k, cos, sin, head_dim), attn.key_layernorm.weight, self.eps, False)
        else:
            q = _rotate(_rms(q, attn.q_norm.weight, self.eps, self.gemma), cos, sin, head_dim)
            k = _rotate(_rms(k, attn.k_norm.weight, self.eps, self.gemma), cos, sin, head_dim)
        new_len = q.shape[1]
        # Query head h reads key head h // groups: a key head's queries stacked, (rows, kv, groups * new_len, hd).
        q = q.reshape(rows, new_len, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(rows, kv_heads, groups * new_len, head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (rows, kv, new_len, hd)
        scores = torch.cat([torch.matmul(q, k.transpose(2, 3)), torch.matmul(q, past[0].transpose(2, 3))], dim=-1)
        scores = scores * self.scaling
        scores = scores.reshape(rows, kv_heads, groups, new_len, -1) + mask
        weights = F.softmax(scores, dim=-1).reshape(rows, kv_heads, groups * new_len, -1)
        attended = torch.matmul(weights[..., :new_len], v) + torch.matmul(weights[..., new_len:], past[1])
        attended = attended.reshape(rows, kv_heads, groups, new_len, head_dim).permute(0, 3, 1, 2, 4)
        return _project(attended.reshape(-1, heads * head_dim), attn.o_proj), k, v


def load(path: str) -> Any:
    """The causal LM of a directory; TranslateGemma's multimodal wrapper as it is (its text decoder is exported)."""
    import json
    from pathlib import Path

    from transformers import AutoModelForCausalLM, Gemma3ForConditionalGeneration

    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") == "gemma3":
        return load_eager(Gemma3ForConditionalGeneration, path)
    return load_eager(AutoModelForCausalLM, path)


def decoder(model: Any, buffered: bool = True) -> nn.Module:
    if not buffered:
        raise ValueError("decoder-only models are exported with the cache buffer only (no --cache-concat)")
    return DecoderOnlyExport(model).eval()
