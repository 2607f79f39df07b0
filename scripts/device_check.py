"""Helpers of scripts/device_check.sh and scripts/fetch_device_wheels.sh (no dependency beyond Python).

  python scripts/device_check.py wheels [--strict]   the .whl/ folder against requirements-device.txt: one wheel
                                                     per pin, CPython 3.12-compatible, manylinux x86_64; sizes
  python scripts/device_check.py gpu-files DIR...    test files with a ``gpu`` mark outside DIRs (one a line)
  python scripts/device_check.py summary OUT MODE    OUT/summary.json from OUT/steps.tsv, OUT/junit_*.xml and
                                                     OUT/bench.json; printed too
"""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def pins(path: str = os.path.join(ROOT, "requirements-device.txt")) -> dict[str, str]:
    out = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
        if m is None:
            raise SystemExit(f"requirements-device.txt: {line!r} is not an exact pin (NAME==VERSION)")
        if _norm(m[1]) in out:
            raise SystemExit(f"requirements-device.txt: {m[1]} pinned twice")
        out[_norm(m[1])] = m[2]
    return out


def _wheel_ok(fname: str) -> str | None:
    """Why a wheel file cannot install on CPython 3.12 / manylinux x86_64 (None: it can)."""
    parts = fname[:-4].split("-")
    if len(parts) < 5:
        return "not a wheel file name"
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    pys = py.split(".")
    if not any(p in ("cp312", "py3", "py2.py3") or (p.startswith("cp3") and abi == "abi3" and int(p[3:]) <= 12)
               for p in pys):
        return f"python tag {py} does not run on CPython 3.12"
    if abi not in ("none", "abi3", "cp312"):
        return f"abi tag {abi}"
    plats = plat.split(".")
    if not any(p == "any" or (p.startswith("manylinux") and p.endswith("x86_64")) for p in plats):
        return f"platform tag {plat}"
    return None


def wheels(strict: bool) -> int:
    want = pins()
    folder = os.path.join(ROOT, ".whl")
    if not os.path.isdir(folder):
        print(f"no .whl/ folder ({len(want)} pins): run scripts/fetch_device_wheels.sh")
        return 1 if strict else 0
    files = sorted(f for f in os.listdir(folder) if f.endswith(".whl"))
    found: dict[str, list[str]] = {}
    problems = []
    for f in files:
        name, version = f.split("-")[:2]
        found.setdefault(_norm(name), []).append(f)
        if _norm(name) not in want:
            problems.append(f"{f}: not in requirements-device.txt")
        elif want[_norm(name)] != version:
            problems.append(f"{f}: version {version}, pinned {want[_norm(name)]}")
        why = _wheel_ok(f)
        if why:
            problems.append(f"{f}: {why}")
    for name in want:
        if len(found.get(name, [])) != 1:
            problems.append(f"{name}: {len(found.get(name, []))} wheels (want exactly one)")
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f".whl/: {len(files)} wheels, {size} bytes ({size / 2**20:.1f} MiB) for {len(want)} pins")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def gpu_files(exclude: list[str]) -> int:
    ex = [os.path.normpath(os.path.join(ROOT, d)) for d in exclude]
    pat = re.compile(r"(pytest\.)?mark\.gpu\b|pytestmark\s*=.*\bgpu\b")
    for dirpath, _, names in sorted(os.walk(os.path.join(ROOT, "tests"))):
        if any(os.path.normpath(dirpath).startswith(e) for e in ex):
            continue
        for n in sorted(names):
            if n.startswith("test_") and n.endswith(".py"):
                p = os.path.join(dirpath, n)
                if pat.search(open(p, encoding="utf-8").read()):
                    print(os.path.relpath(p, ROOT))
    return 0


def junit_counts(path: str) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in c:
            c[k] += int(s.get(k, 0))
    c["passed"] = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    failed = [f"{tc.get('classname')}::{tc.get('name')}" for s in suites for tc in s.iter("testcase")
              if tc.find("failure") is not None or tc.find("error") is not None]
    c["failed_tests"] = failed[:50]
    return c


def summary(out: str, mode: str) -> int:
    res: dict = {"mode": mode, "steps": {}}
    steps = os.path.join(out, "steps.tsv")
    if os.path.exists(steps):
        for line in open(steps):
            name, status, seconds, reason = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
            res["steps"][name] = {"status": status, "seconds": float(seconds or 0), "reason": reason}
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"junit_(\w+)\.xml", name)
        if m:
            try:
                res["steps"].setdefault(f"tests_{m[1]}", {})["junit"] = junit_counts(os.path.join(out, name))
            except ET.ParseError as e:
                res["steps"].setdefault(f"tests_{m[1]}", {})["junit"] = {"error": f"unreadable junit file: {e}"}
    bench = os.path.join(out, "bench.json")
    if os.path.exists(bench):
        b = json.load(open(bench))
        res["bench"] = b
        res["checks"] = {m: e.get("checks") for m, e in b.get("models", {}).items() if e.get("checks")}
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for s in res["steps"].values():
        j = s.get("junit") or {}
        totals["passed"] += j.get("passed", 0)
        totals["failed"] += j.get("failures", 0) + j.get("errors", 0)
        totals["skipped"] += j.get("skipped", 0)
    res["tests_total"] = totals
    res["failed_steps"] = [n for n, s in res["steps"].items() if s.get("status") == "failed"]
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "bench"}, indent=1))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "wheels":
        return wheels("--strict" in rest)
    if cmd == "gpu-files":
        return gpu_files(rest)
    if cmd == "summary":
        return summary(rest[0], rest[1])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
