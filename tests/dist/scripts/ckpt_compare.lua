-- lutra ckpt_compare.lua A.safetensors B.safetensors REL: every tensor of A equals B's within
-- REL relative to the tensor's scale (|a - b| <= REL * max|b|; 0: bitwise). Prints the
-- largest relative difference; exits 1 when over.
local lt = require "lutra"
local a, b = lt.safetensors.load(arg[1]), lt.safetensors.load(arg[2])
local rel = tonumber(arg[3])
local worst, where, over = 0, "-", false
for name, t in pairs(a) do
  local u = assert(b[name], "missing in " .. arg[2] .. ": " .. name)
  local d = (t - u):abs():max():item()
  local scale = u:abs():max():item()
  if not (d <= rel * scale) then over = true end
  local r = d == 0 and 0 or d / scale
  if r > worst or (r ~= r) then worst, where = r, name end
end
for name in pairs(b) do assert(a[name], "missing in " .. arg[1] .. ": " .. name) end
print(string.format("max relative diff %.3g (%s)", worst, where))
os.exit(over and 1 or 0)
