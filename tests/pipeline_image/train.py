"""Stand-in for the data_pipeline example's ``train.py``: reads the shards prep wrote (checksums
from its manifest) and the gpu check's report; fails (exit 1) when either is missing or wrong.
Writes what it read to /tmp/train-summary.json."""

import argparse
import hashlib
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--data", required=True)
ap.add_argument("--node-report", required=True)
a = ap.parse_args()
try:
    with open(os.path.join(a.data, "MANIFEST.json")) as f:
        manifest = json.load(f)
    for name, digest in manifest.items():
        with open(os.path.join(a.data, name), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                sys.exit(f"train: {name} does not match its checksum")
    with open(a.node_report) as f:
        report = json.load(f)
except OSError as exc:
    sys.exit(f"train: cannot read its input: {exc}")
gpu = next((r for r in report if r.get("check_type") == "gpu"), None)
if gpu is None or gpu.get("status") != "pass":
    sys.exit(f"train: the gpu check did not pass: {gpu}")
summary = {"shards": sorted(manifest), "gpu": gpu.get("detail")}
with open("/tmp/train-summary.json", "w") as f:
    json.dump(summary, f)
print(f"train: read {len(manifest)} shards; {gpu.get('detail')}")
