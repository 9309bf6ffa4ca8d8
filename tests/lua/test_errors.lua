-- Errors: every failure names what is wrong, and its message starts with THIS file's
-- name and the line of the call that failed (not a line inside lutra).
local lt = require "lutra"
local T = require "lutra.testing"

-- The line of the caller.
local function here() return debug.getinfo(2, "l").currentline end

-- Runs fn, which must fail; returns the message. The closures below assign instead of
-- `return f(x)`: a Lua tail call replaces the closure's frame, so the error would be
-- reported at the caller of the closure (inside fails) rather than at the closure.
local function fails(fn)
  local ok, msg = pcall(fn)
  if ok then error("expected an error, but the call succeeded", 2) end
  return tostring(msg)
end

-- The message must start with "<...>test_errors.lua:<line>: " and contain fragment.
local function check(msg, line, fragment)
  local got = msg:match("^[^\n]-test_errors%.lua:(%d+): ")
  if tonumber(got) ~= line then
    error(string.format("expected the error at test_errors.lua:%d, got: %s", line, msg), 2)
  end
  if not msg:find(fragment, 1, true) then
    error(string.format("expected '%s' in the error, got: %s", fragment, msg), 2)
  end
end

test("shape mismatch in an operator", function()
  local a, b = lt.ones(2, 3), lt.ones(4, 3)
  local line, msg = here(), fails(function() local _ = a + b end)
  check(msg, line, "not broadcastable")
  check(msg, line, "[2,3]")
end)

test("shape mismatch in a method and a module function", function()
  local a, b = lt.ones(2, 3), lt.ones(4, 3)
  local line, msg = here(), fails(function() local _ = a:mul(b) end)
  check(msg, line, "not broadcastable")
  line, msg = here(), fails(function() local _ = lt.matmul(a, b) end)
  check(msg, line, "matmul")
end)

test("dtype mismatch", function()
  local a, b = lt.ones(3), lt.ones(3, {dtype = "f64"})
  local line, msg = here(), fails(function() local _ = a - b end)
  check(msg, line, "f32")
  check(msg, line, "f64")
end)

test("index out of range", function()
  local t = lt.zeros(3, 4)
  local line, msg = here(), fails(function() local _ = t[3] end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() local _ = t[-4] end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() local _ = t[{0, 4}] end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() local _ = t[{0, 0, 0}] end)
  check(msg, line, "too many indices")
  line, msg = here(), fails(function() t[7] = 1 end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() t[{1, 9}] = 1 end)
  check(msg, line, "out of range")
  local v = lt.zeros(5)
  line, msg = here(), fails(function() v[5] = 1 end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() local _ = t[{{0, 2, 0}}] end)
  check(msg, line, "step must be positive")
  line, msg = here(), fails(function() local _ = t[{"a"}] end)
  check(msg, line, "entry 1")
  line, msg = here(), fails(function() local _ = t[0.5] end)
  check(msg, line, "must be an integer")
end)

test("freed tensor", function()
  local t = lt.ones(4)
  local view = t[{{1, 3}}]
  t:free()
  T.assert_equal(t:is_freed(), true)
  local line, msg = here(), fails(function() local _ = t + 1 end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() local _ = t:sum() end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() local _ = t:tolist() end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() local _ = t:clone() end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() local _ = t[0] end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() t[0] = 3 end)
  check(msg, line, "tensor was freed")
  line, msg = here(), fails(function() local _ = t:item() end)
  check(msg, line, "tensor was freed")
  -- the view keeps its storage
  T.assert_close(view, {1, 1})
  T.assert_equal(tostring(t), "tensor(<freed>, shape=[4], dtype=f32)")
end)

