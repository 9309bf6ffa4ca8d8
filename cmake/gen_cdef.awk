# Prints a C file defining lt_api_cdef_text: lutra.h without preprocessor lines and
# without its C++ guards, as ffi.cdef wants it.
BEGIN { print "/* generated from lutra.h by cmake/gen_cdef.awk */"; print "const char lt_api_cdef_text[] =" }
/^#ifdef __cplusplus/ { skip = 1; next }
skip && /^#endif/ { skip = 0; next }
skip || /^[ \t]*#/ { next }
{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "  \"%s\\n\"\n", $0 }
END { print ";" }
