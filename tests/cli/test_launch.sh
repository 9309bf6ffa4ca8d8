#!/usr/bin/env bash
# test_launch.sh — `lutra launch` without running a job: --help, the mpirun command line of
# --dry-run (ranks, oversubscription, threads per rank, forwarded environment, root, hostfile,
# --repl-on-error's environment, recipe arguments), bad command lines (status 2 and a
# message); lutra.dist.device's choice of device (launcher environment and GPU count
# mocked), the rank in the REPL prompt, lutra.dist.inspect.shard_info.
# usage: test_launch.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_launch.sh path/to/lutra path/to/liblutra.so}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
expect_nogrep() { if printf '%s\n' "$2" | grep -qE -- "$3"; then bad "$1: [$2] matches /$3/"; else ok; fi; }
# launch ARGS...: stdout in $out, stderr in $err, status in $st (no OMP_NUM_THREADS, no MPI world)
launch() {
  env -u OMP_NUM_THREADS -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u LUTRA_DEVICE \
    "$LUTRA" launch "$@" >"$T/out" 2>"$T/err"
  st=$?
  out=$(cat "$T/out")
  err=$(cat "$T/err")
}
recipe="$T/my recipe.lua"
echo 'print("hi")' >"$recipe"

# ---- --help ----------------------------------------------------------------------------------
launch --help
expect_eq "--help status" "$st" "0"
expect_grep "--help usage line" "$out" '^usage: lutra launch \[-n N\] \[--hostfile FILE\] \[--repl-on-error\] \[--dry-run\]'
expect_grep "--help explains --repl-on-error" "$out" 'repl-on-error +a rank that raises an error opens the REPL'
expect_grep "--help explains threads" "$out" 'OMP_NUM_THREADS = cores / ranks per node'
launch -h
expect_eq "-h status" "$st" "0"

# ---- --dry-run: the mpirun command ---------------------------------------------------------------
launch -n 1000 --dry-run "$recipe" --lr=3e-4 'two words'
expect_eq "dry-run status" "$st" "0"
expect_grep "dry-run: mpirun first" "$out" '^[^ ]*mpirun '
expect_grep "dry-run: -np" "$out" ' -np 1000 '
expect_grep "dry-run: more ranks than cores oversubscribe" "$out" ' --oversubscribe '
expect_grep "dry-run: no binding" "$out" ' --bind-to none '
expect_grep "dry-run: the launcher keeps stdin" "$out" ' --stdin none '
expect_grep "dry-run: one thread a rank" "$out" ' -x OMP_NUM_THREADS=1 '
expect_grep "dry-run: BLAS on one thread" "$out" ' -x OPENBLAS_NUM_THREADS(=1)? '
expect_grep "dry-run: the lutra executable runs the recipe" "$out" " $LUTRA '$recipe' --lr=3e-4 'two words'\$"
expect_grep "dry-run: the console directory" "$out" ' -x LUTRA_CONSOLE_DIR=[^ ]*/.lutra-launch-'
expect_grep "dry-run: the hold file" "$out" ' -x LUTRA_HOLD_FILE=[^ ]*/.lutra-launch-[^ ]*/hold '
expect_nogrep "dry-run: no post-mortem without --repl-on-error" "$out" 'LUTRA_REPL_ON_ERROR'
expect_grep "dry-run: output not a terminal, so the ranks' progress is plain lines" "$out" ' -x LUTRA_TTY=0 '
if [ "$(id -u)" = 0 ]; then
  expect_grep "dry-run: root allowed" "$out" ' --allow-run-as-root '
else
  expect_nogrep "dry-run: not root" "$out" 'allow-run-as-root'
