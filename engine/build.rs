//! The build's identity, `ENVFACTORY_BUILD`: a digest of the sources the `engine` front and the
//! engine program (`engine-core`) are built from (engine/oneshot/mod.rs).
//!
//! Why: the two are separate executables of one package. `cargo build` makes both, but
//! `cargo run` makes only the one it runs, so the other can be left from older sources: the
//! front then refuses to hand over to the engine program, and a daemon refuses to serve the
//! front, instead of one running or decoding what the other did not write.
//!
//! The digest covers this package's sources and those of the workspace's crates (their
//! `src`, `Cargo.toml` and the sandbox crate's policies), the manifest and the lock file, by
//! path and content (64-bit FNV-1a): the same sources give the same build.

use std::path::{Path, PathBuf};

/// What the binaries are built from, relative to the workspace root.
const SOURCES: [&str; 10] = [
    "Cargo.toml",
    "Cargo.lock",
    "engine",
    "sandbox/Cargo.toml",
    "sandbox/src",
    "sandbox/policy",
    "policies/Cargo.toml",
    "policies/src",
    "actors/Cargo.toml",
    "actors/src",
];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut files = Vec::new();
    for s in SOURCES {
        let p = root.join(s);
        println!("cargo:rerun-if-changed={}", p.display());
        walk(&p, &mut files);
    }
    files.sort();
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for f in &files {
        // An unreadable file counts by its name alone (the compiler reports it, if it is used).
        let body = std::fs::read(f).unwrap_or_default();
        let rel = f.strip_prefix(&root).unwrap_or(f);
        h.write(rel.as_os_str().as_encoded_bytes());
        h.write(&(body.len() as u64).to_le_bytes());
        h.write(&body);
    }
    println!("cargo:rustc-env=ENVFACTORY_BUILD={:016x}", h.0);
}

/// The files under `p` (or `p`, a file); a link is read as its file, never followed into a
/// directory.
fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return;
    };
    if m.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            walk(&e.path(), out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}

struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
