-- lutra.config: command-line overrides, config files, type checks, unknown-key suggestions,
-- markers, dump/save round trips.
local config = require "lutra.config"
local T = require "lutra.testing"
local equal, fails = T.assert_equal, T.assert_error

local function defaults()
  return {
    lr = 1e-3, steps = 2000, batch = 12, compile = false, shuffle = true, name = "run", device = "auto",
    betas = {0.9, 0.99}, dims = {64, 128},
    model = {arch = "gpt2", n_layer = 4, n_head = 4, attn = {rope = false, theta = 10000.5}},
  }
end

local tmp = os.tmpname()

local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

test("defaults alone; a plain table of copies", function()
  local d = defaults()
  local cfg = config(d, {})
  equal(cfg:plain(), d)
  cfg.model.n_layer = 99
  cfg.betas[1] = 0
  equal(d.model.n_layer, 4)
  equal(d.betas[1], 0.9)
  equal(getmetatable(cfg:plain()), nil)
  equal(getmetatable(cfg.model), nil)
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  equal(keys, {"batch", "betas", "compile", "device", "dims", "lr", "model", "name", "shuffle", "steps"})
end)

test("command-line overrides: forms and types", function()
  local cfg = config(defaults(), {"--lr=6e-4", "--model.n_layer=8", "--compile", "--steps", "500", "--no-shuffle",
    "--name=run 1", "--betas=0.8,0.9", "--betas.2=0.95", "--device=cuda:1", "--model.n-head=2",
    "--model.attn.rope=yes", "--dims=1,2,3", "--batch=1e2"})
  equal(cfg.lr, 6e-4)
  equal(cfg.model.n_layer, 8)
  equal(cfg.compile, true)
  equal(cfg.steps, 500)
  equal(cfg.shuffle, false)
  equal(cfg.name, "run 1")
  equal(cfg.betas, {0.8, 0.95})
  equal(cfg.device, "cuda:1")
  equal(cfg.model.n_head, 2)
  equal(cfg.model.attn.rope, true)
  equal(cfg.dims, {1, 2, 3})
  equal(cfg.batch, 100)
  equal(config(defaults(), {"--device=4"}).device, 4) -- "auto": a number when it parses
  equal(config(defaults(), {"--compile=false", "--compile=true"}).compile, true) -- the last wins
  equal(config(defaults(), {"--name="}).name, "")
  equal(config(defaults(), {"--dims="}).dims, {})
end)

test("type errors are clear", function()
  local d = defaults()
  fails("config: 'steps' expects an integer, got number 1.5 (--steps=1.5)", function() config(d, {"--steps=1.5"}) end)
  fails("lutra.config.number(2000)", function() config(d, {"--steps=1.5"}) end)
  fails("'lr' expects a number, got 'abc' (--lr=abc)", function() config(d, {"--lr=abc"}) end)
  fails("'compile' expects a boolean (true/false), got 'maybe'", function() config(d, {"--compile=maybe"}) end)
  fails("'model' expects a table of keys", function() config(d, {"--model=3"}) end)
  fails("'lr' is a number, not a table of keys", function() config(d, {"--lr.x=1"}) end)
  fails("--lr needs a value (--lr=VALUE)", function() config(d, {"--lr"}) end)
  fails("--lr needs a value", function() config(d, {"--lr", "--steps=3"}) end)
  fails("'dims[2]' expects an integer, got number 2.5", function() config(d, {"--dims=1,2.5"}) end)
  fails("'betas' has 2 elements; cannot set element 4", function() config(d, {"--betas.4=1"}) end)
  fails("unexpected argument 'data.txt': options look like --key=value", function() config(d, {"data.txt"}) end)
  fails("argv must be a list", function() config(d, "--lr=1") end)
  fails("expected a table of defaults", function() config(nil, {}) end)
  fails("the default of 'model.init' is a function", function() config({model = {init = print}}, {}) end)
  fails("mixes", function() config({x = {1, "a"}}, {}) end)
  -- inf and nan are refused (1e400 parses as inf), unless the default is itself one
  fails("config: 'lr' must be a finite number, got inf (--lr=inf)", function() config(d, {"--lr=inf"}) end)
  fails("config: 'lr' must be a finite number, got inf (--lr=1e400)", function() config(d, {"--lr=1e400"}) end)
  fails("config: 'lr' must be a finite number, got -inf", function() config(d, {"--lr=-1e400"}) end)
  fails("config: 'lr' must be a finite number, got nan", function() config(d, {"--lr=nan"}) end)
  fails("config: 'steps' must be a finite number, got inf", function() config(d, {"--steps=1e400"}) end)
  fails("config: 'dims[1]' must be a finite number, got inf", function() config(d, {"--dims=1e400,2"}) end)
  equal(config({limit = math.huge}, {"--limit=1e400"}).limit, math.huge)
end)

