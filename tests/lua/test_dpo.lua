-- lutra.dpo: pair encoding (which tokens count), sequence log-probs against a naive sum,
-- the three losses with label smoothing against PyTorch (tests/py/ref_dpo.py: from
-- log-probs, and from a tiny model's logits through log_softmax), a finite-difference check
-- of the whole loss through a tiny f64 model (full and LoRA), and the reference that
-- provably does not change: its weights bitwise equal after training steps, for a frozen
-- copy and for the LoRA-disabled base.
local lt = require "lutra"
local dpo = require "lutra.dpo"
local lora = require "lutra.lora"
local models = require "lutra.models"
local optim = require "lutra.optim"
local json = require "lutra.json"
local T = require "lutra.testing"
local close, equal, assert_error = T.assert_close, T.assert_equal, T.assert_error

local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/[^/]*$")) or "."

local TEXT = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,!?'<|>_\n0123456789"
local tok = lt.tokenizer.char(TEXT)

local RECORDS = {
  {prompt = "Say hi.", chosen = "Hi there!", rejected = "No."},
  {prompt = "Count to 3.", chosen = "1 2 3", rejected = "3 2 1 0 blah"},
  {prompt = "Capital of France?", chosen = "Paris.", rejected = "London, obviously."},
  {prompt = "Add 2 and 2.", chosen = "4", rejected = "22"},
}

local function tiny(dtype, arch)
  return models.build{arch = arch or "gpt2", n_layer = 1, n_head = 2, d_model = 8, vocab_size = tok.vocab_size,
                      block_size = 48, dtype = dtype}
end

local function encoded(opts)
  local list = {}
  for i, r in ipairs(RECORDS) do
    list[i] = dpo.encode_pair(tok, r, opts)
    list[i].index = i
  end
  return list
end

local function params_snapshot(model)
  local s = {}
  for name, p in model:named_parameters() do s[name] = p:clone() end
  return s
end

local function assert_bitwise(model, snap, what)
  for name, p in model:named_parameters() do
    if snap[name] then
      local ok = lt.no_grad(function() return (p:ne(snap[name])):to("i64"):sum():item() end)
      equal(ok, 0, what .. ": " .. name .. " changed")
    end
  end
end

test("pairs: plain concatenation; the mask covers the response exactly; collate shifts it", function()
  local p = dpo.encode_pair(tok, RECORDS[1])
  equal(#p.chosen, #"Say hi." + #"Hi there!")
  equal(tok:decode(p.chosen), "Say hi.Hi there!")
  local n = 0
  for i, m in ipairs(p.chosen_mask) do
    equal(m, i > #"Say hi." and 1 or 0)
    n = n + m
  end
  equal(n, #"Hi there!")
  local list = encoded()
  local b = dpo.collate(list, {2, 4})
  equal(b.B, 2)
  equal(b.x.shape, {4, b.T})
  -- row 1 (chosen of pair 4): targets are the response's characters at the shifted places
  local y = b.y:tolist()
  local want = {}
  local ids = list[4].chosen
  for t = 1, b.T do want[t] = (list[4].chosen_mask[t + 1] == 1) and ids[t + 1] or -100 end
  equal(y[2], want)
  equal(b.n_tokens, #"1 2 3" + #"4" + #"3 2 1 0 blah" + #"22")
  -- truncation drops the prompt's start first, and the response is never empty
  local tp = dpo.encode_pair(tok, RECORDS[3], {max_len = 10})
  equal(tok:decode(tp.chosen), "nce?Paris.")
  assert(tp.truncated)
  assert_error("has no 'rejected'", function() dpo.encode_pair(tok, {prompt = "a", chosen = "b"}) end)
end)

test("pairs with a chat template: only the final assistant turn counts", function()
  local templates = require "lutra.sft.templates"
  local t = templates.get("chatml")
  local rec = {prompt = {{role = "user", content = "Hi"}, {role = "assistant", content = "Yo"},
                         {role = "user", content = "Bye"}}, chosen = "Ciao", rejected = "no"}
  local p = dpo.encode_pair(tok, rec, {template = t})
  local text, span = {}, {}
  for i, id in ipairs(p.chosen) do
    text[#text + 1] = tok:decode({id})
    if p.chosen_mask[i] == 1 then span[#span + 1] = tok:decode({id}) end
  end
  equal(table.concat(span), "Ciao<|im_end|>")
  assert(table.concat(text):find("<|im_start|>assistant\nYo<|im_end|>", 1, true))
end)

test("sequence log-probs are the sums of log_softmax over the response tokens", function()
  local model = tiny("f64")
  local list = encoded()
  local b = dpo.collate(list, {1, 2, 3})
  local pc, pr = lt.no_grad(function() return dpo.sequence_logps(model, b) end)
  local logits = lt.no_grad(function() return model(b.x) end)
  local lp = logits:log_softmax(-1):tolist()
  local y = b.y:tolist()
  local got = {}
  for _, v in ipairs(pc:tolist()) do got[#got + 1] = v end
  for _, v in ipairs(pr:tolist()) do got[#got + 1] = v end
  for r = 1, 6 do
    local s = 0
    for t = 1, b.T do
      if y[r][t] ~= -100 then s = s + lp[r][t][y[r][t] + 1] end
    end
    close(got[r], s, {rtol = 1e-12, atol = 1e-12})
  end
end)

local CONFIGS = {{loss = "sigmoid", eps = 0}, {loss = "sigmoid", eps = 0.1}, {loss = "sigmoid", eps = 0.3},
                 {loss = "ipo", eps = 0}, {loss = "hinge", eps = 0}}

test("losses and gradients against PyTorch: sigmoid (label smoothing 0, 0.1, 0.3), ipo, hinge", function()
  local PYTHON = T.need_python("torch")
  local B = 5
  local cases, mine = {}, {}
  -- from log-probs, spread so that hinge has both sides of its kink
  for _, c in ipairs(CONFIGS) do
    for _, beta in ipairs {0.1, 0.5} do
      local pc = lt.randn(B, {dtype = "f64"}) * 3 - 10
      local pr = lt.randn(B, {dtype = "f64"}) * 3 - 10
      local rc = lt.randn(B, {dtype = "f64"}) * 3 - 10
      local rr = lt.randn(B, {dtype = "f64"}) * 3 - 10
      pc.requires_grad, pr.requires_grad = true, true
      local loss, m = dpo.loss(pc, pr, rc, rr, {beta = beta, loss = c.loss, label_smoothing = c.eps})
      loss:backward()
      cases[#cases + 1] = {kind = "logps", pc = pc:tolist(), pr = pr:tolist(), rc = rc:tolist(), rr = rr:tolist(),
                           beta = beta, loss = c.loss, eps = c.eps}
      mine[#mine + 1] = {loss = loss:item(), grad_pc = pc.grad:tolist(), grad_pr = pr.grad:tolist(), m = m}
    end
  end
  -- from a tiny model's logits (f64): log_softmax, the masked sums, the loss, d/dlogits
  local model = tiny("f64")
  local list = encoded()
  local b = dpo.collate(list, {1, 2, 3, 4})
  for _, c in ipairs(CONFIGS) do
    local logits = lt.no_grad(function() return model(b.x) end):detach()
    logits.requires_grad = true
    local lp = dpo.logps_of_logits(logits, b.y)
    local pc, pr = lp:narrow(0, 0, 4), lp:narrow(0, 4, 4)
    local rc = lt.randn(4, {dtype = "f64"}) - 40
    local rr = lt.randn(4, {dtype = "f64"}) - 40
    local loss = dpo.loss(pc, pr, rc, rr, {beta = 0.2, loss = c.loss, label_smoothing = c.eps})
    loss:backward()
    local n, tn, v = logits:size(0), logits:size(1), logits:size(2)
    cases[#cases + 1] = {kind = "logits", logits = logits:detach():reshape(-1):tolist(), shape = {n, tn, v},
                         y = b.y:tolist(), rc = rc:tolist(), rr = rr:tolist(), beta = 0.2, loss = c.loss, eps = c.eps}
    mine[#mine + 1] = {loss = loss:item(), grad_logits = logits.grad:reshape(-1):tolist(), pc = pc:detach():tolist(),
                       pr = pr:detach():tolist()}
  end
  local dir = os.tmpname()
  json.write_file(dir .. ".in.json", cases)
  local cmd = string.format("%s %s/tests/py/ref_dpo.py %s.in.json %s.out.json", PYTHON, root, dir, dir)
  local r = os.execute(cmd)
  assert(r == 0 or r == true, "ref_dpo.py failed: " .. cmd)
  local ref = json.read_file(dir .. ".out.json")
  os.remove(dir .. ".in.json")
  os.remove(dir .. ".out.json")
  os.remove(dir)
  equal(#ref, #mine)
  local tol = {rtol = 1e-10, atol = 1e-12}
  for i, want in ipairs(ref) do
    local got = mine[i]
    close(got.loss, want.loss, tol)
    for _, k in ipairs {"grad_pc", "grad_pr", "grad_logits", "pc", "pr"} do
      if want[k] then close(got[k], want[k], tol) end
    end
  end
end)

-- the DPO loss of a model on a batch, as a number (no autograd), for finite differences
local function loss_number(model, b, ref, opts)
  return lt.no_grad(function() return (dpo.step(model, b, ref, opts)):item() end)
end

test("the whole loss through a tiny f64 model: autograd against central differences", function()
  local list = encoded()
  local b = dpo.collate(list, {1, 2, 3, 4})
  for _, c in ipairs(CONFIGS) do
    for _, mode in ipairs {"full", "lora"} do
      local model = tiny("f64", mode == "lora" and "llama" or "gpt2")
      local ref
      if mode == "lora" then
        lora.apply(model, {r = 2, alpha = 4})
        ref = dpo.reference.lora(model)
      else
        ref = dpo.reference.copy(model)
      end
      -- move the policy off the reference (h != 0), so every loss has a nonzero gradient
      lt.no_grad(function()
        for _, p in ipairs(model:parameters()) do
          if p.requires_grad then p:add_(lt.randn_like(p) * 0.3) end
        end
      end)
      local opts = {beta = 0.5, loss = c.loss, label_smoothing = c.eps}
      model:zero_grad()
      local loss = dpo.step(model, b, ref, opts)
      loss:backward()
      local checked = 0
      for name, p in model:named_parameters() do
        if p.requires_grad then
          local flat, g = p:view(-1), p.grad:view(-1)
          for _ = 1, 2 do
            local k = T.randint(0, p:numel())
            local x0 = flat[k]:item()
            local h = 1e-6
            lt.no_grad(function() flat[k] = x0 + h end)
            local lp = loss_number(model, b, ref, opts)
            lt.no_grad(function() flat[k] = x0 - h end)
            local lm = loss_number(model, b, ref, opts)
            lt.no_grad(function() flat[k] = x0 end)
            local fd = (lp - lm) / (2 * h)
            close(g[k]:item(), fd, {rtol = 1e-5, atol = 1e-8})
            checked = checked + 1
          end
        end
        _ = name
      end
      assert(checked >= 8)
    end
  end
end)

test("the reference does not change: frozen copy and LoRA-disabled base, bitwise, after training", function()
  local list = encoded()
  local b = dpo.collate(list, {1, 2, 3, 4})
  -- (a) full fine-tuning against a frozen deep copy
  local model = tiny("f32")
  local ref = dpo.reference.copy(model)
  local snap = params_snapshot(ref.model)
  local rc0, rr0 = ref:logps(b)
  local opt = optim.AdamW(model, {lr = 1e-2})
  local first, last
  for _ = 1, 5 do
    opt:zero_grad()
    local loss, m = dpo.step(model, b, ref, {beta = 0.5})
    loss:backward()
    opt:step()
    first, last = first or m, m
  end
  assert_bitwise(ref.model, snap, "frozen copy")
  for _, p in ipairs(ref.model:parameters()) do equal(p.grad, nil) end
  local rc1, rr1 = ref:logps(b)
  equal((rc1:ne(rc0)):to("i64"):sum():item() + (rr1:ne(rr0)):to("i64"):sum():item(), 0)
  -- the policy did move, and the loss fell
  local moved = false
  for name, p in model:named_parameters() do
    if (p - snap[name]):abs():max():item() > 0 then moved = true end
  end
  assert(moved)
  local after = dpo.step(model, b, ref, {beta = 0.5})
  assert(after:item() < first.loss, string.format("loss %g -> %g", first.loss, after:item()))
  -- tied weights stay tied in the copy (gpt2 ties lm_head to wte)
  assert(rawequal(ref.model.lm_head.weight, ref.model.wte.weight))

  -- (b) LoRA: the reference is the same model with the adapters off; the base is bitwise unchanged
  local lm = tiny("f32", "llama")
  lora.apply(lm, {r = 4, alpha = 8})
  local lref = dpo.reference.lora(lm)
  local base = {}
  for name, p in lm:named_parameters() do
    if not name:find("lora_") then base[name] = p:clone() end
  end
  local c0, r0 = lref:logps(b)
  local pre = dpo.precompute(lref, list, {batch = 3})
  local lopt = optim.AdamW(lora.param_groups(lm), {lr = 1e-2})
  for _ = 1, 5 do
    lopt:zero_grad()
    local loss = dpo.step(lm, b, lref, {beta = 0.5, loss = "ipo"})
    loss:backward()
    lopt:step()
  end
  assert_bitwise(lm, base, "LoRA base")
  local c1, r1 = lref:logps(b)
  equal((c1:ne(c0)):to("i64"):sum():item() + (r1:ne(r0)):to("i64"):sum():item(), 0)
  -- precomputed log-probs give what the live reference gives
  local pref = dpo.reference.precomputed(pre)
  local pc, pr = pref:logps(b)
  close(pc, c1:to("f64"), {rtol = 1e-6, atol = 1e-5})
  close(pr, r1:to("f64"), {rtol = 1e-6, atol = 1e-5})
  local ev = dpo.evaluate(lm, list, pre, {beta = 0.5})
  equal(ev.n, 4)
  assert(ev.accuracy >= 0 and ev.accuracy <= 1 and ev.loss == ev.loss)
end)

test("bad options and inputs are errors that say what is wrong", function()
  local x = lt.zeros(2, {dtype = "f64"})
  assert_error("beta must be a number > 0", function() dpo.loss(x, x, x, x, {beta = 0}) end)
  assert_error("loss must be \"sigmoid\"", function() dpo.loss(x, x, x, x, {loss = "kto"}) end)
  assert_error("label_smoothing applies to the sigmoid loss only",
    function() dpo.loss(x, x, x, x, {loss = "ipo", label_smoothing = 0.1}) end)
  assert_error("label_smoothing must be in", function() dpo.loss(x, x, x, x, {label_smoothing = 0.5}) end)
  assert_error("no LoRA layers", function() dpo.reference.lora(tiny()) end)
  assert_error("no log-probs for pair", function()
    local b = dpo.collate(encoded(), {1})
    dpo.reference.precomputed({chosen = {}, rejected = {}}):logps(b)
  end)
  -- at h = 0 (policy = reference) the sigmoid loss is log 2 and accuracy 0
  local _, m = dpo.loss(x, x, x, x)
  close(m.loss, math.log(2))
  equal(m.accuracy, 0)
end)