fi
launch -n 1 --dry-run "$recipe"
expect_grep "dry-run -n 1" "$out" ' -np 1 '
expect_nogrep "dry-run: one rank does not oversubscribe" "$out" 'oversubscribe'
cores=$("$LUTRA" -e 'print((require("lutra.launch").machine_cores()))')
expect_grep "dry-run: one rank gets every core" "$out" " -x OMP_NUM_THREADS=$cores "
out=$(OMP_NUM_THREADS=3 LUTRA_SOMETHING=x NCCL_DEBUG=INFO "$LUTRA" launch -n=2 --dry-run -- "$recipe")
expect_grep "dry-run: the user's thread count is forwarded, not replaced" "$out" ' -x OMP_NUM_THREADS '
expect_nogrep "dry-run: the user's thread count kept" "$out" 'OMP_NUM_THREADS='
expect_grep "dry-run: LUTRA_* forwarded" "$out" ' -x LUTRA_SOMETHING '
expect_grep "dry-run: NCCL_* forwarded" "$out" ' -x NCCL_DEBUG '
expect_grep "dry-run: -n=2 and --" "$out" ' -np 2 .* '"'$recipe'"'$'
out=$(LUTRA_TTY=1 "$LUTRA" launch -n 2 --dry-run "$recipe")
expect_grep "dry-run: the user's LUTRA_TTY forwarded" "$out" ' -x LUTRA_TTY '
expect_nogrep "dry-run: the user's LUTRA_TTY kept" "$out" 'LUTRA_TTY='
launch -n 2 --repl-on-error --dry-run "$recipe"
expect_grep "repl-on-error: post-mortem asked of every rank" "$out" ' -x LUTRA_REPL_ON_ERROR=1 '
printf 'node1 slots=4\nnode2 slots=4 # comment\n' >"$T/hosts"
launch --hostfile "$T/hosts" -n 8 --dry-run "$recipe"
expect_grep "hostfile passed" "$out" " --hostfile $T/hosts "
expect_nogrep "hostfile: slots decide, no oversubscription" "$out" 'oversubscribe'
launch --hostfile "$T/hosts" --dry-run "$recipe"
expect_nogrep "hostfile without -n: mpirun counts the slots" "$out" ' -np '
launch -n 2 --stdin 1 --mpi-arg --mca --mpi-arg btl --mpi-arg self,tcp --dry-run "$recipe"
expect_grep "--stdin R goes to mpirun" "$out" ' --stdin 1 '
expect_nogrep "--stdin R: no console" "$out" 'LUTRA_CONSOLE_DIR'
expect_grep "--mpi-arg words before the program" "$out" " --mca btl self,tcp $LUTRA "
launch -n 2 --mpirun /bin/true "$recipe"
expect_eq "mpirun's status is the command's (true)" "$st" "0"
launch -n 2 --mpirun /bin/false "$recipe"
expect_eq "mpirun's status is the command's (false)" "$st" "1"

