"""Traceable decoder-only translators (HY-MT / Hunyuan dense, Qwen3, Gemma 3 and TranslateGemma's text decoder):
one graph that prefills a prompt and then takes single steps, with a cache buffer per layer that the runtime owns.

Inputs: `input_ids` (rows, new_len), right-padded; `input_length` (rows,), how many of a row's new_len positions are
its own (a prompt's length at prefill, 1 at a step); `past_length` (rows,), each row's cache length (its first new
token's position); per layer `past_key.i` / `past_value.i` buffers (rows, kv_heads, capacity, head_dim), read up to
each row's past_length. Outputs: `logits` (rows, vocab) at each row's last own position, and per layer either
- (the default, `--fused-attention`) `present_key.i` / `present_value.i`: the buffers themselves, into which ONNX
  Runtime's GroupQueryAttention writes each row's own new positions at its past_length (the runtime binds each to
  the memory of its `past_*` input, so nothing is copied; the buffer needs room for the whole padded chunk), or
- (`--separate-attention`) `new_key.i` / `new_value.i` (rows, kv_heads, new_len, head_dim), which the runtime writes
  into its buffers at the row's past_length (only the row's own input_length of them).
Rows of different prompt and cache lengths share one call, as the encoder-decoder graphs' rows do (format 4): a
padded position writes nothing the row will read, and no own position attends to one (the causal mask).

Each family's arithmetic, as transformers computes it (modeling_hunyuan_v1_dense.py, modeling_qwen3.py,
modeling_gemma3.py), written out rather than traced through transformers' Cache classes:

- rotary embeddings from the model's own `inv_freq` buffers (Hunyuan's "dynamic" NTK-alpha rope is a static base,
  already in its buffer; Gemma 3 has one table for its sliding layers and one, linearly scaled, for its global ones);
- q/k norms per head: Qwen3 and Gemma 3 before the rotation, Hunyuan after it;
- grouped-query attention without repeating the keys: a key head's query heads are stacked along the query axis;
- Gemma 3: `(1 + w)` RMSNorm, four norms per layer, the embedding times sqrt(hidden) rounded to the weights' dtype,
  `query_pre_attn_scalar ** -0.5` as the score scale, sliding-window layers, the final logits' soft-capping where
  transformers applies it (Gemma3ForCausalLM only; no attention soft-capping);
- ONNX Runtime's fused CPU kernels where they compute the same thing: every RMSNorm as SimplifiedLayerNormalization,
  each residual add with the norm that reads its sum as SkipSimplifiedLayerNormalization, the rotations as
  RotaryEmbedding (com.microsoft); each works on one position's row at a time, so a row's bits do not depend on
  what runs beside it;
- tied embeddings stored once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .marian import load_eager


class _SimplifiedNorm(torch.autograd.Function):
    """RMSNorm over the last axis, `weight * x / rms(x)`, exported as ONNX Runtime's SimplifiedLayerNormalization
    (one kernel instead of seven; each row normalised on its own, so a row's bits do not depend on its batch)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    @staticmethod
    def symbolic(g: Any, x: Any, weight: Any, eps: float) -> Any:
        out = g.op("SimplifiedLayerNormalization", x, weight, axis_i=-1, epsilon_f=eps, stash_type_i=1)
        return out.setType(x.type())


class _SkipNorm(torch.autograd.Function):
    """`x + skip` and its RMSNorm, exported as ONNX Runtime's SkipSimplifiedLayerNormalization (com.microsoft):
    the residual add and the norm in one kernel. Returns (normed, sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, eps: float) -> Any:
        total = x + skip
        return weight * (total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps)), total

    @staticmethod
    def symbolic(g: Any, x: Any, skip: Any, weight: Any, eps: float) -> Any:
        op = "com.microsoft::SkipSimplifiedLayerNormalization"
        normed, _, _, total = g.op(op, x, skip, weight, epsilon_f=eps, outputs=4)
        return normed.setType(x.type()), total.setType(x.type())


class _Rotary(torch.autograd.Function):
    """transformers' apply_rotary_pos_emb (rotate_half) on `x` (rows, new_len, heads * head_dim), exported as ONNX
    Runtime's RotaryEmbedding (com.microsoft). `cos` and `sin` (rows * new_len, head_dim / 2) are each position's
    own table rows, and `index` (rows, new_len) is each position's row in them: no table of every position the
    model could reach (HY-MT's 262,144 positions would be 128 MB), and a row's rotation is its own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int):
        rows, new_len, width = x.shape
        x = x.reshape(rows, new_len, heads, width // heads)
        half = x.shape[-1] // 2
        cos_full = torch.cat([cos, cos], dim=-1)[index][:, :, None, :]  # (rows, new_len, 1, head_dim)
        sin_full = torch.cat([sin, sin], dim=-1)[index][:, :, None, :]
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x * cos_full + rotated * sin_full).reshape(rows, new_len, width)

    @staticmethod
    def symbolic(g: Any, x: Any, index: Any, cos: Any, sin: Any, heads: int) -> Any:
        out = g.op("com.microsoft::RotaryEmbedding", x, index, cos, sin, num_heads_i=heads, interleaved_i=0)
        return out.setType(x.type())


class _GroupQueryAttention(torch.autograd.Function):
    """Causal grouped-query attention of each row's own new positions over its cache, exported as ONNX Runtime's
    GroupQueryAttention (com.microsoft), which writes the new keys and values into the cache buffer in place.

    q (rows, new_len, heads * hd), k and v (rows, new_len, kv_heads * hd), right-padded: row r's first
    `query_lengths[r]` positions are its own. past_k / past_v (rows, kv_heads, capacity, hd) hold each row's
    `total[r] - query_lengths[r]` cached positions. Returns the attended values (rows, new_len, heads * hd; a padded
    position's are unspecified) and the buffers with the own positions written after the cached ones (the same
    memory when the caller binds each present output to its past input, as runtime/decoder_only.py does).
    `seqlens` is `total - 1` (int32, the operator's form), `bound` an upper bound of every row's total (int32).
    `window`: a sliding layer's window (keys `window` or more positions behind the query are dropped), or -1."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        seqlens: torch.Tensor,
        bound: torch.Tensor,
        query_lengths: torch.Tensor,
        heads: int,
        kv_heads: int,
        scale: float,
        window: int,
    ) -> Any:
        rows, new_len, _ = q.shape
        hd = past_k.shape[-1]
        present_k, present_v = past_k.clone(), past_v.clone()
        out = torch.zeros_like(q).reshape(rows, new_len, heads, hd)
        for r in range(rows):
            n, total = int(query_lengths[r]), int(seqlens[r]) + 1
            start = total - n
            present_k[r, :, start:total] = k[r, :n].reshape(n, kv_heads, hd).transpose(0, 1)
            present_v[r, :, start:total] = v[r, :n].reshape(n, kv_heads, hd).transpose(0, 1)
            keys = present_k[r, :, :total].repeat_interleave(heads // kv_heads, dim=0)  # (heads, total, hd)
            values = present_v[r, :, :total].repeat_interleave(heads // kv_heads, dim=0)
            query = q[r, :n].reshape(n, heads, hd).transpose(0, 1)  # (heads, n, hd)
            scores = torch.matmul(query, keys.transpose(1, 2)) * scale  # (heads, n, total)
            key_pos, query_pos = torch.arange(total)[None, :], torch.arange(start, total)[:, None]
            blocked = key_pos > query_pos
            if window > 0:
                blocked = blocked | (key_pos <= query_pos - window)
            weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
            out[r, :n] = torch.matmul(weights, values).transpose(0, 1)
        return out.reshape(rows, new_len, heads * hd), present_k, present_v

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens, bound, query_lengths, heads, kv_heads, scale, window):
        none = g.op("prim::Constant").setType(torch._C.NoneType.get())
        # Inputs 7-15 (rotary tables, positions, bias, sinks, cache scales, q/k norm weights) are not used: the
        # rotation and the norms are nodes of their own (Hunyuan normalises after the rotation).
        out, present_k, present_v = g.op(
            "com.microsoft::GroupQueryAttention",
            q, k, v, past_k, past_v, seqlens, bound, *[none] * 9, query_lengths,
            num_heads_i=heads, kv_num_heads_i=kv_heads, scale_f=scale,
            local_window_size_i=window if window > 0 else -1, outputs=3,
        )  # fmt: skip
        return out.setType(q.type()), present_k.setType(past_k.type()), present_v.setType(past_v.type())


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """Llama's RMSNorm (`w * x / rms`), or Gemma's (`x / rms * (1 + w)`, the same with the weight `1 + w`, which
    the binding folds into one tensor)."""
    return _SimplifiedNorm.apply(x, 1.0 + weight if gemma else weight, eps)


def _skip_rms(
    x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm of `x + skip`, `x + skip`)."""
    return _SkipNorm.apply(x, skip, 1.0 + weight if gemma else weight, eps)


def _project(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """`linear(x)` as a MatMul (plus Add for a bias): the int8 quantizer quantizes layer MatMuls per channel."""
    out = torch.matmul(x, linear.weight.t())
    return out if linear.bias is None else out + linear.bias


class DecoderOnlyExport(nn.Module):
    """The graph described in the module docstring, for a transformers causal LM of one of the three families."""

    buffered = True

    def __init__(self, model: Any, cache_in_place: bool = False) -> None:
        """`cache_in_place`: attention as GroupQueryAttention, which writes the new keys and values into the cache
        buffers (outputs `present_key.i` / `present_value.i`, the buffers themselves) instead of returning them
        (`new_key.i` / `new_value.i`) for the runtime to write."""
        super().__init__()
        self.cache_in_place = cache_in_place
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
        steps = torch.arange(new_len, device=input_ids.device)
        positions = past_length[:, None] + steps[None, :]  # (rows, new_len)
        # Gemma 3's sliding and global layers have rotary tables of their own; the others one for every layer.
        tables = {kind: kind if self.gemma else "full_attention" for kind in set(self.layer_types)}
        rope = {kind: self._rope(positions, table) for kind, table in tables.items()}
        masks: dict[str, Any]
        if self.cache_in_place:  # GroupQueryAttention's per-row lengths and window stand for the mask
            seqlens = (past_length + input_length - 1).to(torch.int32)
            lengths = (seqlens, seqlens.max() + 1, input_length.to(torch.int32))
            masks = {kind: (*lengths, self._window(kind)) for kind in set(self.layer_types)}
        else:
            masks = {kind: self._mask(positions, past_length, past[0].shape[2], kind) for kind in set(self.layer_types)}
        outputs: list[torch.Tensor] = []
        # Each residual add is fused with the norm that reads its sum (SkipSimplifiedLayerNormalization): a layer
        # leaves its last sublayer's output `pending`, which the next layer's input norm adds to `hidden`.
        pending: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            kind = self.layer_types[i]
            hidden, pending, key, value = self._layer(
                layer, hidden, pending, (rows, new_len), rope[kind], masks[kind], past[2 * i : 2 * i + 2]
            )
            outputs += [key, value]
        hidden = hidden + pending if pending is not None else hidden
        # Only each row's last own position leaves the graph: (rows, hidden), then the head.
        last = hidden[torch.arange(rows), input_length - 1]
        logits = F.linear(_rms(last, self.norm.weight, self.eps, self.gemma), self.lm_head.weight)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return (logits, *outputs)

    def _rope(self, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rotary tables of the call's own positions, as transformers' rotary modules compute them: cos and sin
        (rows * new_len, head_dim / 2), and each position's row in them, (rows, new_len) (`_Rotary`)."""
        freqs = positions.reshape(-1, 1).float() * getattr(self, f"inv_freq_{kind}")  # (rows * new_len, hd / 2)
        scaling = getattr(self, f"rope_scaling_{kind}")
        cos, sin = freqs.cos(), freqs.sin()
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        index = torch.arange(positions.numel(), device=positions.device).reshape(positions.shape)
        return index, cos, sin

    def _window(self, kind: str) -> int:
        """A sliding layer's window, -1 for a global one."""
        return int(self.window) if kind == "sliding_attention" and self.window is not None else -1

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

    def _layer(self, layer, hidden, pending, shape, rope, mask, past):
        """One layer on `hidden + pending` (the residual stream and the previous layer's last output, not yet
        added; None at the first layer): (the stream, this layer's last output, key, value)."""
        eps, gemma = self.eps, self.gemma
        if pending is None:
            normed = _rms(hidden, layer.input_layernorm.weight, eps, gemma)
        else:
            normed, hidden = _skip_rms(pending, hidden, layer.input_layernorm.weight, eps, gemma)
        attended, key, value = self._attention(layer.self_attn, normed, shape, rope, mask, past)
        if gemma:
            attended = _rms(attended, layer.post_attention_layernorm.weight, eps, gemma)
            normed, hidden = _skip_rms(attended, hidden, layer.pre_feedforward_layernorm.weight, eps, gemma)
            mlp = _rms(self._mlp(layer.mlp, normed), layer.post_feedforward_layernorm.weight, eps, gemma)
            return hidden, mlp, key, value
        normed, hidden = _skip_rms(attended, hidden, layer.post_attention_layernorm.weight, eps, gemma)
        return hidden, self._mlp(layer.mlp, normed), key, value

    def _mlp(self, mlp, x):
        # gate and up as one MatMul on their weights side by side (the same dot products per column), split once:
        # one kernel, and in int8 one quantization of x, instead of two.
        inter = mlp.gate_proj.weight.shape[0]
        gate_up = torch.matmul(x, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t())
        return _project(mlp.act_fn(gate_up[..., :inter]) * gate_up[..., inter:], mlp.down_proj)

    def _attention(self, attn, x, shape, rope, mask, past):
        """Self-attention of `x` (rows, new_len, hidden) over the buffers and the new positions, out-projected;
        and the new positions' keys and values (rows, kv_heads, new_len, head_dim)."""
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        groups = heads // kv_heads
        # Query, key and value as one MatMul on the three weights side by side (the same dot products per column),
        # split once: one kernel (and in int8 one quantization of x) instead of three.
        if attn.q_proj.bias is not None:
            raise ValueError("decoder-only export: attention projections with a bias are not supported")
        qkv = torch.matmul(x, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t())
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        # The call's rows and new_len, read once from input_ids for every layer (q.shape would be read again in each).
        rows, new_len = shape
        q = qkv[..., :q_width]  # (rows, new_len, heads * hd)
        k = qkv[..., q_width : q_width + kv_width]  # (rows, new_len, kv_heads * hd)
        v = qkv[..., q_width + kv_width :]

        def rotate(x: torch.Tensor, n: int) -> torch.Tensor:  # (rows, new_len, n * hd)
            return _Rotary.apply(x, *rope, n)

        def norm(x: torch.Tensor, n: int, weight: torch.Tensor, gemma: bool) -> torch.Tensor:  # per head
            return _rms(x.reshape(rows, new_len, n, head_dim), weight, self.eps, gemma).reshape(rows, new_len, -1)

        if self.family == "hunyuan_v1_dense":  # its q/k norms come after the rotation
            q = norm(rotate(q, heads), heads, attn.query_layernorm.weight, False)
            k = norm(rotate(k, kv_heads), kv_heads, attn.key_layernorm.weight, False)
        else:
            q = rotate(norm(q, heads, attn.q_norm.weight, self.gemma), heads)
            k = rotate(norm(k, kv_heads, attn.k_norm.weight, self.gemma), kv_heads)
        if self.cache_in_place:  # mask: (seqlens, bound, query_lengths, window), _GroupQueryAttention's
            out, key, value = _GroupQueryAttention.apply(
                q, k, v, *past, *mask[:3], heads, kv_heads, self.scaling, mask[3]
            )
            return _project(out, attn.o_proj), key, value
        q = q.reshape(rows, new_len, heads, head_dim)
        k = k.reshape(rows, new_len, kv_heads, head_dim)
        v = v.reshape(rows, new_len, kv_heads, head_dim)
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
        return _project(attended.reshape(rows, new_len, heads * head_dim), attn.o_proj), k, v


def load(path: str) -> Any:
    """The causal LM of a directory; TranslateGemma's multimodal wrapper as it is (its text decoder is exported)."""
    import json
    from pathlib import Path

    from transformers import AutoModelForCausalLM, Gemma3ForConditionalGeneration

    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") == "gemma3":
        return load_eager(Gemma3ForConditionalGeneration, path)
    return load_eager(AutoModelForCausalLM, path)


def decoder(model: Any, buffered: bool = True, fused_attention: bool = True) -> nn.Module:
    """`fused_attention`: GroupQueryAttention writing the cache in place (DecoderOnlyExport's `cache_in_place`)."""
    if not buffered:
        raise ValueError("decoder-only models are exported with the cache buffer only (no --cache-concat)")
    return DecoderOnlyExport(model, cache_in_place=fused_attention).eval()