test("unknown keys suggest the nearest valid key", function()
  local d = defaults()
  equal(pcall(config, d, {"--model.n_layers=8"}), false)
  fails("config: unknown config key 'model.n_layers'; did you mean 'model.n_layer'? (--model.n_layers=8)",
    function() config(d, {"--model.n_layers=8"}) end)
  fails("unknown config key 'n_layer'; did you mean 'model.n_layer'?", function() config(d, {"--n_layer=3"}) end)
  fails("unknown config key 'lrr'; did you mean 'lr'?", function() config(d, {"--lrr=1"}) end)
  fails("did you mean 'model.attn.theta'?", function() config(d, {"--model.attn.tehta=1"}) end)
  fails("did you mean 'compile'?", function() config(d, {"--compil"}) end)
  local msg = fails("unknown config key 'zzzzzzzz'", function() config(d, {"--zzzzzzzz=1"}) end)
  equal(msg:find("did you mean", 1, true), nil)
  equal(config.edit_distance("kitten", "sitting"), 3)
  equal(config.edit_distance("", "abc"), 3)
  equal(config.edit_distance("flaw", "lawn"), 2)
end)

test("--config files merge before the command line", function()
  local path = tmp .. "_a.lua"
  write(path, "return {lr = 0.5, model = {n_layer = 12, attn = {theta = 500}}, betas = {0.1, 0.2, 0.3}}")
  local cfg = config(defaults(), {"--model.n_layer=3", "--config=" .. path})
  equal(cfg.lr, 0.5)
  equal(cfg.model.n_layer, 3) -- the command line wins wherever it is
  equal(cfg.model.attn.theta, 500)
  equal(cfg.model.n_head, 4) -- untouched keys keep their defaults
  equal(cfg.betas, {0.1, 0.2, 0.3})
  equal(config(defaults(), {"--config", path}).lr, 0.5)
  local second = tmp .. "_b.lua"
  write(second, "return {lr = 0.25}")
  equal(config(defaults(), {"--config=" .. path, "--config=" .. second}).lr, 0.25)

  write(path, "return {steps = 'many'}")
  fails("'steps' expects an integer, got string 'many' (in " .. path .. ")",
    function() config(defaults(), {"--config=" .. path}) end)
  write(path, "return {model = {n_layers = 2}}")
  fails("unknown config key 'model.n_layers'; did you mean 'model.n_layer'? (in " .. path .. ")",
    function() config(defaults(), {"--config=" .. path}) end)
  write(path, "return {model = 3}")
  fails("'model' expects a table of keys", function() config(defaults(), {"--config=" .. path}) end)
  write(path, "return {betas = {a = 1}}")
  fails("'betas' expects a list", function() config(defaults(), {"--config=" .. path}) end)
  write(path, "return 42")
  fails("must return a table, got number", function() config(defaults(), {"--config=" .. path}) end)
  write(path, "return {")
  fails("cannot load --config=", function() config(defaults(), {"--config=" .. path}) end)
  fails("cannot load --config=", function() config(defaults(), {"--config=" .. tmp .. "_missing.lua"}) end)
  write(path, "error('boom')")
  fails("boom", function() config(defaults(), {"--config=" .. path}) end)
  os.remove(path)
  os.remove(second)
end)

