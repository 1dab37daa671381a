#![allow(clippy::unwrap_used)]
mod common;
use common::*;

#[test]
fn runs_a_command_in_a_fresh_sandbox() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let r = sh(&mut sb, "echo hello; echo err >&2; hostname; id -u; echo $$; exit 3");
    assert_eq!(r.termination, sandbox::Termination::Exited(3), "{r:?}");
    assert_eq!(out(&r), "hello\nsandbox\n0\n2\n", "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(r.stderr, b"err\n");
}
