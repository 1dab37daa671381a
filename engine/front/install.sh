#!/usr/bin/env bash
# Install the engine with its static front: `engine` (the program users run) built for musl,
# statically linked, beside the engine program `engine-core` and the init program, in DIR.
# The static front starts in 0.13-0.22 ms where the glibc-linked one that `cargo build` makes
# takes 0.82-0.85 (no dynamic loader; no glibc start-up probing the CPU with CPUID, which
# traps to the hypervisor in a virtual machine): see docs/sandbox.md, "The static front".
# Needs rustup (adds the musl target when missing). A later `cargo build` that remakes the
# engine program leaves DIR's link on the old file: run this again (a daemon serves a front
# only when the engine program beside it is the daemon's own file).
# Usage: engine/front/install.sh [DIR]   (default target/static)
set -euo pipefail
# DIR as given, from the caller's directory.
dir=$(realpath -m "${1:-$(dirname "$0")/../../target/static}")
target=$(realpath -m "${CARGO_TARGET_DIR:-$(dirname "$0")/../../target}")
cd "$(dirname "$0")/../.."
triple=$(uname -m)-unknown-linux-musl
if ! rustup target list --installed | grep -x "$triple" >/dev/null; then
  rustup target add "$triple"
fi
cargo build --release --locked --bin engine-core --bin envfactory-init --target-dir "$target"
cargo build --release --locked --manifest-path engine/front/Cargo.toml --target "$triple" \
  --target-dir "$target"
mkdir -p "$dir"
# Hard links where DIR is on the same filesystem (the engine program is large), else copies;
# each replaced whole, never written over while it may run.
for bin in engine-core envfactory-init; do
  ln -f "$target/release/$bin" "$dir/$bin" 2>/dev/null || install -m 755 "$target/release/$bin" "$dir/$bin"
done
install -m 755 "$target/$triple/release/engine" "$dir/engine"
echo "installed $dir/engine (static front), $dir/engine-core, $dir/envfactory-init"