test("markers: optional, number, one_of", function()
  local d = {seed = config.optional("integer"), out = config.optional("string", "runs/x"),
             clip = config.number(1), arch = config.one_of({"gpt2", "llama"}, "gpt2"), warmup = 1}
  local cfg = config(d, {})
  equal(cfg.seed, nil)
  equal(cfg.out, "runs/x")
  equal(cfg.clip, 1)
  equal(cfg.arch, "gpt2")
  cfg = config(d, {"--seed=5", "--out=nil", "--clip=0.5", "--arch=llama"})
  equal({cfg.seed, cfg.out, cfg.clip, cfg.arch}, {5, nil, 0.5, "llama"})
  equal(config(d, {"--seed=5", "--seed=none"}).seed, nil)
  fails("'seed' expects an integer, got 'x'", function() config(d, {"--seed=x"}) end)
  fails("'seed' expects an integer, got number 2.5", function() config(d, {"--seed=2.5"}) end)
  fails("'arch' must be one of gpt2, llama; got 'lama' (did you mean 'llama'?)",
    function() config(d, {"--arch=lama"}) end)
  fails("'warmup' expects an integer", function() config(d, {"--warmup=0.5"}) end)
  fails("config.optional: kind must be", function() config.optional("float") end)
  fails("is not one of the choices", function() config.one_of({"a"}, "b") end)
  local path = tmp .. "_m.lua"
  write(path, "return {seed = 7, arch = 'llama'}")
  cfg = config(d, {"--config=" .. path})
  equal({cfg.seed, cfg.arch}, {7, "llama"})
  write(path, "return {arch = 'bert'}")
  fails("must be one of gpt2, llama; got 'bert'", function() config(d, {"--config=" .. path}) end)
  os.remove(path)
end)

test("dump is sorted and readable; save round-trips through --config", function()
  local d = {b = 2, a = {z = "x", y = {1, 2}}, lr = 6e-4, name = 'say "hi"\n\tbye', seed = config.optional("integer"),
             big = 2 ^ 60, tiny = 1e-300, third = 1 / 3, flag = false, ["not-ident"] = 1, ["end"] = "kw"}
  local cfg = config(d, {})
  equal(cfg:dump(), table.concat({
    "{",
    "  a = {",
    "    y = {1, 2},",
    '    z = "x",',
    "  },",
    "  b = 2,",
    "  big = 1152921504606846976,",
    '  ["end"] = "kw",',
    "  flag = false,",
    "  lr = 0.0006,",
    '  name = "say \\"hi\\"\\n\\tbye",',
    '  ["not-ident"] = 1,',
    "  seed = nil, -- optional integer",
    "  third = 0.3333333333333333,",
    "  tiny = 1e-300,",
    "}"}, "\n"))
  equal(tostring(cfg), cfg:dump())
  equal(config.dump(cfg), cfg:dump())
  local path = tmp .. "_saved.json"
  local changed = config(d, {"--lr=3e-4", "--seed=42", "--a.y=5,6,7", "--name=x\"y", "--third=0.1"})
  equal(changed:save(path), path)
  local back = config(d, {"--config=" .. path})
  equal(back:plain(), changed:plain())
  equal(back:dump(), changed:dump())
  -- keys the recipe added after parsing show up too
  changed.run_dir = "runs/1"
  T.assert_equal(changed:dump():find('run_dir = "runs/1"', 1, true) ~= nil, true)
  fails("config: cannot write /nonexistent-dir/x.json: cannot create a temporary file in /nonexistent-dir",
    function() cfg:save("/nonexistent-dir/x.json") end)
  fails("config: save writes JSON; name the file *.json (got x.lua)", function() cfg:save("x.lua") end)
  os.remove(path)
end)

