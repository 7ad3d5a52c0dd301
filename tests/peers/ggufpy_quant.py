#!/usr/bin/python3
"""Reads a GGUF file with llama.cpp's own gguf-py and writes, for the test
that compares our block formats with it (tests/test_gguf_quants_ggufpy.c):

  OUT/NAME.deq   every quantized tensor NAME dequantized by gguf.quants
                 (raw float32, row-major);
  OUT/NAME.q     every F32 tensor NAME quantized by gguf.quants to --type
                 (raw blocks, as GGUF stores them).

Usage: ggufpy_quant.py --gguf-py DIR --in F.gguf --out DIR --type Q4_0
Needs NumPy; gguf-py imports sentencepiece, which a stub stands in for.
"""
import argparse
import os
import sys
import types

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", required=True)
    a = ap.parse_args()

    stub = types.ModuleType("sentencepiece")
    stub.SentencePieceProcessor = type("SentencePieceProcessor", (), {})
    sys.modules.setdefault("sentencepiece", stub)
    sys.path.insert(0, a.gguf_py)
    import gguf

    qtype = gguf.GGMLQuantizationType[a.type]
    r = gguf.GGUFReader(a.inp)
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            x = np.asarray(t.data, dtype=np.float32)
            q = gguf.quants.quantize(x, qtype)
            q.tofile(os.path.join(a.out, t.name + ".q"))
        else:
            d = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            np.asarray(d, dtype=np.float32).tofile(os.path.join(a.out, t.name + ".deq"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