test("views and reshapes", function()
  local t = lt.zeros(4, 6):t()
  local line, msg = here(), fails(function() local _ = t:view(24) end)
  check(msg, line, "use reshape")
  line, msg = here(), fails(function() local _ = t:reshape(5, 5) end)
  check(msg, line, "invalid for input")
  line, msg = here(), fails(function() local _ = t:transpose(0, 2) end)
  check(msg, line, "out of range")
  line, msg = here(), fails(function() local _ = t:size(2) end)
  check(msg, line, "dim 2 out of range")
  line, msg = here(), fails(function() local _ = t:view("a") end)
  check(msg, line, "")
  line, msg = here(), fails(function() local _ = t:expand(3, 3) end)
  check(msg, line, "expand")
  line, msg = here(), fails(function() local _ = #lt.tensor(3) end)
  check(msg, line, "0-d")
end)

test("bad arguments", function()
  local t = lt.ones(2)
  local line, msg = here(), fails(function() local _ = t:foo() end)
  check(msg, line, "no method or property 'foo'")
  line, msg = here(), fails(function() local _ = t + {} end)
  check(msg, line, "expected tensors or numbers")
  line, msg = here(), fails(function() local _ = t:add(t, 5) end)
  check(msg, line, "out must be a tensor")
  line, msg = here(), fails(function() local _ = lt.zeros(2, "f33") end)
  check(msg, line, "unknown dtype 'f33'")
  line, msg = here(), fails(function() local _ = lt.zeros(2, {device = "tpu"}) end)
  check(msg, line, "device")
  line, msg = here(), fails(function() local _ = lt.tensor({{1, 2}, {3}}) end)
  check(msg, line, "ragged")
  line, msg = here(), fails(function() local _ = lt.tensor({{1, 2}, {3, "x"}}) end)
  check(msg, line, "[2][2]")
  line, msg = here(), fails(function() local _ = lt.zeros(-1) end)
  check(msg, line, "negative")
  line, msg = here(), fails(function() t.shape = 3 end)
  check(msg, line, "cannot set 'shape'")
  line, msg = here(), fails(function() local _ = lt.cat({lt.ones(2), lt.ones(2, 2)}) end)
  check(msg, line, "cat: tensor 2")
  line, msg = here(), fails(function() local _ = lt.manual_seed(-1) end)
  check(msg, line, "manual_seed")
end)

test("out of the wrong shape", function()
  local a, out = lt.ones(2, 3), lt.empty(3, 2)
  local line, msg = here(), fails(function() local _ = a:exp(out) end)
  check(msg, line, "out is [3,2]")
end)

test("errors from nested user functions point at the innermost user line", function()
  local function user_helper(x)
    local y = x:view(7) -- fails here (a `return x:view(7)` tail call would leave no frame for this line)
    return y
  end
  local line = here() - 3
  local msg = fails(function() local _ = user_helper(lt.ones(4)) end)
  check(msg, line, "invalid for input")
end)

test("errors inside tidy keep their position", function()
  local line, msg = here(), fails(function() local _ = lt.tidy(function() return lt.ones(2) + lt.ones(3) end) end)
  check(msg, line, "not broadcastable")
end)

test("errors carry a traceback through the user's frames", function()
  local function inner() return lt.ones(2) + lt.ones(3) end
  local ok, tb = xpcall(inner, debug.traceback)
  T.assert_equal(ok, false)
  if not tb:find("test_errors.lua", 1, true) or not tb:find("stack traceback", 1, true) then
    error("no traceback: " .. tb)
  end
end)

test("wrong argument types are reported at the user's line, not inside the FFI", function()
  local t = lt.ones(2, 3)
  local line, msg = here(), fails(function() local _ = lt.exp("x") end)
  check(msg, line, "exp: expected a tensor, got string")
  line, msg = here(), fails(function() local _ = lt.sum({1, 2}) end)
  check(msg, line, "sum: expected a tensor, got table")
  line, msg = here(), fails(function() local _ = lt.matmul(t, 3) end)
  check(msg, line, "matmul: b must be a tensor")
  line, msg = here(), fails(function() local _ = t:transpose("a", 1) end)
  check(msg, line, "transpose: dim0 must be an integer")
  line, msg = here(), fails(function() local _ = t:narrow(0, 0.5, 1) end)
  check(msg, line, "narrow: start must be an integer")
  line, msg = here(), fails(function() local _ = t:softmax("last") end)
  check(msg, line, "softmax: dim must be an integer")
  line, msg = here(), fails(function() local _ = t:expand_as({2, 3}) end)
  check(msg, line, "expand_as: other must be a tensor")
  line, msg = here(), fails(function() local _ = t:clamp("a") end)
  check(msg, line, "clamp: min must be a number, a tensor or nil")
  line, msg = here(), fails(function() local _ = lt.F.layer_norm(t, "w") end)
  check(msg, line, "layer_norm: weight must be a tensor or nil")
  line, msg = here(), fails(function() local _ = lt.linspace(0, 1, 2.5) end)
  check(msg, line, "linspace: steps must be an integer")
end)

test("cuda without a usable device is a clear error", function()
  -- ctest hides any GPU (CUDA_VISIBLE_DEVICES=), so this runs on every machine
  assert(lt.cuda.device_count() == 0, "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)")
  local line, msg = here(), fails(function() local _ = lt.zeros(2, {device = "cuda"}) end)
  check(msg, line, "cuda:0 is not available")
  line, msg = here(), fails(function() local _ = lt.ones(2):cuda() end)
  check(msg, line, "cuda:0 is not available")
  line, msg = here(), fails(function() local _ = lt.ones(2):to("cuda:1", "f64") end)
  check(msg, line, "cuda:1 is not available")
end)
