#!/usr/bin/env bash
# Thin wrapper around run_poc.py (the whole NVFlare POC cycle: prepare, start, submit, wait, fetch, verify,
# stop, clean). Arguments pass through, e.g.
#     poc_workspace/run_poc.sh --job jobs/fedavg --out runs/poc/report.json
# PYTHON picks the interpreter (default: python3 on PATH, which must have fedseg and nvflare installed).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" >/dev/null 2>&1 && pwd)"
exec "${PYTHON:-python3}" "$HERE/run_poc.py" "$@"
