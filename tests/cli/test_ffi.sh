#!/usr/bin/env bash
# test_ffi.sh — the C API through the FFI: inside lutra, ffi.C resolves lt_* (the executable
# links liblutra and exports its symbols); a plain luajit can ffi.load liblutra, ffi.cdef the
# text of lt_api_cdef() and call into it.
# usage: test_ffi.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_ffi.sh path/to/lutra path/to/liblutra.so}")
LIB=$(realpath "${2:?usage: test_ffi.sh path/to/lutra path/to/liblutra.so}")
T=$(mktemp -d)
HAS_C_LUA='local ffi = require "ffi" ffi.cdef "const char *lt_version(void);"
  io.write(tostring(pcall(function() return ffi.C.lt_version end)))'
VERSION_LUA='local ffi = require "ffi" ffi.cdef "const char *lt_version(void);" io.write(ffi.string(ffi.C.lt_version()))'
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

version=$("$LUTRA" --version | sed -n 's/^lutra \([^ ]*\) .*/\1/p')

# The whole API: cdef the generated text, then make a tensor, fill it, read it back.
cat >"$T/api.lua" <<'EOF'
local ffi = require "ffi"
local lib_path = ...
ffi.cdef "const char *lt_api_cdef(void);"
local C = lib_path and ffi.load(lib_path) or ffi.C
ffi.cdef(ffi.string(C.lt_api_cdef()))
print("version " .. ffi.string(C.lt_version()))
local t = C.lt_tensor_new()
local shape = ffi.new("int64_t[2]", 3, 4)
assert(C.lt_empty(t, 2, shape, C.LT_F32, C.LT_DEVICE_CPU) == 0, ffi.string(C.lt_last_error()))
assert(C.lt_fill(t, 2.5) == 0, ffi.string(C.lt_last_error()))
local idx, v = ffi.new("int64_t[2]", 2, 3), ffi.new("double[1]")
assert(C.lt_get_at(t, idx, v) == 0)
print("numel " .. tonumber(C.lt_numel(t)) .. " value " .. v[0])
-- an error comes back as -1 with a message, not a crash
print("bad " .. C.lt_empty(t, 2, shape, 99, C.LT_DEVICE_CPU) .. " " .. (#ffi.string(C.lt_last_error()) > 0 and "msg" or "nomsg"))
C.lt_release(t)
EOF
want="version $version
numel 12 value 2.5
bad -1 msg"
expect_eq "ffi.C resolves the API inside lutra" "$("$LUTRA" "$T/api.lua" 2>&1)" "$want"
expect_eq "ffi.C.lt_version in lutra -e" \
  "$("$LUTRA" -e "$VERSION_LUA" 2>&1)" \
  "$version"
# symbols are reachable from the process: dlsym on the default namespace finds them
expect_eq "lt_version is found by dlsym(RTLD_DEFAULT)" "$("$LUTRA" -e '
local ffi = require "ffi"
ffi.cdef "void *dlsym(void *handle, const char *name);"
io.write(tostring(ffi.C.dlsym(nil, "lt_version") ~= nil), " ", tostring(ffi.C.dlsym(nil, "lt_api_cdef") ~= nil))' 2>&1)" \
  "true true"
if command -v luajit >/dev/null; then
  expect_eq "plain luajit ffi.load of liblutra" "$(luajit "$T/api.lua" "$LIB" 2>&1)" "$want"
  expect_eq "plain luajit: ffi.C does not have it (so the check above means something)" \
    "$(luajit -e "$HAS_C_LUA" 2>&1)" \
    "false"
else
  bad "luajit not found in PATH"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
