-- lutra.json: decoding (every escape, surrogate pairs, numbers, nesting bound), encoding
-- (sorted keys, arrays, escapes, errors), round trips on random values, JSONL, error
-- positions; and python's json module as the independent reference (where /usr/bin/python3
-- or python3 runs): its output is decoded here, and ours is decoded and re-encoded there.
local json = require "lutra.json"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error
local files = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "file_helpers.lua")
local read, write = files.read, files.write

test("scalars and literals", function()
  equal(json.decode("true"), true)
  equal(json.decode(" false "), false)
  assert(json.decode("null") == json.null)
  equal(tostring(json.null), "json.null")
  equal(json.decode("0"), 0)
  equal(json.decode("-0.5"), -0.5)
  equal(json.decode("1e3"), 1000)
  equal(json.decode("1E-2"), 0.01)
  equal(json.decode("-12.5e+1"), -125)
  equal(json.decode("123456789012"), 123456789012)
  equal(json.decode('"abc"'), "abc")
  equal(json.decode('""'), "")
  equal(json.decode("\239\187\191[1]"), {1}) -- byte order mark skipped
end)

test("string escapes and unicode", function()
  equal(json.decode([["a\"b\\c\/d\b\f\n\r\t"]]), 'a"b\\c/d\b\f\n\r\t')
  equal(json.decode([["\u0041\u00e9\u20ac"]]), "A\195\169\226\130\172") -- A é €
  equal(json.decode([["\ud83d\ude00"]]), "\240\159\152\128") -- U+1F600 from a surrogate pair
  equal(json.decode([["\uD834\uDD1E"]]), "\240\157\132\158") -- U+1D11E, upper-case hex
  equal(json.decode([["\u0000x"]]), "\0x")
  equal(json.decode('"h\195\169llo \240\159\152\128"'), "h\195\169llo \240\159\152\128") -- raw UTF-8 passes through
  equal(json.decode('"\127"'), "\127") -- DEL is not a control character in JSON
  -- encode: control characters, quotes and backslashes escaped; UTF-8 kept
  equal(json.encode('a"b\\c\n\t\1\31\127'), [["a\"b\\c\n\t\u0001\u001f\u007f"]])
  equal(json.encode("\226\130\172"), '"\226\130\172"')
  for _, s in ipairs {"", "x", "\0\1\2", 'q"q', "\\\\", "\240\159\152\128", "tab\there"} do
    equal(json.decode(json.encode(s)), s)
  end
end)

