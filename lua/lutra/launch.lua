-- lutra.launch — `lutra launch -n N recipe.lua [args]`: runs a recipe on N ranks under mpirun.
--
-- It only builds an mpirun command line and runs it: the lutra executable itself on every
-- rank, one thread pool per rank sized to share the cores (CPU) or one process per GPU
-- (device chosen by local rank: lutra.dist.device), the LUTRA_* environment forwarded,
-- --oversubscribe when there are more ranks than cores, --allow-run-as-root as root.
-- mpirun's exit status is the command's. The launcher keeps stdin and lends it to a rank's
-- REPL (lutra.dist.console); --repl-on-error adds the post-mortem REPL (lua/lutra/repl.lua,
-- host/app/main.c) and a hold file that keeps the other ranks' watchdogs waiting.
local ffi = require "ffi"
local console = require "lutra.dist.console"

local M = {}

M.HELP = [[
usage: lutra launch [-n N] [--hostfile FILE] [--repl-on-error] [--dry-run] [--] recipe.lua [args]

Runs `lutra recipe.lua args` on N ranks with mpirun (OpenMPI). Every rank sees the MPI
world (lutra.dist.init builds the mesh from it); the recipe's own options (--lr=3e-4,
--parallel.tp=2) follow the recipe's name.

Options:
  -n, --np N          number of ranks (default: one per GPU on a GPU machine, else 1;
                      with --hostfile: the hostfile's slots)
  --hostfile FILE     hosts and slots, passed to mpirun (multi-node; see README)
  --repl-on-error     a rank that raises an error opens the REPL at the failing frame (the
                      other ranks are held: their watchdog waits); leaving it ends the job
  --stdin R           send stdin to rank R from the start (mpirun's forwarding), or none;
                      by default the launcher keeps it and lends it to whichever rank opens
                      a REPL (lutra.debug, --repl-on-error), one at a time
  --mpirun PATH       the mpirun to use (default: $LUTRA_MPIRUN, else mpirun on PATH)
  --mpi-arg WORD      one more word for mpirun's command line (repeatable), e.g.
                      --mpi-arg --mca --mpi-arg btl --mpi-arg tcp,self
  --max-restarts N    when the job fails (a rank dies, the watchdog ends a hang), run it
                      again, up to N times, resuming from the latest valid checkpoint
                      (the ranks see LUTRA_RESUME=auto and LUTRA_RESTART=k)
  --min-ranks M       a restart may come back with fewer ranks, down to M, when ranks were
                      lost (the checkpoint reshards to the new world; dp = "auto" adapts)
  --dry-run           print the mpirun command instead of running it
  -h, --help          this text

What it sets: --bind-to none; -x LUTRA_*, NCCL_*, UCX_*, CUDA_VISIBLE_DEVICES when set;
OMP_NUM_THREADS = cores / ranks per node (at least 1) and OPENBLAS_NUM_THREADS=1 (lutra
splits gemms over the OpenMP threads itself) unless you set them; --oversubscribe when the
ranks outnumber this machine's cores; --allow-run-as-root when run as root; LUTRA_TTY=1 when
this command's output is a terminal, else 0 (progress lines in place, or one line a step). On GPUs each
rank uses cuda:(local rank % GPUs) unless LUTRA_DEVICE is set.
Exit status: the job's (the first failing rank's); 2 for a bad command line.
Examples:
  lutra launch -n 4 recipes/pretrain.lua --parallel.dp=2 --parallel.tp=2
  lutra launch -n 2 --repl-on-error my_recipe.lua
  lutra launch --hostfile hosts -n 16 recipes/pretrain.lua]]

-- Environment forwarded to the ranks with -x (mpirun passes OMPI_* by itself).
local FORWARD_PREFIXES = {"LUTRA_", "NCCL_", "UCX_"}
local FORWARD_NAMES = {OMP_NUM_THREADS = true, OPENBLAS_NUM_THREADS = true, CUDA_VISIBLE_DEVICES = true}

pcall(ffi.cdef, [[
extern char **environ;
unsigned int geteuid(void);
int sched_getaffinity(int pid, size_t size, void *mask);
long readlink(const char *path, char *buf, size_t size);
char *mkdtemp(char *template);
int access(const char *path, int mode);
]])

