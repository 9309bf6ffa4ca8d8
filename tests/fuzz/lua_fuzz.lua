-- tests/fuzz/lua_fuzz.lua — a mutation fuzzer for the parsers of outside data whose checks are
-- written in Lua (an HF config.json's typing, SFT/DPO JSONL records, ...), run in the lutra
-- process. libFuzzer covers the C readers under them (tests/fuzz/fuzz_*.c); this one covers the
-- layer that turns a parsed document into a model, a tokenizer or a batch.
--
--   lutra tests/fuzz/lua_fuzz.lua TARGETS.lua NAME [--runs=N] [--seed=S] [--max_len=BYTES]
--                                [--seconds=T] [--crash_dir=DIR]
--
-- NAME "all" runs every target of the file in turn.
-- TARGETS.lua returns {NAME = target, ...}; a target is
--   { seeds = {string, ...},        -- valid inputs to mutate
--     dict = {string, ...},         -- tokens worth inserting (keys, numbers, quotes)
--     run = function(bytes) end }   -- reads bytes as its parser does (writing them to a file
--                                   -- first when the parser reads files)
--     names = "text",               -- what every error must contain (the file's path, say)
-- Each execution mutates a seed (or the previous input) and calls run. The run passes when it
-- returns or raises a string error that contains `names` and is not one of Lua's own runtime
-- errors (an index of nil, arithmetic on a string: those mean a check is missing). Anything
-- else is a failure: its input is written to crash_dir/crash-NAME-<n> and the fuzzer exits 1.
-- An execution that runs more than 10^8 VM instructions counts as a hang.
-- The same seed gives the same inputs (a failure reproduces by running again).
local target_file, name = arg[1], arg[2]
if not (target_file and name) then
  io.stderr:write("usage: lutra tests/fuzz/lua_fuzz.lua TARGETS.lua NAME [--runs=N] [--seed=S] [--max_len=BYTES] [--seconds=T]\n")
  os.exit(2)
end
local opts = {runs = 100000, seed = 1, max_len = 4096, seconds = 0, crash_dir = "."}
for i = 3, #arg do
  local k, v = arg[i]:match("^%-%-([%w_]+)=(.*)$")
  if not k or opts[k] == nil then
    io.stderr:write("lua_fuzz: unknown option " .. arg[i] .. "\n")
    os.exit(2)
  end
  opts[k] = tonumber(v) or v
end

local targets = dofile(target_file)
local names = {}
for k in pairs(targets) do names[#names + 1] = k end
table.sort(names)
if name ~= "all" and not targets[name] then
  io.stderr:write(string.format("lua_fuzz: %s has no target '%s' (it has: %s)\n", target_file, name,
                                table.concat(names, ", ")))
  os.exit(2)
end

-- Park-Miller (products stay below 2^53, exact in doubles): the same inputs on every machine.
local state
local function rand(n) -- integer in [0, n)
  state = state * 48271 % 2147483647
  return math.floor((state - 1) / 2147483646 * n)
end
local bit = require "bit"
local sub, char, byte = string.sub, string.char, string.byte
local function pick(t) return t[rand(#t) + 1] end

local interesting = {"0", "-1", "1", "1e400", "-1e400", "nan", "NaN", "Infinity", "1e308", "4294967296",
                     "9007199254740993", "2147483648", "-0", "0.5", "\"\"", "null", "true", "[]", "{}",
                     "\"\\u0000\"", "\"\\ud800\"", "\255", "\192\128", "\"a\"", "[[[[[[[[", "}}}}", "\n"}

local function mutator(seeds, dict)
  return function(s)
    local n = #s
    local op = rand(9)
    local at = rand(n + 1)
    if op == 0 and n > 0 then -- flip a bit
      local c = byte(s, at + 1) or 0
      return sub(s, 1, at) .. char(bit.bxor(c, bit.lshift(1, rand(8)))) .. sub(s, at + 2)
    elseif op == 1 then -- a random byte
      return sub(s, 1, at) .. char(rand(256)) .. sub(s, at + 2)
    elseif op == 2 then -- insert a random byte
      return sub(s, 1, at) .. char(rand(256)) .. sub(s, at + 1)
    elseif op == 3 and n > 0 then -- delete a run
      return sub(s, 1, at) .. sub(s, at + 1 + rand(16) + 1)
    elseif op == 4 and n > 0 then -- duplicate a run
      local len = rand(math.min(64, n)) + 1
      local from = rand(n)
      return sub(s, 1, at) .. sub(s, from + 1, from + len) .. sub(s, at + 1)
    elseif op == 5 and #dict > 0 then -- a dictionary token
      return sub(s, 1, at) .. pick(dict) .. sub(s, at + 1)
    elseif op == 6 then -- an interesting value over a few bytes
      return sub(s, 1, at) .. pick(interesting) .. sub(s, at + 1 + rand(8))
    elseif op == 7 then -- splice with a seed
      local other = pick(seeds)
      return sub(s, 1, at) .. sub(other, rand(#other + 1) + 1)
    end
    return pick(seeds) -- start over
  end
end

local raw_lua_error = {"attempt to index", "attempt to call", "attempt to perform arithmetic", "attempt to compare",
                       "attempt to concatenate", "attempt to get length", "bad argument #", "stack overflow",
                       "table index is nil", "table index is NaN", "invalid value (at index", "number has no integer"}
local function judge(target, ok, err)
  if ok then return nil end
  if type(err) ~= "string" then return "raised a " .. type(err) .. " instead of a message" end
  for _, pat in ipairs(raw_lua_error) do
    if err:find(pat, 1, true) then return "a raw Lua error: " .. err end
  end
  if target.names and not err:find(target.names, 1, true) then
    return "the error does not name " .. target.names .. ": " .. err
  end
  return nil
end

local HANG = 100000000
local function hang() error("lua_fuzz: hang (more than 10^8 instructions)", 2) end

local function fuzz(tname, target)
  assert(target.seeds and #target.seeds > 0, "lua_fuzz: target " .. tname .. " has no seeds")
  state = opts.seed % 2147483646 + 1
  local seeds, mutate = target.seeds, mutator(target.seeds, target.dict or {})
  local started = os.clock()
  local input = pick(seeds)
  local runs, errors_seen, passes = opts.runs, 0, 0
  for run = 1, opts.runs do
    input = mutate(rand(4) == 0 and pick(seeds) or input)
    if #input > opts.max_len then input = sub(input, 1, opts.max_len) end
    debug.sethook(hang, "", HANG)
    local ok, err = pcall(target.run, input)
    debug.sethook()
    local why = judge(target, ok, err)
    if why then
      local path = string.format("%s/crash-%s-%d", opts.crash_dir, tname, run)
      local f = assert(io.open(path, "wb"))
      f:write(input)
      f:close()
      io.stderr:write(string.format("lua_fuzz: %s: FAILURE at execution %d (seed %d): %s\ninput written to %s\n",
                                    tname, run, opts.seed, why, path))
      os.exit(1)
    end
    if ok then passes = passes + 1 else errors_seen = errors_seen + 1 end
    if run % 1000 == 0 then
      collectgarbage("step", 200)
      if opts.seconds > 0 and os.clock() - started > opts.seconds then
        print(string.format("lua_fuzz: %s: stopping at the %d s limit", tname, opts.seconds))
        runs = run
        break
      end
    end
    if run % 1000000 == 0 then
      io.stderr:write(string.format("lua_fuzz: %s: %d executions, %.0f/s\n", tname, run, run / (os.clock() - started)))
    end
  end
  local secs = os.clock() - started
  print(string.format("lua_fuzz: %s: %d executions in %.1f s (%.0f/s), %d accepted, %d clear errors, 0 failures",
                      tname, runs, secs, runs / math.max(secs, 1e-9), passes, errors_seen))
end

for _, tname in ipairs(names) do
  if name == "all" or name == tname then fuzz(tname, targets[tname]) end
end
