//! The build network (`engine::harbor::registries`): a `RUN` step reaches the registries it is
//! allowed, through the proxy in its sandbox, and nothing else; `--offline-build` gives it
//! none; an agent's episode on the built image never has it. The "registry" is a server on
//! this host's `127.0.0.2` (loopback, outside every sandbox's network namespace).

use super::{copy_fixture, on_host, Store};
use crate::common;
use engine::harbor::{self, Agent, BuildNetwork, BuildOptions, Registry};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// An HTTP server on `127.0.0.2:PORT` that answers every request with `package <path>` and
/// records each request line and `Host` header; stopped and joined when dropped.
struct FakeRegistry {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeRegistry {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                let Ok((mut c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                c.set_nonblocking(false).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or_default().to_string();
                let host = head
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("host:"))
                    .unwrap_or_default()
                    .to_string();
                let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                seen2.lock().unwrap().push(format!("{line} | {host}"));
                let body = format!("package {path}\n");
                let _ = c.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Self {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn registry(&self) -> Registry {
        format!("127.0.0.2:{}", self.port).parse().unwrap()
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A copy of `harbor/hello-file` with `run` appended to its Dockerfile: (the copy, the task,
/// the Dockerfile parsed).
fn with_run(
    run: &str,
) -> (
    tempfile::TempDir,
    harbor::Task,
    harbor::dockerfile::Dockerfile,
) {
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    let task = harbor::load(&dir).unwrap();
    let text = std::fs::read_to_string(&task.dockerfile).unwrap() + run + "\n";
    std::fs::write(&task.dockerfile, &text).unwrap();
    let df = harbor::dockerfile::parse(&text).unwrap();
    (t, task, df)
}

fn options(network: BuildNetwork) -> BuildOptions {
    BuildOptions {
        network,
        ..on_host()
    }
}

#[test]
fn run_steps_reach_the_allowed_registries_and_nothing_else() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let reg = FakeRegistry::start();
    let url = format!("http://127.0.0.2:{}", reg.port);
    let allowed = options(BuildNetwork::with(&[reg.registry()]));

    // Allowed: a plain request (sent on in origin form, with its own Host) and a tunnel.
    let (_t, task, df) = with_run(&format!(
        "RUN curl -sSf {url}/pool/a.deb -o /opt/a && curl -sSf --proxytunnel {url}/tunnel -o /opt/b"
    ));
    let img =
        harbor::build_image(&rt, &s.store, &task, &df, &allowed).unwrap_or_else(|e| panic!("{e}"));
    let top = &img.layers[0];
    assert_eq!(
        std::fs::read_to_string(top.join("opt/a")).unwrap(),
        "package /pool/a.deb\n"
    );
    assert_eq!(
        std::fs::read_to_string(top.join("opt/b")).unwrap(),
        "package /tunnel\n"
    );
    let host = format!("Host: 127.0.0.2:{}", reg.port);
    assert_eq!(
        reg.seen(),
        vec![
            format!("GET /pool/a.deb HTTP/1.1 | {host}"),
            format!("GET /tunnel HTTP/1.1 | {host}"),
        ]
    );

    // Around the proxy, straight to the host's loopback: the sandbox has no way there.
    let (_t, task, df) = with_run(&format!(
        "RUN curl -sSf --noproxy '*' {url}/direct -o /opt/c"
    ));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &allowed)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the step failed"), "{e}");

    // Not among the allowed: refused by the proxy, and the error says which and how to allow it.
    let (_t, task, df) = with_run(&format!("RUN curl -sSf {url}/refused -o /opt/d"));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &on_host())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "the build network refused 127.0.0.2:{}: not a registry it may reach; --registry",
            reg.port
        )),
        "{e}"
    );

    // Offline: the same step that passed above fails.
    let (_t, task, df) = with_run(&format!("RUN curl -sSf {url}/offline -o /opt/e"));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &options(BuildNetwork::Offline))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the step failed"), "{e}");
    assert!(!e.contains("refused"), "no proxy to refuse: {e}");

    // The agent's episode on an image built with the network is offline: neither straight
    // nor through a proxy variable it finds.
    let (_t, task, _) = with_run(&format!("RUN curl -sSf {url}/built -o /opt/f"));
    let agent = Agent::Commands(vec![
        format!("curl -sSf --max-time 5 {url}/agent-direct -o /tmp/x"),
        format!("env | grep -i proxy; curl -sSf --max-time 5 {url}/agent-env -o /tmp/y"),
    ]);
    let o = harbor::check_task(&rt, &rt, &s.store, &task.dir, &allowed, &agent, &[], 1)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!o.infrastructure, "{o:?}");
    let seen = reg.seen();
    assert!(
        seen.iter().any(|l| l.starts_with("GET /built ")),
        "the build reached it: {seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("/agent")),
        "the agent reached the registry: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|l| l.contains("/direct") || l.contains("/refused") || l.contains("/offline")),
        "{seen:?}"
    );
}