# a GPU machine (4 GPUs and 32 CPUs mocked): one rank per GPU, the CPUs shared among them
out=$("$LUTRA" -e '
local launch = require "lutra.launch"
local function cmd(words, gpus)
  local o = assert(launch.parse(words))
  local argv = launch.command(o, {cpus = 32, cores = 16, gpus = gpus, root = false, exe = "LUTRA", mpirun = "MPIRUN",
                                  env = {}, dir = "/D"})
  return table.concat(argv, " ")
end
print(cmd({"'"$recipe"'"}, 4))
print(cmd({"-n", "2", "'"$recipe"'"}, 4))
print(cmd({"'"$recipe"'"}, 0))' 2>&1)
expect_eq "GPUs: one rank each by default; -n wins; CPU default 1" "$out" "MPIRUN -np 4 --bind-to none --stdin none -x LUTRA_CONSOLE_DIR=/D -x LUTRA_HOLD_FILE=/D/hold -x LUTRA_LAUNCH_DIR=/D -x OMP_NUM_THREADS=8 -x OPENBLAS_NUM_THREADS=1 LUTRA $recipe
MPIRUN -np 2 --bind-to none --stdin none -x LUTRA_CONSOLE_DIR=/D -x LUTRA_HOLD_FILE=/D/hold -x LUTRA_LAUNCH_DIR=/D -x OMP_NUM_THREADS=16 -x OPENBLAS_NUM_THREADS=1 LUTRA $recipe
MPIRUN -np 1 --bind-to none --stdin none -x LUTRA_CONSOLE_DIR=/D -x LUTRA_HOLD_FILE=/D/hold -x LUTRA_LAUNCH_DIR=/D -x OMP_NUM_THREADS=32 -x OPENBLAS_NUM_THREADS=1 LUTRA $recipe"

# ---- bad command lines: status 2 and a message ---------------------------------------------------
launch -n 2
expect_eq "no recipe: status" "$st" "2"
expect_grep "no recipe: message" "$err" 'lutra launch: no recipe given'
launch -n 2 "$T/missing.lua"
expect_eq "missing recipe: status" "$st" "2"
expect_grep "missing recipe: message" "$err" "lutra launch: cannot read the recipe '$T/missing.lua'"
launch -n 0 "$recipe"
expect_eq "-n 0: status" "$st" "2"
expect_grep "-n 0: message" "$err" "wants a positive number of ranks, got '0'"
launch -n two "$recipe"
expect_eq "-n two: status" "$st" "2"
expect_grep "-n two: message" "$err" "got 'two'"
launch --dry-run "$recipe" -n 3
expect_grep "options after the recipe belong to it" "$out" "'$recipe' -n 3\$"
launch -n
expect_eq "-n without a value: status" "$st" "2"
expect_grep "-n without a value: message" "$err" '-n needs a number of ranks'
launch --frobnicate "$recipe"
expect_eq "unknown option: status" "$st" "2"
expect_grep "unknown option: message" "$err" "unknown option '--frobnicate'"
launch --hostfile "$T/nohosts" "$recipe"
expect_eq "missing hostfile: status" "$st" "2"
expect_grep "missing hostfile: message" "$err" "cannot read the hostfile"
launch --stdin all "$recipe"
expect_eq "--stdin all: status" "$st" "2"
launch -n 2 --mpirun "$T/no-mpirun" "$recipe"
expect_eq "mpirun missing: status" "$st" "2"
expect_grep "mpirun missing: message" "$err" "cannot find mpirun .*install OpenMPI"
PATH=/nonexistent "$LUTRA" launch -n 2 "$recipe" >/dev/null 2>"$T/err"
expect_eq "mpirun not on PATH: status" "$?" "2"
expect_grep "mpirun not on PATH: message" "$(cat "$T/err")" "cannot find mpirun \('mpirun'\)"

# ---- lutra.dist.device: LUTRA_DEVICE, else cuda:(local rank % GPUs), else cpu -------------------
out=$(env -u LUTRA_DEVICE "$LUTRA" -e '
local d = require "lutra.dist.device"
local function dev(env, n) return d.default_device {env = env, device_count = n} end
print(dev({}, 0), dev({OMPI_COMM_WORLD_LOCAL_RANK = "3"}, 0))
print(dev({}, 2), dev({OMPI_COMM_WORLD_LOCAL_RANK = "3"}, 2), dev({OMPI_COMM_WORLD_LOCAL_RANK = "1"}, 8))
print(dev({MPI_LOCALRANKID = "5"}, 4), dev({SLURM_LOCALID = "2"}, 4), dev({SLURM_LOCALID = "2", PMIX_RANK = "6"}, 4))
print(dev({LUTRA_DEVICE = "cpu", OMPI_COMM_WORLD_LOCAL_RANK = "1"}, 2), dev({LUTRA_DEVICE = "cuda:3"}, 0),
      dev({LUTRA_DEVICE = "cuda", OMPI_COMM_WORLD_LOCAL_RANK = "5"}, 4))
print(pcall(dev, {LUTRA_DEVICE = "cuda"}, 0))
print(d.world_rank {env = {OMPI_COMM_WORLD_RANK = "3"}}, d.world_size {env = {OMPI_COMM_WORLD_SIZE = "4"}},
      d.world_size {env = {}}, d.local_rank {env = {}})
print(d.default_device())' 2>&1)
expect_eq "default_device" "$out" "cpu	cpu
cuda:0	cuda:1	cuda:1
cuda:1	cuda:0	cuda:2
cpu	cuda:3	cuda:1
false	LUTRA_DEVICE=cuda: no CUDA device is available
3	4	1	nil
cpu"

# ---- the REPL's prompt names the rank in a world of more than one --------------------------------
show='local r = require "lutra.repl" print(r.prompt("debug> ") .. "|" .. r.prompt("> "))'
expect_eq "prompt alone" "$(env -u OMPI_COMM_WORLD_SIZE "$LUTRA" -e "$show")" "debug> |> "
expect_eq "prompt of rank 1 of 2" "$(OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 "$LUTRA" -e "$show")" \
  "debug[rank 1]> |lutra[rank 1]> "

# ---- lutra.debug{rank = r}: bad ranks are errors; alone, rank 0 opens the REPL ---------------------
out=$(printf 'x\n' | env -u OMPI_COMM_WORLD_SIZE "$LUTRA" -e '
local repl = require "lutra.repl"
local function try(...) print((select(2, pcall(repl.debug, ...)))) end
try {rank = 1}
try {rank = -1}
try {rank = 0.5}
try "zero"
local x = 42
repl.debug {rank = 0}' 2>&1)
expect_grep "debug: a rank outside the world" "$out" 'lutra.debug: rank 1 is not in the world of 1'
expect_grep "debug: a negative rank" "$out" 'lutra.debug: rank must be a non-negative integer, got -1'
expect_grep "debug: a fractional rank" "$out" 'got 0.5'
expect_grep "debug: not a table" "$out" 'lutra.debug: expected nothing or \{rank = r\}, got string'
expect_grep "debug{rank = 0} alone opens the REPL" "$out" '^42$'

# ---- lutra.dist.inspect.shard_info -----------------------------------------------------------------
out=$("$LUTRA" -e '
local lt = require "lutra"
local spec = require "lutra.dist.spec"
local inspect = require "lutra.dist.inspect"
local t = lt.zeros(2, 3)
print(inspect.shard_info(t))
spec.set(t, {global = {8, 3}, offset = {4, 0}})
local i = inspect.shard_info(t)
print(i)
print(table.concat(i.shape, ","), table.concat(i.global, ","), table.concat(i.offset, ","), i.dup, i.sharded)
spec.set(t, {global = {2, 3}, dup = true})
print(inspect.shard_info(t))
print(select(2, pcall(inspect.shard_info, 5)):match("shard_info: .*"))' 2>&1)
expect_eq "shard_info" "$out" "local (2, 3) (whole tensor, not sharded)
local (2, 3) of global (8, 3) at offset (4, 0)
2,3	8,3	4,0	false	true
local (2, 3) of global (2, 3) at offset (0, 0) (a copy: another rank owns it)
shard_info: expected a tensor, got number"

# ---- automatic restart: options -------------------------------------------------------------
launch -n 2 --max-restarts 3 --min-ranks 1 --dry-run "$recipe"
expect_eq "restart options: status" "$st" "0"
expect_nogrep "restart options: a first attempt resumes nothing" "$out" 'LUTRA_RESUME'
expect_grep "restart options: the launch dir outlives an attempt" "$out" ' -x LUTRA_LAUNCH_DIR=[^ ]*/.lutra-launch-'
launch -n 2 --max-restarts x "$recipe"
expect_eq "--max-restarts x: status" "$st" "2"
expect_grep "--max-restarts x: says what" "$err" '--max-restarts wants a number'
launch -n 2 --min-ranks 3 "$recipe"
expect_eq "--min-ranks above -n: status" "$st" "2"
expect_grep "--min-ranks above -n: says what" "$err" '--min-ranks 3 is more than the 2 ranks'

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