-- ---- the machine ------------------------------------------------------------------------------

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The CPUs this process may run on (its affinity mask), as a list of ids.
local function allowed_cpus()
  local mask = ffi.new("uint8_t[128]")
  local cpus = {}
  if ffi.C.sched_getaffinity(0, 128, mask) == 0 then
    for i = 0, 1023 do
      if bit.band(mask[bit.rshift(i, 3)], bit.lshift(1, bit.band(i, 7))) ~= 0 then cpus[#cpus + 1] = i end
    end
  end
  return cpus
end

-- Logical CPUs and physical cores (mpirun counts a slot per core) this process may use.
function M.machine_cores()
  local cpus = allowed_cpus()
  if #cpus == 0 then return 1, 1 end
  local cores, ncores = {}, 0
  for _, c in ipairs(cpus) do
    local dir = "/sys/devices/system/cpu/cpu" .. c .. "/topology/"
    local key = (read_file(dir .. "physical_package_id") or "?") .. ":" .. (read_file(dir .. "core_id") or c)
    if not cores[key] then
      cores[key] = true
      ncores = ncores + 1
    end
  end
  return #cpus, ncores
end

function M.environment()
  local env, i = {}, 0
  while ffi.C.environ[i] ~= nil do
    local s = ffi.string(ffi.C.environ[i])
    local k, v = s:match("^([^=]+)=(.*)$")
    if k then env[k] = v end
    i = i + 1
  end
  return env
end

local function self_exe()
  local buf = ffi.new("char[4096]")
  local n = ffi.C.readlink("/proc/self/exe", buf, 4095)
  if n > 0 then return ffi.string(buf, n) end
  return arg and arg[-1] or "lutra"
end

local function gpu_count()
  local ok, device = pcall(require, "lutra.dist.device")
  return ok and device.device_count() or 0
end

-- Full path of an executable named on PATH (or given with a slash), or nil.
local function find_program(name, path)
  local function executable(p) -- executable, and a file (reading a directory fails)
    if ffi.C.access(p, 1) ~= 0 then return false end
    local f = io.open(p, "rb")
    local ok = f and f:read(1) ~= nil
    if f then f:close() end
    return ok
  end
  if name:find("/", 1, true) then return executable(name) and name or nil end
  for dir in (path or ""):gmatch("[^:]+") do
    if executable(dir .. "/" .. name) then return dir .. "/" .. name end
  end
  return nil
end

-- ---- the command line -------------------------------------------------------------------------

function M.quote(word)
  if word:match("^[%w%-_./=:,+@%%]+$") then return word end
  return "'" .. word:gsub("'", "'\\''") .. "'"
end

local function usage_error(msg) return nil, msg end

-- words -> opts {np, hostfile, repl_on_error, dry_run, stdin, mpirun, mpi_args, recipe, args, help}
function M.parse(words)
  local o = {mpi_args = {}, args = {}}
  local i = 1
  local function value(name, inline)
    if inline then return inline end
    i = i + 1
    if words[i] == nil then return nil end
    return words[i]
  end
  while i <= #words do
    local w = words[i]
    local name, inline = w:match("^(%-%-?[%w%-]+)=(.*)$")
    name = name or w
    if w == "--" then
      i = i + 1
      break
    elseif w == "-h" or w == "--help" then
      o.help = true
    elseif name == "-n" or name == "--np" or name == "-np" then
      local v = value(name, inline)
      if v == nil then return usage_error(name .. " needs a number of ranks") end
      if not v:match("^%d+$") or tonumber(v) < 1 then
        return usage_error(name .. " wants a positive number of ranks, got '" .. v .. "'")
      end
      o.np = tonumber(v)
    elseif name == "--hostfile" then
      o.hostfile = value(name, inline)
      if o.hostfile == nil then return usage_error("--hostfile needs a file") end
      if not read_file(o.hostfile) then return usage_error("cannot read the hostfile '" .. o.hostfile .. "'") end
    elseif w == "--repl-on-error" then
      o.repl_on_error = true
    elseif w == "--dry-run" then
      o.dry_run = true
    elseif name == "--max-restarts" or name == "--min-ranks" then
      local v = value(name, inline)
      if v == nil or not v:match("^%d+$") then return usage_error(name .. " wants a number, got '" .. tostring(v) .. "'") end
      if name == "--max-restarts" then o.max_restarts = tonumber(v) else o.min_ranks = tonumber(v) end
    elseif name == "--stdin" then
      o.stdin = value(name, inline)
      if o.stdin == nil or not (o.stdin == "none" or o.stdin:match("^%d+$")) then
        return usage_error("--stdin wants a rank number or none (OpenMPI 4.1's --stdin all hangs)")
      end
    elseif name == "--mpirun" then
      o.mpirun = value(name, inline)
      if o.mpirun == nil then return usage_error("--mpirun needs a path") end
    elseif name == "--mpi-arg" then
      local v = value(name, inline)
      if v == nil then return usage_error("--mpi-arg needs a word") end
      o.mpi_args[#o.mpi_args + 1] = v
    elseif w:sub(1, 1) == "-" and w ~= "-" then
      return usage_error("unknown option '" .. w .. "' (options go before the recipe; `lutra launch --help`)")
    else
      break
    end
    i = i + 1
  end
  if o.help then return o end
  if o.min_ranks and o.np and o.min_ranks > o.np then
    return usage_error(string.format("--min-ranks %d is more than the %d ranks asked for", o.min_ranks, o.np))
  end
  o.recipe = words[i]
  if o.recipe == nil then return usage_error("no recipe given (usage: lutra launch -n N recipe.lua [args])") end
  if not read_file(o.recipe) then return usage_error("cannot read the recipe '" .. o.recipe .. "'") end
  for j = i + 1, #words do o.args[#o.args + 1] = words[j] end
  return o
end

-- Largest slots= of the hostfile's hosts (nil where none is given).
local function hostfile_slots(path)
  local most
  for line in (read_file(path) or ""):gmatch("[^\n]+") do
    local slots = line:gsub("#.*", ""):match("slots%s*=%s*(%d+)")
    if slots then most = math.max(most or 0, tonumber(slots)) end
  end
  return most
end

-- opts (from parse) and sys = {cpus, cores, gpus, root, exe, mpirun, env, dir, tty} -> argv (a list)
-- and the number of ranks (nil when the hostfile decides).
function M.command(o, sys)
  local env = sys.env
  local np = o.np
  if np == nil and not o.hostfile then np = sys.gpus > 0 and sys.gpus or 1 end
  local argv = {sys.mpirun}
  local function add(...) for _, w in ipairs {...} do argv[#argv + 1] = w end end
  if sys.root then add("--allow-run-as-root") end
  if np then add("-np", tostring(np)) end
  if o.hostfile then add("--hostfile", o.hostfile) end
  if np and not o.hostfile and np > sys.cores then add("--oversubscribe") end
  add("--bind-to", "none")
  -- without --stdin the launcher keeps stdin and lends it to a rank's REPL (lutra.dist.console)
  add("--stdin", o.stdin or "none")
  -- ranks per node: all of them here; with a hostfile at most the largest slot count (the
  -- nodes alike)
  local per_node = np or sys.cores
  if o.hostfile then per_node = math.min(np or math.huge, hostfile_slots(o.hostfile) or sys.cores) end
  local set = {}
  if not env.OMP_NUM_THREADS then set.OMP_NUM_THREADS = tostring(math.max(1, math.floor(sys.cpus / per_node))) end
  if not env.OPENBLAS_NUM_THREADS then set.OPENBLAS_NUM_THREADS = "1" end
  -- the hold file: while it exists (a rank is in a REPL) no rank's watchdog ends the job
  if sys.dir then set.LUTRA_HOLD_FILE = sys.dir .. "/hold" end
  if o.stdin == nil then set.LUTRA_CONSOLE_DIR = sys.dir end
  if o.repl_on_error then set.LUTRA_REPL_ON_ERROR = "1" end
  -- mpirun gives each rank a pty, whatever its own output is: the ranks' progress lines update
  -- in place only where the launcher's stdout is a terminal (lutra.train.progress)
  if sys.tty ~= nil and not env.LUTRA_TTY then set.LUTRA_TTY = sys.tty and "1" or "0" end
  -- restarts: the ranks resume from the latest valid checkpoint; LUTRA_LAUNCH_DIR keeps what
  -- must outlive one attempt (a fault injected once, ranks reported lost)
  if sys.dir then set.LUTRA_LAUNCH_DIR = sys.dir end
  if sys.restart and sys.restart > 0 then
    set.LUTRA_RESTART = tostring(sys.restart)
    set.LUTRA_RESUME = "auto"
  end
  local names = {}
  for k in pairs(env) do
    if FORWARD_NAMES[k] and not set[k] then names[#names + 1] = k end
    for _, p in ipairs(FORWARD_PREFIXES) do
      if k:sub(1, #p) == p and not set[k] then names[#names + 1] = k end
    end
  end
  for k in pairs(set) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add("-x", set[k] and k .. "=" .. set[k] or k) end
  for _, w in ipairs(o.mpi_args) do add(w) end
  add(sys.exe, o.recipe)
  for _, w in ipairs(o.args) do add(w) end
  return argv, np
end

local function command_text(argv)
  local q = {}
  for i, w in ipairs(argv) do q[i] = M.quote(w) end
  return table.concat(q, " ")
end

local function fail(msg, status)
  io.stderr:write("lutra launch: ", msg, "\n")
  return status or 2
end

function M.main(words)
  local o, err = M.parse(words or {})
  if not o then return fail(err .. "\n" .. M.HELP:match("^[^\n]*")) end
  if o.help then
    io.stdout:write(M.HELP, "\n")
    return 0
  end
  local env = M.environment()
  local cpus, cores = M.machine_cores()
  local name = o.mpirun or env.LUTRA_MPIRUN or "mpirun"
  local mpirun = find_program(name, env.PATH)
  if not mpirun and not o.dry_run then
    return fail("cannot find mpirun ('" .. name .. "'): install OpenMPI (apt-get install openmpi-bin) "
      .. "or give its path with --mpirun or LUTRA_MPIRUN")
  end
  local sys = {cpus = cpus, cores = cores, gpus = gpu_count(), root = ffi.C.geteuid() == 0, exe = self_exe(),
               mpirun = mpirun or name, env = env, tty = require("lutra.train.progress").isatty(1)}
  -- a directory for the console (stdin lent to a rank's REPL) and the hold file: visible to
  -- every rank, so in the current directory (shared on clusters) when a hostfile spreads the
  -- ranks over nodes, else in $TMPDIR
  local base = env.LUTRA_TMPDIR or (o.hostfile and ".") or env.TMPDIR or "/tmp"
  local dir = base .. "/.lutra-launch-XXXXXX"
  if not o.dry_run then
    local template = ffi.new("char[?]", #dir + 1, dir)
    if ffi.C.mkdtemp(template) == nil then return fail("cannot create a directory in " .. base, 1) end
    dir = ffi.string(template)
    local ok, why = console.prepare(dir)
    if not ok then
      console.cleanup(dir)
      return fail(why, 1)
    end
  end
  sys.dir = dir
  local argv = M.command(o, sys)
  if o.dry_run then
    io.stdout:write(command_text(argv), "\n")
    return 0
  end
  io.stdout:flush()
  local status, why = console.run(argv, o.stdin == nil and dir or nil)
  -- automatic restart: the same job again from its latest valid checkpoint, with fewer
  -- ranks (down to --min-ranks) when some were reported lost
  local restarts, np = o.max_restarts or 0, select(2, M.command(o, sys))
  local first_np = np
  for k = 1, restarts do
    if status == 0 or not status then break end
    local lost = tonumber(read_file(dir .. "/lost") or "") or 0
    os.remove(dir .. "/lost")
    if lost > 0 and np then
      -- the most ranks left that divide the first count: the layout's dims still fit
      local floor, left = o.min_ranks or np, np - lost
      while left > 0 and first_np % left ~= 0 do left = left - 1 end
      if left < floor then
        io.stderr:write(string.format("lutra launch: %d rank(s) lost; %d left is below --min-ranks %d: giving up\n",
          lost, np - lost, floor))
        break
      end
      np = left
      o.np = np
    end
    io.stderr:write(string.format("lutra launch: the job failed (status %d); restart %d of %d%s, from the latest "
      .. "valid checkpoint\n", status, k, restarts, np and string.format(" on %d ranks", np) or ""))
    sys.restart = k
    argv = M.command(o, sys)
    io.stdout:flush()
    status, why = console.run(argv, o.stdin == nil and dir or nil)
  end
  console.cleanup(dir)
  if not status then return fail(why, 1) end
  return status
end

return M
