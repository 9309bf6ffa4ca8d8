#!/usr/bin/env bash
# test_plot.sh — `lutra plot` on two synthetic runs (a: loss = 5 exp(-s/20) + 0.1 in the run-dir
# layout, found through `latest`; b: loss = 4 exp(-s/50) + 0.5 with val_loss every 10 steps, a plain
# directory): the terminal plot (lines, braille, legend, plain text in a pipe, colour on request),
# a PNG decoded by python's zlib and struct (not cairo): its size, both series' colours inside the
# axes, a's start above its end and b's end above a's; an SVG parsed by xml.etree: the curves as
# paths in the series' colours, a's path descending, the legend's glyphs, title and desc; --log;
# and the errors (exit 2: usage, a bad --out extension; exit 1: a missing path, no such metric).
# usage: test_plot.sh LUTRA LIBLUTRA
LUTRA=$(realpath "${1:?usage: test_plot.sh path/to/lutra path/to/liblutra.so}")
cd "$(dirname "$0")/../.." || exit 2
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
command -v python3 > /dev/null || { echo "skipped: no python3 (the PNG and SVG readers)"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/a/runs/20261204-163005" "$tmp/b"
ln -s runs/20261204-163005 "$tmp/a/latest"
python3 - "$tmp" <<'EOF' || bad "writing the runs"
import json, math, sys
t = sys.argv[1]
with open(t + "/a/runs/20261204-163005/metrics.jsonl", "w") as a, open(t + "/b/metrics.jsonl", "w") as b:
    for s in range(1, 101):
        a.write(json.dumps({"step": s, "loss": 5 * math.exp(-s / 20) + 0.1, "tokens": s * 1024}) + "\n")
        b.write(json.dumps({"step": s, "loss": 4 * math.exp(-s / 50) + 0.5, "tokens": s * 2048}) + "\n")
        if s % 10 == 0:
            b.write(json.dumps({"step": s, "val_loss": 4 * math.exp(-s / 50) + 0.7}) + "\n")
EOF

# ---- terminal --------------------------------------------------------------------------------
out=$("$LUTRA" plot "$tmp/a" "$tmp/b" --width 60 --height 15)
expect_eq "terminal exit" "$?" "0"
expect_eq "terminal lines: title, 15 rows, axis, x values, 3 legend lines" "$(printf '%s\n' "$out" | wc -l)" "21"
# braille: U+2800..U+28FF, bytes e2 a0..a3 xx
if printf '%s' "$out" | LC_ALL=C grep -q $'\xe2[\xa0-\xa3]'; then ok; else bad "no braille in [$out]"; fi
expect_contains "legend a" "$out" "⣿ a loss"
expect_contains "legend b" "$out" "+ b loss"
expect_contains "legend b val" "$out" "x b val_loss"
expect_eq "plain text in a pipe" "$(printf '%s' "$out" | grep -c $'\e')" "0"
expect_contains "x values" "$(printf '%s\n' "$out" | sed -n 18p)" "100"
col=$("$LUTRA" plot "$tmp/a" "$tmp/b" --width 60 --height 15 --color always)
expect_contains "colour: the first series" "$col" $'\e[38;5;32m'
expect_contains "colour: the second series" "$col" $'\e[38;5;208m'
one=$("$LUTRA" plot "$tmp/a/runs/20261204-163005" --metric loss --height 10 --width 40 --log)
expect_eq "one run, log: lines" "$(printf '%s\n' "$one" | wc -l)" "14"
expect_contains "log title" "$one" "loss by step (log y)"

# ---- PNG ------------------------------------------------------------------------------------------
if ! "$LUTRA" plot "$tmp/a" "$tmp/b" --out "$tmp/c.png" --width 640 --height 400 > "$tmp/png.out" 2>&1 &&
   grep -q "could not be loaded" "$tmp/png.out"; then
  echo "skipped: $(cat "$tmp/png.out")"
  exit 77
fi
expect_contains "png written" "$(cat "$tmp/png.out")" "wrote $tmp/c.png"
png=$(python3 - "$tmp/c.png" <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert depth == 8 and ctype in (2, 6), (depth, ctype)
bpp = 4 if ctype == 6 else 3
raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
for y in range(h):  # PNG's five scanline filters, undone
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
px = lambda x, y: tuple(rows[y][x * bpp:x * bpp + 3])
dark = lambda p: max(p) < 60
# the axes: the row (x axis) and the column (y axis) with the longest dark runs
axis_y = max(range(h), key=lambda y: sum(dark(px(x, y)) for x in range(w)))
axis_x = max(range(w), key=lambda x: sum(dark(px(x, y)) for y in range(h)))
def near(p, c): return sum((p[i] - c[i]) ** 2 for i in range(3)) < 30 ** 2
def pixels(c): return [(x, y) for y in range(axis_y) for x in range(axis_x + 1, w) if near(px(x, y), c)]
a, b = pixels((0x1f, 0x77, 0xb4)), pixels((0xff, 0x7f, 0x0e))
def ends(pts):
    xs = [x for x, _ in pts]
    lo, hi = min(xs), max(xs)
    left = [y for x, y in pts if x <= lo + (hi - lo) * 0.05]
    right = [y for x, y in pts if x >= hi - (hi - lo) * 0.05]
    return sum(left) / len(left), sum(right) / len(right)
(al, ar), (bl, br) = ends(a), ends(b)
print(f"size={w}x{h} axes={axis_x},{axis_y} a={len(a)} b={len(b)} a_starts_higher={al < ar - 100} "
      f"b_ends_higher={br < ar - 20} span={max(x for x, _ in a) - min(x for x, _ in a)}")
EOF
)
echo "png: $png"
expect_contains "png decoded, size" "$png" "size=640x400"
expect_grep "png: first series' pixels" "$png" " a=([5-9][0-9]|[0-9]{3,}) "
expect_grep "png: second series' pixels" "$png" " b=([5-9][0-9]|[0-9]{3,}) "
expect_contains "png: a starts high and ends low" "$png" "a_starts_higher=True"
expect_contains "png: b ends above a" "$png" "b_ends_higher=True"
expect_grep "png: a spans the plot's width" "$png" "span=(4[5-9][0-9]|5[0-9][0-9])"

# ---- SVG ------------------------------------------------------------------------------------------
"$LUTRA" plot "$tmp/a" "$tmp/b" --out "$tmp/c.svg" --smooth 0.5 > /dev/null
expect_eq "svg exit" "$?" "0"
svg=$(python3 - "$tmp/c.svg" <<'EOF'
import re, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
def colour(style):
    m = re.search(r"stroke:rgb\(([\d.]+)%,([\d.]+)%,([\d.]+)%\)", style or "")
    return m and tuple(round(float(v) * 2.55) for v in m.groups())
def near(c, d): return c and all(abs(c[i] - d[i]) <= 2 for i in range(3))
def points(d): return [(float(x), float(y)) for x, y in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", d)]
curves = {}
for p in root.iter(ns + "path"):
    c, pts = colour(p.get("style")), points(p.get("d", ""))
    for name, rgb in (("a", (0x1f, 0x77, 0xb4)), ("b", (0xff, 0x7f, 0x0e)), ("v", (0x2c, 0xa0, 0x2c))):
        if near(c, rgb) and len(pts) > len(curves.get(name, [])):
            curves[name] = pts
a = curves.get("a", [])
glyphs = sum(1 for u in root.iter(ns + "use"))
print(f"a={len(a)} b={len(curves.get('b', []))} v={len(curves.get('v', []))} "
      f"a_descends={bool(a) and a[0][1] < a[-1][1] - 100} a_x_increases={all(p[0] <= q[0] for p, q in zip(a, a[1:]))} "
      f"glyphs={glyphs} title={root.findtext(ns + 'title')!r} desc={root.findtext(ns + 'desc')!r}")
EOF
)
echo "svg: $svg"
expect_contains "svg: a's curve (100 points)" "$svg" "a=100 "
expect_contains "svg: b's curve" "$svg" " b=100 "
expect_contains "svg: val_loss (10 points)" "$svg" " v=10 "
expect_contains "svg: a descends" "$svg" "a_descends=True"
expect_contains "svg: x increases" "$svg" "a_x_increases=True"
expect_grep "svg: glyphs of the labels" "$svg" "glyphs=([4-9][0-9]|[0-9]{3,})"
expect_contains "svg: title" "$svg" "title='loss, val_loss by step (smoothed 0.5)'"
expect_contains "svg: legend" "$svg" "desc='a loss; b loss; b val_loss'"

# ---- errors --------------------------------------------------------------------------------------
err=$("$LUTRA" plot "$tmp/nope" 2>&1)
expect_eq "missing path: exit 1" "$?" "1"
expect_contains "missing path: message" "$err" "lutra plot: $tmp/nope: no such file or directory"
err=$("$LUTRA" plot "$tmp/a" --metric grad_norm 2>&1)
expect_eq "no such metric: exit 1" "$?" "1"
expect_contains "no such metric: message" "$err" "no run has grad_norm with a step value (the metrics there: loss, tokens)"
err=$("$LUTRA" plot "$tmp/a" --out "$tmp/c.jpg" 2>&1)
expect_eq "bad extension: exit 2" "$?" "2"
expect_contains "bad extension: message" "$err" "--out $tmp/c.jpg: the file must end in .png or .svg"
err=$("$LUTRA" plot "$tmp/a" "$tmp/b" --metric loss,val_loss 2>&1 > /dev/null)
expect_contains "a metric absent from a run: a note" "$err" "plot: a has no val_loss: skipped"
"$LUTRA" plot > /dev/null 2>&1
expect_eq "no path: exit 2" "$?" "2"
"$LUTRA" plot "$tmp/a" --smooth 1.5 > /dev/null 2>&1
expect_eq "bad --smooth: exit 2" "$?" "2"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
