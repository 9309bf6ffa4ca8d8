-- lutra.tensorboard and lutra.train.tb_sink against TensorBoard's own readers (PyPI, in the venv
-- tests/py/tb_venv.sh makes under the build directory; skipped only when pip cannot install it):
-- tests/py/tb_read.py reports what EventAccumulator, the plugin accumulator the app uses, and the
-- record reader (which checks both CRC32Cs of every record) find, and this file compares it with
-- what was written: tags, steps, f32 values bit for bit, text, histogram fields and buckets.
local lt = require "lutra"
local ffi = require "ffi"
local json = require "lutra.json"
local tb = require "lutra.tensorboard"
local tb_sink = require "lutra.train.tb_sink"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
local files = dofile(here .. "file_helpers.lua")
local root = here .. "../../"

local dir = files.temp_dir()

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local tb_read = dofile(here .. "tb_reader.lua").read

local function f32(x) return tonumber(ffi.new("float", x)) end

local function file_in(d)
  local p = io.popen("ls " .. sh_quote(d))
  local names = {}
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  return names
end

test("scalars: tags, steps, wall times and f32 values as TensorBoard reads them", function()
  local d = dir .. "/scalars"
  local w = tb.open(d) -- made with its parents
  local values = {2.5, 0.1, 1 / 3, 0, -7.25e-30, 3e38, 1e40, -1e40, 0 / 0}
  for i, v in ipairs(values) do w:scalar("loss", v, i - 1, 1700000000 + i / 4) end
  w:scalar("train/lr", 3e-4, 5)
  w:scalar("train/lr", 1e-4, -2) -- any int64 step
  w:close()
  w:close() -- twice is fine
  local got = tb_read(d)
  equal(#got.files, 1)
  local host = io.popen("hostname"):read("*l")
  assert(got.files[1]:match("^events%.out%.tfevents%.%d+%." .. host:gsub("%p", "%%%0") .. "$"), got.files[1])
  equal(w.path, d .. "/" .. got.files[1])
  local rec = got.records[got.files[1]]
  equal(rec.count, 1 + #values + 2)
  equal(rec.framed, rec.count)
  assert(json.is_null(rec.error))
  equal(rec.file_version, "brain.Event:2")
  local loss = got.scalars.loss
  equal(#loss, #values)
  for i, v in ipairs(values) do
    equal(loss[i][1], i - 1)
    local want = f32(v)
    if want ~= want then
      equal(loss[i][2], "nan")
    elseif want == math.huge or want == -math.huge then
      equal(loss[i][2], want > 0 and "inf" or "-inf")
    else
      equal(loss[i][2], want, "loss at step " .. (i - 1)) -- the stored f32, bit for bit
    end
    equal(loss[i][3], 1700000000 + i / 4)
  end
  equal(got.scalars["train/lr"][1][1], 5)
  equal(got.scalars["train/lr"][1][2], f32(3e-4))
  equal(got.scalars["train/lr"][2][1], -2)
  local now = os.time()
  assert(math.abs(got.scalars["train/lr"][1][3] - now) < 600, "wall time defaults to now")
  equal(got.plugins.scalars, {"loss", "train/lr"})
end)

test("text: the text plugin's string tensor, bytes as written", function()
  local d = dir .. "/text"
  local w = tb.open(d)
  local s = "| a | b |\n|---|---|\n| naïve ✓ | `x` |\n\ttab"
  w:text("config", s, 0)
  w:text("notes", "", 3)
  w:text("notes", "two", 4)
  w:close()
  local got = tb_read(d)
  local t = got.texts.config[1]
  equal(t.step, 0)
  equal(t.text, {s})
  equal(t.dtype, 7) -- DT_STRING
  equal(t.plugin, "text")
  equal(#got.texts.notes, 2)
  equal(got.texts.notes[1].text, {""})
  equal(got.texts.notes[2].step, 4)
  equal(got.texts.notes[2].text, {"two"})
  equal(got.plugins.text, {"config", "notes"})
end)

-- Checks a histogram TensorBoard read against the values it was made of: count, min, max, sum and
-- sum of squares (finite values only), and each value's bucket by the limits read back.
local function check_histogram(h, values, bins)
  local n, lo, hi, sum, sq = 0, math.huge, -math.huge, 0, 0
  for _, v in ipairs(values) do
    if v == v and v ~= math.huge and v ~= -math.huge then
      n, lo, hi, sum, sq = n + 1, math.min(lo, v), math.max(hi, v), sum + v, sq + v * v
    end
  end
  equal(h.num, n)
  equal(h.min, lo)
  equal(h.max, hi)
  T.assert_close(h.sum, sum, {rtol = 1e-12, atol = 1e-12})
  T.assert_close(h.sum_squares, sq, {rtol = 1e-12, atol = 1e-12})
  equal(#h.bucket_limit, bins)
  equal(#h.bucket, bins)
  equal(h.bucket_limit[bins], hi)
  local want = {}
  for i = 1, bins do want[i] = 0 end
  for _, v in ipairs(values) do
    if v == v and v ~= math.huge and v ~= -math.huge then
      local b = 1
      while h.bucket_limit[b] < v do b = b + 1 end -- (limit[b-1], limit[b]]
      want[b] = want[b] + 1
    end
  end
  equal(h.bucket, want)
  for i = 2, bins do assert(h.bucket_limit[i] > h.bucket_limit[i - 1]) end
  T.assert_close(h.bucket_limit[1] - lo, (hi - lo) / bins, {rtol = 1e-9, atol = 1e-300}) -- equal widths
end

test("histograms: tensors of any dtype, tables, given buckets; NaN and infinities left out", function()
  local d = dir .. "/histo"
  local w = tb.open(d)
  local x = lt.randn(1000)
  w:histogram("weights/f32", x, 1)
  local xs = x:tolist()
  w:histogram("weights/bf16", x:to("bf16"), 1, {bins = 7})
  local xb = x:to("bf16"):to("f64"):tolist()
  local ints = lt.arange(0, 50):to("i64")
  w:histogram("ints", ints, 2, {bins = 10})
  local strided = lt.randn(6, 4):to("f64"):t() -- not contiguous
  w:histogram("strided", strided, 2, {bins = 5})
  local mixed = {1, 0 / 0, 5, math.huge, 3, -math.huge, 3}
  w:histogram("mixed", mixed, 3, {bins = 4})
  w:histogram("same", {2, 2, 2}, 3)
  w:histogram("empty", {}, 3)
  w:histogram("given", {min = -1, max = 4, num = 6, sum = 9, sum_squares = 25, bucket_limit = {0, 1, 4},
                        bucket = {1, 2, 3}}, 4)
  w:close()
  local got = tb_read(d)
  local H = got.histograms
  check_histogram(H["weights/f32"][1], xs, 30)
  equal(H["weights/f32"][1].step, 1)
  check_histogram(H["weights/bf16"][1], xb, 7)
  check_histogram(H.ints[1], ints:tolist(), 10)
  equal(H.ints[1].bucket, {5, 5, 5, 5, 5, 5, 5, 5, 5, 5}) -- 0..49 in tenths of [0, 49]
  check_histogram(H.strided[1], strided:contiguous():reshape(24):tolist(), 5)
  check_histogram(H.mixed[1], mixed, 4)
  equal(H.mixed[1].bucket, {1, 2, 0, 1}) -- limits 2, 3, 4, 5: 3 is in (2, 3]
  equal(H.same[1].bucket_limit, {2})
  equal(H.same[1].bucket, {3})
  equal(H.empty[1].num, 0)
  equal(H.empty[1].bucket, {})
  local g = H.given[1]
  equal({g.step, g.min, g.max, g.num, g.sum, g.sum_squares}, {4, -1, 4, 6, 9, 25})
  equal(g.bucket_limit, {0, 1, 4})
  equal(g.bucket, {1, 2, 3})
  equal(got.plugins.histograms, {"empty", "given", "ints", "mixed", "same", "strided", "weights/bf16", "weights/f32"})
end)

test("CRC32C: TensorBoard's record reader refuses a record whose header or data was changed", function()
  local d = dir .. "/crc"
  local w = tb.open(d)
  w:scalar("a", 1, 1)
  w:scalar("a", 2, 2)
  w:close()
  local path = w.path
  local good = tb_read("--records", path)
  equal(good.count, 3)
  assert(json.is_null(good.error))
  local s = files.read(path)
  local n = 0 -- the first record's length (u64, little-endian)
  for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
  local first = 16 + n -- where the second record starts: length, its CRC, data, data CRC
  local function flipped(at) return s:sub(1, at - 1) .. string.char(bit.bxor(s:byte(at), 1)) .. s:sub(at + 1) end
  local bad = d .. "/copy.tfevents.data"
  files.write(bad, flipped(first + 12 + 3)) -- a byte of the second record's data
  local r = tb_read("--records", bad)
  equal(r.count, 1)
  assert(tostring(r.error):find("failed event crc32 check", 1, true), tostring(r.error))
  files.write(bad, flipped(first + 1)) -- the second record's length
  r = tb_read("--records", bad)
  equal(r.count, 1)
  assert(tostring(r.error):find("failed header crc32 check", 1, true), tostring(r.error))
  os.remove(bad)
  -- TensorBoard's crc32c is the standard one (the check value of "123456789")
  equal(tb_read("--crc", "123456789").crc32c, 0xe3069283)
end)

test("files: one writer a file; a link planted at the name is never written through", function()
  local d = dir .. "/links"
  local outside = files.temp_dir()
  files.write(outside .. "/victim", "precious")
  lt.C.lt_tb_path(nil, nil) -- (an error status, not a crash)
  local host = io.popen("hostname"):read("*l")
  local t0 = os.time()
  assert(os.execute("mkdir -p " .. sh_quote(d)))
  for t = t0, t0 + 5 do -- every name the next seconds could take
    assert(os.execute(string.format("ln -s %s %s", sh_quote(outside .. "/victim"),
                                    sh_quote(string.format("%s/events.out.tfevents.%d.%s", d, t, host)))))
  end
  local a, b = tb.open(d), tb.open(d)
  assert(a.path ~= b.path)
  assert(a.path:match("%.2$") or a.path:match("%.3$"), a.path)
  a:scalar("x", 1, 1)
  b:scalar("x", 2, 1)
  a:close()
  b:close()
  equal(files.read(outside .. "/victim"), "precious")
  local got = tb_read(d)
  equal(#got.scalars.x, 2)
  os.execute("rm -rf " .. sh_quote(outside))
end)

test("errors name the file and the problem; nothing crashes", function()
  files.write(dir .. "/plain", "x")
  fails("cannot create the directory " .. dir .. "/plain", function() tb.open(dir .. "/plain/sub") end)
  local out = ffi.new("lt_tb_writer*[1]")
  equal(lt.C.lt_tb_open(out, dir .. "/nowhere"), -1)
  equal(ffi.string(lt.C.lt_last_error()), "tensorboard: cannot write in " .. dir .. "/nowhere: no such file or directory")
  equal(lt.C.lt_tb_open(out, dir .. "/plain"), -1)
  equal(ffi.string(lt.C.lt_last_error()), "tensorboard: cannot write in " .. dir .. "/plain: not a directory")
  if io.popen("id -u"):read("*l") ~= "0" then -- root writes anywhere
    local ro = dir .. "/readonly"
    assert(os.execute("mkdir -p " .. sh_quote(ro) .. " && chmod 555 " .. sh_quote(ro)))
    fails("tensorboard: cannot write " .. ro .. "/events.out.tfevents.", function() tb.open(ro) end)
    fails("permission denied", function() tb.open(ro) end)
  end
  local w = tb.open(dir .. "/errors")
  fails("tag must be a non-empty string", function() w:scalar("", 1, 1) end)
  fails("the tag \255x is not valid UTF-8", function() w:scalar("\255x", 1, 1) end)
  fails("the tag \237\160\128 is not valid UTF-8", function() w:scalar("\237\160\128", 1, 1) end) -- a surrogate
  fails("step must be an integer, got 1.5", function() w:scalar("a", 1, 1.5) end)
  fails("value must be a number, got string", function() w:scalar("a", "1", 1) end)
  fails("bins must be a positive integer", function() w:histogram("h", {1}, 1, {bins = 0}) end)
  fails("item 2 is not a number", function() w:histogram("h", {1, "x"}, 1) end)
  fails("bucket_limit[1] = 1 is not above bucket_limit[0] = 1", function()
    w:histogram("h", {min = 0, max = 1, num = 2, sum = 1, sum_squares = 1, bucket_limit = {1, 1}, bucket = {1, 1}}, 1)
  end)
  fails("2 bucket_limit but 1 bucket", function()
    w:histogram("h", {min = 0, max = 1, num = 2, sum = 1, sum_squares = 1, bucket_limit = {0, 1}, bucket = {1}}, 1)
  end)
  w:scalar("ok", 1, 1)
  local path = w.path
  w:close()
  fails("the writer of " .. path .. " is closed", function() w:scalar("a", 1, 1) end)
  local got = tb_read(dir .. "/errors")
  equal(got.scalars.ok[1][2], 1) -- the refused calls left no half record
  equal(got.records[got.files[1]].count, 2)
end)

test("tb_sink: records as scalars, lists per rank, config and samples as text, weights and grads", function()
  local d = dir .. "/sink"
  local cfg = {lr = 3e-4, steps = 10, model = {n_layer = 2, arch = "gpt|2"}, tags = {"a", "b"}}
  local sink = tb_sink.open(d, cfg)
  sink:record{step = 1, loss = 2.5, lr = 1e-3, grad_norm = 0.75, tokens_per_s = 12345.5, mfu = 0.31,
              peak_mem_mb = 812, step_ms = 21.5, lm_loss = 2.4, aux_loss = 0.1, loss_scale = 65536,
              rank_step_ms = {12.1, 12.5}, eta = "3m", note = {x = 1}}
  sink:record{step = 2, val_loss = 2.25}
  sink:sample(2, "Once upon a ```time```")
  local lin = lt.nn.Linear(4, 3)
  lin(lt.randn(5, 4)):sum():backward()
  sink:histograms(2, lin)
  sink:close()
  local got = tb_read(d)
  local S = got.scalars
  for k, v in pairs {loss = 2.5, lr = 1e-3, grad_norm = 0.75, tokens_per_s = 12345.5, mfu = 0.31, peak_mem_mb = 812,
                     step_ms = 21.5, lm_loss = 2.4, aux_loss = 0.1, loss_scale = 65536,
                     ["rank_step_ms/rank0"] = 12.1, ["rank_step_ms/rank1"] = 12.5} do
    equal(S[k] and #S[k], 1, k)
    equal(S[k][1][1], 1, k)
    equal(S[k][1][2], f32(v), k)
  end
  equal(S.val_loss[1][1], 2)
  equal(S.val_loss[1][2], 2.25)
  equal(S.step, nil)
  equal(S.eta, nil)
  equal(got.texts.config[1].step, 0)
  equal(got.texts.config[1].text[1], table.concat({"| key | value |", "|---|---|", '| lr | 0.00029999999999999997 |',
    '| model.arch | "gpt\\|2" |', "| model.n_layer | 2 |", "| steps | 10 |", '| tags | ["a","b"] |'}, "\n"))
  equal(got.texts.samples[1].step, 2)
  equal(got.texts.samples[1].text[1], "````\nOnce upon a ```time```\n````")
  local H = got.histograms
  check_histogram(H["weights/weight"][1], lin.weight:to("f64"):reshape(12):tolist(), 30)
  check_histogram(H["weights/bias"][1], lin.bias:to("f64"):tolist(), 30)
  check_histogram(H["grads/weight"][1], lin.weight.grad:to("f64"):reshape(12):tolist(), 30)
  equal(H["grads/bias"][1].num, 3)
  equal(H["grads/bias"][1].min, 5) -- d(sum)/d(bias) = the batch size, for each of the 3
  equal(got.plugins.text, {"config", "samples"})
end)

test("lt.tensorboard is lutra.tensorboard", function() assert(rawequal(lt.tensorboard, tb)) end)

test("cleanup", function() os.execute("rm -rf " .. sh_quote(dir)) end)
