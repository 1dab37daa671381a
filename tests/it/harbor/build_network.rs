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
/// records each request line and `Host` header, and any request line sent after the first on
/// the same connection (smuggled); `/hold` gets bytes without end and is never read further,
/// until the server stops. Stopped, every thread joined, when dropped.
struct FakeRegistry {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn handle(mut c: std::net::TcpStream, seen: &Mutex<Vec<String>>, stop: &AtomicBool) {
    c.set_nonblocking(false).unwrap();
    // The head may come late on a loaded machine (a tunnel's request follows its CONNECT).
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // What came after the first head in the same reads counts as more.
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(head.len(), |i| i + 4);
    let mut more = head.split_off(end);
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or_default().to_string();
    let host = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("host:"))
        .unwrap_or_default()
        .to_string();
    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
    seen.lock().unwrap().push(format!("{line} | {host}"));
    if path == "/hold" {
        // Write without end and never read, until the server stops.
        c.set_write_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let junk = vec![b'y'; 65536];
        while !stop.load(Ordering::SeqCst) {
            match c.write(&junk) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        return;
    }
    let body = format!("package {path}\n");
    let _ = c.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    // Anything more on this connection is a request that was not meant to reach us.
    while let Ok(n) = c.read(&mut b) {
        if n == 0 {
            break;
        }
        more.extend_from_slice(&b[..n]);
    }
    for l in String::from_utf8_lossy(&more).lines() {
        if l.starts_with("GET ") || l.starts_with("POST ") || l.starts_with("HEAD ") {
            seen.lock().unwrap().push(format!("smuggled: {l}"));
        }
    }
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
            let mut conns = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                let Ok((c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let (seen3, stop3) = (seen2.clone(), stop2.clone());
                conns.push(std::thread::spawn(move || handle(c, &seen3, &stop3)));
            }
            for c in conns {
                let _ = c.join();
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

/// A Python client in the task's build context, named `name`: `body` runs with `s`, a socket
/// connected to the build proxy of the step that runs it.
fn write_client(task: &harbor::Task, name: &str, body: &str) {
    let script = format!(
        "import os, socket\n\
         port = int(os.environ['http_proxy'].rsplit(':', 1)[1])\n\
         s = socket.create_connection(('127.0.0.1', port))\n{body}"
    );
    std::fs::write(task.context.join(name), script).unwrap();
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

    // Allowed: a plain request (sent on in origin form, with its own Host whatever the
    // client says) and a tunnel.
    let (_t, task, df) = with_run(&format!(
        "RUN curl -sSf -H 'Host: evil.example' {url}/pool/a.deb -o /opt/a && curl -sSf --proxytunnel {url}/tunnel -o /opt/b"
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
    // The layer built with the network is not taken for an offline build of the same file.
    let e = harbor::build_image(&rt, &s.store, &task, &df, &options(BuildNetwork::Offline))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the step failed"), "{e}");
    assert!(
        !img.env
            .iter()
            .any(|(k, _)| k.to_ascii_lowercase().contains("proxy")),
        "the proxy is the step's, not the image's: {:?}",
        img.env
    );

    // Around the proxy, straight to the host's loopback: the sandbox has no way there.
    let (_t, task, df) = with_run(&format!(
        "RUN curl -sSf --noproxy '*' {url}/direct -o /opt/c"
    ));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &allowed)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the step failed (exit 7)"),
        "curl cannot connect: {e}"
    );

    // Not among the allowed: refused by the proxy, and the error says which and how to allow it.
    let (_t, task, df) = with_run(&format!("RUN curl -sSf {url}/refused -o /opt/d"));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &on_host())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "the build network refused 127.0.0.2:{} (not a registry it may reach; --registry HOST[:PORT] adds one)",
            reg.port
        )),
        "{e}"
    );

    // Hack trial: a second request pipelined (or smuggled) behind an allowed one, with another
    // Host, never reaches the origin.
    let (_t, task, df) = with_run("COPY smuggle.py /tmp/\nRUN python3 /tmp/smuggle.py");
    write_client(
        &task,
        "smuggle.py",
        &format!(
            "s.sendall(b'GET {url}/first HTTP/1.1\\r\\nHost: 127.0.0.2\\r\\n\\r\\n'\n\
             \x20         b'GET /smuggled HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n')\n\
             got = b''\n\
             while True:\n\
             \x20   b = s.recv(4096)\n\
             \x20   if not b: break\n\
             \x20   got += b\n\
             assert b'package /first' in got, got\n"
        ),
    );
    harbor::build_image(&rt, &s.store, &task, &df, &allowed).unwrap_or_else(|e| panic!("{e}"));
    let seen = reg.seen();
    assert!(
        seen.iter().any(|l| l.starts_with("GET /first ")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|l| l.contains("/smuggled")), "{seen:?}");

    // A step that fails while a process it left behind writes into a tunnel and never reads
    // what the other end writes without end: the build still ends (both of the proxy's
    // threads are blocked writing; they give up once the proxy stops).
    let (_t, task, df) = with_run(
        "COPY hold.py /tmp/\nRUN setsid python3 /tmp/hold.py </dev/null >/dev/null 2>&1 & \
         until [ -e /tmp/held ]; do sleep 0.05; done; exit 1",
    );
    write_client(
        &task,
        "hold.py",
        &format!(
            "s.sendall(b'CONNECT 127.0.0.2:{} HTTP/1.1\\r\\n\\r\\n')\n\
             s.recv(100)\n\
             s.sendall(b'GET /hold HTTP/1.1\\r\\n\\r\\n')\n\
             open('/tmp/held', 'w').close()\n\
             while True:\n\
             \x20   s.sendall(b'x' * 65536)\n",
            reg.port
        ),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (rt2, store2, opts2) = (rt.clone(), s.store.clone(), allowed.clone());
    // Not scoped, and no panic on a timeout: either would wait for the stuck build forever.
    std::thread::spawn(move || {
        let r = harbor::build_image(&rt2, &store2, &task, &df, &opts2);
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    });
    let Ok(r) = rx.recv_timeout(Duration::from_secs(120)) else {
        // Straight to the descriptor: the harness's capture of `eprintln!` dies with us.
        let _ = std::io::stderr()
            .write_all(b"the build did not return in 120 s: the build proxy's threads are stuck\n");
        std::process::exit(101);
    };
    assert!(r.unwrap_err().contains("the step failed (exit 1)"));
    assert!(reg.seen().iter().any(|l| l.starts_with("GET /hold ")));

    // Offline: the same step that passed above fails.
    let (_t, task, df) = with_run(&format!("RUN curl -sSf {url}/offline -o /opt/e"));
    let e = harbor::build_image(&rt, &s.store, &task, &df, &options(BuildNetwork::Offline))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the step failed"), "{e}");
    assert!(
        !e.contains("the build network refused"),
        "no proxy to refuse: {e}"
    );

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
