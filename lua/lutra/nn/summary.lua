-- lutra.nn.summary — tostring(module): the module tree, one line per module with its
-- settings and parameter count; runs of identical list elements print once
-- ("0-11: 12 x Block ... each"); a tensor already counted elsewhere (tied weights)
-- is named instead of counted again.
--
--   GPT(gpt2: 2 layers, d_model 32, 4 heads, vocab 64)  27,776 parameters
--     wte: Embedding(64, 32)  2,048
--     blocks: ModuleList  12,672
--       0-1: 2 x Block  6,336 each
--         ln_1: LayerNorm(32)  64
--     ...
--     lm_head: Linear(32, 64, bias=false)  0 (weight tied to wte.weight)
local M = {}

-- 1234567 -> "1,234,567"
function M.thousands(n)
  local s = tostring(math.floor(n))
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""):gsub("^%-,", "-"))
end
local thousands = M.thousands

-- tensor -> its first dotted name, and the module that counts it
local function find_owners(root)
  local first_name, owner = {}, {}
  root._walk(root, "", function(mod, prefix)
    for _, e in ipairs(mod._entries) do
      local t = rawget(mod, e.key)
      if e.kind == "param" and t ~= nil and first_name[t] == nil then
        first_name[t], owner[t] = prefix .. e.name, mod
      end
    end
  end, {})
  return first_name, owner
end

-- The parameters mod and its submodules count (each tensor and module once).
local function count_owned(tree, mod, seen)
  local n = 0
  for _, e in ipairs(mod._entries) do
    local v = rawget(mod, e.key)
    if v ~= nil and not seen[v] then
      seen[v] = true
      if e.kind == "param" and tree.owner[v] == mod then
        n = n + v:numel()
      elseif e.kind == "module" then
        n = n + count_owned(tree, v, seen)
      end
    end
  end
  return n
end

-- mod's own line: its repr, its count ("each" for a merged run) and its tied parameters.
local function module_line(tree, mod, each)
  local n = count_owned(tree, mod, {})
  local notes = {}
  for _, e in ipairs(mod._entries) do
    local t = rawget(mod, e.key)
    if e.kind == "param" and t ~= nil and tree.owner[t] ~= mod then
      notes[#notes + 1] = e.name .. " tied to " .. tree.first_name[t]
    end
  end
  local s = mod:repr()
  if n > 0 or #mod._entries > 0 then s = s .. "  " .. thousands(n) .. (each and " each" or "") end
  if #notes == 0 then notes = nil end
  if notes then s = s .. " (" .. table.concat(notes, ", ") .. ")" end
  return s
end

-- A container's own parameters and buffers, a line each (a layer's show in its repr).
local function own_tensor_lines(tree, mod, indent)
  local has_children = false
  for _, e in ipairs(mod._entries) do
    if e.kind == "module" and rawget(mod, e.key) ~= nil then has_children = true end
  end
  local own = {}
  for _, e in ipairs(mod._entries) do
    local t = rawget(mod, e.key)
    if has_children and e.kind ~= "module" and t ~= nil then
      local s = string.format("%s%s: %s [%s]", indent, e.name, e.kind == "param" and "parameter" or "buffer",
        table.concat(t.shape, ", "))
      if e.kind == "param" and tree.owner[t] ~= mod then
        s = s .. " tied to " .. tree.first_name[t]
      elseif e.kind == "param" then
        s = s .. "  " .. thousands(t:numel())
      end
      own[#own + 1] = s .. "\n"
    end
  end
  return own
end

local render

-- mod's submodules, each {name, mod, text = {head = its line, body = the lines under it}};
-- a module already printed is named by where it was.
local function child_items(tree, mod, path, indent)
  local items = {}
  for _, e in ipairs(mod._entries) do
    local c = rawget(mod, e.key)
    if e.kind == "module" and c ~= nil then
      local cpath = path == "" and e.name or (path .. "." .. e.name)
      local text
      if tree.shown[c] then
        text = {head = c:repr() .. " (the module at " .. tree.shown[c] .. ")", body = ""}
      else
        tree.shown[c] = cpath
        text = {head = module_line(tree, c), body = render(tree, c, cpath, indent .. "  ")}
      end
      items[#items + 1] = {name = e.name, mod = c, text = text}
    end
  end
  return items
end

-- Appends the items to out, a run of list elements that print the same as one line.
local function append_merged(tree, items, out, indent)
  local i = 1
  while i <= #items do
    local j = i
    while j < #items and tonumber(items[i].name) and tonumber(items[j + 1].name)
        and items[j + 1].text.head == items[i].text.head and items[j + 1].text.body == items[i].text.body do
      j = j + 1
    end
    local it = items[i]
    if j > i then
      local head = module_line(tree, it.mod, true)
      out[#out + 1] = string.format("%s%s-%s: %d x %s\n%s", indent, it.name, items[j].name, j - i + 1, head,
        it.text.body)
    else
      out[#out + 1] = indent .. it.name .. ": " .. it.text.head .. "\n" .. it.text.body
    end
    i = j + 1
  end
  return out
end

-- The lines under mod (each indented by `indent`), without mod's own line.
render = function(tree, mod, path, indent)
  local own = own_tensor_lines(tree, mod, indent)
  local items = child_items(tree, mod, path, indent)
  return table.concat(append_merged(tree, items, own, indent))
end

function M.tree(root)
  local first_name, owner = find_owners(root)
  -- shown: modules already printed (a module held twice prints once)
  local tree = {first_name = first_name, owner = owner, shown = {[root] = "(root)"}}
  local total = root:num_parameters()
  local head = root:repr() .. "  " .. thousands(total) .. " parameters"
  local body = render(tree, root, "", "  ")
  return (head .. "\n" .. body):gsub("\n$", "")
end

return M