test("save writes JSON that is data: python reads it, --config reads it back without running it", function()
  local d = {lr = 1e-3, seed = config.optional("integer"), out = config.optional("string", "runs/x"), empty = {},
             cap = config.number(math.huge), model = {n_layer = 4, names = {"a", "b"}}, flag = true}
  local cfg = config(d, {"--seed=7", "--out=nil", "--lr=2.5e-4", "--cap=12.5"})
  local path = tmp .. "_data.json"
  cfg:save(path)
  local text = read(path)
  -- the exact layout: sorted keys, two spaces, lists as arrays (the empty one too), null for an
  -- optional key that is unset (it reads back unset, not as its default "runs/x")
  equal(text, table.concat({
    "{",
    '  "cap": 12.5,',
    '  "empty": [],',
    '  "flag": true,',
    '  "lr": 0.00025,',
    '  "model": {',
    '    "n_layer": 4,',
    '    "names": [',
    '      "a",',
    '      "b"',
    "    ]",
    "  },",
    '  "out": null,',
    '  "seed": 7',
    "}", ""}, "\n"))
  local back = config(d, {"--config=" .. path})
  equal(back:plain(), cfg:plain())
  equal(back.out, nil)
  -- a number that is not finite (only where its default is one) as a string JSON can hold
  local inf = config(d, {})
  inf:save(path)
  assert(read(path):find('"cap": "inf"', 1, true), read(path))
  equal(config(d, {"--config=" .. path}).cap, math.huge)
  write(path, '{"lr": "inf"}')
  fails("'lr' must be a finite number, got inf (in " .. path .. ")", function() config(d, {"--config=" .. path}) end)
  -- JSON is read, never run: Lua text in a .json file is a parse error naming the file
  write(path, 'os.exit(3) return {lr = 1}')
  fails("config: cannot load --config=" .. path .. ": json: " .. path .. ": unexpected 'o' at line 1 column 1",
    function() config(d, {"--config=" .. path}) end)
  write(path, '[1, 2]')
  fails("--config=" .. path .. " must hold a JSON object of settings, got an array",
    function() config(d, {"--config=" .. path}) end)
  write(path, '{"model": {"n_layers": 2}}')
  fails("unknown config key 'model.n_layers'; did you mean 'model.n_layer'? (in " .. path .. ")",
    function() config(d, {"--config=" .. path}) end)
  write(path, '{"lr": null}')
  fails("'lr' expects a number, got null (in " .. path .. ")", function() config(d, {"--config=" .. path}) end)
  write(path, '{"model": {"names": "a"}}')
  fails("'model.names' expects a list, got string 'a'", function() config(d, {"--config=" .. path}) end)
  fails("config: cannot load --config=" .. tmp .. "_missing.json: json: cannot open", function()
    config(d, {"--config=" .. tmp .. "_missing.json"})
  end)
  -- a string that is not UTF-8 is refused by name, not written as invalid JSON
  local bad = config(d, {"--out=caf\233"})
  fails("config: cannot save " .. path .. ": json: invalid UTF-8 (byte 0xe9 at offset 4) in the string at out",
    function() bad:save(path) end)
  -- python's json module reads the file (where python3 runs)
  cfg:save(path)
  local py = io.popen("python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); "
    .. "print(v[\"lr\"], v[\"out\"], v[\"model\"][\"names\"], v[\"empty\"])' " .. path .. " 2>/dev/null")
  local said = py:read("*a")
  py:close()
  if said ~= "" then equal(said, "0.00025 None ['a', 'b'] []\n") end
  os.remove(path)
end)

test("the script's arguments by default; --help text", function()
  local saved = rawget(_G, "arg")
  rawset(_G, "arg", {[0] = "recipe.lua", "--lr=2", "--model.n_layer=1"})
  local ok, cfg = pcall(config, defaults())
  rawset(_G, "arg", saved)
  assert(ok, cfg)
  equal({cfg.lr, cfg.model.n_layer}, {2, 1})
  local help = config.help({lr = 1e-3, model = {n_layer = 4}, seed = config.optional("integer"),
                            arch = config.one_of({"gpt2", "llama"}, "gpt2")})
  assert(help:find("  --model.n_layer=4  (integer)", 1, true), help)
  assert(help:find("  --lr=0.001  (number)", 1, true), help)
  assert(help:find("  --seed=nil  (integer, optional)", 1, true), help)
  assert(help:find("  --arch=\"gpt2\"  (string: gpt2|llama)", 1, true), help)
  -- a key named help is an ordinary key
  equal(config({help = false}, {"--help"}).help, true)
end)

test("cleanup", function() os.remove(tmp) end)
