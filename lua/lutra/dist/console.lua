-- lutra.dist.console — the terminal of `lutra launch`, lent to the rank whose REPL is open.
--
-- mpirun can send stdin to one rank chosen in advance (--stdin R), but which rank will fail
-- or stop in lutra.debug{rank = r} is not known then, and OpenMPI 4.1's --stdin all gives
-- every rank an empty stdin and hangs. So the launcher keeps stdin (mpirun --stdin none) and
-- lends it on request, through files in a directory it creates (LUTRA_CONSOLE_DIR):
--   host      the launcher's host name: ranks on other nodes cannot reach its FIFO
--   input     a FIFO: while a rank reads it, the launcher copies its stdin into it; at the
--             end of input (Ctrl-D on a terminal) it closes it, and that REPL ends
--   request   the lock: the rank that has the terminal created it (O_EXCL: one at a time,
--             the others wait their turn) and removes it when its REPL ends; its line
--             (rank, pid, count) tells the launcher a new request from an old one
-- The REPL's output goes through mpirun's stdout as any output does.
--
-- Rank side: console.attach(rank) -> a function that gives the process its own stdin back
-- (nil when not under the launcher). Launcher side: console.prepare(dir), console.run(argv,
-- dir) runs mpirun, serves the terminal, returns mpirun's exit status; console.cleanup(dir).
local ffi = require "ffi"

local M = {}

pcall(ffi.cdef, [[
struct lutra_pollfd { int fd; short events; short revents; };
int poll(struct lutra_pollfd *fds, unsigned long nfds, int timeout);
long read(int fd, void *buf, size_t count);
long write(int fd, const void *buf, size_t count);
int open(const char *path, int flags, ...);
int close(int fd);
int dup(int fd);
int dup2(int fd, int fd2);
int fcntl(int fd, int cmd, ...);
int isatty(int fd);
int mkfifo(const char *path, unsigned int mode);
int unlink(const char *path);
int rmdir(const char *path);
int gethostname(char *name, size_t len);
int kill(int pid, int sig);
typedef struct { unsigned long val[16]; } lutra_sigset;
int sigemptyset(lutra_sigset *set);
int sigaddset(lutra_sigset *set, int sig);
int sigprocmask(int how, const lutra_sigset *set, lutra_sigset *old);
int signalfd(int fd, const lutra_sigset *mask, int flags);
int getpid(void);
int waitpid(int pid, int *status, int options);
int posix_spawnp(int *pid, const char *file, const void *file_actions, const void *attrp,
                 char *const argv[], char *const envp[]);
typedef void (*lutra_sighandler)(int);
lutra_sighandler signal(int sig, lutra_sighandler handler);
void clearerr(void *stream);
]])
pcall(ffi.cdef, "extern char **environ;")
pcall(ffi.cdef, "extern void *stdin;")

local O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NONBLOCK = 0, 1, 0x40, 0x80, 0x800
local F_GETFD, F_GETFL, F_SETFL, FD_CLOEXEC = 1, 3, 4, 1
local POLLIN, POLLERR, POLLHUP, POLLNVAL = 1, 0x8, 0x10, 0x20
local EINTR, EAGAIN = 4, 11
local WNOHANG = 1
local SIGHUP, SIGINT, SIGPIPE, SIGTERM = 1, 2, 13, 15
local SIG_BLOCK, SIG_SETMASK = 0, 2
local SFD_NONBLOCK, SFD_CLOEXEC = 0x800, 0x80000
local SIG_IGN = ffi.cast("lutra_sighandler", 1)

function M.dir() local d = os.getenv("LUTRA_CONSOLE_DIR") return d ~= "" and d or nil end

-- ---- rank side ---------------------------------------------------------------------------------

local requests = 0 -- made by this process: with the pid, a request's id

local function sleep_ms(ms) ffi.C.poll(nil, 0, ms) end

function M.hostname()
  local buf = ffi.new("char[256]")
  if ffi.C.gethostname(buf, 255) ~= 0 then return "?" end
  return ffi.string(buf)
