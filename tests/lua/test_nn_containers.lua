-- nn.Sequential and nn.ModuleDict: order, indexing, append, iteration, errors; a tree of them nested
-- in each other and in ModuleLists names its parameters, buffers and modules as PyTorch does
-- (tests/py/ref_containers.py builds the same tree in torch; the names are also written out here, so
-- the test checks them without torch too).
local lt = require "lutra"
local nn = lt.nn
local T = require "lutra.testing"
local close, equal, fails = T.assert_close, T.assert_equal, T.assert_error
local EXACT = {rtol = 0, atol = 0}

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]+$") or "tests/lua"
local SCRIPT = here .. "/../py/ref_containers.py"

-- The tree of ref_containers.py.
local Top = nn.Module:extend("Top")
function Top:init()
  self.scale = lt.parameter(lt.ones(4))
  self.body = nn.Sequential(
    nn.Linear(3, 4),
    nn.GELU(),
    nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Identity()),
    nn.ModuleDict{{"b", nn.Linear(4, 2)}, {"a", nn.LayerNorm(4)}},
    nn.ModuleList{nn.Linear(2, 2), nn.Sequential(nn.SiLU(), nn.Linear(2, 2, {bias = false}))})
  self:buffer("count", lt.zeros(1))
  self.heads = nn.ModuleDict{{"policy", nn.Linear(2, 3)}, {"value", nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())}}
  self.heads.value[1]:buffer("steps", lt.zeros(1))
  self.heads:update{{"aux", nn.ReLU()}}
  self.offset = lt.parameter(lt.zeros(2))
end

