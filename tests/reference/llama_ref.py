#!/usr/bin/python3
"""Independent NumPy reference of the Llama-family forward pass.

Reads config.json and the safetensors file(s) of a Hugging Face model
directory directly (no torch, no infergate code), runs each prompt through
the model in float64 and writes the logits of every prompt position,
prompts one after another, as little-endian float32 rows (tokens, vocab).

Usage: llama_ref.py --model DIR --prompts FILE.json --out FILE.bin
FILE.json holds a list of token-id lists. The infergate engine tests run it
with Debian's /usr/bin/python3 (python3-numpy).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        raw = data[b:e]
        dt = meta["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: unsupported dtype {dt}")
        out[name] = a.astype(np.float64).reshape(meta["shape"])
    return out


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    w = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            w.update(read_safetensors(os.path.join(model_dir, fn)))
    else:
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    return cfg, w


def inv_freq(cfg, head_dim):
    """As transformers' rope initialisers (default, linear, llama3), in float64
    then rounded once to float32 as the engine stores it."""
    theta = float(cfg.get("rope_theta", 10000.0))
    f = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        f = f / float(rs["factor"])
    elif kind == "llama3":
        factor = float(rs["factor"])
        lo = float(rs.get("low_freq_factor", 1.0))
        hi = float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        scaled = np.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        f = np.where(medium, smoothed, scaled)
    return f.astype(np.float32).astype(np.float64)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, freq):
    # x: (T, heads, hd); rotate-half convention of HF Llama.
    ang = pos[:, None].astype(np.float64) * freq[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def forward(cfg, w, tokens):
    dim = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or dim // nh
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    nl = cfg["num_hidden_layers"]
    freq = inv_freq(cfg, hd)
    T = len(tokens)
    pos = np.arange(T)
    x = w["model.embed_tokens.weight"][np.array(tokens)]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    rep = nh // nkv
    for l in range(nl):
        p = f"model.layers.{l}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(T, nh, hd)
        k = k.reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: RMSNorm of each head
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = rope(q, pos, freq)
        k = rope(k, pos, freq)
        v = v.reshape(T, nkv, hd)
        k = np.repeat(k, rep, axis=1)  # kv head j serves q heads j*rep .. j*rep+rep-1
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask[None]
        s = s - s.max(axis=-1, keepdims=True)
        pr = np.exp(s)
        pr = pr / pr.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", pr, v).reshape(T, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = w["model.embed_tokens.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg, w = load(a.model)
    with open(a.prompts) as f:
        prompts = json.load(f)
    with open(a.out, "wb") as f:
        for p in prompts:
            f.write(forward(cfg, w, p).astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
