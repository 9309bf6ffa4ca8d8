-- lutra ckpt_compare.lua A.safetensors B.safetensors TOL: every tensor of A equals B's within
-- TOL (0: bitwise). Prints the largest difference; exits 1 when over.
local lt = require "lutra"
local a, b = lt.safetensors.load(arg[1]), lt.safetensors.load(arg[2])
local tol = tonumber(arg[3])
local worst, where = 0, "-"
for name, t in pairs(a) do
  local u = assert(b[name], "missing in " .. arg[2] .. ": " .. name)
  local d = (t - u):abs():max():item()
  -- the key bias of gpt2's attention: an exactly zero gradient, rounding noise under AdamW
  if name:match("attn%.qkv%.bias$") then
    local C = t:size(0) / 3
    d = math.max((t:narrow(0, 0, C) - u:narrow(0, 0, C)):abs():max():item(),
      (t:narrow(0, 2 * C, C) - u:narrow(0, 2 * C, C)):abs():max():item())
  end
  if d > worst then worst, where = d, name end
end
print(string.format("max |diff| %.3g (%s)", worst, where))
os.exit(worst <= tol and 0 or 1)
