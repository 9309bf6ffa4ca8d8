-- lutra.doc: help(x)'s text read from the sources' doc comments (the module head; the comment above a
-- function), and the REPL's help() asking it. Each expected text is the source's own comment, read here
-- independently of lutra.doc.
local lt = require "lutra"
local doc = require "lutra.doc"
local repl = require "lutra.repl"
local T = require "lutra.testing"
local equal = T.assert_equal

local function source(rel)
  local f = assert(io.open("lua/" .. rel, "r"))
  local text = f:read("*a")
  f:close()
  return text
end

local function has(text, piece)
  if not text or not text:find(piece, 1, true) then
    error(("expected %q in:\n%s"):format(piece, tostring(text)), 2)
  end
end

test("a class: nn.Linear (the class, an instance, the name) is its module's head comment", function()
  local head = source("lutra/nn/linear.lua"):match("^%-%- ([^\n]*)")
  equal(head:sub(1, 10), "nn.Linear(")
  local text = doc.find(lt.nn.Linear)
  has(text, head)
  has(text, "lutra/nn/linear.lua")
  equal(doc.find(lt.nn.Linear(2, 3)), text)
  equal(doc.find("nn.Linear"), text)
  equal(doc.find("Linear"), text)
end)

test("a tensor method by identity: t.matmul is the comment above ops.matmul's definition", function()
  local t = lt.zeros(2, 2)
  local lines, n = {}, nil
  for line in source("lutra/ops/matmul.lua"):gmatch("([^\n]*)\n") do
    lines[#lines + 1] = line
    if line:match("^function M%.matmul%(") then n = #lines end
  end
  local text = doc.find(t.matmul)
  has(text, lines[n])
  has(text, lines[n - 1]:gsub("^%-%- ", ""))
  has(text, "lutra/ops/matmul.lua:" .. n)
  equal(doc.find("t:matmul"), text)
end)

test("a name: \"cross_entropy\" finds F.cross_entropy and its usage lines in the module head", function()
  local text = doc.find("cross_entropy")
  has(text, "function M.cross_entropy(logits, targets, opts)")
  has(text, "F.cross_entropy(logits, targets, opts)   -> loss, losses, lse")
  has(text, "ignore_index = -100")
  equal(doc.find(lt.F.cross_entropy), text)
  equal(doc.find("F.cross_entropy"), text)
end)

test("lutra.exp, the checking wrapper of t:exp, shows the method's doc", function()
  local text = doc.find(lt.exp)
  has(text, "lutra.exp(t, ...) is t:exp(...):")
  has(text, "t:exp(out), and neg, log, sqrt")
  equal(doc.find("exp"), text)
end)

test("an object whose class is a field of a module (an optimizer, a loader class) shows that module's head", function()
  local o = lt.optim.AdamW(lt.nn.Linear(2, 2), {})
  has(doc.find(o), "lutra.optim.optimizer — what every optimizer shares")
  has(doc.find(lt.data.Loader), "lutra.data — a corpus tokenized once into a token file")
  has(doc.find(lt.data.Loader), "(lutra.data.Loader, in lutra.data, lutra/data.lua)")
  -- a class held by several modules: the most specific one's head, not its parent class's
  has(doc.find(lt.nn.GELU), "(lutra.nn.activation.GELU, in lutra.nn.activation, lutra/nn/activation.lua)")
  has(doc.find(lt.nn.Identity), "nn.Identity()                   returns its input")
  has(doc.find(lt.nn.ModuleList), "(lutra.nn.module.ModuleList, in lutra.nn.module, lutra/nn/module.lua)")
end)

test("a callable module: lt.train is lutra.train's head comment", function()
  local text = doc.find(lt.train)
  has(text, "lutra.train — the training loop.")
  has(text, "lutra.train{model = model, data = train_loader, config = cfg}")
  equal(doc.find("lutra.train"), text)
end)

test("a function made in a loop takes the comment above the loop; without one, its file's head", function()
  has(doc.find(lt.Tensor.sum), "t:sum(dims, keepdim, out), mean, prod, norm (L2)")
  has(doc.find("t:mean"), "t:sum(dims, keepdim, out), mean, prod, norm (L2)")
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  local f = assert(io.open(dir .. "/doc_probe.lua", "w"))
  f:write("-- doc_probe — a module whose functions have no comments.\nlocal M = {}\n",
          "for _, n in ipairs {\"a\"} do\n  M[n] = function() end\nend\nfunction M.plain() end\nreturn M\n")
  f:close()
  local saved = package.path
  package.path = dir .. "/?.lua;" .. saved
  local ok, probe = pcall(require, "doc_probe")
  package.path = saved
  assert(ok, probe)
  for _, fn in ipairs {probe.a, probe.plain} do
    local text = doc.find(fn)
    has(text, "(no doc comment of its own; its file's head:)\ndoc_probe — a module whose functions have no comments.")
    equal(doc.function_doc(fn).text, nil)
  end
  os.remove(dir .. "/doc_probe.lua")
  os.remove(dir)
  equal(doc.find("no_such_name_anywhere"), nil)
  equal(doc.find(print), nil)
  equal(doc.find({}), nil)
end)

test("help(x) in the REPL prints lutra.doc's text; help() the REPL's commands", function()
  local written = {}
  local stdout = io.stdout
  io.stdout = {write = function(self, ...) for _, s in ipairs {...} do written[#written + 1] = s end end}
  local ok, err = pcall(function()
    repl.help(lt.nn.Linear)
    repl.help("cross_entropy")
    repl.help("no_such_name_anywhere")
  end)
  io.stdout = stdout
  assert(ok, err)
  local out = table.concat(written)
  has(out, doc.find(lt.nn.Linear) .. "\n")
  has(out, doc.find("cross_entropy") .. "\n")
  has(out, "help: no documentation for")
end)
