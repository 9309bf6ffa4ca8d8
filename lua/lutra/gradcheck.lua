-- lutra.gradcheck — lt.gradcheck(fn, inputs, opts): are fn's autograd gradients right? Compares
-- them with central finite differences computed in f64, element by element, and reports the
-- worst element. As torch.autograd.gradcheck, for the gradients of ops written by hand
-- (lt.custom_op, a custom backward).
local ffi = require "ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local fields = require "lutra.tensor.fields"
local autograd = require "lutra.autograd"
local create = require "lutra.create"
local C = require("lutra.ffi").C

local raise, is_tensor = errors.raise, ops.is_tensor

-- Projections from a fixed xorshift64 sequence: the same check on every run and machine.
local function projection(shape, dt, device)
  local state = 88172645463325252ULL
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local vals = {}
  for i = 1, n do
    state = bit.bxor(state, bit.lshift(state, 13))
    state = bit.bxor(state, bit.rshift(state, 7))
    state = bit.bxor(state, bit.lshift(state, 17))
    vals[i] = tonumber(bit.rshift(state, 11)) / 9007199254740992 * 2 - 1
  end
  local r = create.tensor(vals, {dtype = "f64"})
  return r:reshape(#shape > 0 and shape or {}):to(dt):to(device)
end

local function float_outputs(...)
  local res = {...}
  if #res == 1 and type(res[1]) == "table" and not is_tensor(res[1]) then res = res[1] end
  local list = {}
  for _, r in ipairs(res) do
    if is_tensor(r) and dtype.is_float(fields.dtype_id(r)) then list[#list + 1] = r end
  end
  return list
end

local function flat_list(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for q = 1, #v do walk(v[q]) end else out[#out + 1] = v end
  end
  walk(t:double():contiguous():cpu():tolist())
  return out
end

local function index_string(shape, e)
  local idx, r = {}, e
  for d = #shape, 1, -1 do
    idx[d] = r % shape[d]
    r = math.floor(r / shape[d])
  end
  return "[" .. table.concat(idx, ", ") .. "]"
end

-- lt.gradcheck(fn, inputs, opts) -> ok, report. Checks the gradients of fn at inputs (a list; tensors that require grad are checked, other
-- values passed as they are). fn returns a tensor, several, or one list of them; the
-- gradient checked is that of sum_k <out_k, r_k> for fixed random r_k. Floating inputs that
-- are not f64 are checked through f64 copies (opts.cast = false keeps them), so the finite
-- differences are not lost to rounding: fn must then work in f64 too. Options: eps (1e-6),
-- atol (1e-5), rtol (1e-3): element e passes when |analytic - numeric| <= atol + rtol *
-- |numeric|; raise (true): raise on a failure, naming the worst element, else return false and
-- the report. Returns true, report; report = {checked =, worst = {input =, index =, analytic =,
-- numeric =, excess =}, text =}. An input that requires grad but gets no gradient counts as 0.
return function(fn, inputs, opts)
  opts = opts or {}
  if type(inputs) ~= "table" or is_tensor(inputs) then raise("gradcheck: inputs must be a list of arguments") end
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  local prefix = opts.msg and (opts.msg .. ": ") or ""
  local args, checked = {}, {}
  for i = 1, table.maxn(inputs) do
    local x = inputs[i]
    if is_tensor(x) and x.requires_grad then
      if opts.cast ~= false and x.dtype ~= "f64" then x = x:detach():double():requires_grad_() end
      checked[#checked + 1] = i
    end
    args[i] = x
  end
  if #checked == 0 then raise(prefix .. "gradcheck: no input requires grad") end
  local n_args = table.maxn(inputs)
  local outs = float_outputs(fn(unpack(args, 1, n_args)))
  if #outs == 0 then raise(prefix .. "gradcheck: fn returned no floating point tensor") end
  local proj, diff_outs, diff_proj = {}, {}, {}
  for k, o in ipairs(outs) do
    proj[k] = projection(o.shape, o.dtype, o.device)
    if o.requires_grad then diff_outs[#diff_outs + 1], diff_proj[#diff_proj + 1] = o, proj[k] end
  end
  local wrt = {}
  for j, i in ipairs(checked) do wrt[j] = args[i] end
  local analytic = {}
  if #diff_outs > 0 then analytic = autograd.grad(diff_outs, wrt, diff_proj, {allow_unused = true}) end
  local function value()
    local total = 0
    local o = float_outputs(fn(unpack(args, 1, n_args)))
    for k = 1, #o do total = total + (o[k]:double() * proj[k]:double()):sum():item() end
    return total
  end
  local idx, cur = ffi.new("int64_t[8]"), ffi.new("double[1]")
  local worst, count = nil, 0
  autograd.no_grad(function()
    for j, i in ipairs(checked) do
      local x = args[i]
      local a = analytic[j] and flat_list(analytic[j]) or nil
      local shape = x.shape
      for e = 0, x:numel() - 1 do
        local r = e
        for d = #shape, 1, -1 do
          idx[d - 1] = r % shape[d]
          r = math.floor(r / shape[d])
        end
        if C.lt_get_at(x, idx, cur) ~= 0 then errors.fail() end
        local x0 = cur[0]
        C.lt_set_at(x, idx, x0 + eps)
        local fp = value()
        C.lt_set_at(x, idx, x0 - eps)
        local fm = value()
        C.lt_set_at(x, idx, x0)
        local numeric = (fp - fm) / (2 * eps)
        local got = a and a[e + 1] or 0
        local diff, allowed = math.abs(got - numeric), atol + rtol * math.abs(numeric)
        local excess = diff ~= diff and math.huge or diff / allowed
        count = count + 1
        if not worst or excess > worst.excess then
          worst = {input = i, element = e, index = index_string(shape, e), analytic = got, numeric = numeric,
                   excess = excess}
        end
      end
    end
  end)
  local ok = worst.excess <= 1
  local text = string.format("%sgradcheck: input %d element %d %s: analytic %.10g, numeric %.10g (|diff| %.3g is %.3g "
    .. "times the allowed atol %g + rtol %g * |numeric|; worst of %d elements)", prefix, worst.input, worst.element,
    worst.index, worst.analytic, worst.numeric, math.abs(worst.analytic - worst.numeric), worst.excess, atol, rtol, count)
  local report = {checked = count, worst = worst, text = text}
  if not ok and opts.raise ~= false then raise(text) end
  return ok, report
end