test("objects, arrays, null in lists, repeated keys", function()
  local v = json.decode(' { "b" : [1, 2, null, {"x": []}], "a": {}, "c": "s" , "a": {"k": true}} ')
  equal(v.a, {k = true})
  equal(v.c, "s")
  equal(#v.b, 4)
  assert(v.b[3] == json.null)
  assert(json.is_array(v.b) and json.is_array(v.b[4].x) and not json.is_array(v))
  equal(json.encode(v), '{"a":{"k":true},"b":[1,2,null,{"x":[]}],"c":"s"}')
  equal(json.encode({}), "{}")
  equal(json.encode(json.array()), "[]")
  equal(json.encode(json.array {1, 2}), "[1,2]")
  equal(json.encode({z = 1, a = 2, m = {3}}), '{"a":2,"m":[3],"z":1}')
  equal(json.encode({1, "two", false, json.null}), '[1,"two",false,null]')
end)

test("numbers encode to the shortest text that reads back", function()
  equal(json.encode(1), "1")
  equal(json.encode(-0.0), "0") -- integral
  equal(json.encode(0.1), "0.1")
  equal(json.encode(1e-7), "1e-07")
  equal(json.encode(2 ^ 53), "9007199254740992")
  equal(json.encode(1 / 3), "0.3333333333333333")
  equal(json.encode(1e100), "1e+100")
  T.seed(3)
  for _ = 1, 2000 do
    local x = (T.uniform() - 0.5) * 10 ^ T.randint(-30, 30)
    equal(json.decode(json.encode(x)), x)
  end
  for _, x in ipairs {2 ^ 53 - 1, -(2 ^ 53 - 1), 1e300, 5e-324, 2.2250738585072014e-308} do
    equal(json.decode(json.encode(x)), x)
  end
end)

test("indent: python's json.dumps(indent=2, sort_keys=True) layout", function()
  local v = {name = "x", dims = {1, 2}, empty = {}, list0 = json.array(), nested = {a = {true}}}
  equal(json.encode(v, {indent = 2}), table.concat({
    '{',
    '  "dims": [',
    '    1,',
    '    2',
    '  ],',
    '  "empty": {},',
    '  "list0": [],',
    '  "name": "x",',
    '  "nested": {',
    '    "a": [',
    '      true',
    '    ]',
    '  }',
    '}'}, "\n"))
  equal(json.decode(json.encode(v, {indent = 4})), json.decode(json.encode(v)))
end)

test("decode errors name the problem, line and column", function()
  local cases = {
    {"", "unexpected end of input at line 1 column 1"},
    {"[1, 2", "',' or ']' expected, got end of input at line 1 column 6"},
    {'{"a" 1}', "':' expected, got '1' at line 1 column 6"},
    {"{1: 2}", "string key expected, got '1' at line 1 column 2"},
    {'{"a": 1,}', "string key expected, got '}'"},
    {"[1,]", "unexpected ']' at line 1 column 4"},
    {"[1]\n  x", "extra data after the value: 'x' at line 2 column 3"},
    {'"abc', "unterminated string at line 1 column 1"},
    {'\n\n  "a\nb"', "control character 0x0a in string (escape it) at line 3 column 5"},
    {[["\x"]], "bad escape \\x at line 1 column 2"},
    {[["\u12G4"]], "bad \\u escape (four hex digits expected) at line 1 column 4"},
    {[["\ud800"]], "lone high surrogate \\uD800"},
    {[["\ud800\u0041"]], "\\u0041 does not follow high surrogate \\uD800"},
    {[["\udc00"]], "lone low surrogate \\uDC00"},
    {"01", "leading zero in number at line 1 column 1"},
    {"-", "unexpected '-'"},
    {"1.", "digit expected after '.' at line 1 column 2"},
    {"1e", "digits expected in exponent at line 1 column 2"},
    {".5", "unexpected '.'"},
    {"tru", "unexpected 't'"},
    {"NaN", "unexpected 'N'"},
    {"[1] [2]", "extra data after the value: '['"},
    {"\1", "unexpected byte 0x01"},
    {"[1, -2e400]", "number -2e400 is out of range at line 1 column 5"},
    {"206E80395191432666", "number 206E80395191432666 is out of range"},
  }
  for _, c in ipairs(cases) do
    local msg = fails("json: " .. c[2], json.decode, c[1])
    assert(msg:find("test_json.lua", 1, true), "error points at the caller: " .. msg)
    local v, err = json.try_decode(c[1])
    assert(v == nil and err:find(c[2], 1, true), err)
  end
  fails("json: decode expects a string, got number", json.decode, 5)
end)

test("nesting depth is bounded, not a stack overflow", function()
  local deep = ("["):rep(600) .. ("]"):rep(600)
  fails("json: nesting deeper than 512 at line 1 column 513", json.decode, deep)
  local ok = ("["):rep(500) .. ("]"):rep(500)
  local v = json.decode(ok)
  for _ = 1, 499 do v = v[1] end
  equal(#v, 0)
  local t = {}
  local cur = t
  for _ = 1, 600 do cur[1] = {}; cur = cur[1] end
  fails("json: nesting deeper than 512", json.encode, t)
end)

test("deep nesting: the bound is max_depth (at most 1000), objects count as arrays do", function()
  local mixed = ('{"a":['):rep(256) .. ("]}"):rep(256) -- 512 levels
  local v = json.decode(mixed)
  for _ = 1, 255 do v = v.a[1] end
  equal(#v.a, 0)
  fails("json: nesting deeper than 512 at line 1 column 1541", json.decode, "{\"a\":" .. mixed .. "}")
  local saved = json.max_depth
  json.max_depth = 3
  equal(json.decode("[[[1]]]"), {{{1}}})
  fails("json: nesting deeper than 3 at line 1 column 4", json.decode, "[[[[1]]]]")
  json.max_depth = 5000 -- capped at 1000, the reader's own bound
  equal(#json.decode(("["):rep(1000) .. ("]"):rep(1000)), 1)
  fails("json: nesting deeper than 1000 at line 1 column 1001", json.decode, ("["):rep(1001) .. ("]"):rep(1001))
  json.max_depth = saved
  fails("json: nesting deeper than 512", json.decode, ("[{\"k\":"):rep(100000)) -- no stack overflow
end)

test("UTF-8: the reader keeps invalid bytes, the writer refuses them by place; surrogates must pair", function()
  for _, s in ipairs {"\255\254", "\192\128", "\237\160\128", "a\128b", "\240\159\152"} do
    equal(json.decode('"' .. s .. '"'), s) -- not checked, not changed (as the Lua reader did)
    -- writing it would not be JSON: refused, naming the place inside the value
    fails("json: invalid UTF-8 (byte 0x", json.encode, {[s] = 1})
    fails("json: invalid UTF-8", json.encode, s)
  end
  fails("json: invalid UTF-8 (byte 0xff at offset 2) in the string at config.data[2]", json.encode,
    {config = {data = {"ok", "a\255"}}})
  fails("json: invalid UTF-8 (byte 0xc0 at offset 1) in a key at files", json.encode, {files = {["\192\128"] = 1}})
  fails('json: invalid UTF-8 (byte 0xed at offset 1) in the string at ["a key"][1]', json.encode,
    {["a key"] = {"\237\160\128"}})
  fails("json: invalid UTF-8 (byte 0x80 at offset 1) in the string at the top level", json.encode, "\128")
  fails("json: x.json: invalid UTF-8 (byte 0xf5 at offset 1) in the string at [1]", json.write_file, "x.json", {"\245"})
  fails("json: invalid UTF-8", json.encode_string, "\255")
  equal(json.encode_string("\226\130\172\""), '"\226\130\172\\""')
  equal(json.decode([["\uD800\uDC00"]]), "\240\144\128\128") -- the lowest pair, U+10000
  equal(json.decode([["\uDBFF\uDFFF"]]), "\244\143\191\191") -- the highest, U+10FFFF
  local cases = {
    {[["\uD800"]], "lone high surrogate \\uD800 at line 1 column 2"},
    {[["x\uDBFFx"]], "lone high surrogate \\uDBFF at line 1 column 3"},
    {[["\uD800\n"]], "lone high surrogate \\uD800 at line 1 column 2"},
    {[["\uD800\uD800"]], "\\uD800 does not follow high surrogate \\uD800 at line 1 column 8"},
    {[["\uD800\u12"]], "bad \\u escape (four hex digits expected) at line 1 column 10"},
    {[["\uDFFF\uD800"]], "lone low surrogate \\uDFFF at line 1 column 2"},
    {[[{"\uDC00": 1}]], "lone low surrogate \\uDC00 at line 1 column 3"},
    {'"\\', "bad escape \\ at line 1 column 2"},
    {'"\\\1"', "bad escape \\ (byte 0x01) at line 1 column 2"},
  }
  for _, c in ipairs(cases) do fails("json: " .. c[2], json.decode, c[1]) end
end)

test("strings and keys with NUL bytes keep their length", function()
  local v = json.decode('{"k\\u0000z": "\\u0000\\u0000y", "plain": "\\u0000", "list": ["a\\u0000", "", "b"]}')
  equal(v["k\0z"], "\0\0y")
  equal(v.plain, "\0")
  equal(v.list, {"a\0", "", "b"})
  equal(json.encode(v), '{"k\\u0000z":"\\u0000\\u0000y","list":["a\\u0000","","b"],"plain":"\\u0000"}')
end)

test("huge numbers: long texts, the double range's edges, integers past 2^53", function()
  equal(json.decode("1" .. ("0"):rep(70)), 1e70)
  equal(json.decode("[" .. ("9"):rep(400) .. "e-100]")[1], tonumber(("9"):rep(400) .. "e-100"))
  equal(json.decode("0." .. ("0"):rep(100) .. "1"), 1e-101)
  equal(json.decode("-0." .. ("0"):rep(400) .. "1"), -0.0) -- below the smallest double: zero
  equal(json.decode("1.7976931348623157e308"), 1.7976931348623157e308)
  equal(json.decode("4.9406564584124654e-324"), 5e-324)
  equal(json.decode("18446744073709551616"), 2 ^ 64)
  equal(json.decode("9007199254740993"), 2 ^ 53) -- rounded to the nearest double, as tonumber does
  equal(json.decode('{"a": 123456789012345678901234567890123456789012345678901234567890123456789, "b": "x"}'),
    {a = 1.2345678901234568e68, b = "x"})
  fails("json: number 1e309 is out of range at line 1 column 2", json.decode, "[1e309]")
  fails("json: number -1" .. ("0"):rep(78) .. "... is out of range", json.decode, "-1" .. ("0"):rep(400))
  for _, x in ipairs {1e308, -1e-308, 123456789012345678, 2 ^ 63, 0.1 + 0.2} do equal(json.decode(json.encode(x)), x) end
end)

test("repeated keys: the last one wins", function()
  equal(json.decode('{"a": 1, "b": 2, "a": 3}'), {a = 3, b = 2})
  equal(json.decode('{"a": {"x": 1}, "a": [2]}').a, {2})
  equal(json.decode('{"a": 1, "a": null}').a, json.null)
end)

test("encode errors", function()
  fails("json: cannot encode a non-finite number (inf)", json.encode, {x = math.huge})
  fails("json: cannot encode a non-finite number (-inf)", json.encode, -math.huge)
  fails("json: cannot encode a non-finite number", json.encode, {0 / 0})
  fails("json: cannot encode a function", json.encode, {f = print})
  fails("json: cannot encode a table with both list and string keys", json.encode, {1, 2, a = 3})
  fails("json: cannot encode a list with holes (2 values, last index 3; use json.null)", json.encode, {1, nil, 3})
  fails("json: cannot encode a table with a boolean key", json.encode, {[true] = 1})
  fails("json: cannot encode a table with a number key (1.5)", json.encode, {[1.5] = 1})
  local cyc = {}
  cyc.self = cyc
  fails("json: cannot encode a table that contains itself", json.encode, cyc)
  fails("json: indent must be a non-negative number", json.encode, {}, {indent = "x"})
  -- the same table twice (not a cycle) is fine
  local shared = {1}
  equal(json.encode({a = shared, b = shared}), '{"a":[1],"b":[1]}')
end)

-- Random JSON-able values: nested objects and lists of strings (any bytes incl. UTF-8),
-- numbers, booleans and null.
local function random_string()
  local parts = {}
  for i = 1, T.randint(0, 8) do
    local r = T.uniform()
    if r < 0.6 then
      parts[i] = string.char(T.randint(32, 127))
    elseif r < 0.75 then
      parts[i] = string.char(T.randint(0, 32))
    elseif r < 0.9 then
      parts[i] = ({"\195\169", "\226\130\172", "\240\159\152\128", "\228\184\173"})[T.randint(1, 5)]
    else
      parts[i] = ({'"', "\\", "/", "\127"})[T.randint(1, 5)]
    end
  end
  return table.concat(parts)
end

local function random_value(depth)
  local r = T.uniform()
  if depth > 3 then r = r * 0.6 end
  if r < 0.15 then return random_string() end
  if r < 0.3 then return (T.uniform() - 0.5) * 10 ^ T.randint(-10, 10) end
  if r < 0.4 then return T.randint(-1000000, 1000000) end
  if r < 0.5 then return T.uniform() < 0.5 end
  if r < 0.6 then return json.null end
  if r < 0.8 then
    local l = json.array()
    for i = 1, T.randint(0, 5) do l[i] = random_value(depth + 1) end
    return l
  end
  local o = {}
  for _ = 1, T.randint(0, 5) do o[random_string()] = random_value(depth + 1) end
  return o
end

test("round trips of random values (compact and indented)", function()
  T.seed(11)
  for _ = 1, 300 do
    local v = random_value(0)
    local s = json.encode(v)
    equal(json.decode(s), v)
    equal(json.encode(json.decode(s)), s) -- decoding keeps what encoding needs (empty arrays stay arrays)
    equal(json.decode(json.encode(v, {indent = 1})), v)
  end
end)

test("mutated JSON: every outcome is a value or a json: error, never a Lua error", function()
  T.seed(17)
  local alphabet = '{}[]",:\\u0123456789abcdefEnrtl.-+ \n\t\0\255'
  local n_ok, n_err = 0, 0
  for _ = 1, 3000 do
    local s = json.encode(random_value(0))
    for _ = 1, T.randint(1, 4) do
      local i = T.randint(1, #s + 1)
      local r = T.uniform()
      local k = T.randint(1, #alphabet + 1)
      local c = alphabet:sub(k, k)
      if r < 0.4 then
        s = s:sub(1, i - 1) .. c .. s:sub(i + 1) -- replace
      elseif r < 0.7 then
        s = s:sub(1, i - 1) .. c .. s:sub(i) -- insert
      else
        s = s:sub(1, i - 1) .. s:sub(i + 1) -- delete
      end
    end
    local ok, err = pcall(json.decode, s)
    if ok then
      n_ok = n_ok + 1
      -- what decodes re-encodes to the same value, or (raw bytes that are not UTF-8 kept by the
      -- reader: the text then has a byte >= 0x80 of its own) is refused as invalid UTF-8
      local encoded, text = pcall(json.encode, err)
      if encoded then
        equal(json.decode(text), err, string.format("%q", s))
      else
        assert(tostring(text):find("json: invalid UTF-8 (byte 0x", 1, true) and s:find("[\128-\255]"),
          string.format("%q", s) .. ": " .. tostring(text))
      end
    else
      n_err = n_err + 1
      assert(tostring(err):find("json: ", 1, true) and tostring(err):find(" at line %d+ column %d+"),
        "not a clean json error for " .. string.format("%q", s) .. ": " .. tostring(err))
    end
  end
  assert(n_ok > 100 and n_err > 100, n_ok .. " decoded, " .. n_err .. " rejected")
end)

test("JSONL: line numbers, blank lines, a bad line names the file and line", function()
  local path = os.tmpname()
  write(path, '{"a": 1}\n\n  \n[2, 3]\r\n"x"\n')
  local got = {}
  for n, v in json.lines(path) do got[#got + 1] = {n, v} end
  equal(got, {{1, {a = 1}}, {4, {2, 3}}, {5, "x"}})
  write(path, '{"a": 1}\n{"a": 2\n')
  local it = json.lines(path)
  equal(select(2, it()), {a = 1})
  fails(path .. ":2: ',' or '}' expected, got end of input at column 8", it)
  write(path, '{"k": [1, {"z": null}]}')
  equal(json.read_file(path).k[1], 1)
  write(path, '{"k": [1, \n  {"z": nul}]}')
  fails("json: " .. path .. ": unexpected 'n' at line 2 column 9", json.read_file, path)
  fails("json: cannot open", json.read_file, path .. ".missing")
  fails("json: cannot open", json.lines, path .. ".missing")
  json.write_file(path, {b = {1.5}, a = "x"}, {indent = 2})
  equal(read(path), '{\n  "a": "x",\n  "b": [\n    1.5\n  ]\n}\n')
  os.remove(path)
end)

test("UTF-8: python decides which byte strings are valid; what we write of them python reads back", function()
  local PYTHON = T.need_python("json")
  T.seed(23)
  -- byte strings near the edges of UTF-8: boundary code points, cut and overlong sequences,
  -- surrogates, bytes past U+10FFFF, stray continuation bytes, control characters
  local pieces = {"a", "\0", "\31", "\127", '"', "\\", "\194\128", "\223\191", "\224\160\128", "\239\191\191",
                  "\240\144\128\128", "\244\143\191\191", "\237\159\191", "\238\128\128", "\192\128", "\193\191",
                  "\224\159\191", "\237\160\128", "\237\191\191", "\240\143\191\191", "\244\144\128\128",
                  "\245\128\128\128", "\255", "\128", "\191", "\226\130", "\240\159\152", "\194"}
  local hex, ours = {}, {}
  local valid = 0
  for i = 1, 1500 do
    local parts = {}
    for k = 1, T.randint(1, 5) do
      parts[k] = T.uniform() < 0.8 and pieces[T.randint(1, #pieces + 1)] or string.char(T.randint(0, 256))
    end
    local str = table.concat(parts)
    hex[i] = str:gsub(".", function(c) return string.format("%02x", c:byte()) end)
    local ok, text = pcall(json.encode, {str})
    if ok then valid = valid + 1 end
    ours[i] = hex[i] .. "\t" .. (ok and text or "refused")
    assert(ok or tostring(text):find("json: invalid UTF-8 (byte 0x", 1, true), tostring(text))
  end
  assert(valid > 200 and valid < 1300, valid .. " of 1500 valid: the mix tests both sides")
  local dir = files.temp_dir()
  write(dir .. "/ours.txt", table.concat(ours, "\n") .. "\n")
  write(dir .. "/check.py", [==[
import json, sys
bad = 0
n = 0
for line in open(sys.argv[1], "rb"):
    h, out = line.rstrip(b"\n").split(b"\t", 1)
    raw = bytes.fromhex(h.decode())
    n += 1
    try:
        text = out.decode("utf-8")  # what we wrote must itself be UTF-8
    except UnicodeDecodeError:
        bad += 1
        print("wrote bytes that are not UTF-8", h)
        continue
    try:
        want = raw.decode("utf-8")  # strict: RFC 3629, as the writer must be
    except UnicodeDecodeError:
        want = None
    if want is None:
        if text != "refused":
            bad += 1
            print("accepted invalid UTF-8", h, text)
    elif text == "refused":
        bad += 1
        print("refused valid UTF-8", h)
    elif json.loads(text) != [want]:
        bad += 1
        print("python reads back something else", h, text)
print("checked", n, "bad", bad)
]==])
  local p = io.popen(PYTHON .. " " .. dir .. "/check.py " .. dir .. "/ours.txt 2>&1")
  local said = p:read("*a")
  p:close()
  equal(said:match("checked %d+ bad %d+\n$"), "checked 1500 bad 0\n", said)
  os.execute("rm -rf " .. dir)
end)

test("python's json module as the reference", function()
  local PYTHON = T.need_python("json")
  -- 1. python writes escapes we must decode (ensure_ascii: \uXXXX and surrogate pairs)
  local dir = files.temp_dir()
  local py = dir .. "/ref.py"
  write(py, [==[
import json, sys
mode, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "emit":
    v = {"ascii": "h\u00e9llo \u20ac \U0001F600 \u4e2d", "ctl": "\x00\x01\x1f\x7f\"\\/\b\f\n\r\t",
         "nums": [0, -1, 1.5, 1e-300, 1.7976931348623157e308, 123456789, -0.25, 3.141592653589793],
         "nested": {"a": [[], {}, [None, True, False]], "b": {"": ""}}, "big": list(range(50))}
    with open(dst, "w") as f:
        json.dump(v, f, ensure_ascii=True, indent=3)
    with open(dst + ".raw", "w", encoding="utf-8") as f:
        json.dump(v, f, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
else:  # reencode: read ours, write python's canonical form
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    with open(dst, "w", encoding="utf-8") as f:
        for line in lines:
            if line:
                f.write(json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":"), sort_keys=True) + "\n")
]==])
  local function run(...)
    local cmd = table.concat({PYTHON, py, ...}, " ")
    local r = os.execute(cmd)
    assert(r == 0 or r == true, "failed: " .. cmd)
  end
  run("emit", "-", dir .. "/py.json")
  local v = json.read_file(dir .. "/py.json")
  equal(v.ascii, "h\195\169llo \226\130\172 \240\159\152\128 \228\184\173")
  equal(v.ctl, '\0\1\31\127"\\/\b\f\n\r\t')
  equal(v.nums, {0, -1, 1.5, 1e-300, 1.7976931348623157e308, 123456789, -0.25, 3.141592653589793})
  equal(v.nested.a[3], {json.null, true, false})
  equal(#v.big, 50)
  equal(v.big[50], 49)
  -- the same value, written by python compactly with sorted keys, equals our encoding of it
  -- except for number spelling (python writes 0.0/1e-300 differently): compare decoded values
  equal(json.read_file(dir .. "/py.json.raw"), v)
  -- 2. python decodes what we write and re-encodes it; that decodes here to the same values
  T.seed(5)
  local values, lines = {}, {}
  for i = 1, 200 do
    values[i] = random_value(0)
    lines[i] = json.encode(values[i])
  end
  write(dir .. "/ours.jsonl", table.concat(lines, "\n") .. "\n")
  run("reencode", dir .. "/ours.jsonl", dir .. "/back.jsonl")
  local n = 0
  for i, back in json.lines(dir .. "/back.jsonl") do
    equal(back, values[i], "value " .. i)
    n = n + 1
  end
  equal(n, 200)
  os.execute("rm -rf " .. dir)
end)
