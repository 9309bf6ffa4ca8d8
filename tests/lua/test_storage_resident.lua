-- Storage residency (host/core/storage_resident.c): a storage's bytes are released and
-- allocated again in place, so that views and references autograd saved stay valid
-- (ZeRO stage 3 frees parameters between the modules that use them).
local lt = require "lutra"
local ffi = require "lutra.ffi"
local S = require "lutra.autograd.state"
local T = require "lutra.testing"
local equal, fails, close = T.assert_equal, T.assert_error, T.assert_close

local C = ffi.C
local F = require "lutra.functional"

local function allocated() return lt.memory_stats().allocated end
local function check(rc)
  if rc ~= 0 then require("lutra.errors").fail() end
end
local function resident(t) return C.lt_storage_is_resident(t) ~= 0 end

for _, n in ipairs {{3, 5}, {512, 1024}} do -- a small block (malloc) and a 2 MiB one (the block cache)
  test(string.format("release and restore keep the storage object, views see the new bytes (%dx%d)", n[1], n[2]),
    function()
      local t = lt.randn(n[1], n[2])
      local view = t:narrow(0, 1, 2) -- shares t's storage
      local storage = t.storage
      local refs = storage.refcount
      local bytes = n[1] * n[2] * 4
      local before = allocated()
      check(C.lt_storage_release_bytes(t))
      assert(not resident(t) and not resident(view), "released")
      assert(allocated() <= before - bytes, "allocated did not drop by the tensor's bytes")
      equal(tonumber(storage.nbytes), 0)
      assert(t.storage == storage and view.storage == storage, "same storage object")
      equal(storage.refcount, refs, "refcount untouched")
      check(C.lt_storage_release_bytes(t)) -- twice: a no-op
      check(C.lt_storage_restore_bytes(view, 0)) -- through a view: the whole storage reached by it
      assert(resident(t), "restored")
      assert(tonumber(storage.nbytes) >= (1 + 2) * n[2] * 4, "restored bytes cover the view")
      check(C.lt_storage_release_bytes(t))
      check(C.lt_storage_restore_bytes(t, 0))
      assert(tonumber(storage.nbytes) >= bytes)
      assert(allocated() >= before, "allocated back")
      check(C.lt_storage_restore_bytes(t, 0)) -- resident: a no-op
      local src = lt.arange(0, n[1] * n[2]):float():view(n[1], n[2])
      check(C.lt_copy(t, src))
      close(view, src:narrow(0, 1, 2), {rtol = 0, atol = 0})
      check(C.lt_storage_release_bytes(t))
      t:free() -- freeing while released: nothing more is handed back, nothing crashes
      view:free()
      collectgarbage()
    end)
end

test("a parameter released after forward and restored before backward gives the same gradients", function()
  local w = lt.randn(4, 3, {requires_grad = true})
  local x = lt.randn(2, 3)
  local keep = w:detach():clone()
  local y = F.linear(x, w)
  check(C.lt_storage_release_bytes(w))
  check(C.lt_storage_restore_bytes(w, 0))
  check(C.lt_copy(w, keep)) -- refilled in C: no version bump, the saved reference is valid
  y:sum():backward()
  local w2 = keep:clone():requires_grad_()
  F.linear(x, w2):sum():backward()
  close(w.grad, w2.grad, {rtol = 0, atol = 0})
  assert(S ~= nil)
end)

test("bad input: NULL and undefined tensors", function()
  fails("storage_release_bytes", function() check(C.lt_storage_release_bytes(nil)) end)
  fails("storage_restore_bytes", function() check(C.lt_storage_restore_bytes(nil, 0)) end)
  local t = lt.randn(2)
  t:free()
  fails("storage_release_bytes", function() check(C.lt_storage_release_bytes(t)) end)
  fails("storage_restore_bytes", function() check(C.lt_storage_restore_bytes(t, 0)) end)
  equal(C.lt_storage_is_resident(t), 0)
  equal(C.lt_storage_is_resident(nil), 0)
end)
