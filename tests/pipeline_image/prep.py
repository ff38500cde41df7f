"""Stand-in for the data_pipeline example's ``prep.py`` (registry.example.com/team/train:1.0):
writes three shards and a manifest with their checksums under ``--out``."""

import argparse
import hashlib
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
manifest = {}
for i in range(3):
    data = f"shard {i} written by {os.environ.get('HOSTNAME', '?')}\n".encode() * 100
    with open(os.path.join(a.out, f"shard-{i}.txt"), "wb") as f:
        f.write(data)
    manifest[f"shard-{i}.txt"] = hashlib.sha256(data).hexdigest()
with open(os.path.join(a.out, "MANIFEST.json"), "w") as f:
    json.dump(manifest, f)
print(f"prep: wrote {len(manifest)} shards to {a.out}")