local function listed(iter, obj)
  local out = {}
  for name in iter(obj) do out[#out + 1] = name == "" and "-" or name end
  return out
end

local function words(s)
  local out = {}
  for w in s:gmatch("%S+") do out[#out + 1] = w end
  return out
end

-- What torch prints for the tree (ref_containers.py, torch 1.13).
local WANT = {
  params = words("scale offset body.0.weight body.0.bias body.2.0.weight body.2.0.bias body.3.b.weight body.3.b.bias "
    .. "body.3.a.weight body.3.a.bias body.4.0.weight body.4.0.bias body.4.1.1.weight heads.policy.weight "
    .. "heads.policy.bias heads.value.0.weight heads.value.0.bias"),
  buffers = words("count heads.value.0.steps"),
  modules = words("- body body.0 body.1 body.2 body.2.0 body.2.1 body.2.2 body.3 body.3.b body.3.a body.4 body.4.0 "
    .. "body.4.1 body.4.1.0 body.4.1.1 heads heads.policy heads.value heads.value.0 heads.value.1 heads.aux"),
  state = words("body.0.bias body.0.weight body.2.0.bias body.2.0.weight body.3.a.bias body.3.a.weight body.3.b.bias "
    .. "body.3.b.weight body.4.0.bias body.4.0.weight body.4.1.1.weight count heads.policy.bias heads.policy.weight "
    .. "heads.value.0.bias heads.value.0.steps heads.value.0.weight offset scale"),
}

local function ours()
  local m = Top()
  local state = {}
  for k in pairs(m:state_dict()) do state[#state + 1] = k end
  table.sort(state)
  return {
    params = listed(m.named_parameters, m), buffers = listed(m.named_buffers, m),
    modules = listed(m.named_modules, m), state = state,
  }, m
end

test("nested Sequential / ModuleDict / ModuleList: PyTorch's names and order", function()
  local got, m = ours()
  for _, k in ipairs {"params", "buffers", "modules", "state"} do equal(got[k], WANT[k], k) end
  equal(#m.body, 5)
  equal(m.heads:len(), 3)
  equal(m.heads:keys(), {"policy", "value", "aux"})
  -- state_names: every parameter in traversal order, then the buffers
  local names = nn.state_names(m)
  equal(#names, #WANT.params + #WANT.buffers)
  equal(names[1], "scale")
  equal(names[#names], "heads.value.0.steps")
end)

test("the same names as torch prints them now", function()
  local py = T.need_python("torch")
  local out = os.tmpname()
  local ok = os.execute(string.format("%s '%s' %s 2>/dev/null", py, SCRIPT, out))
  if ok ~= true and ok ~= 0 then error(SCRIPT .. " failed") end
  local ref = {}
  for line in io.lines(out) do
    local tag, rest = line:match("^(%S+)%s*(.*)$")
    if tag == "len" or tag == "keys" then tag = tag .. " " .. rest:match("^%S+") end
    ref[tag] = rest
  end
  os.remove(out)
  local got, m = ours()
  for _, k in ipairs {"params", "buffers", "modules", "state"} do equal(got[k], words(ref[k]), k) end
  equal(ref["len body"], "body " .. #m.body)
  equal(ref["len heads"], "heads " .. m.heads:len())
  equal(words(ref["keys heads"]), {"heads", "policy", "value", "aux"})
end)

test("Sequential: calls in order, indexing from 1, append, varargs or a list, empty", function()
  lt.manual_seed(3)
  local a, b = nn.Linear(3, 5, {dtype = "f64"}), nn.Linear(5, 2, {dtype = "f64"})
  local seq = nn.Sequential(a, nn.Tanh(), b)
  local x = lt.randn(4, 3, {dtype = "f64"})
  close(seq(x), b(a(x):tanh()), EXACT)
  assert(rawequal(seq[1], a) and rawequal(seq[3], b))
  equal(#seq, 3)
  local n = 0
  for i, mod in ipairs(seq) do
    n = n + 1
    assert(rawequal(mod, seq[i]))
  end
  equal(n, 3)
  equal(seq:append(nn.Sigmoid()), seq)
  equal(#seq, 4)
  close(seq(x), b(a(x):tanh()):sigmoid(), EXACT)
  local names = {}
  for name in seq:named_parameters() do names[#names + 1] = name end
  equal(names, {"0.weight", "0.bias", "2.weight", "2.bias"})
  -- a list, and an empty Sequential (the identity)
  local from_list = nn.Sequential{a, b}
  close(from_list(x), b(a(x)), EXACT)
  assert(rawequal(nn.Sequential()(x), x))
  -- gradients flow through every module
  local loss = seq(x):sum()
  loss:backward()
  assert(a.weight.grad ~= nil and b.bias.grad ~= nil)
  -- a tree line per module
  local s = tostring(nn.Sequential(nn.Linear(2, 2), nn.GELU{approximate = "tanh"}))
  assert(s:find("Sequential", 1, true) and s:find("GELU(approximate=tanh)", 1, true), s)
end)

test("Sequential: errors name the argument", function()
  fails("Sequential: module 2 must be a module, got number", function() nn.Sequential(nn.ReLU(), 3) end)
  fails("Sequential: module 2 must be a module, got nil", function() nn.Sequential(nn.ReLU(), nil, nn.ReLU()) end)
  fails("Sequential: module 1 must be a module, got string", function() nn.Sequential{"x"} end)
  local seq = nn.Sequential(nn.ReLU())
  fails("no holes", function() seq[3] = nn.ReLU() end)
  fails("ModuleList: element 2 must be a module", function() seq:append(4) end)
end)

test("ModuleDict: order, sorted plain tables, access, replace, contains, pop, update", function()
  local d = nn.ModuleDict{{"zeta", nn.Linear(2, 2)}, {"alpha", nn.ReLU()}}
  d.mid = nn.Tanh()
  d:add("last", nn.Identity())
  equal(d:keys(), {"zeta", "alpha", "mid", "last"})
  local seen = {}
  for k, mod in d:items() do seen[#seen + 1] = k .. "=" .. mod.__name end
  equal(seen, {"zeta=Linear", "alpha=ReLU", "mid=Tanh", "last=Identity"})
  equal(#d:values(), 4)
  assert(rawequal(d["alpha"], d.alpha))
  assert(d:contains("mid") and not d:contains("nope") and not d:contains(3))
  -- a plain table key -> module: added in sorted key order
  local s = nn.ModuleDict{c = nn.ReLU(), a = nn.Linear(1, 1), b = nn.Tanh()}
  equal(s:keys(), {"a", "b", "c"})
  -- replacing keeps the position; pop removes
  local new = nn.Linear(2, 2)
  d:add("zeta", new)
  equal(d:keys(), {"zeta", "alpha", "mid", "last"})
  assert(rawequal(d.zeta, new))
  equal(d:pop("alpha").__name, "ReLU")
  equal(d.alpha, nil)
  equal(d:keys(), {"zeta", "mid", "last"})
  equal(d:pop("alpha"), nil)
  equal(d:len(), 3)
  local names = {}
  for name in d:named_parameters() do names[#names + 1] = name end
  equal(names, {"zeta.weight", "zeta.bias"})
  -- update from another ModuleDict keeps its order
  local e = nn.ModuleDict():update(d)
  equal(e:keys(), {"zeta", "mid", "last"})
  -- parent names
  local m = nn.Module()
  m.heads = nn.ModuleDict{{"x", nn.Linear(1, 2)}}
  equal(nn.state_names(m), {"heads.x.weight", "heads.x.bias"})
end)

test("ModuleDict: bad keys and values are refused, naming them", function()
  local d = nn.ModuleDict()
  fails("ModuleDict: key 'items' is the name of a ModuleDict method or field", function() d.items = nn.ReLU() end)
  fails("ModuleDict: key 'train' is the name", function() d:add("train", nn.ReLU()) end)
  fails("ModuleDict: key 'training' is the name", function() nn.ModuleDict{{"training", nn.ReLU()}} end)
  fails("ModuleDict: key 'a.b' is not a valid name", function() d["a.b"] = nn.ReLU() end)
  fails("ModuleDict: key '' is not a valid name", function() d[""] = nn.ReLU() end)
  fails("ModuleDict: key '_x' is not a valid name", function() d._x = nn.ReLU() end)
  fails("ModuleDict: a key must be a string, got number", function() d[1] = nn.ReLU() end)
  fails("ModuleDict: 'w' must be a module, got number", function() d.w = 3 end)
  fails("ModuleDict: entry 2 must be a pair {key, module}", function() nn.ModuleDict{{"a", nn.ReLU()}, {"b"}} end)
  fails("ModuleDict: a list of pairs cannot also have key 'c'",
    function() nn.ModuleDict{{"a", nn.ReLU()}, c = nn.ReLU()} end)
  fails("ModuleDict: expected a table of modules, got a module", function() nn.ModuleDict(nn.ReLU()) end)
  fails("ModuleDict: has no forward", function() d(1) end)
end)

test("activation modules: no parameters, options checked, Identity returns its input", function()
  for _, cls in ipairs {nn.GELU, nn.SiLU, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity} do
    equal(#cls():parameters(), 0)
  end
  fails("GELU: approximate must be \"none\" or \"tanh\", got erf", function() nn.GELU{approximate = "erf"} end)
  fails("unknown option 'approx'", function() nn.GELU{approx = "tanh"} end)
  local x = lt.randn(2, 3)
  assert(rawequal(nn.Identity(5, "ignored")(x), x))
  equal(nn.GELU().approximate, "none")
end)