end

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Asks the launcher for the terminal and makes it this process's stdin (waits for the ranks
-- before it in line, then for the launcher). Returns the function that gives the old stdin
-- back and frees the terminal, and whether the terminal is one (then the REPL shows its
-- prompts); nil when not under `lutra launch`, or on another node.
function M.attach(rank)
  local dir = M.dir()
  if not dir then return nil end
  local host = read_file(dir .. "/host")
  if host and host ~= M.hostname() then
    io.stderr:write("lutra: rank ", tostring(rank), " is on ", M.hostname(), "; the terminal of lutra launch is on ",
                    host, ": this REPL reads its own stdin\n")
    return nil
  end
  io.stdout:flush()
  local lock = dir .. "/request"
  local waited = false
  while true do
    local fd = ffi.C.open(lock, bit.bor(O_WRONLY, O_CREAT, O_EXCL), ffi.cast("int", tonumber("644", 8)))
    if fd >= 0 then
      requests = requests + 1
      local text = string.format("rank %s pid %d request %d\n", tostring(rank or 0), ffi.C.getpid(), requests)
      ffi.C.write(fd, text, #text)
      ffi.C.close(fd)
      break
    end
    if not read_file(dir .. "/host") then return nil end -- the launcher is gone
    if not waited then
      io.stderr:write("lutra: rank ", tostring(rank), " waits for the terminal (another rank's REPL has it)\n")
      waited = true
    end
    sleep_ms(100)
  end
  local fd = ffi.C.open(dir .. "/input", O_RDONLY)
  if fd < 0 then
    os.remove(lock)
    return nil
  end
  local saved = ffi.C.dup(0)
  ffi.C.dup2(fd, 0)
  ffi.C.close(fd)
  ffi.C.clearerr(ffi.C.stdin)
  local restore = function()
    if saved >= 0 then
      ffi.C.dup2(saved, 0)
      ffi.C.close(saved)
    end
    ffi.C.clearerr(ffi.C.stdin)
    os.remove(lock)
  end
  return restore, read_file(dir .. "/tty") ~= nil
end

-- ---- launcher side ------------------------------------------------------------------------------

-- Writes all n bytes; false when the reader is gone.
local function write_all(fd, buf, n)
  local done = 0
  while done < n do
    local w = ffi.C.write(fd, buf + done, n - done)
    if w < 0 then
      local e = ffi.errno()
      if e ~= EINTR and e ~= EAGAIN then return false end
    else
      done = done + w
    end
  end
  return true
end

-- Decodes a wait status: exit code, or 128 + signal.
local function exit_code(status)
  local sig = bit.band(status, 0x7f)
  if sig == 0 then return bit.band(bit.rshift(status, 8), 0xff) end
  return 128 + sig
end

-- Creates the FIFO and the host file in dir (made by the caller).
function M.prepare(dir)
  if ffi.C.mkfifo(dir .. "/input", tonumber("600", 8)) ~= 0 then
    return nil, "cannot create the FIFO " .. dir .. "/input"
  end
  local f = io.open(dir .. "/host", "w")
  if not f then return nil, "cannot write in " .. dir end
  f:write(M.hostname())
  f:close()
  if ffi.C.isatty(0) == 1 then io.open(dir .. "/tty", "w"):close() end
  return true
end

-- Starts argv (argv[1] is found on PATH): its pid, or nil and a message.
local function spawn(argv)
  local cargv = ffi.new("char *[?]", #argv + 1)
  local keep = {}
  for i, w in ipairs(argv) do
    keep[i] = ffi.new("char[?]", #w + 1, w)
    cargv[i - 1] = keep[i]
  end
  cargv[#argv] = nil
  -- a closed stdin (`<&-`) would let the next open() take fd 0: give it /dev/null
  if ffi.C.fcntl(0, F_GETFL) < 0 then ffi.C.open("/dev/null", O_RDONLY) end
  local pid = ffi.new("int[1]")
  local rc = ffi.C.posix_spawnp(pid, argv[1], nil, nil, cargv, ffi.C.environ)
  if rc ~= 0 then return nil, "cannot start " .. argv[1] .. " (error " .. rc .. ")" end
  return pid[0]
end

-- After the spawn (a child inherits ignored signals): Ctrl-C reaches mpirun, which stops
-- the job, while this process waits for it as system() does; SIGTERM and SIGHUP (kill,
-- a closed terminal) are blocked and read from a signalfd, to be passed on to mpirun,
-- never leaving it behind. Returns what restore_signals puts back.
local function take_signals()
  local saved = {int = ffi.C.signal(SIGINT, SIG_IGN), pipe = ffi.C.signal(SIGPIPE, SIG_IGN)}
  local forward, old_mask = ffi.new("lutra_sigset"), ffi.new("lutra_sigset")
  ffi.C.sigemptyset(forward)
  ffi.C.sigaddset(forward, SIGTERM)
  ffi.C.sigaddset(forward, SIGHUP)
  ffi.C.sigprocmask(SIG_BLOCK, forward, old_mask)
  saved.mask = old_mask
  saved.sigfd = ffi.C.signalfd(-1, forward, bit.bor(SFD_NONBLOCK, SFD_CLOEXEC))
  saved.siginfo = ffi.new("uint32_t[32]") -- struct signalfd_siginfo: 128 bytes, ssi_signo first
  return saved
end

local function restore_signals(saved)
  if saved.sigfd >= 0 then ffi.C.close(saved.sigfd) end
  ffi.C.sigprocmask(SIG_SETMASK, saved.mask, nil)
  ffi.C.signal(SIGINT, saved.int)
  ffi.C.signal(SIGPIPE, saved.pipe)
end

-- Passes a pending SIGTERM or SIGHUP on to pid.
local function forward_signal(saved, pid)
  if saved.sigfd >= 0 and ffi.C.read(saved.sigfd, saved.siginfo, 128) == 128 then ffi.C.kill(pid, saved.siginfo[0]) end
end

-- The terminal being lent: out, the FIFO's write end while a REPL has it (else -1);
-- current, the request being served; served, the request whose input ended (its rank is
-- letting go of it).
local function new_terminal(dir)
  local stdin_tty = ffi.C.isatty(0) == 1
  -- a pipe or file at its end: later REPLs get end of input at once. A stdin marked
  -- close-on-exec is not the user's: with stdin closed the host's own wake-up pipe took fd 0
  local stdin_done = bit.band(ffi.C.fcntl(0, F_GETFD), FD_CLOEXEC) ~= 0
  return {dir = dir, out = -1, served = nil, current = nil, stdin_tty = stdin_tty, stdin_done = stdin_done,
          buf = ffi.new("char[4096]"), pfd = ffi.new("struct lutra_pollfd[1]")}
end

-- Opens the FIFO for a new request once its rank opened it (its id line is complete).
local function lend_terminal(term)
  local dir = term.dir
  local requested = dir and read_file(dir .. "/request")
  if requested and requested:sub(-1) ~= "\n" then requested = nil end
  if term.out < 0 and requested and requested ~= term.served then
    local fd = ffi.C.open(dir .. "/input", bit.bor(O_WRONLY, O_NONBLOCK)) -- fails until the rank opened it
    if fd >= 0 then
      ffi.C.fcntl(fd, F_SETFL, ffi.cast("int", bit.band(ffi.C.fcntl(fd, F_GETFL), bit.bnot(O_NONBLOCK))))
      term.out, term.current = fd, requested
      if term.stdin_done then
        ffi.C.close(term.out)
        term.out, term.served = -1, requested
      end
    end
  end
end

-- Copies what stdin has (waiting up to 100 ms) into the FIFO; ends the REPL's input when
-- its reader is gone or stdin ends.
local function copy_input(term)
  local pfd = term.pfd
  pfd[0].fd, pfd[0].events, pfd[0].revents = 0, POLLIN, 0
  local ready = ffi.C.poll(pfd, 1, 100)
  if ready > 0 and bit.band(pfd[0].revents, bit.bor(POLLIN, POLLERR, POLLHUP, POLLNVAL)) ~= 0 then
    local n = ffi.C.read(0, term.buf, 4096)
    if n > 0 then
      if not write_all(term.out, term.buf, n) then
        ffi.C.close(term.out)
        term.out, term.served = -1, term.current
      end
    elseif n == 0 or ffi.errno() ~= EINTR then
      -- Ctrl-D on a terminal ends this REPL only; a pipe's end is the end of all input
      ffi.C.close(term.out)
      term.out, term.served = -1, term.current
      term.stdin_done = not term.stdin_tty
    end
  end
end

-- Runs argv (argv[1] is found on PATH) and serves the console in dir while it runs;
-- returns its exit status.
function M.run(argv, dir)
  local pid, err = spawn(argv)
  if not pid then return nil, err end
  local saved = take_signals()
  local status = ffi.new("int[1]")
  local term = new_terminal(dir)
  local result
  while true do
    forward_signal(saved, pid)
    local w = ffi.C.waitpid(pid, status, WNOHANG)
    if w == pid then
      result = exit_code(status[0])
      break
    elseif w < 0 and ffi.errno() ~= EINTR then
      result = 1
      break
    end
    lend_terminal(term)
    if term.out >= 0 then
      copy_input(term)
    else
      sleep_ms(100)
    end
  end
  if term.out >= 0 then ffi.C.close(term.out) end
  restore_signals(saved)
  return result
end

-- Removes the directory's files and the directory.
function M.cleanup(dir)
  for _, name in ipairs {"input", "request", "hold", "host", "tty"} do ffi.C.unlink(dir .. "/" .. name) end
  ffi.C.rmdir(dir)
end

return M
