# Prints a C file defining lt_api_cdef_text: lutra.h without preprocessor lines and
# without its C++ guards, as ffi.cdef wants it, with each part it includes
# (#include "lutra/x.h") read in place, in order.
#   awk -f gen_cdef.awk host/include/lutra.h
function emit(file,    line, part) {
  while ((getline line < file) > 0) {
    if (line ~ /^#include "lutra\/[a-z_]+\.h"/) {
      part = line
      sub(/^#include "/, "", part)
      sub(/".*$/, "", part)
      emit(dir "/" part)
      continue
    }
    if (line ~ /^#ifdef __cplusplus/) { skip = 1; continue }
    if (skip && line ~ /^#endif/) { skip = 0; continue }
    if (skip || line ~ /^[ \t]*#/) continue
    gsub(/\\/, "\\\\", line)
    gsub(/"/, "\\\"", line)
    printf "  \"%s\\n\"\n", line
  }
  close(file)
}
BEGIN {
  dir = ARGV[1]
  sub(/\/[^\/]*$/, "", dir)
  print "/* generated from lutra.h and its parts (host/include/lutra/) by cmake/gen_cdef.awk */"
  print "const char lt_api_cdef_text[] ="
  emit(ARGV[1])
  print ";"
  exit
}
