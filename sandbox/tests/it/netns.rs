//! Network namespaces made ahead of time (`sandbox/src/netns.rs`): each goes to one sandbox
//! only, so nothing one sandbox does to its network (a TCP listener, an abstract unix socket)
//! is visible to any other, before or after it is dropped.

use crate::common::{config, out, require_root, runtime, sh};
use sandbox::testing::eventually;

/// A listener on 127.0.0.1:5555 and on the abstract unix socket `@envfactory-leak`, left
/// running in the background (it survives the step, as a daemon would).
const LISTEN: &str = "setsid python3 -c '
import socket, time
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((\"127.0.0.1\", 5555)); t.listen()
u = socket.socket(socket.AF_UNIX); u.bind(\"\\0envfactory-leak\"); u.listen()
open(\"/tmp/listening\", \"w\").close()
time.sleep(600)' </dev/null >/dev/null 2>&1 &
for i in $(seq 100); do [ -e /tmp/listening ] && break; sleep 0.05; done; echo started";

/// What a sandbox can reach of those listeners, and its namespace.
const PROBE: &str = "python3 -c '
import socket
for fam, addr in ((socket.AF_INET, (\"127.0.0.1\", 5555)), (socket.AF_UNIX, \"\\0envfactory-leak\")):
    s = socket.socket(fam)
    try:
        s.connect(addr); print(\"reached\")
    except OSError as e:
        print(\"refused\" if e.errno == 111 else e)
'; grep -c '0100007F:15B3 00000000:0000 0A' /proc/net/tcp; readlink /proc/self/ns/net";

#[test]
fn a_listener_in_one_sandbox_is_never_visible_in_another() {
    require_root!();
    let rt = runtime();
    // The reserve starts at a runtime's second sandbox; wait until one is ready, so the next
    // sandboxes enter namespaces made ahead.
    let _first = rt.create(&config()).unwrap();
    let _second = rt.create(&config()).unwrap();
    assert!(
        eventually(10, || rt.netns_ready() >= 1),
        "no network namespace was made ahead"
    );
    let mut a = rt.create(&config()).unwrap();
    assert_eq!(out(&sh(&mut a, LISTEN)), "started\n");
    let seen_by_a = out(&sh(&mut a, PROBE));
    let mut lines = seen_by_a.lines();
    assert_eq!(lines.next(), Some("reached"), "{seen_by_a}");
    assert_eq!(lines.next(), Some("reached"), "{seen_by_a}");
    assert_eq!(lines.next(), Some("1"), "{seen_by_a}");
    let ns_a = lines.next().unwrap().to_string();
    // Loopback is up in a namespace made ahead: a sandbox reaches its own listeners.
    let check = |seen: &str, who: &str, nss: &[String]| {
        let l: Vec<&str> = seen.lines().collect();
        assert_eq!(
            l[..3],
            ["refused", "refused", "0"],
            "{who} saw A's listeners: {seen}"
        );
        assert!(
            !nss.iter().any(|n| n == l[3]),
            "{who} shares a network namespace: {seen}"
        );
        l[3].to_string()
    };
    assert!(eventually(10, || rt.netns_ready() >= 1));
    let mut b = rt.create(&config()).unwrap();
    let ns_b = check(
        &out(&sh(&mut b, PROBE)),
        "B, alive beside A",
        std::slice::from_ref(&ns_a),
    );
    // A dropped: its namespace goes with it and is never handed to another sandbox.
    drop(a);
    assert!(eventually(10, || rt.netns_ready() >= 1));
    let mut c = rt.create(&config()).unwrap();
    check(&out(&sh(&mut c, PROBE)), "C, after A", &[ns_b]);
    // A reset keeps the sandbox's own namespace (its listeners die with its processes).
    b.reset().unwrap();
    let again = out(&sh(&mut b, PROBE));
    assert!(again.starts_with("refused\nrefused\n0\n"), "{again}");
}

#[test]
fn the_first_sandbox_of_a_runtime_clones_its_own_namespace() {
    require_root!();
    let rt = runtime();
    let mut s = rt.create(&config()).unwrap();
    // Nothing made ahead for a process that creates one sandbox (a one-shot command).
    assert_eq!(rt.netns_ready(), 0);
    let r = sh(&mut s, "cat /sys/class/net/lo/operstate; ls /sys/class/net");
    assert_eq!(out(&r), "unknown\nlo\n", "{r:?}");
}
