"""apply.py FILE OLD NEW: replaces the one occurrence of OLD in FILE by NEW ("\\n" in either
stands for a newline). Exits 1, changing nothing, when OLD is not in FILE exactly once."""
import sys

path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path, encoding="utf-8").read()
count = text.count(old)
if count != 1:
    sys.stderr.write(f"apply.py: {path} holds the text {count} times (expected once): {old!r}\n")
    sys.exit(1)
open(path, "w", encoding="utf-8").write(text.replace(old, new))
