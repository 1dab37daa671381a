#!/usr/bin/env bash
# Install the engine with its static front: `engine` (the program users run) built for musl,
# statically linked, beside the engine program `engine-core` and the init program, in DIR.
# The static front starts in about a fifth of the time of the glibc-linked one that
# `cargo build` makes (no dynamic loader; where CPUID traps to a hypervisor, no glibc start-up
# probing the CPU's caches with it): see docs/sandbox.md, "The front".
# Needs rustup (adds the musl target when missing).
# Usage: engine/front/install.sh [DIR]   (default target/static)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-target/static}
triple=$(uname -m)-unknown-linux-musl
target=${CARGO_TARGET_DIR:-target}
if ! rustup target list --installed | grep -qx "$triple"; then
  rustup target add "$triple"
fi
cargo build --release --locked --bin engine-core --bin envfactory-init
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
