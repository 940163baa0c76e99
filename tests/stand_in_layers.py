"""A stand-in `fla` package with a layer shaped like fla 0.6.0's GatedLinearAttention (its forward's
arguments and return, the cache it reads and updates, `state_v_first` states, a padding mask
unpadded into `cu_seqlens`, an output norm of fla.modules that refuses float64 as fla's Triton
norms do), computing with our kernels so that it runs on CPU; and the same package with one
planted mistake each (`release`). {path: source} for tests/test_upstream_layers.py."""

RELEASE = {
    "fla/__init__.py": "__version__ = '0.6.0'",
    "fla/ops/__init__.py": "",
    "fla/ops/gla/__init__.py": """
        from fla_kernels.ops.gla import chunk_gla as _chunk, fused_recurrent_gla as _recurrent


        def _v_first(fn, q, k, v, g, scale, initial_state, output_final_state, state_v_first, cu_seqlens):
            if state_v_first and initial_state is not None:
                initial_state = initial_state.transpose(-1, -2)
            o, ht = fn(q, k, v, g, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens)
            return o, (ht.transpose(-1, -2) if state_v_first and ht is not None else ht)


        def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                      state_v_first=False, cu_seqlens=None):
            return _v_first(_chunk, q, k, v, g, scale, initial_state, output_final_state, state_v_first,
                            cu_seqlens)


        def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None,
                                output_final_state=False, state_v_first=False, cu_seqlens=None):
            return _v_first(_recurrent, q, k, v, gk, scale, initial_state, output_final_state,
                            state_v_first, cu_seqlens)


        def fused_chunk_gla(**kwargs):
            raise NotImplementedError("fused_chunk_gla is deprecated")
    """,
    "fla/modules/__init__.py": "from fla.modules.norm import RMSNorm",
    "fla/modules/norm.py": """
        import torch
        import torch.nn as nn


        def _rms_norm_fwd(x, weight, eps):
            if x.dtype == torch.float64 or weight.dtype == torch.float64:
                raise TypeError("the norm kernel does not compile for float64")   # as fla's Triton norms
            y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight.float()
            return y.to(x.dtype)


        def rms_norm(x, weight, eps=1e-5):
            return _rms_norm_fwd(x, weight, eps)


        class RMSNorm(nn.Module):
            def __init__(self, hidden_size, eps=1e-5):
                super().__init__()
                self.weight, self.eps = nn.Parameter(torch.ones(hidden_size)), eps

            def forward(self, x):
                return rms_norm(x, self.weight, self.eps)
    """,
    "fla/models/__init__.py": "",
    "fla/models/utils.py": """
        class Cache:
            def __init__(self):
                self.layers = []

            def __len__(self):
                return len(self.layers)

            def __getitem__(self, layer_idx):
                return self.layers[layer_idx]

            def update(self, recurrent_state=None, layer_idx=0, offset=1, **kwargs):
                while len(self.layers) <= layer_idx:
                    self.layers.append({})
                self.layers[layer_idx] = {"recurrent_state": recurrent_state}
    """,
    "fla/layers/__init__.py": "from fla.layers.gla import GatedLinearAttention",
    "fla/layers/gla.py": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        from fla.modules import RMSNorm
        from fla.ops.gla import chunk_gla, fused_chunk_gla, fused_recurrent_gla


        class GatedLinearAttention(nn.Module):
            def __init__(self, mode="chunk", hidden_size=1024, expand_k=0.5, expand_v=1.0, num_heads=4,
                         gate_logit_normalizer=16, layer_idx=None):
                super().__init__()
                assert mode in ("chunk", "fused_recurrent", "fused_chunk"), f"Not supported mode `{mode}`."
                self.mode, self.hidden_size, self.num_heads, self.layer_idx = mode, hidden_size, num_heads, layer_idx
                self.key_dim, self.value_dim = round(hidden_size * expand_k), round(hidden_size * expand_v)
                self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
                self.gate_logit_normalizer = gate_logit_normalizer
                self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
                self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
                self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
                self.gk_proj = nn.Linear(hidden_size, self.key_dim, bias=True)
                self.g_norm = RMSNorm(self.head_v_dim)
                self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

            def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                        **kwargs):
                batch_size, q_len, _ = hidden_states.shape
                last_state = None
                if past_key_values is not None and len(past_key_values) > self.layer_idx:
                    last_state = past_key_values[self.layer_idx]
                indices, cu_seqlens = None, None
                if attention_mask is not None:
                    indices = attention_mask.flatten().nonzero().squeeze(-1)
                    cu_seqlens = F.pad(attention_mask.sum(-1).cumsum(0), (1, 0)).to(torch.int32)
                    hidden_states = hidden_states.flatten(0, 1)[indices][None]
                q = self.q_proj(hidden_states).unflatten(-1, (self.num_heads, self.head_k_dim))
                k = self.k_proj(hidden_states).unflatten(-1, (self.num_heads, self.head_k_dim))
                v = self.v_proj(hidden_states).unflatten(-1, (self.num_heads, self.head_v_dim))
                gk = (F.logsigmoid(self.gk_proj(hidden_states)) / self.gate_logit_normalizer).unflatten(
                    -1, (self.num_heads, self.head_k_dim))
                recurrent_state = last_state["recurrent_state"] if last_state is not None else None
                if self.mode == "fused_recurrent":
                    o, recurrent_state = fused_recurrent_gla(q=q, k=k, v=v, gk=gk, initial_state=recurrent_state,
                                                             output_final_state=use_cache, state_v_first=True,
                                                             cu_seqlens=cu_seqlens)
                elif self.mode == "fused_chunk":
                    o, recurrent_state = fused_chunk_gla(q=q, k=k, v=v, g=gk, initial_state=recurrent_state,
                                                         output_final_state=use_cache)
                else:
                    o, recurrent_state = chunk_gla(q=q, k=k, v=v, g=gk, initial_state=recurrent_state,
                                                   output_final_state=use_cache, state_v_first=True,
                                                   cu_seqlens=cu_seqlens)
                if past_key_values is not None:
                    past_key_values.update(recurrent_state=recurrent_state, layer_idx=self.layer_idx,
                                           offset=q_len)
                o = self.o_proj(self.g_norm(o).flatten(-2))
                if indices is not None:
                    o = o.new_zeros(batch_size * q_len, o.shape[-1]).index_copy(0, indices, o[0])
                    o = o.view(batch_size, q_len, -1)
                return o, None, past_key_values
    """,
}

# one mistake each, as (the line of fla/layers/gla.py it replaces, its replacement)
MISTAKES = {
    # the state stored with V and K swapped: every later call reads it transposed
    "state_stored_transposed": ("past_key_values.update(recurrent_state=recurrent_state,",
                                "past_key_values.update(recurrent_state=recurrent_state.transpose(-1, -2),"),
    # the padding mask read but not applied: padded tokens enter the state as real ones
    "mask_ignored": ("if attention_mask is not None:", "if False:"),
    # the input scaled in place
    "input_written": ("batch_size, q_len, _ = hidden_states.shape",
                      "batch_size, q_len, _ = hidden_states.mul_(1.5).shape"),
    # not a mistake: a mode whose kernel has no backward refused in training, as fla's GatedDeltaNet
    "refuses_training": ("batch_size, q_len, _ = hidden_states.shape",
                         "assert not (self.training and self.mode == 'fused_recurrent'), "
                         "'Only chunk mode is supported in training.'\n"
                         "                batch_size, q_len, _ = hidden_states.shape"),
}


# an inference-only fused_recurrent_gla, as fla's fused_recurrent of the gated delta rule: its
# output's backward raises NotImplementedError
FORWARD_ONLY = ("            return o, (ht.transpose(-1, -2) if state_v_first and ht is not None else ht)",
                """            return _NoBackward.apply(o), (ht.transpose(-1, -2) if state_v_first and ht is not None else ht)


        import torch


        class _NoBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, o):
                return o.clone()

            @staticmethod
            def backward(ctx, do):
                raise NotImplementedError("Backward pass is not implemented yet")""")


# layers of releases that keep no cache: forward(x) returning y alone (fla 0.1's LinearAttention),
# and forward(x, **kwargs) that takes and ignores any keyword (0.2's and 0.3's)
STATELESS = {
    "stateless": "def forward(self, hidden_states):",
    "stateless_kwargs": "def forward(self, hidden_states, **kwargs):",
}
_FORWARD = """def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                        **kwargs):"""
_NO_CACHE = """
                attention_mask, past_key_values, use_cache = None, None, False"""


def release(changes: str | None = None) -> dict:
    """RELEASE, or RELEASE with `changes` ("+"-joined): one of MISTAKES in its layer, one of
    STATELESS's forwards, "forward_only" (FORWARD_ONLY), or "unbuildable", a layers package that
    does not import (fla's needs transformers)."""
    files = dict(RELEASE)
    for change in (changes or "").split("+") if changes else []:
        if change == "unbuildable":
            files["fla/layers/__init__.py"] = "raise ImportError('No module named transformers')"
            continue
        if change in STATELESS:
            layer = files["fla/layers/gla.py"]
            assert _FORWARD in layer and "return o, None, past_key_values" in layer
            files["fla/layers/gla.py"] = layer.replace(_FORWARD, STATELESS[change] + _NO_CACHE).replace(
                "return o, None, past_key_values", "return o")
            continue
        path, (old, new) = (("fla/ops/gla/__init__.py", FORWARD_ONLY) if change == "forward_only"
                            else ("fla/layers/gla.py", MISTAKES[change]))
        assert old in files[path], change
        files[path] = files[path].replace(old, new)
    return files
