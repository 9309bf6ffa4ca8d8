"""Bad weights: safetensors headers (names with NUL or invalid UTF-8, duplicates, overlapping or
out-of-range offsets, bad lengths, dtypes and shapes), weights whose dtype differs from the
parameter's (refused unless the conversion is lossless and --cast / allow_cast asks for it),
NaN/inf values, in Hugging Face directories (lutra convert, lutra generate), lutra checkpoints
loaded as models and LoRA adapters. Each error names the file, the tensor and the problem."""
import json
import math
import struct
from pathlib import Path

from badinput import case, edit_json, read_safetensors, write_safetensors

ST = "model/model.safetensors"
FC = "transformer.h.0.mlp.c_fc.weight"


def convert(fx, tmp, *extra):
    return fx.lutra_cmd("convert", tmp / "model", tmp / "out", *extra)


def generate(fx, tmp, *extra):
    return fx.lutra_cmd("generate", tmp / "model", "--prompt", "the", "--max_new_tokens=2", *extra)


# ---- editing safetensors files ----------------------------------------------------------------

def tensors_of(path):
    """{name: [dtype, shape, bytes]} and the metadata of a safetensors file."""
    header, data = read_safetensors(path)
    meta = header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = [e["dtype"], e["shape"], data[b:end]]
    return out, meta


def rebuild(path, fn):
    """Rewrites the file with fn(tensors, metadata) applied (it edits them in place)."""
    tensors, meta = tensors_of(path)
    fn(tensors, meta)
    write_safetensors(path, {k: tuple(v) for k, v in tensors.items()}, meta)


def floats(raw):
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


def retyped(raw, dtype):
    """F32 bytes as dtype: I32 keeps the bytes (the f32 bits read as integers), the others convert."""
    v = floats(raw)
    if dtype == "I32":
        return raw
    if dtype == "F64":
        return struct.pack("<%dd" % len(v), *v)
    if dtype == "F16":
        return struct.pack("<%de" % len(v), *v)
    if dtype == "BF16":
        return b"".join(struct.pack("<f", x)[2:] for x in v)
    if dtype in ("U8", "BOOL"):
        return bytes(1 if x > 0 else 0 for x in v)
    raise ValueError(dtype)


def retype(path, name, dtype):
    def fn(tensors, meta):
        tensors[name][0] = dtype
        tensors[name][2] = retyped(tensors[name][2], dtype)
    rebuild(path, fn)


def retype_all(path, dtype):
    def fn(tensors, meta):
        for t in tensors.values():
            t[0], t[2] = dtype, retyped(t[2], dtype)
    rebuild(path, fn)


def poison(path, name, values):
    """Puts values (NaN, inf) at the start of tensor name."""
    def fn(tensors, meta):
        v = floats(tensors[name][2])
        v[:len(values)] = values
        tensors[name][2] = struct.pack("<%df" % len(v), *v)
    rebuild(path, fn)


