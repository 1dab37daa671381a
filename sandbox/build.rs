//! Links the C toolchain's unwinder into every binary that uses this crate (`libgcc_eh.a`,
//! what `-static-libgcc` links), so that none of them loads `libgcc_s.so.1` at start.
//!
//! Why: a one-shot `engine sandbox exec` is a whole process start, and every program start
//! counts (docs/sandbox-speed.md, the ninth pass). `libgcc_s.so.1` is one more library for the
//! dynamic loader to map, relocate and bind, and its constructor (`__cpu_indicator_init`)
//! runs `cpuid` several times; on a virtual machine each `cpuid` traps to the hypervisor. The
//! unwinder is the same code either way (Rust's panics, `catch_unwind` and backtraces work as
//! before), only linked statically.
//!
//! The link directive belongs to this crate's library, which comes before the standard
//! library on the linker's command line: the unwinder's symbols are then resolved from the
//! archive, and `--as-needed` (rustc's default) leaves `libgcc_s.so.1` out. Nothing is done
//! off GNU/Linux, for a static C runtime (`crt-static` links it that way already), for a cross
//! build or a linker set apart from rustc's default `cc`, where the toolchain has no
//! `libgcc_eh.a`, or when `ENVFACTORY_DYNAMIC_LIBGCC` is set.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=ENVFACTORY_DYNAMIC_LIBGCC");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    // Only where the C compiler asked below is the one that links: a native build with
    // rustc's default linker (a cross build, or a linker of its own such as clang with
    // compiler-rt, may have no libgcc_eh at all).
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let native = var("HOST") == var("TARGET") && std::env::var_os("RUSTC_LINKER").is_none();
    if var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || crt_static
        || !native
        || std::env::var_os("ENVFACTORY_DYNAMIC_LIBGCC").is_some()
    {
        return;
    }
    // The C compiler that links (rustc's default linker, `cc`, whatever `CC` says) tells
    // where its archive is; it answers the bare name when it has none.
    let cc = "cc";
    let found = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| Path::new(p).is_absolute() && Path::new(p).is_file());
    match found.as_deref().map(Path::new).and_then(Path::parent) {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
        }
        None => println!(
            "cargo:warning=`{cc} -print-file-name=libgcc_eh.a` found no archive: binaries load libgcc_s.so.1"
        ),
    }
}
