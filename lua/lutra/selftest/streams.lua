-- lutra.selftest.streams — pinned memory, the copy stream and events on a GPU: a tensor
-- goes up with copy_async, is worked on by the compute stream (which must wait for the
-- copy), comes back down with copy_async into a pinned buffer, and the host waits on the
-- event before reading it. Exact: only copies and an add of integers in f32.
-- Needs a CUDA device (pinned memory does not exist without one): nothing runs on the CPU.
return function(st)
  if st.device == "cpu" then return end
  local lt = st.lt
  for _, n in ipairs {1, 7, 65537, 4194304} do
    local host = lt.arange(0, n, 1, {dtype = "f32"}):pin_memory()
    local dev = lt.empty({n}, {device = st.device})
    local up = lt.cuda.copy_async(dev, host)
    local sum = dev + dev -- on the compute stream: must see the copied values
    local back = lt.empty({n}, {pin_memory = true})
    local down = lt.cuda.copy_async(back, sum)
    down:synchronize()
    st.check("copy_async up+down", "f32", back, host:clone() + host:clone(), 0)
    st.report("copy_async events", {n}, "f32", 0, 0, up ~= nil and down ~= nil and down:query())
  end
  -- single elements of a device tensor, read and written (lt_get_at / lt_set_at)
  local ffi, C = require "ffi", st.C
  for _, dt in ipairs {"f32", "bf16", "i64"} do
    local h = st.rand({5, 7}, dt, -50, 50)
    local d = st.to_device(h):transpose(0, 1) -- (7, 5), strided
    local idx, v = ffi.new("int64_t[2]", 6, 3), ffi.new("double[1]")
    local want = ffi.new("double[1]")
    assert(C.lt_get_at(d, idx, v) == 0, ffi.string(C.lt_last_error()))
    assert(C.lt_get_at(h:transpose(0, 1), idx, want) == 0, ffi.string(C.lt_last_error()))
    assert(C.lt_set_at(d, idx, 3) == 0, ffi.string(C.lt_last_error()))
    local back = ffi.new("double[1]")
    assert(C.lt_get_at(d, idx, back) == 0, ffi.string(C.lt_last_error()))
    local ok = v[0] == want[0] and back[0] == 3
    st.report("get/set one element", {7, 5}, dt, math.abs(v[0] - want[0]), 0, ok)
  end
  -- events time work on the compute stream
  local a, b = lt.cuda.event():record(st.device), nil
  local x = lt.ones({1024, 1024}, {device = st.device})
  for _ = 1, 10 do x = x + x end
  b = lt.cuda.event():record(st.device)
  b:synchronize()
  local ms = a:elapsed(b)
  st.report("event elapsed", {1024, 1024}, "f32", 0, 0, ms > 0 and ms < 10000)
end
