#!/usr/bin/env python3
"""PEFT's merge, in plain PyTorch, as a check of lutra's adapter export (tests/lua/test_lora.lua).

usage: ref_lora.py BASE_DIR ADAPTER_DIR MERGED_DIR

BASE_DIR and MERGED_DIR are Hugging Face model directories (model.safetensors) of the base
model and of lutra's merged model; ADAPTER_DIR holds adapter_model.safetensors and
adapter_config.json. For every lora_A/lora_B pair this does what peft's LoraLayer.merge does
(peft/tuners/lora/layer.py): weight += transpose(B @ A, fan_in_fan_out) * scaling, with
scaling = lora_alpha / r (or / sqrt(r) with use_rslora), on the base module named by the key
(base_model.model.<module>.lora_A.weight), and compares every tensor with the merged model.
Checks too that each module's last name is in target_modules and that the shapes fit.
Prints "modules=N max_err=E" and exits 1 on any mismatch. Reads safetensors with the
standard library and torch only (no safetensors/peft packages needed).
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[info["dtype"]]) if end > begin else \
            torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    base = read_safetensors(base_dir + "/model.safetensors")
    merged = read_safetensors(merged_dir + "/model.safetensors")
    adapter = read_safetensors(adapter_dir + "/adapter_model.safetensors")
    with open(adapter_dir + "/adapter_config.json") as f:
        conf = json.load(f)
    assert conf["peft_type"] == "LORA" and conf["task_type"] == "CAUSAL_LM" and conf["bias"] == "none", conf
    r, alpha = conf["r"], conf["lora_alpha"]
    scaling = alpha / math.sqrt(r) if conf.get("use_rslora") else alpha / r
    fan_in_fan_out = conf.get("fan_in_fan_out", False)
    prefix = "base_model.model."
    modules = sorted({k[len(prefix):].rsplit(".lora_", 1)[0] for k in adapter})
    want = {k: v.double() for k, v in base.items()}
    for m in modules:
        assert m.split(".")[-1] in conf["target_modules"], (m, conf["target_modules"])
        a = adapter[prefix + m + ".lora_A.weight"].double()
        b = adapter[prefix + m + ".lora_B.weight"].double()
        assert a.shape[0] == r and b.shape[1] == r, (m, a.shape, b.shape)
        delta = b @ a
        if fan_in_fan_out:
            delta = delta.T
        w = want[m + ".weight"]
        assert w.shape == delta.shape, (m, w.shape, delta.shape)
        want[m + ".weight"] = w + delta * scaling
    assert set(want) == set(merged), (sorted(set(want) ^ set(merged)))
    max_err = 0.0
    for k in want:
        err = (want[k] - merged[k].double()).abs().max().item() if want[k].numel() else 0.0
        max_err = max(max_err, err)
    print("modules=%d max_err=%.3e" % (len(modules), max_err))
    sys.exit(0 if max_err < 1e-5 else 1)


if __name__ == "__main__":
    main()
