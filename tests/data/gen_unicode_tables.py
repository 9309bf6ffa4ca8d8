#!/usr/bin/env python3
"""Writes host/tokenizer_unicode.c: the Unicode classes the GPT-2 pre-tokenizer needs.

    pip install unicodedata2==16.0.0 && python3 tests/data/gen_unicode_tables.py > host/tokenizer_unicode.c
    clang-format -i --style="{BasedOnStyle: LLVM, ColumnLimit: 120}" host/tokenizer_unicode.c

Classes: letter (\\p{L}), number (\\p{N}), whitespace (\\s, the White_Space property, as
Oniguruma and Python's regex module read it) and other. Only code points >= 0x80 are
listed; ASCII is classified inline. Uses unicodedata2 when it is installed, else this Python's
unicodedata. Unicode 16.0 is what Hugging Face's tokenizers 0.23 uses: with it, our splits
equal that library's ByteLevel pre-tokenizer for every code point (checked in context).
"""
try:
    import unicodedata2 as unicodedata
except ImportError:
    import unicodedata

WHITE_SPACE = {*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
               0x205F, 0x3000}


def klass(cp):
    if cp in WHITE_SPACE:
        return 3
    cat = unicodedata.category(chr(cp))
    return 1 if cat[0] == "L" else 2 if cat[0] == "N" else 0


ranges = []
for cp in range(0x80, 0x110000):
    k = klass(cp)
    if not k:
        continue
    if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == k:
        ranges[-1][1] = cp
    else:
        ranges.append([cp, cp, k])

print(f"""/* tokenizer_unicode.c — Unicode classes for the pre-tokenizer (generated, do not edit).
 *
 * Written by tests/data/gen_unicode_tables.py from Unicode {unicodedata.unidata_version}: sorted, disjoint ranges
 * of code points >= 0x80 that are letters (1, \\p{{L}}), numbers (2, \\p{{N}}) or whitespace (3,
 * White_Space); every other code point is class 0. */
#include "tokenizer.h"

// {{first, last, class}}
static const uint32_t ranges[][3] = {{""")
line = "   "
for lo, hi, k in ranges:
    item = f" {{0x{lo:X}, 0x{hi:X}, {k}}},"
    if len(line) + len(item) > 118:
        print(line)
        line = "   "
    line += item
print(line)
print("""};

int lt_tok_unicode_class(uint32_t cp) {
  int lo = 0, hi = (int)(sizeof ranges / sizeof ranges[0]) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (cp < ranges[mid][0]) {
      hi = mid - 1;
    } else if (cp > ranges[mid][1]) {
      lo = mid + 1;
    } else {
      return (int)ranges[mid][2];
    }
  }
  return 0;
}""")
