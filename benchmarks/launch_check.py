"""Every variant of the shipped search space launched on a llama-server build, one request
each: that the build takes the flags spec-tuner gives it and drafts with the per-request
fields (a build of ik_llama.cpp's head, say, before its help text is saved for the tests).

Usage: python benchmarks/launch_check.py LLAMA_SERVER [--out FILE.json]
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tuner.tuning.config import load_tuning
from tuner.tuning.variants import grid, request_fields
from tuner.upstream.capabilities import probe_capabilities
from tuner.upstream.launch import default_model_path
from tuner.upstream.process import free_port

binary = Path(sys.argv[1])
out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
caps = probe_capabilities(binary)
model = default_model_path()
rows = []
prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
for variant in grid(load_tuning().search, caps):
    port = free_port()
    flags = variant.flags(caps, per_request=True)
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--port",
        str(port),
        "-t",
        "2",
        "-c",
        "4096",
        "--no-context-shift",
        *flags,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ok, drafted, why = False, None, ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        if proc.poll() is not None:
            why = (proc.stderr.read() or "")[-300:]
        else:
            body = {"prompt": prompt, "n_predict": 32, "temperature": 0, **request_fields(variant)}
            r = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=120)
            ok = r.status_code == 200
            t = r.json().get("timings", {}) if ok else {}
            drafted = (t.get("draft_n"), t.get("draft_n_accepted"))
            why = "" if ok else r.text[:200]
    finally:
        proc.kill()
        proc.wait()
    rows.append(
        {"variant": variant.name, "flags": flags, "ok": ok, "drafted_accepted": drafted, "why": why}
    )
    print(variant.name, ok, drafted, why.replace("\n", " ")[:200], flush=True)
summary = {"commit": caps.commit, "variants": len(rows), "launched": sum(r["ok"] for r in rows)}
print(json.dumps(summary))
if out is not None:
    out.write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")
