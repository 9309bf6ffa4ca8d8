-- Memory: free() and tidy() return storage at once; GC pressure bounds a loop of big
-- temporaries; memory_stats reports the C allocator's counters.
local lt = require "lutra"
local T = require "lutra.testing"
local fields = require "lutra.tensor.fields"
local equal, fails = T.assert_equal, T.assert_error

local MiB = 1024 * 1024

local function allocated()
  return lt.memory_stats().allocated
end

test("memory_stats fields", function()
  local s = lt.memory_stats()
  for _, k in ipairs {"allocated", "peak", "reserved", "num_allocs", "num_frees"} do
    equal(type(s[k]), "number", k)
  end
  equal(type(lt.memory_stats("cpu").allocated), "number")
  -- the figures of a CUDA device's caching allocator: one API for every device, 0 on the CPU
  for _, k in ipairs {"peak_reserved", "cache_hits", "num_segments", "segment_allocs", "segment_frees", "num_ooms"} do
    equal(s[k], 0, k)
  end
  local before = lt.memory_stats()
  local t = lt.empty(1000)
  local after = lt.memory_stats()
  equal(after.num_allocs, before.num_allocs + 1)
  assert(after.allocated >= before.allocated + 4000, "allocated did not grow")
  assert(after.peak >= after.allocated, "peak below allocated")
  t:free()
  equal(lt.memory_stats().num_frees, after.num_frees + 1)
  fails("device", function() lt.memory_stats("tpu") end)
end)

test("free() releases the storage now; views keep theirs", function()
  collectgarbage()
  local base = allocated()
  local t = lt.empty(4 * MiB)
  assert(allocated() >= base + 16 * MiB, "allocation not counted")
  t:free()
  equal(allocated(), base)
  equal(t:is_freed(), true)
  fails("tensor was freed", function() return t + 1 end)
  -- a view shares the storage: freeing the base leaves the view's data alone
  local x = lt.arange(10):float()
  local v = x[{{2, 5}}]
  x:free()
  equal(v:tolist(), {2, 3, 4})
  v:free()
  collectgarbage()
  equal(allocated(), base)
end)

test("a loop of 1000 8 MB temporaries keeps peak memory bounded", function()
  collectgarbage()
  lt.reset_peak_memory_stats()
  local start = lt.memory_stats()
  local x = lt.ones(2 * MiB) -- 8 MB
  for i = 1, 1000 do
    local tmp = lt.empty(2 * MiB) -- nothing frees these but the GC
    if i % 100 == 0 then tmp = x * 2 end
  end
  local s = lt.memory_stats()
  local grew = s.peak - start.allocated
  -- without pressure-driven collection this would be 8 GB
  assert(grew < 300 * MiB, string.format("peak grew by %.0f MiB", grew / MiB))
  assert(s.num_frees - start.num_frees > 900, "temporaries were not freed")
  x:free()
end)

test("tidy frees what the function created, except what it returns", function()
  collectgarbage()
  local base = allocated()
  local inner = {}
  local kept_outside = lt.ones(3)
  local result, extra, n = lt.tidy(function(a, b)
    inner.tmp = lt.empty(MiB)
    inner.view = kept_outside[{{0, 2}}] -- a view of an outside tensor: freeing it drops only its reference
    local y = (a + b) * 2
    return y, "extra", 3
  end, lt.ones(2), lt.ones(2))
  equal(extra, "extra")
  equal(n, 3)
  equal(result:tolist(), {4, 4})
  equal(inner.tmp:is_freed(), true)
  equal(inner.view:is_freed(), true)
  equal(kept_outside:tolist(), {1, 1, 1})
  result:free()
  -- everything back without a GC (the argument tensors were made outside the scope)
  local leftover = allocated() - base
  assert(leftover <= 2 * 64 + 3 * 64, "tidy left " .. leftover .. " bytes")
end)

test("tidy keeps tensors returned in tables, and lutra.keep()", function()
  local kept, tmp
  local out = lt.tidy(function()
    tmp = lt.zeros(4)
    kept = lt.keep(lt.ones(2))
    return {loss = lt.tensor(1.5), parts = {lt.tensor({1, 2})}}
  end)
  equal(out.loss:item(), 1.5)
  equal(out.parts[1]:tolist(), {1, 2})
  equal(kept:tolist(), {1, 1})
  equal(tmp:is_freed(), true)
end)

test("nested tidy: what the inner returns belongs to the outer", function()
  local from_inner, inner_tmp
  local r = lt.tidy(function()
    from_inner = lt.tidy(function()
      inner_tmp = lt.ones(2)
      return lt.zeros(3)
    end)
    equal(from_inner:is_freed(), false)
    equal(inner_tmp:is_freed(), true)
    return from_inner + 1
  end)
  equal(from_inner:is_freed(), true) -- the outer scope did not return it
  equal(r:tolist(), {1, 1, 1})
end)

test("tidy frees everything when the function fails, and rethrows", function()
  local tmp
  local ok, err = pcall(lt.tidy, function()
    tmp = lt.ones(8)
    error("boom")
  end)
  equal(ok, false)
  assert(tostring(err):find("boom"), err)
  equal(tmp:is_freed(), true)
  -- the scope is closed: tensors made now are not tracked
  local after = lt.ones(2)
  lt.tidy(function() end)
  equal(after:is_freed(), false)
end)

test("the GC finalizer releases unreachable tensors", function()
  collectgarbage()
  local base = allocated()
  do
    local t = lt.empty(MiB)
    t = nil
  end
  collectgarbage()
  equal(allocated(), base)
end)

test("empty_cache hands cached blocks back", function()
  do local _ = lt.empty(4 * MiB) end
  lt.empty_cache()
  local s = lt.memory_stats()
  -- reserved covers live storages only (small ones are not cached)
  assert(s.reserved - s.allocated < MiB, "cache not emptied: " .. (s.reserved - s.allocated))
end)

test("the registry: tensors made while GC steps sweep keep their storage and a slot of their own", function()
  local function churn()
    local kept = {}
    for i = 1, 30000 do
      local t = lt.full({2}, i)
      if i % 7 == 0 then kept[#kept + 1] = t end
      if i % 500 == 0 then collectgarbage("step", 20) end
    end
    local slots = {}
    for k, t in ipairs(kept) do
      local v = t:tolist()
      equal(v, {7 * k, 7 * k}) -- a released and reused tensor would hold another value
      local slot = fields.slot(t)
      assert(slot > 0 and not slots[slot], "slot shared or missing")
      slots[slot] = true
    end
  end
  jit.off(churn) -- the interpreter allocates in more places than compiled code
  churn()
  jit.on(churn)
  churn()
  collectgarbage()
end)
