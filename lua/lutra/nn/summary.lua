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

function M.tree(root)
  local first_name, owner = {}, {} -- tensor -> its first dotted name, and the module that counts it
  root._walk(root, "", function(mod, prefix)
    for _, e in ipairs(mod._entries) do
      local t = rawget(mod, e.key)
      if e.kind == "param" and t ~= nil and first_name[t] == nil then
        first_name[t], owner[t] = prefix .. e.name, mod
      end
    end
  end, {})

  local shown = {} -- modules already printed (a module held twice prints once)
  local function count(mod, seen)
    local n = 0
    for _, e in ipairs(mod._entries) do
      local v = rawget(mod, e.key)
      if v ~= nil and not seen[v] then
        seen[v] = true
        if e.kind == "param" and owner[v] == mod then
          n = n + v:numel()
        elseif e.kind == "module" then
          n = n + count(v, seen)
        end
      end
    end
    return n
  end

  -- The lines under mod (each indented by `indent`), without mod's own line.
  local render
  local function line(mod, path, each)
    local n = count(mod, {})
    local notes = {}
    for _, e in ipairs(mod._entries) do
      local t = rawget(mod, e.key)
      if e.kind == "param" and t ~= nil and owner[t] ~= mod then
        notes[#notes + 1] = e.name .. " tied to " .. first_name[t]
      end
    end
    local s = mod:repr()
    if n > 0 or #mod._entries > 0 then s = s .. "  " .. thousands(n) .. (each and " each" or "") end
    if #notes == 0 then notes = nil end
    if notes then s = s .. " (" .. table.concat(notes, ", ") .. ")" end
    return s
  end

  render = function(mod, path, indent)
    local items, has_children = {}, false
    for _, e in ipairs(mod._entries) do
      if e.kind == "module" and rawget(mod, e.key) ~= nil then has_children = true end
    end
    local own = {} -- a container's own parameters and buffers (a layer's show in its repr)
    for _, e in ipairs(mod._entries) do
      local t = rawget(mod, e.key)
      if has_children and e.kind ~= "module" and t ~= nil then
        local s = string.format("%s%s: %s [%s]", indent, e.name, e.kind == "param" and "parameter" or "buffer",
          table.concat(t.shape, ", "))
        if e.kind == "param" and owner[t] ~= mod then
          s = s .. " tied to " .. first_name[t]
        elseif e.kind == "param" then
          s = s .. "  " .. thousands(t:numel())
        end
        own[#own + 1] = s .. "\n"
      end
    end
    for _, e in ipairs(mod._entries) do
      local c = rawget(mod, e.key)
      if e.kind == "module" and c ~= nil then
        local cpath = path == "" and e.name or (path .. "." .. e.name)
        local text
        if shown[c] then
          text = {head = c:repr() .. " (the module at " .. shown[c] .. ")", body = ""}
        else
          shown[c] = cpath
          text = {head = line(c, cpath), body = render(c, cpath, indent .. "  ")}
        end
        items[#items + 1] = {name = e.name, mod = c, text = text}
      end
    end
    local out, i = own, 1
    while i <= #items do
      local j = i
      -- merge a run of list elements that print the same
      while j < #items and tonumber(items[i].name) and tonumber(items[j + 1].name)
          and items[j + 1].text.head == items[i].text.head and items[j + 1].text.body == items[i].text.body do
        j = j + 1
      end
      local it = items[i]
      if j > i then
        local head = line(it.mod, nil, true)
        out[#out + 1] = string.format("%s%s-%s: %d x %s\n%s", indent, it.name, items[j].name, j - i + 1, head,
          it.text.body)
      else
        out[#out + 1] = indent .. it.name .. ": " .. it.text.head .. "\n" .. it.text.body
      end
      i = j + 1
    end
    return table.concat(out)
  end

  shown[root] = "(root)"
  local total = root:num_parameters()
  local head = root:repr() .. "  " .. thousands(total) .. " parameters"
  local body = render(root, "", "  ")
  return (head .. "\n" .. body):gsub("\n$", "")
end

return M
