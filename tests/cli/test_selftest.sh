#!/usr/bin/env bash
# test_selftest.sh — `lutra selftest`'s exit status says what happened: 77 (ctest's skip)
# only where there is no GPU to test (none visible, no driver, or a build without CUDA);
# a driver that is there but fails is a failure, and so is "no GPU" under LUTRA_REQUIRE_GPU=1.
# CUDA_VISIBLE_DEVICES= hides every GPU, so each case runs on any machine; the broken driver
# is tests/cli/fake_libcuda.c (built into LUTRA_FAKE_LIBCUDA_DIR), loaded only by CUDA builds.
# usage: test_selftest.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_selftest.sh path/to/lutra path/to/liblutra.so}")
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

# no GPU visible: skipped, saying why
out=$(CUDA_VISIBLE_DEVICES= LUTRA_REQUIRE_GPU= "$LUTRA" selftest 2>&1)
expect_eq "no GPU: exit 77" "$?" "77"
expect_grep "no GPU: says skipped and why" "$out" '^selftest: skipped: no GPU to test \(.+\)$'
avail=$(CUDA_VISIBLE_DEVICES= "$LUTRA" -e 'io.write(require("lutra").cuda.availability())' 2>/dev/null)
expect_grep "no GPU: availability" "$avail" '^(no device|not built)$'

# LUTRA_REQUIRE_GPU=1 (GPU machines): no GPU is a failure
out=$(CUDA_VISIBLE_DEVICES= LUTRA_REQUIRE_GPU=1 "$LUTRA" selftest 2>&1)
expect_eq "LUTRA_REQUIRE_GPU=1 without a GPU: exit 1" "$?" "1"
expect_grep "LUTRA_REQUIRE_GPU=1: says why" "$out" '^selftest: FAILED: no GPU to test \(.+\) and LUTRA_REQUIRE_GPU=1$'
out=$(CUDA_VISIBLE_DEVICES= LUTRA_REQUIRE_GPU=0 "$LUTRA" selftest 2>&1)
expect_eq "LUTRA_REQUIRE_GPU=0 is off" "$?" "77"

# a driver that is there but too old: a failure that names it
if [ "$("$LUTRA" -e 'io.write(require("lutra").cuda.availability())' 2>/dev/null)" = "not built" ]; then
  out=$(LD_LIBRARY_PATH="$LUTRA_FAKE_LIBCUDA_DIR" "$LUTRA" selftest 2>&1)
  expect_eq "a build without CUDA ignores any driver: exit 77" "$?" "77"
else
  [ -f "${LUTRA_FAKE_LIBCUDA_DIR:-}/libcuda.so.1" ] && ok || bad "LUTRA_FAKE_LIBCUDA_DIR has no libcuda.so.1 (${LUTRA_FAKE_LIBCUDA_DIR:-unset})"
  out=$(LD_LIBRARY_PATH="$LUTRA_FAKE_LIBCUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$LUTRA" selftest 2>&1)
  expect_eq "broken driver: exit 1" "$?" "1"
  expect_grep "broken driver: says why" "$out" '^selftest: FAILED: the CUDA driver does not work: CUDA driver too old: supports CUDA 9\.0'
  avail=$(LD_LIBRARY_PATH="$LUTRA_FAKE_LIBCUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$LUTRA" -e 'io.write(require("lutra").cuda.availability())' 2>/dev/null)
  expect_eq "broken driver: availability" "$avail" "broken"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
