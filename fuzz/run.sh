#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 300), keeping and minimising the corpus.
# Works on the stable toolchain: cargo-fuzz with `-s none` (coverage instrumentation without
# sanitizers; Rust bounds checks plus overflow checks and debug assertions (`-a`) catch
# memory and arithmetic errors). Crashes land in fuzz/artifacts/<target>/; each one found
# becomes a regression test in crates/treepack/tests/hostile.rs.
#   usage: fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-300}"; shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(manifest directory single_file keypath codec parts repo safetensors gguf signature transport encrypted); fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# The kept corpus (minimised with `cargo fuzz cmin`) lives compressed in corpus.tar.xz; re-pack it
# after a run with: cargo fuzz cmin -s none -a <target> corpus/<target>; tar -cJf corpus.tar.xz corpus
if [ ! -d corpus/manifest ]; then
  if [ -f corpus.tar.xz ]; then tar -xJf corpus.tar.xz; else ../.venv/bin/python make_seeds.py; fi
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  # GGUF's seed: the file gguf-py wrote for the engine's tests.
  if [ "$t" = gguf ] && [ -z "$(ls -A corpus/gguf)" ]; then cp ../crates/treepack/tests/data/gguf/*.gguf corpus/gguf/; fi
  echo "== fuzz $t for ${secs}s"
  cargo fuzz run -s none -a "$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 2>&1 \
    | grep -E "^(#[0-9]+.*(DONE|pulse)|stat::|==|SUMMARY|panicked|Test unit written)" | tail -12
done
