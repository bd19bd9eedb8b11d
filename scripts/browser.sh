#!/usr/bin/env bash
# Install the browser the viewer's page is tested in (python/tests/test_view_browser.py): headless
# Chromium and its WebDriver from Debian's packages (`chromium`, `chromium-driver`), so nothing is
# downloaded when the tests run. Needs root or passwordless sudo; safe to re-run.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "browser ready: $(command -v chromium) $(command -v chromedriver)"
  exit 0
fi
if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "error: chromium/chromium-driver are missing and apt-get needs root: install them (apt-get install chromium chromium-driver)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
# CI (TREEPACK_LEAN_DISK) keeps no copy of the packages it installed (~0.1 GB in apt's cache).
if [ -n "${TREEPACK_LEAN_DISK:-}" ]; then "${sudo[@]}" apt-get clean; fi
echo "browser ready: $(command -v chromium) $(command -v chromedriver)"
