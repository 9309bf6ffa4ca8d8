-- lutra.ckpt.safetensors: round trips of every dtype (non-contiguous and scalar tensors
-- included), metadata, the header view, loading a subset, errors on bad files from Lua;
-- and PyTorch (/usr/bin/python3 with torch, no safetensors package needed) as the
-- independent reader and writer: it parses our file with struct/json/torch.frombuffer and
-- writes one by the spec that we read.
local lt = require "lutra"
local st = require "lutra.ckpt.safetensors"
local json = require "lutra.json"
local T = require "lutra.testing"
local equal, fails, close = T.assert_equal, T.assert_error, T.assert_close
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local read, write = files.read, files.write

local dir = files.temp_dir()

local function le64(n)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end

local function sample_tensors()
  return {
    ["w.f32"] = lt.tensor(T.random_list({3, 4})),
    ["w.f64"] = lt.tensor(T.random_list({2, 2, 2}), "f64"),
    ["w.bf16"] = lt.tensor(T.random_list({5}), "bf16"),
    ["w.f16"] = lt.tensor(T.random_list({2, 3}), "f16"),
    ["i.i32"] = lt.tensor({{1, -2, 3}, {2147483647, -2147483648, 0}}, "i32"),
    ["i.i64"] = lt.tensor({-5, 9007199254740991, 0}, "i64"),
    ["b.u8"] = lt.tensor({0, 255, 7}, "u8"),
    ["b.bool"] = lt.tensor({true, false, true}, "bool"),
    ["s.scalar"] = lt.tensor(2.5),
    ["e.empty"] = lt.zeros(0, 3),
    ["t.transposed"] = lt.tensor(T.random_list({3, 5})):t(), -- non-contiguous
  }
end

