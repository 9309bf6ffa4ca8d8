-- lutra.nn.Module: registration and declaration order, names, traversal, state dicts
-- (round trip, strict errors), freeze, train/eval, apply, to(), the printed tree.
local lt = require "lutra"
local nn = require "lutra.nn"
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error

local function names_of(m)
  local list = {}
  for name in m:named_parameters() do list[#list + 1] = name end
  return list
end

local function same(a, b) return rawequal(a, b) or a == b end

-- A module with its own parameters declared around its submodules.
local Net = nn.Module:extend("Net")
function Net:init(d)
  self.scale = lt.parameter(lt.ones(d))
  self.fc1 = nn.Linear(d, 2 * d)
  self.layers = {nn.Linear(2 * d, 2 * d), nn.LayerNorm(2 * d)}
  self:param("offset", lt.zeros(d))
  self.fc2 = nn.Linear(2 * d, d, {bias = false})
  self:buffer("count", lt.zeros(1, "i64"))
  self:buffer("scratch", lt.zeros(2), false)
  self.d = d
end
function Net:forward(x)
  x = self.fc1(x * self.scale)
  for _, layer in ipairs(self.layers) do x = layer(x) end
  return self.fc2(x) + self.offset
end

test("parameters: own first in declaration order, then submodules, dotted 0-based names", function()
  local m = Net(4)
  equal(names_of(m), {"scale", "offset", "fc1.weight", "fc1.bias", "layers.0.weight", "layers.0.bias",
                      "layers.1.weight", "layers.1.bias", "fc2.weight"})
  local ps = m:parameters()
  equal(#ps, 9)
  assert(same(ps[3], m.fc1.weight) and same(ps[9], m.fc2.weight))
  equal(m.fc1.weight.shape, {8, 4})
  equal(m.layers[1].weight.shape, {8, 8}) -- Lua indexing is 1-based: layers[1] is "layers.0"
  equal(#m.layers, 2)
  equal(m:num_parameters(), 4 + 4 + 8 * 4 + 8 + 8 * 8 + 8 + 8 + 8 + 4 * 8)
  -- buffers are not parameters; non-persistent ones are not state
  local bn = {}
  for name, b in m:named_buffers() do bn[#bn + 1] = name .. ":" .. b.dtype end
  equal(bn, {"count:i64", "scratch:f32"})
  local sd = m:state_dict()
  assert(sd.count ~= nil and sd.scratch == nil and sd["layers.1.bias"] ~= nil)
  equal(nn.state_names(m), {"scale", "offset", "fc1.weight", "fc1.bias", "layers.0.weight", "layers.0.bias",
                            "layers.1.weight", "layers.1.bias", "fc2.weight", "count"})
  -- plain fields stay plain
  equal(m.d, 4)
  local y = m(lt.randn(3, 4))
  equal(y.shape, {3, 4})
end)

test("modules, named_modules, children, apply order, train/eval", function()
  local m = Net(2)
  local names = {}
  for name, mod in m:named_modules() do names[#names + 1] = name .. "=" .. mod.__name end
  equal(names, {"=Net", "fc1=Linear", "layers=ModuleList", "layers.0=Linear", "layers.1=LayerNorm", "fc2=Linear"})
  equal(#m:modules(), 6)
  local kids = {}
  for name in m:children() do kids[#kids + 1] = name end
  equal(kids, {"fc1", "layers", "fc2"})
  local order = {}
  m:apply(function(mod) order[#order + 1] = mod.__name end)
  equal(order, {"Linear", "LayerNorm", "Linear", "ModuleList", "Linear", "Net"})
  equal(m.training, true)
  m:eval()
  for _, mod in ipairs(m:modules()) do equal(mod.training, false) end
  m:train()
  for _, mod in ipairs(m:modules()) do equal(mod.training, true) end
  m.layers:train(false)
  equal({m.training, m.layers.training, m.layers[2].training, m.fc1.training}, {true, false, false, true})
end)

test("tied and shared: one tensor listed once, every name in the state", function()
  local m = nn.Module()
  m.a = nn.Linear(3, 5)
  m.b = nn.Linear(3, 5)
  m.b.weight = m.a.weight -- tie
  local shared = nn.Linear(2, 2)
  m.blocks = {shared, shared, nn.Linear(2, 2)}
  equal(names_of(m), {"a.weight", "a.bias", "b.bias", "blocks.0.weight", "blocks.0.bias", "blocks.2.weight",
                      "blocks.2.bias"})
  equal(m:num_parameters(), 15 + 5 + 5 + 6 + 6)
  local sd = m:state_dict()
  assert(same(sd["b.weight"], sd["a.weight"]) and same(sd["blocks.1.weight"], shared.weight))
  equal(#m:modules(), 6) -- root, a, b, blocks, shared, blocks.2
  local s = tostring(m)
  assert(s:find("weight tied to a.weight", 1, true), s)
  assert(s:find("1: Linear(2, 2, bias=true) (the module at blocks.0)", 1, true), s)
end)

test("state_dict round trip into a fresh module", function()
  lt.manual_seed(1)
  local a = Net(4)
  lt.manual_seed(2)
  local b = Net(4)
  local x = lt.randn(2, 4)
  local ya = a(x)
  assert((ya - b(x)):abs():max():item() > 1e-3)
  lt.no_grad(function() a.count:fill_(7) end)
  local r = b:load_state_dict(a:state_dict())
  equal(r, {missing_keys = {}, unexpected_keys = {}})
  close(b(x), ya, {rtol = 0, atol = 0})
  equal(b.count:item(), 7)
  -- values were copied, not shared
  assert(not same(b.fc1.weight, a.fc1.weight))
  lt.no_grad(function() a.fc1.weight:fill_(0) end)
  assert(b.fc1.weight:abs():sum():item() > 0)
  -- dtype converts on load
  local sd = a:state_dict()
  sd["fc2.weight"] = sd["fc2.weight"]:to("f64")
  b:load_state_dict(sd)
  equal(b.fc2.weight.dtype, "f32")
  close(b.fc2.weight, a.fc2.weight, {rtol = 0, atol = 0})
  -- weights from a file (source =): the parameter's dtype unless lossless and allowed, finite
  local before = b.fc2.weight:clone()
  fails("load_state_dict: cannot load into Net from w.ckpt:\n  w.ckpt: tensor 'fc2.weight' is f64, the parameter is "
    .. "f32: converting it would lose precision", function() b:load_state_dict(sd, {source = "w.ckpt"}) end)
  sd["fc2.weight"] = a:state_dict()["fc2.weight"]:to("bf16")
  fails("w.ckpt: tensor 'fc2.weight' is bf16, the parameter is f32: the conversion is lossless but is not made",
    function() b:load_state_dict(sd, {source = "w.ckpt"}) end)
  close(b.fc2.weight, before, {rtol = 0, atol = 0}) -- nothing copied
  b:load_state_dict(sd, {source = "w.ckpt", allow_cast = true})
  close(b.fc2.weight, sd["fc2.weight"]:to("f32"), {rtol = 0, atol = 0})
  sd["fc2.weight"] = lt.full(b.fc2.weight.shape, 0 / 0)
  fails("w.ckpt: tensor 'fc2.weight': " .. b.fc2.weight:numel() .. " of its " .. b.fc2.weight:numel()
    .. " values are not finite", function() b:load_state_dict(sd, {source = "w.ckpt"}) end)
  b:load_state_dict(sd, {source = "w.ckpt", allow_nonfinite = true})
end)

test("load_state_dict: strict errors name every problem; nothing is copied", function()
  local a, b = Net(4), Net(4)
  local before = b.fc1.weight:clone()
  local sd = a:state_dict()
  sd["fc1.weight"] = nil
  sd["layers.1.bias"] = nil
  sd["fc3.weight"] = lt.zeros(2)
  local err = fails("missing keys: fc1.weight, layers.1.bias", function() b:load_state_dict(sd) end)
  assert(err:find("unexpected keys: fc3.weight", 1, true), err)
  assert(err:find("cannot load into Net", 1, true), err)
  close(b.fc1.weight, before, {rtol = 0, atol = 0})
  -- not strict: missing and unexpected are reported, the rest loads
  local r = b:load_state_dict(sd, {strict = false})
  equal(r, {missing_keys = {"fc1.weight", "layers.1.bias"}, unexpected_keys = {"fc3.weight"}})
  close(b.fc2.weight, a.fc2.weight, {rtol = 0, atol = 0})
  close(b.fc1.weight, before, {rtol = 0, atol = 0})
  -- a shape mismatch names the key and both shapes, strict or not
  sd = a:state_dict()
  sd["fc1.weight"] = lt.zeros(4, 8)
  fails("shape mismatch for 'fc1.weight': the state dict has [4, 8], the model [8, 4]",
    function() b:load_state_dict(sd, {strict = false}) end)
  sd["fc1.weight"] = 3
  fails("'fc1.weight' is a number, not a tensor", function() b:load_state_dict(sd) end)
  fails("expected a table", function() b:load_state_dict("x") end)
end)

test("parameters require grad; freeze and unfreeze, all or by pattern", function()
  local m = Net(2)
  for _, p in ipairs(m:parameters()) do assert(p.requires_grad) end
  assert(not m.count.requires_grad)
  m:freeze()
  for _, p in ipairs(m:parameters()) do assert(not p.requires_grad) end
  equal(m:num_parameters{trainable = true}, 0)
  m:unfreeze("^layers%.")
  local on = {}
  for name, p in m:named_parameters() do
    if p.requires_grad then on[#on + 1] = name end
  end
  equal(on, {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"})
  equal(m:num_parameters{trainable = true}, 16 + 4 + 4 + 4)
  m:unfreeze()
  equal(m:num_parameters{trainable = true}, m:num_parameters())
  fails("the pattern must be a string", function() m:freeze(3) end)
end)

test("zero_grad drops every gradient", function()
  local m = Net(3)
  local loss = m(lt.randn(2, 3)):sum()
  loss:backward()
  for _, p in ipairs(m:parameters()) do assert(p.grad ~= nil) end
  m:zero_grad()
  for _, p in ipairs(m:parameters()) do assert(p.grad == nil) end
end)

test("to(dtype) converts floating tensors in place, keeps ties and flags", function()
  local m = nn.Module()
  m.a = nn.Linear(3, 4)
  m.b = nn.Linear(3, 4, {bias = false})
  m.b.weight = m.a.weight
  m:buffer("ids", lt.tensor({1, 2}, "i64"))
  m.a.bias:requires_grad_(false)
  local w = m.a.weight:tolist()
  equal(m:to("f64"), m)
  equal({m.a.weight.dtype, m.a.bias.dtype, m.ids.dtype}, {"f64", "f64", "i64"})
  assert(same(m.a.weight, m.b.weight))
  assert(m.a.weight.requires_grad and m.a.weight.is_leaf and not m.a.bias.requires_grad)
  close(m.a.weight, w, {rtol = 1e-7, atol = 0})
  m:to{dtype = "f32", device = "cpu"}
  equal(m.a.weight.dtype, "f32")
  equal(m.a.weight.device, "cpu")
end)

test("the printed tree: parameter counts, collapsed runs, own parameters", function()
  local m = Net(4)
  m.stack = {nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.LayerNorm(4)}
  local s = tostring(m)
  local lines = {}
  for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
  equal(lines[1], "Net  " .. require("lutra.nn.summary").thousands(m:num_parameters()) .. " parameters")
  equal(m:num_parameters(), 8 + 40 + 72 + 16 + 32 + 60 + 8)
  equal(lines[2], "  scale: parameter [4]  4")
  equal(lines[3], "  offset: parameter [4]  4")
  equal(lines[4], "  count: buffer [1]")
  equal(lines[6], "  fc1: Linear(4, 8, bias=true)  40")
  equal(lines[7], "  layers: ModuleList  88")
  equal(lines[8], "    0: Linear(8, 8, bias=true)  72")
  equal(lines[9], "    1: LayerNorm(8, eps=1e-05)  16")
  equal(lines[11], "  stack: ModuleList  68")
  equal(lines[12], "    0-2: 3 x Linear(4, 4, bias=true)  20 each")
  equal(lines[13], "    3: LayerNorm(4, eps=1e-05)  8")
  equal(#lines, 13)
  equal(require("lutra.nn.summary").thousands(1234567), "1,234,567")
end)

test("registration errors and explicit declarations", function()
  local m = nn.Module()
  fails("parameter: the tensor must be a floating-point tensor, got i64", function() m.ids = lt.parameter(lt.zeros(2, "i64")) end)
  fails("parameter 'ids' must be a floating-point tensor, got i64", function() m:param("ids", lt.zeros(2, "i64")) end)
  local x = lt.randn(2, {requires_grad = true})
  fails("parameter: the tensor must be a leaf tensor", function() m.y = lt.parameter(x * 2) end)
  fails("parameter 'y' must be a leaf tensor", function() m:param("y", x * 2) end)
  fails("parameter: the tensor must be a tensor, got number", function() lt.parameter(3) end)
  m.w = lt.parameter(lt.zeros(2))
  fails("'w' is a param, cannot assign a module to it", function() m:add("w", nn.Linear(1, 1)) end)
  m:add("lin", nn.Linear(2, 2))
  m:param("p", lt.zeros(3))
  m._private = lt.parameter(lt.zeros(5)) -- "_" names are never registered
  rawset(m, "cache", lt.zeros(5))
  equal(names_of(m), {"w", "p", "lin.weight", "lin.bias"})
  fails("forward is not defined", function() m(1) end)
  fails("ModuleList: element 1 must be a module", function() nn.ModuleList{3} end)
  local list = nn.ModuleList()
  list:append(nn.Linear(1, 1))
  fails("ModuleList:add: the name must be a string (add(name, module) names a child; to add to a ModuleList, "
    .. "use list:append(module))", function() list:add(nn.Linear(1, 1)) end)
  fails("no holes", function() list[3] = nn.Linear(1, 1) end)
  equal(#list, 1)
  fails("unknown option 'biass'", function() nn.Linear(2, 2, {biass = false}) end)
  fails("in_features must be a positive integer, got 0", function() nn.Linear(0, 2) end)
  local loop = nn.Module()
  loop.inner = nn.Module()
  loop.inner.back = loop
  fails("contains itself", function() loop:state_dict() end)
end)

test("parameters are declared: lt.parameter and self:param; other tensors are plain fields", function()
  local p = lt.ones(3)
  equal(lt.parameter(p), p) -- the tensor itself, marked, requiring grad
  assert(rawequal(lt.parameter(p), p) and p.requires_grad and nn.is_parameter(p))
  assert(not nn.is_parameter(lt.ones(3)) and not nn.is_parameter(p:detach()) and not nn.is_parameter(p:view(3)))
  -- a plain tensor given to a field outside init is a plain field: no parameter, no state, not moved
  local m = nn.Module()
  m.w = lt.parameter(lt.zeros(2))
  local plain = lt.ones(4)
  m.plain = plain
  equal(names_of(m), {"w"})
  assert(m:state_dict().plain == nil and not plain.requires_grad)
  m:to("f64")
  equal({m.w.dtype, m.plain.dtype}, {"f64", "f32"})
  assert(rawequal(m.plain, plain))
  -- a converted parameter keeps its mark: given to another field it ties (one tensor, two names)
  assert(nn.is_parameter(m.w))
  m.w2 = m.w
  equal(names_of(m), {"w"})
  equal(nn.state_names(m), {"w", "w2"})
  -- a declared field emptied and given a value again keeps its kind
  m.w2 = nil
  m.w2 = lt.zeros(2)
  equal(nn.state_names(m), {"w", "w2"})
  assert(m.w2.requires_grad and nn.is_parameter(m.w2))
  fails("'w2' is a param, cannot assign a number to it", function() m.w2 = nil; m.w2 = 3 end)
  m:buffer("buf", nil)
  m.buf = lt.zeros(1, "i64") -- a buffer declared empty, filled later: a buffer
  local bn = {}
  for name in m:named_buffers() do bn[#bn + 1] = name end
  equal(bn, {"buf"})
  m.kids = {nn.Linear(1, 1)}
  m.kids = nil
  m.kids = {nn.Linear(1, 1), nn.Linear(1, 1)} -- a list of modules given to an emptied module field: a ModuleList
  equal(m.kids.__name, "ModuleList")
  equal(#m.kids, 2)
end)

test("a tensor set in forward is a plain field: detached copies and losses keeping their gradient", function()
  local Aux = nn.Module:extend("Aux")
  function Aux:init(d)
    self.fc = nn.Linear(d, d)
    self.gain = lt.parameter(lt.full({d}, 2))
  end
  function Aux:forward(x)
    local y = self.fc(x) * self.gain
    self.last = y:detach()
    self.aux = (y * y):mean() -- an auxiliary loss read by the caller, its graph intact
    return y
  end
  local m = Aux(3)
  equal(#m:parameters(), 3)
  local x = lt.randn(4, 3, {dtype = "f64"})
  m:to("f64")
  local y = m(x)
  m(x)
  equal(#m:parameters(), 3) -- forward declared nothing
  equal(nn.state_names(m), {"gain", "fc.weight", "fc.bias"})
  close(m.last, y, {rtol = 0, atol = 0})
  assert(m.aux.requires_grad and not m.aux.is_leaf)
  m.aux:backward()
  -- d mean(y^2) / d gain_j = sum_i 2 y_ij * (x W^T + b)_ij / numel
  local h = (x:matmul(m.fc.weight:t()) + m.fc.bias):detach()
  close(m.gain.grad, (y:detach() * h * 2 / y:numel()):sum(0), {rtol = 1e-12, atol = 0})
end)

test("transition: a plain tensor given to a field in init() says what to write", function()
  local Old = nn.Module:extend("Old")
  function Old:init(d) self.scale = lt.ones(d) end
  local err = fails("Old: field 'scale' is given a tensor in init(); parameters are declared now", function() Old(2) end)
  for _, want in ipairs {"self.scale = lt.parameter(t)", 'self:param("scale", t)', 'self:buffer("scale", t)',
                         'rawset(self, "scale", t)'} do
    assert(err:find(want, 1, true), err)
  end
  -- the same inside a method init calls, and in a subclass's init
  local Helper = nn.Module:extend("Helper")
  function Helper:init() self:reset() end
  function Helper:reset() self.cache = lt.zeros(2) end
  fails("Helper: field 'cache' is given a tensor in init()", function() Helper() end)
  local Sub = nn.Linear:extend("Sub")
  function Sub:init(a, b)
    Sub.super.init(self, a, b)
    self.extra = lt.zeros(b)
  end
  fails("Sub: field 'extra' is given a tensor in init()", function() Sub(2, 3) end)
  -- after init the same assignment is a plain field; replacing a declared parameter ties
  local h = Helper:extend("Quiet")
  function h:init() end
  local q = h()
  q:reset()
  equal(#q:parameters(), 0)
  local a, b = nn.Linear(2, 3), nn.Linear(2, 3)
  b.weight = a.weight
  assert(rawequal(b.weight, a.weight))
end)

test("subclasses of subclasses: super, methods, calling", function()
  local Scaled = nn.Linear:extend("Scaled")
  function Scaled:init(a, b, k)
    Scaled.super.init(self, a, b)
    self.k = k
  end
  function Scaled:forward(x) return Scaled.super.forward(self, x) * self.k end
  local s = Scaled(3, 2, 10)
  local x = lt.randn(4, 3)
  close(s(x), (x:matmul(s.weight:t()) + s.bias) * 10, {rtol = 1e-5, atol = 1e-5})
  equal(names_of(s), {"weight", "bias"})
  equal(tostring(s):match("^[^\n]*"), "Scaled(3, 2, bias=true)  8 parameters")
end)
