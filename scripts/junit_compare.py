"""Compare the junit XML of a stock and a patched pytest run of the same files (the upstream-test
scripts write ``OUT/<name>-stock.xml`` and ``OUT/<name>-patched.xml``): per-file counts, and every
test whose outcome (passed, skipped, failed, error) differs. Exit status 1 iff any does.

    python scripts/junit_compare.py OUT test/a.py test/b.py
"""

import os
import sys
import xml.etree.ElementTree as ET

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def outcomes(path):
    """{test id: outcome} from one junit XML file (None when pytest wrote none)."""
    if not os.path.exists(path):
        return None
    found = {}
    for case in ET.parse(path).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        marks = (("error", "error"), ("failure", "failed"), ("skipped", "skipped"))
        now = next((o for t, o in marks if t in tags), "passed")
        # pytest can report a test twice (a failure, then an error in teardown): keep the worst
        found[key] = max(found.get(key, now), now, key=RANK.get)
    return found


def counts(found):
    if found is None:
        return "no XML"
    return "/".join(str(sum(o == k for o in found.values())) for k in RANK)


out, files = sys.argv[1], sys.argv[2:]
differ = []
print(f"\n{'file':<28} {'stock p/s/f/e':>16} {'patched p/s/f/e':>16}")
for f in files:
    name = os.path.basename(f)[: -len(".py")]
    stock, patched = (outcomes(os.path.join(out, f"{name}-{m}.xml")) for m in ("stock", "patched"))
    print(f"{name:<28} {counts(stock):>16} {counts(patched):>16}")
    if stock is None or patched is None:
        differ.append(f"{name}: no XML from the {'stock' if stock is None else 'patched'} run")
        continue
    for key in sorted(stock.keys() | patched.keys()):
        a, b = stock.get(key, "absent"), patched.get(key, "absent")
        if a != b:
            differ.append(f"{key}: stock {a}, patched {b}")
print(f"\n{len(differ)} outcome(s) differ" + (":" if differ else ""))
for line in differ:
    print("  " + line)
sys.exit(1 if differ else 0)
