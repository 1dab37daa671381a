//! The build's identity, `ENVFACTORY_BUILD`: a digest of what the `engine` front and the
//! engine program (`engine-core`) must agree on (engine/oneshot/mod.rs).
//!
//! Why: the two are separate executables of one package. `cargo build` makes both, but
//! `cargo run` makes only the engine program (and `cargo build --bin engine` only the front),
//! so one can be left from older sources: the engine program then refuses a command line the
//! front hands over, and a daemon refuses to serve the front, instead of one decoding what the
//! other did not write.
//!
//! The digest covers the front, the code both include (`engine/oneshot/`), what that uses of
//! the library (`units.rs`, `text.rs`) and of the sandbox crate (its `src`), the manifests and
//! both lock files (the workspace's and the static front's, `engine/front/`), by path and
//! content (64-bit FNV-1a): the same sources give the same build.
//! Only these: every edit to a file here makes cargo rebuild the whole package (the library
//! too), and a change to the engine program alone changes nothing the two exchange.

use std::path::{Path, PathBuf};

/// What the front and the engine program agree on, relative to the workspace root.
const SOURCES: [&str; 12] = [
    "Cargo.toml",
    "Cargo.lock",
    "engine/build.rs",
    "engine/front.rs",
    "engine/front/Cargo.toml",
    "engine/front/Cargo.lock",
    "engine/front/lib.rs",
    "engine/oneshot",
    "engine/units.rs",
    "engine/text.rs",
    "sandbox/Cargo.toml",
    "sandbox/src",
];

fn main() {
    // The workspace root: the engine's manifest is there, the static front's two levels down
    // (engine/front/Cargo.toml, which builds the same front for musl).
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = if std::env::var("CARGO_PKG_NAME").as_deref() == Ok("engine-front") {
        manifest.join("../..")
    } else {
        manifest
    };
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
