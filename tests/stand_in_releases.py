"""Stand-in `fla` packages shaped like single upstream releases (their public functions' signatures,
defaults, layouts and return forms as each release's code has them, read from its tagged source),
computing with our kernels so that they run on CPU. Each is {path: source} for `installed`."""
import importlib
import sys
import textwrap


def installed(files: dict, tmp_path, monkeypatch):
    """A fixture's body: `files` ({path: source}) written under tmp_path and importable as the
    only fla, for the test's duration."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]


# fla 0.1.0: chunk_rwkv6 takes (q, k, v, g, u) where later releases take (r, k, v, w, u); both rwkv6
# functions and fused_chunk_gla (scale=-1 meaning K ** -0.5) default to head_first=True
RELEASE_0_1_0 = {
    "fla/__init__.py": "__version__ = '0.1'",
    "fla/ops/__init__.py": "",
    "fla/ops/rwkv6/__init__.py": """
        from fla_kernels.ops.rwkv6 import chunk_rwkv6 as _chunk, fused_recurrent_rwkv6 as _recurrent

        def _head_first(fn, r, k, v, w, u, head_first, **kwargs):
            if head_first:
                r, k, v, w = (x.transpose(1, 2) for x in (r, k, v, w))
            o, ht = fn(r, k, v, w, u, **kwargs)
            return (o.transpose(1, 2) if head_first else o), ht

        def chunk_rwkv6(q, k, v, g, u, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, head_first=True):
            return _head_first(_chunk, q, k, v, g, u, head_first, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)

        def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                                  reverse=False, cu_seqlens=None, head_first=True):
            assert not reverse
            return _head_first(_recurrent, r, k, v, w, u, head_first, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    """,
    "fla/ops/gla/__init__.py": """
        from fla_kernels.ops.gla import fused_chunk_gla as _fused_chunk

        def fused_chunk_gla(q, k, v, g, scale=-1, initial_state=None, output_final_state=False,
                            head_first=True):
            if scale == -1:
                scale = q.shape[-1] ** -0.5
            if head_first:
                q, k, v, g = (x.transpose(1, 2) for x in (q, k, v, g))
            o, ht = _fused_chunk(q, k, v, g, scale=float(scale), initial_state=initial_state,
                                 output_final_state=output_final_state)   # its kernel takes no None
            return (o.transpose(1, 2) if head_first else o), ht
    """,
}

# fla 0.2.2: gsa returns its final states as a list, [None, None] without them; simple_gla has no
# g_gamma yet
RELEASE_0_2_2 = {
    "fla/__init__.py": "__version__ = '0.2.2'",
    "fla/ops/__init__.py": "",
    "fla/ops/gsa/__init__.py": """
        from fla_kernels.ops.gsa import fused_recurrent_gsa as _recurrent

        def fused_recurrent_gsa(q, k, v, s, g=None, scale=None, initial_state=None,
                                output_final_state=False, reverse=False, cu_seqlens=None):
            assert not reverse
            if initial_state is None:
                initial_state = (None, None)
            hk0, hv0 = initial_state
            o, final = _recurrent(q, k, v, s, g, scale=scale,
                                  initial_state=None if hk0 is None else (hk0, hv0),
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens)
            return o, [None, None] if final is None else list(final)
    """,
    "fla/ops/simple_gla/__init__.py": """
        from fla_kernels.ops.simple_gla import chunk_simple_gla as _chunk

        def chunk_simple_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, head_first=False):
            if head_first:
                raise DeprecationWarning("head_first is deprecated")
            return _chunk(q, k, v, g, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    """,
}

# linear attention of fla 0.3.2 and 0.4.2 (the same signatures): normalize=True keeps no
# normaliser state; the fused paths' wrappers give scale no default; 0.3.x normalises with a
# cumulative sum over dim -2, which is H in the [B, T, H, K] layout (fixed in 0.4.0: dim 1)
_LINEAR_ATTN_0_3 = """
    from fla_kernels.ops.linear_attn import chunk_linear_attn as _ours


    def normalize_output(q, k, o):
        k = k.cumsum({axis})
        z = (q * k).sum(-1, keepdim=True)
        return o / (z + 1e-10)


    def _unnormalised(q, k, v, scale, initial_state, output_final_state, cu_seqlens=None):
        return _ours(q, k, v, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)


    def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                          normalize=True, head_first=False):
        if head_first:
            raise DeprecationWarning("head_first is deprecated")
        if q.shape[1] < q.shape[2]:
            raise DeprecationWarning("seq_len < num_heads")
        if scale is None:
            scale = k.shape[-1] ** -0.5
        o, final_state = _unnormalised(q, k, v, scale, initial_state, output_final_state)
        if normalize:
            o = normalize_output(q * scale, k, o)
        return o, final_state


    def fused_chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                normalize=True, cu_seqlens=None):
        o, final_state = _unnormalised(q, k, v, scale, initial_state, output_final_state, cu_seqlens)
        if normalize:
            o = normalize_output(q * scale, k, o)
        return o, final_state


    def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                    reverse=False, normalize=False, cu_seqlens=None):
        assert not reverse
        o, final_state = _unnormalised(q, k, v, scale, initial_state, output_final_state, cu_seqlens)
        if normalize:
            o = normalize_output(q * scale, k, o)
        return o, final_state
"""

RELEASE_0_3_2 = {
    "fla/__init__.py": "__version__ = '0.3.2'",
    "fla/ops/__init__.py": "",
    "fla/ops/linear_attn/__init__.py": _LINEAR_ATTN_0_3.format(axis=-2),
}

# fla 0.4.2: fused_chunk_gla only raises
RELEASE_0_4_2 = {
    "fla/__init__.py": "__version__ = '0.4.2'",
    "fla/ops/__init__.py": "",
    "fla/ops/linear_attn/__init__.py": _LINEAR_ATTN_0_3.format(axis=1),
    "fla/ops/gla/__init__.py": """
        def fused_chunk_gla(**kwargs):
            raise NotImplementedError("`fused_chunk_gla` is deprecated. Please use `chunk_gla` instead.")
    """,
}

# fla 0.5.2: with normalize=True linear attention takes the state (h0, z0) as a tuple and returns
# (o, (final_state, z_state)), final_state None unless asked for, z_state in k's dtype
RELEASE_0_5_2 = {
    "fla/__init__.py": "__version__ = '0.5.2'",
    "fla/ops/__init__.py": "",
    "fla/ops/linear_attn/__init__.py": """
        import torch

        from fla_kernels.ops.linear_attn import chunk_linear_attn as _ours


        def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              normalize=True, cu_seqlens=None):
            if normalize and isinstance(initial_state, tuple):
                kv_init, z_init = initial_state
            else:
                kv_init, z_init = initial_state, None
            if scale is None:
                scale = k.shape[-1] ** -0.5
            o, final_state = _ours(q, k, v, scale=scale, initial_state=kv_init,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens)
            if normalize:
                k_cum = torch.cumsum(k, dim=1)
                if z_init is not None:
                    k_cum = k_cum + z_init
                o = o / ((q * scale * k_cum).sum(-1, keepdim=True) + 1e-10)
                return o, (final_state, k_cum[:, -1:])
            return o, final_state
    """,
}