def raw_edit(path, fn):
    """Rewrites the header's JSON text (bytes) with fn, keeping the data section."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = fn(raw[8:8 + n].rstrip(b" "))
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])


def header_edit(path, fn):
    """Edits the parsed header (fn(header) in place), keeping the data section."""
    raw_edit(path, lambda h: json.dumps(_edited(json.loads(h), fn)).encode())


def _edited(h, fn):
    fn(h)
    return h


def header_case(title, edit, expect, raw=False):
    @case("model.safetensors %s: convert names the file and the problem" % title,
          expect=r"model/model\.safetensors: " + expect)
    def _(fx, tmp):
        fx.model_dir(tmp)
        (raw_edit if raw else header_edit)(tmp / ST, edit)
        return convert(fx, tmp)


# ---- names -------------------------------------------------------------------------------------

header_case('with a tensor named "a\\u0000b"',
            lambda h: h.update({"a\u0000b": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}),
            r'the header string "a\\u0000b" holds a NUL character')
header_case("with a real tensor's name followed by \\u0000 and more",
            lambda h: h.update({"transformer.wte.weight\u0000x": h.pop("transformer.wte.weight")}),
            r'the header string "transformer\.wte\.weight\\u0000x" holds a NUL character')
header_case("with a NUL in a __metadata__ key", lambda h: h["__metadata__"].update({"k\u0000": "v"}),
            r'the header string "k\\u0000" holds a NUL character')


def name_bytes(old, new):
    return lambda h: h.replace(old.encode(), new, 1)


header_case("with a name holding the byte 0xFF", name_bytes('"transformer.wte.weight"', b'"transformer.wte.weight\xff"'),
            r"tensor name 'transformer\.wte\.weight\\xFF' is not valid UTF-8 \(byte 22\)", raw=True)
header_case("with an overlong UTF-8 sequence in a name", name_bytes('"transformer.wte.weight"', b'"\xc0\xaftransformer.wte.weight"'),
            r"tensor name '\\xC0\\xAFtransformer\.wte\.weight' is not valid UTF-8 \(byte 0\)", raw=True)
header_case("with a UTF-16 surrogate encoded in a name", name_bytes('"transformer.wte.weight"', b'"w\xed\xa0\x80"'),
            r"tensor name 'w\\xED\\xA0\\x80' is not valid UTF-8 \(byte 1\)", raw=True)
header_case("with a code point past U+10FFFF in a name", name_bytes('"transformer.wte.weight"', b'"w\xf4\x90\x80\x80"'),
            r"tensor name 'w\\xF4\\x90\\x80\\x80' is not valid UTF-8 \(byte 1\)", raw=True)
header_case("with a name cut inside a UTF-8 sequence", name_bytes('"transformer.wte.weight"', b'"w\xe2\x82"'),
            r"tensor name 'w\\xE2\\x82' is not valid UTF-8 \(byte 1\)", raw=True)
header_case("with invalid UTF-8 in a __metadata__ value", name_bytes('"pt"', b'"p\xfft"'),
            r"__metadata__ value 'p\\xFFt' is not valid UTF-8 \(byte 1\)", raw=True)
header_case("with a tensor listed twice",
            lambda h: h.replace(b'"transformer.wte.weight"', b'"transformer.ln_f.bias"', 1),
            r"tensor 'transformer\.ln_f\.bias' appears twice", raw=True)
header_case("with __metadata__ twice", lambda h: h[:-1] + b', "__metadata__": {"a": "b"}}',
            r"__metadata__ appears twice", raw=True)

# ---- offsets, lengths, dtypes, shapes -----------------------------------------------------------


def overlap(h):
    h["transformer.ln_f.bias"]["data_offsets"] = list(h["transformer.ln_f.weight"]["data_offsets"])


header_case("with two tensors over the same bytes", overlap,
            r"tensors '\S+' \[\d+, \d+\] and '\S+' \[\d+, \d+\] overlap")


def past_end(h):
    e = h["transformer.ln_f.bias"]
    b, end = e["data_offsets"]
    e["data_offsets"] = [b + 10 ** 6, end + 10 ** 6]


header_case("with offsets past the data section", past_end,
            r"tensor 'transformer\.ln_f\.bias': data_offsets \[\d+, \d+\] run past the data section")
header_case("with offsets that end before they begin",
            lambda h: h["transformer.ln_f.bias"].update(data_offsets=[64, 0]),
            r"tensor 'transformer\.ln_f\.bias': data_offsets \[64, 0\] end before they begin")
header_case("with offsets holding fewer bytes than the shape needs",
            lambda h: h["transformer.ln_f.bias"].update(shape=[17]),
            r"tensor 'transformer\.ln_f\.bias': data_offsets \[\d+, \d+\] hold 64 bytes but shape and dtype F32 need 68")
header_case("with a negative offset", lambda h: h["transformer.ln_f.bias"].update(data_offsets=[-64, 0]),
            r"tensor 'transformer\.ln_f\.bias': data_offsets are not non-negative integers")
header_case("with a fractional offset", lambda h: h["transformer.ln_f.bias"].update(data_offsets=[0.5, 64.5]),
            r"tensor 'transformer\.ln_f\.bias': data_offsets are not non-negative integers")
header_case("with data_offsets missing", lambda h: h["transformer.ln_f.bias"].pop("data_offsets") and None,
            r"tensor 'transformer\.ln_f\.bias': data_offsets missing or not a list of 2")
header_case("with dtype missing", lambda h: h["transformer.ln_f.bias"].pop("dtype") and None,
            r"tensor 'transformer\.ln_f\.bias': dtype missing or not a string")
header_case("with an unknown dtype", lambda h: h["transformer.ln_f.bias"].update(dtype="Q7"),
            r"tensor 'transformer\.ln_f\.bias': unknown dtype 'Q7'")
header_case("with dtype F8_E4M3", lambda h: h["transformer.ln_f.bias"].update(dtype="F8_E4M3"),
            r"tensor 'transformer\.ln_f\.bias': dtype F8_E4M3 is not supported by lutra")
header_case("with a negative shape entry", lambda h: h["transformer.ln_f.bias"].update(shape=[-16]),
            r"tensor 'transformer\.ln_f\.bias': shape entry 0 is not a non-negative integer")
header_case("with 9 dims", lambda h: h["transformer.ln_f.bias"].update(shape=[16] + [1] * 8),
            r"tensor 'transformer\.ln_f\.bias': 9 dims \(lutra tensors have at most 8\)")
header_case("with a shape whose byte size overflows", lambda h: h["transformer.ln_f.bias"].update(shape=[2 ** 40, 2 ** 40]),
            r"tensor 'transformer\.ln_f\.bias': shape's byte size overflows 64 bits")
header_case("with an entry that is not an object", lambda h: h.update({"transformer.ln_f.bias": [1, 2]}),
            r"tensor 'transformer\.ln_f\.bias': entry is not a JSON object")
header_case("with __metadata__ a list", lambda h: h.update({"__metadata__": ["pt"]}),
            r"__metadata__ is not a JSON object")
header_case("with a __metadata__ value a number", lambda h: h["__metadata__"].update(format=1),
            r"__metadata__ value of 'format' is not a string")
header_case("with trailing bytes after the JSON object", lambda h: h + b"xyz",
            r"header has extra bytes after the JSON object", raw=True)
header_case("with a header that is not JSON", lambda h: h[:-2], r"header is not well-formed JSON", raw=True)
header_case("with a header that is a JSON list", lambda h: b"[1, 2]",
            r"header does not start with a JSON object", raw=True)


def length_case(title, length_of, expect, keep=None):
    @case("model.safetensors %s: convert names the file and the problem" % title, expect=r"model/model\.safetensors: " + expect)
    def _(fx, tmp):
        fx.model_dir(tmp)
        raw = (tmp / ST).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        (tmp / ST).write_bytes(raw[:keep] if keep is not None else struct.pack("<Q", length_of(n, len(raw))) + raw[8:])
        return convert(fx, tmp)


length_case("with a header length past the end of the file", lambda n, size: size,
            r"header length \d+ runs past the end of the file")
length_case("with a header length of 2^40", lambda n, size: 2 ** 40, r"header length 1099511627776 exceeds the bound")
length_case("cut to 5 bytes", None, r"too short \(5 bytes\) to hold the 8-byte header length", keep=5)
length_case("cut inside the data section", None,
            r"tensor '\S+': data_offsets \[\d+, \d+\] run past the data section \(\d+ bytes; truncated file\?\)", keep=-100)

# ---- dtypes and values -------------------------------------------------------------------------


def dtype_case(dtype, expect, extra=(), exit=1, cmd=convert):
    how = " with %s" % " ".join(extra) if extra else ""
    @case("%s weights into f32 parameters%s (%s)" % (dtype, how, cmd.__name__), expect=expect, exit=exit)
    def _(fx, tmp):
        fx.model_dir(tmp)
        retype(tmp / ST, FC, dtype)
        return cmd(fx, tmp, *extra)


HEAD = r"model/model\.safetensors: tensor 'transformer\.h\.0\.mlp\.c_fc\.weight' is "
dtype_case("I32", HEAD + r"i32, the parameter is f32: integer and bool tensors are not weights")
dtype_case("I32", HEAD + r"i32, the parameter is f32: integer", ("--cast",))
dtype_case("I32", HEAD + r"i32, the parameter is f32: integer", cmd=generate)
dtype_case("U8", HEAD + r"u8, the parameter is f32: integer and bool tensors are not weights")
dtype_case("BOOL", HEAD + r"bool, the parameter is f32: integer and bool tensors are not weights")
dtype_case("F64", HEAD + r"f64, the parameter is f32: converting it would lose precision")
dtype_case("F64", HEAD + r"f64, the parameter is f32: converting it would lose precision", ("--cast",))
dtype_case("BF16", HEAD + r"bf16, the parameter is f32: the conversion is lossless but is not made unless asked for "
           r"\(allow_cast = true, --cast\)")
dtype_case("F16", HEAD + r"f16, the parameter is f32: the conversion is lossless but is not made unless asked for")
dtype_case("BF16", HEAD + r"bf16, the parameter is f32: the conversion is lossless", cmd=generate)
dtype_case("BF16", r"-> \S*out \(lutra checkpoint", ("--cast",), exit=0)
dtype_case("F16", r"-> \S*out \(lutra checkpoint", ("--cast",), exit=0)


@case("a whole bf16 model with --cast: convert loads it into the f32 model (documented)",
      expect=r"model \(Hugging Face gpt2, 1 layers\) -> \S*out \(lutra checkpoint", exit=0)
def _(fx, tmp):
    fx.model_dir(tmp)
    retype_all(tmp / ST, "BF16")
    return convert(fx, tmp, "--cast")


def values_case(title, values, cmd=convert, name=FC):
    @case("%s in %s (%s): refused, counted" % (title, name, cmd.__name__),
          expect=r"model/model\.safetensors: tensor '%s': %d of its \d+ values are not finite \(NaN or inf\)"
                 % (name.replace(".", r"\."), len(values)))
    def _(fx, tmp):
        fx.model_dir(tmp)
        poison(tmp / ST, name, values)
        return cmd(fx, tmp)


values_case("a NaN", [math.nan])
values_case("+inf", [math.inf])
values_case("two NaN and -inf", [math.nan, math.nan, -math.inf], cmd=generate, name="transformer.wte.weight")

# ---- sharded index -----------------------------------------------------------------------------


def sharded(tmp):
    (tmp / ST).rename(tmp / "model/model-00001-of-00001.safetensors")
    names = [n for n in read_safetensors(tmp / "model/model-00001-of-00001.safetensors")[0] if n != "__metadata__"]
    return {n: "model-00001-of-00001.safetensors" for n in names}


@case("model.safetensors.index.json naming '../model.safetensors': refused",
      expect=r"model\.safetensors\.index\.json: weight_map\['transformer\.wte\.weight'\] = \"\.\./outside\.safetensors\" is not "
             r"a file name in")
def _(fx, tmp):
    fx.model_dir(tmp)
    wm = sharded(tmp)
    (tmp / "model/model-00001-of-00001.safetensors").rename(tmp / "outside.safetensors")
    wm["transformer.wte.weight"] = "../outside.safetensors"
    (tmp / "model/model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return convert(fx, tmp)


@case("model.safetensors.index.json naming a shard without the tensor: refused",
      expect=r"model-00002-of-00002\.safetensors does not hold transformer\.wte\.weight")
def _(fx, tmp):
    fx.model_dir(tmp)
    wm = sharded(tmp)
    write_safetensors(tmp / "model/model-00002-of-00002.safetensors", {"x": ("F32", [1], struct.pack("<f", 1))})
    wm["transformer.wte.weight"] = "model-00002-of-00002.safetensors"
    (tmp / "model/model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return convert(fx, tmp)


# ---- lutra checkpoints loaded as a model -------------------------------------------------------

WEIGHTS_SCRIPT = """
local ckpt = require "lutra.ckpt"
local w = ckpt.load_weights("run/ckpt/step_000004")
local name = os.getenv("NAME")
local t = w.model[name]
if os.getenv("HOW") == "nan" then t:view(-1):narrow(0, 1, 1):fill_(0 / 0) else t = t:to(os.getenv("HOW")) end
w.model[name] = t
w.model["lm_head.weight"] = nil -- the tied head load_weights adds
ckpt.save_weights("weights", w.model, w.config)
"""


def weights_checkpoint(fx, tmp, how, name="blocks.0.mlp.fc.weight"):
    """tmp/weights: the trained run's model saved alone (ckpt.save_weights) with tensor name
    converted to dtype `how`, or holding a NaN (how = "nan")."""
    fx.run(tmp)
    fx.lutra_script(WEIGHTS_SCRIPT, cwd=tmp, NAME=name, HOW=how)


@case("lutra checkpoint with an f64 tensor in an f32 model: convert to Hugging Face refuses it",
      expect=r"load_state_dict: cannot load into \S+ from \S*weights:\s+\S*weights: tensor 'blocks\.0\.mlp\.fc\.weight' is "
             r"f64, the parameter is f32: converting it would lose precision")
def _(fx, tmp):
    weights_checkpoint(fx, tmp, "f64")
    return fx.lutra_cmd("convert", tmp / "weights", tmp / "hf")


@case("lutra checkpoint with a bf16 tensor in an f32 model: convert refuses it without --cast",
      expect=r"\S*weights: tensor 'blocks\.0\.mlp\.fc\.weight' is bf16, the parameter is f32: the conversion is lossless")
def _(fx, tmp):
    weights_checkpoint(fx, tmp, "bf16")
    return fx.lutra_cmd("convert", tmp / "weights", tmp / "hf")


@case("lutra checkpoint with a bf16 tensor in an f32 model: convert --cast loads it (documented)",
      expect=r"weights \(step 0, gpt2, 1 layers\) -> \S*hf \(Hugging Face gpt2", exit=0)
def _(fx, tmp):
    weights_checkpoint(fx, tmp, "bf16")
    return fx.lutra_cmd("convert", tmp / "weights", tmp / "hf", "--cast", "--tokenizer=%s" % (tmp / "run/tokenizer.json"))


@case("lutra checkpoint with a NaN weight: convert refuses it, counting",
      expect=r"\S*weights: tensor 'blocks\.0\.mlp\.fc\.weight': 1 of its \d+ values are not finite")
def _(fx, tmp):
    weights_checkpoint(fx, tmp, "nan")
    return fx.lutra_cmd("convert", tmp / "weights", tmp / "hf")


@case("lutra checkpoint with a NaN weight: generate refuses it, counting",
      expect=r"\S*weights: tensor 'blocks\.0\.mlp\.fc\.weight': 1 of its \d+ values are not finite")
def _(fx, tmp):
    weights_checkpoint(fx, tmp, "nan")
    return fx.lutra_cmd("generate", tmp / "weights", "--prompt", "the", "--max_new_tokens=2",
                        "--tokenizer=%s" % (tmp / "run/tokenizer.json"))


@case("trainer checkpoint whose tensor's dtype was edited to i32: convert refuses it, naming the tensor",
      expect=r"step_000004: tensor 'blocks\.0\.mlp\.fc\.weight' is i32, the parameter is f32: integer and bool tensors")
def _(fx, tmp):
    run = fx.run(tmp)
    edit_json(run / "ckpt/step_000004/manifest.json",
              lambda m: next(t for t in m["tensors"] if t["name"] == "blocks.0.mlp.fc.weight").update(dtype="i32"))
    return fx.lutra_cmd("convert", run / "ckpt/step_000004", tmp / "hf")


# ---- LoRA adapters -----------------------------------------------------------------------------

ADAPTER_SCRIPT = """
local hf, lora = require "lutra.hf", require "lutra.lora"
local model = hf.load_pretrained("model")
lora.apply(model, {r = 2, alpha = 4})
lora.save("adapter", model)
"""

LOAD_SCRIPT = """
local hf, lora = require "lutra.hf", require "lutra.lora"
local model = hf.load_pretrained("model")
lora.load("adapter", model, {allow_cast = os.getenv("CAST") == "1"})
print("adapter loaded")
"""


def adapter_case(title, edit, expect, exit=1, cast=False):
    @case("LoRA adapter %s" % title, expect=expect, exit=exit, env={"CAST": "1" if cast else "0"})
    def _(fx, tmp):
        fx.model_dir(tmp)
        fx.lutra_script(ADAPTER_SCRIPT, cwd=tmp)
        path = tmp / "adapter/adapter_model.safetensors"
        names = sorted(n for n in read_safetensors(path)[0] if n.endswith("lora_A.weight"))
        edit(path, names[0])
        return fx.lutra_cmd("-e", LOAD_SCRIPT)


LORA_A = r"adapter/adapter_model\.safetensors: tensor 'base_model\.model\.\S+\.lora_A\.weight' is "
adapter_case("with an I32 lora_A: refused, naming the file and tensor", lambda p, n: retype(p, n, "I32"),
             LORA_A + r"i32, the parameter is f32: integer and bool tensors are not weights")
adapter_case("with an F64 lora_A: refused even with allow_cast", lambda p, n: retype(p, n, "F64"),
             LORA_A + r"f64, the parameter is f32: converting it would lose precision", cast=True)
adapter_case("with an F16 lora_A: refused without allow_cast", lambda p, n: retype(p, n, "F16"),
             LORA_A + r"f16, the parameter is f32: the conversion is lossless")
adapter_case("with an F16 lora_A and allow_cast: loaded (documented)", lambda p, n: retype(p, n, "F16"),
             r"adapter loaded", exit=0, cast=True)
adapter_case("with a NaN in lora_A: refused, counted", lambda p, n: poison(p, n, [math.nan]),
             r"adapter/adapter_model\.safetensors: tensor 'base_model\.model\.\S+\.lora_A\.weight': 1 of its \d+ values "
             r"are not finite")
adapter_case("with a tensor name holding a NUL", lambda p, n: header_edit(p, lambda h: h.update({n + "\u0000x": h.pop(n)})),
             r'adapter/adapter_model\.safetensors: the header string "base_model\.model\.\S+\.lora_A\.weight\\u0000x" holds a NUL')


@case("a valid model directory: convert loads it (the fixture itself)", expect=r"-> \S*out \(lutra checkpoint", exit=0)
def _(fx, tmp):
    fx.model_dir(tmp)
    return convert(fx, tmp)