test("round trip of every dtype, metadata, header", function()
  local ts = sample_tensors()
  local path = dir .. "/rt.safetensors"
  st.save(path, ts, {format = "pt", step = 12, note = "h\195\169"})
  local back, meta = st.load(path)
  equal(meta, {format = "pt", step = "12", note = "h\195\169"})
  local n = 0
  for name, t in pairs(ts) do
    n = n + 1
    local b = back[name]
    assert(b, "missing " .. name)
    equal(b.dtype, t.dtype, name)
    equal(b.shape, t.shape, name)
    equal(b:tolist(), t:tolist(), name) -- bitwise: same dtype, values read back exactly
  end
  local m = 0
  for _ in pairs(back) do m = m + 1 end
  equal(m, n)
  local h = st.read_header(path)
  equal(#h.names, n)
  local sorted = {}
  for name in pairs(ts) do sorted[#sorted + 1] = name end
  table.sort(sorted)
  equal(h.names, sorted)
  equal(h.tensors["w.bf16"].dtype, "bf16")
  equal(h.tensors["t.transposed"].shape, {5, 3})
  equal(h.data_offset % 8, 0)
  -- the header is JSON with the spec's fields, padded with spaces
  local raw = read(path)
  local hlen = 0
  for i = 8, 1, -1 do hlen = hlen * 256 + raw:byte(i) end
  equal(hlen + 8, h.data_offset)
  local header = json.decode(raw:sub(9, 8 + hlen))
  equal(header.__metadata__.format, "pt")
  equal(header["i.i64"], {dtype = "I64", shape = {3}, data_offsets = {h.tensors["i.i64"].begin, h.tensors["i.i64"]["end"]}})
  assert(raw:sub(9, 8 + hlen):match("^{.*} *$"))
  equal(h.file_size, #raw)
end)

test("load a subset by name; a missing name is an error", function()
  local path = dir .. "/sub.safetensors"
  st.save(path, {a = lt.ones(2), b = lt.zeros(3), c = lt.arange(4)})
  local got = st.load(path, {names = {"c", "a"}})
  equal(got.a:tolist(), {1, 1})
  equal(got.c:tolist(), {0, 1, 2, 3})
  equal(got.b, nil)
  fails("no tensor named 'zz'", st.load, path, {names = {"a", "zz"}})
end)

test("reader: one tensor at a time, into a given tensor in place", function()
  local path = dir .. "/reader.safetensors"
  local w = lt.tensor(T.random_list({4, 3}))
  st.save(path, {w = w, b = lt.arange(5):to("i32")}, {k = "v"})
  local r = st.open(path)
  equal(r.names, {"b", "w"})
  equal(r.tensors.w.shape, {4, 3})
  equal(r.metadata, {k = "v"})
  equal(r:load("b"):tolist(), {0, 1, 2, 3, 4})
  local into = lt.zeros(4, 3)
  local got = r:load("w", into)
  assert(rawequal(got, into), "loads into the given tensor")
  equal(into:tolist(), w:tolist())
  fails("safetensors load 'w'", r.load, r, "w", lt.zeros(3, 4)) -- wrong shape
  fails("safetensors load 'w'", r.load, r, "w", lt.zeros(4, 3, "f64")) -- wrong dtype
  fails("out must be contiguous", r.load, r, "w", lt.zeros(3, 4):t())
  fails("no tensor named 'x'", r.load, r, "x")
  r:close()
  fails("is closed", r.load, r, "w")
  r:close() -- twice is fine
end)

test("errors: bad files and bad arguments", function()
  local bad = dir .. "/bad.safetensors"
  local function file(header, data)
    write(bad, le64(#header) .. header .. (data or ""))
  end
  file('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', "1234")
  local msg = fails("tensor 'w': data_offsets [0, 8] run past the data section (4 bytes; truncated file?)", st.load, bad)
  assert(msg:find("test_safetensors.lua", 1, true), "error points at the caller: " .. msg)
  fails(bad .. ": tensor 'w'", st.read_header, bad)
  file('{"w": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]}}', "1234")
  fails("tensor 'w': dtype I16 is not supported by lutra", st.load, bad)
  file('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}')
  fails("header is not well-formed JSON", st.load, bad)
  write(bad, "\255\255\255\255\255\255\255\127{}")
  fails("exceeds the bound", st.load, bad)
  write(bad, "abc")
  fails("too short (3 bytes)", st.read_header, bad)
  fails("cannot open " .. dir .. "/none.safetensors", st.load, dir .. "/none.safetensors")
  fails("safetensors: path must be a string", st.load, 3)
  fails("'x' is a number, not a tensor", st.save, bad, {x = 1})
  fails("metadata 'k' must be a string, got table", st.save, bad, {x = lt.ones(1)}, {k = {}})
  fails("may not be named __metadata__", st.save, bad, {__metadata__ = lt.ones(1)})
  local freed = lt.ones(2)
  freed:free()
  fails("tensor was freed", st.save, bad, {x = freed})
  -- names: UTF-8 without NUL, read and written ("a\u0000b" is not the name "a")
  file('{"a\\u0000b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', "x")
  fails(bad .. ': the header string "a\\u0000b" holds a NUL character', st.load, bad)
  file('{"a\\\\u0000b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', "x") -- an escaped backslash
  equal(st.read_header(bad).names, {"a\\u0000b"})
  file('{"a\255": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', "x")
  fails("tensor name 'a\\xFF' is not valid UTF-8 (byte 1)", st.load, bad)
  file('{"\237\160\128": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', "x") -- a UTF-16 surrogate
  fails("tensor name '\\xED\\xA0\\x80' is not valid UTF-8 (byte 0)", st.load, bad)
  file('{"\195\169t\195\169": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', "x")
  equal(st.read_header(bad).names, {"\195\169t\195\169"}) -- "été"
  fails('tensor name "a\\0b" holds a NUL byte', st.save, bad, {["a\0b"] = lt.ones(1)})
  fails("tensor name 'a\\xFF' is not valid UTF-8", st.save, bad, {["a\255"] = lt.ones(1)})
  fails("metadata 'k' is not valid UTF-8", st.save, bad, {x = lt.ones(1)}, {k = "\192\175"})
end)

test("PyTorch reads our file and writes one we read", function()
  local PYTHON = T.need_python("torch")
  local ts = sample_tensors()
  local ours = dir .. "/ours.safetensors"
  st.save(ours, ts, {format = "pt"})
  -- each tensor's values as JSON, for python to compare with what it parses (bf16/f16 as f64)
  local expect = {}
  for name, t in pairs(ts) do
    local vals = (t.dtype == "bool" and t:to("u8") or t:to("f64")):tolist() -- exact for every value here
    expect[name] = {dtype = t.dtype, shape = json.array(t.shape), values = type(vals) == "table" and json.array(vals) or vals}
  end
  json.write_file(dir .. "/expect.json", expect)
  local py = dir .. "/st.py"
  write(py, [==[
import json, struct, sys, torch
DT = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
      "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = bytearray(raw[8 + n:])
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = data[b:end]
        t = torch.frombuffer(buf, dtype=DT[e["dtype"]]) if len(buf) else torch.empty(0, dtype=DT[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out, meta
# check OURS EXPECT_JSON, then write THEIRS THEIRS_JSON (one python start: torch imports slowly)
if True:
    ts, meta = read(sys.argv[1])
    expect = json.load(open(sys.argv[2]))
    assert meta == {"format": "pt"}, meta
    assert sorted(ts) == sorted(expect), (sorted(ts), sorted(expect))
    for name, e in expect.items():
        t = ts[name]
        assert list(t.shape) == e["shape"], (name, t.shape, e["shape"])
        want = torch.tensor(e["values"], dtype=torch.float64).reshape(e["shape"])
        got = t.to(torch.float64)
        assert torch.equal(got, want), (name, got, want)
    print("python: ok", len(ts))
if True:  # write: a file as the reference writer lays it out (data sorted by dtype, then name)
    g = torch.Generator().manual_seed(0)
    ts = {"z.f32": torch.randn(3, 2, generator=g), "a.bf16": torch.randn(4, generator=g).bfloat16(),
          "m.i64": torch.tensor([[1, -2], [3, 4]]), "k.f16": torch.randn(2, 2, generator=g).half()}
    items = sorted(ts.items(), key=lambda kv: (-ts[kv[0]].element_size(), kv[0]))
    header, blobs, off = {"__metadata__": {"format": "pt", "who": "torch"}}, [], 0
    for name, t in items:
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": {v: k for k, v in DT.items()}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(sys.argv[3], "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    json.dump({k: {"shape": list(v.shape), "values": v.double().tolist()} for k, v in ts.items()},
              open(sys.argv[4], "w"))
]==])
  local function run(...)
    local cmd = table.concat({PYTHON, py, ...}, " ")
    local r = os.execute(cmd .. " 2>&1")
    assert(r == 0 or r == true, "failed: " .. cmd)
  end
  run(ours, dir .. "/expect.json", dir .. "/theirs.safetensors", dir .. "/theirs.json")
  local got, meta = st.load(dir .. "/theirs.safetensors")
  equal(meta, {format = "pt", who = "torch"})
  local want = json.read_file(dir .. "/theirs.json")
  local dts = {["z.f32"] = "f32", ["a.bf16"] = "bf16", ["m.i64"] = "i64", ["k.f16"] = "f16"}
  for name, w in pairs(want) do
    equal(got[name].dtype, dts[name], name)
    equal(got[name].shape, w.shape, name)
    close(got[name]:to("f64"), w.values, {rtol = 0, atol = 0, msg = name})
  end
end)

test("cleanup", function() os.execute("rm -rf " .. dir) end)
