//! The build network: how a Dockerfile's build steps reach the package registries, and
//! nothing else.
//!
//! A build sandbox has its own network namespace with only `lo`, like every sandbox. For a
//! build step the engine runs an HTTP proxy on `127.0.0.1:PORT` *inside* that namespace (a
//! short-lived thread joins it with `setns` and binds; the listener, and every connection it
//! accepts, stays in the sandbox's namespace) while the connections to the registries are
//! made from the engine's own namespace. The step gets `http_proxy`, `https_proxy` (and the
//! upper-case names) pointing at it, which apt, pip, npm, cargo, curl and wget honour.
//!
//! The proxy serves two kinds of request, and refuses everything else with a 403 that names
//! the host:
//! - `CONNECT host:port` (TLS: pip, npm, cargo, `https://` apt sources): a tunnel, when the
//!   host is allowed and the port is 443 (or the port the allowance names);
//! - an absolute-form `http://host[:port]/path` request (apt's `http://` sources): sent on as
//!   an origin-form request with its `Host` header set to that host, `Connection: close`, and
//!   no proxy headers, when the host is allowed and the port is 80 (or the one named).
//!
//! Names are resolved by the engine. A name (not an IP literal) that resolves to a loopback,
//! unspecified, link-local or multicast address is refused: an allowed name cannot be turned
//! into a way to the host's own services. What an allowed registry serves is not inspected
//! (the TLS inside a tunnel is the step's own), so the allowance is by destination, not by
//! content. Agent episodes never get the proxy: their sandboxes are offline.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The registries a build step reaches unless told otherwise: Debian's archive and security
/// archive, PyPI, npm's registry and crates.io (the hosts their clients connect to).
pub const DEFAULT_REGISTRIES: &[&str] = &[
    "deb.debian.org",
    "security.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
];

/// The longest request head read (request line and headers).
const MAX_HEAD: usize = 16 << 10;
/// Connections served at once; more are refused at accept.
const MAX_CONNECTIONS: usize = 64;
/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(50);
/// A connection with no byte in either direction for this long is closed.
const IDLE: Duration = Duration::from_secs(120);
/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest chunk forwarded at once.
const CHUNK: usize = 32 << 10;

/// A host a build step may reach: `host` (ports 80 and 443) or `host:port` (that port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// Lower case, without a trailing dot.
    pub host: String,
    pub port: Option<u16>,
}

impl std::str::FromStr for Registry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{s:?}: the port must be 1-65535"))?;
                (h, Some(port))
            }
            None => (s, None),
        };
        let host = normal_host(host);
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            && !host.starts_with(['.', '-']);
        if !ok {
            return Err(format!(
                "{s:?}: a registry is a host name or an IPv4 address, optionally with :PORT"
            ));
        }
        Ok(Self { host, port })
    }
}

impl std::fmt::Display for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

fn normal_host(h: &str) -> String {
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// How build steps reach the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildNetwork {
    /// No network at all (the sandbox's own `lo` only).
    Offline,
    /// These registries, through the build proxy.
    Registries(Vec<Registry>),
}

impl Default for BuildNetwork {
    /// [`DEFAULT_REGISTRIES`].
    fn default() -> Self {
        Self::Registries(
            DEFAULT_REGISTRIES
                .iter()
                .map(|h| Registry {
                    host: (*h).to_string(),
                    port: None,
                })
                .collect(),
        )
    }
}

impl BuildNetwork {
    /// The default registries and `more`.
    pub fn with(more: &[Registry]) -> Self {
        let mut all = match Self::default() {
            Self::Registries(r) => r,
            Self::Offline => Vec::new(),
        };
        for r in more {
            if !all.contains(r) {
                all.push(r.clone());
            }
        }
        Self::Registries(all)
    }

    /// In words, for reports.
    pub fn describe(&self) -> String {
        match self {
            Self::Offline => "offline".into(),
            Self::Registries(r) => {
                let names: Vec<String> = r.iter().map(ToString::to_string).collect();
                format!("registries only ({})", names.join(", "))
            }
        }
    }
}

/// What every thread of one proxy shares.
struct Shared {
    stop: AtomicBool,
    allowed: Vec<Registry>,
    /// `host:port` of every request refused, in order (for the step's error).
    refused: Mutex<Vec<String>>,
}

impl Shared {
    fn refuse(&self, host: &str, port: u16) {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("{host}:{port}"));
    }
}

/// A running build proxy; dropping it closes every connection and joins every thread.
pub struct RegistryProxy {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    port: u16,
}

impl RegistryProxy {
    /// Start a proxy listening on `127.0.0.1` in the network namespace of the sandbox whose
    /// init is `init_pid`, connecting out from the calling thread's namespace.
    pub fn start(init_pid: i32, allowed: &[Registry]) -> std::io::Result<Self> {
        let ns_path = format!("/proc/{init_pid}/ns/net");
        let ns = std::fs::File::open(&ns_path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("opening {ns_path}: {e}")))?;
        // `setns` changes only the calling thread: a thread of its own joins the sandbox's
        // namespace, binds, and ends; the socket keeps the namespace it was made in.
        let listener = std::thread::Builder::new()
            .name("registry-bind".into())
            .spawn(move || -> std::io::Result<TcpListener> {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })?
            .join()
            .map_err(|_| std::io::Error::other("the proxy's binding thread panicked"))??;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            allowed: allowed.to_vec(),
            refused: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("registry-proxy".into())
            .spawn(move || accept_loop(listener, sh))?;
        tracing::debug!(port, init_pid, "build proxy started");
        Ok(Self {
            shared,
            accept: Some(accept),
            port,
        })
    }

    /// The port it listens on, on the sandbox's `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The environment a build step gets: the proxy for HTTP and HTTPS, and never for the
    /// sandbox's own loopback.
    pub fn env(&self) -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{}", self.port);
        let mut v = Vec::new();
        for k in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
            v.push((k.to_string(), url.clone()));
        }
        for k in ["no_proxy", "NO_PROXY"] {
            v.push((k.to_string(), "localhost,127.0.0.1,::1".to_string()));
        }
        v
    }

    /// The `host:port`s refused so far (each once, in order).
    pub fn refused(&self) -> Vec<String> {
        let v = self
            .shared
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<String> = Vec::new();
        for r in v.iter() {
            if !out.contains(r) {
                out.push(r.clone());
            }
        }
        out
    }
}

impl Drop for RegistryProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            // The accept loop joins its connection threads before it returns.
            let _ = h.join();
        }
        tracing::debug!(port = self.port, "build proxy stopped");
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let Some(client) = crate::netfault::accept_within(&listener, TICK, "build proxy") else {
            continue;
        };
        conns.retain(|h| !h.is_finished());
        if conns.len() >= MAX_CONNECTIONS {
            tracing::warn!("build proxy: too many connections, closing one");
            continue;
        }
        let sh = shared.clone();
        match std::thread::Builder::new()
            .name("registry-conn".into())
            .spawn(move || serve(client, &sh))
        {
            Ok(h) => conns.push(h),
            Err(e) => tracing::warn!(error = %e, "build proxy: no thread"),
        }
    }
    for h in conns {
        let _ = h.join();
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// `CONNECT host:port`.
    Connect { host: String, port: u16 },
    /// An absolute-form `http://` request, with the head to send to the origin.
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
    },
}

/// Parse a request head (up to and including the blank line). `Err` is the reason it is
/// refused (400).
pub(crate) fn parse_head(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "a request head that is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("a malformed request line {first:?}"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("an unsupported version {version:?}"));
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(format!(
            "{method} {target}: only CONNECT and absolute http:// requests go through the build proxy"
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err("credentials in the URL".into());
    }
    let (host, port) = split_authority(authority, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    out += &format!(
        "Host: {}\r\n",
        if port == 80 {
            host.clone()
        } else {
            format!("{host}:{port}")
        }
    );
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let name = line.split(':').next().unwrap_or_default().trim();
        let drop = ["host", "connection", "proxy-connection", "keep-alive"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
            || name.to_ascii_lowercase().starts_with("proxy-");
        if !drop {
            out += line;
            out += "\r\n";
        }
    }
    out += "Connection: close\r\n\r\n";
    Ok(Request::Forward {
        host,
        port,
        head: out.into_bytes(),
    })
}

/// `host:port` (the port may be left out where `default` is given).
fn split_authority(a: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("a bad port in {a:?}"))?,
        ),
        None => (a, default.ok_or_else(|| format!("no port in {a:?}"))?),
    };
    let host = normal_host(host);
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return Err(format!("a bad host in {a:?}"));
    }
    Ok((host, port))
}

/// Whether `host:port` may be reached by a request of this kind (`tls`: a tunnel).
pub(crate) fn allowed(allowed: &[Registry], host: &str, port: u16, tls: bool) -> bool {
    allowed.iter().any(|r| {
        r.host == host
            && match r.port {
                Some(p) => p == port,
                None => port == if tls { 443 } else { 80 },
            }
    })
}

/// Whether an address is one a registry's name must never resolve to.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || v.is_link_local()
                || v.is_multicast()
                || v.is_broadcast()
        }
        IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (v.segments()[0] & 0xffc0) == 0xfe80
                || v.to_ipv4_mapped().is_some_and(|m| internal(IpAddr::V4(m)))
        }
    }
}

/// Connect to an allowed registry from the engine's namespace.
fn connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let literal = host.parse::<IpAddr>().is_ok();
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            ErrorKind::NotFound,
            format!("{host} has no address"),
        ));
    }
    if !literal {
        if let Some(a) = addrs.iter().find(|a| internal(a.ip())) {
            return Err(std::io::Error::new(
                ErrorKind::PermissionDenied,
                format!("{host} resolves to {}, an address of this host", a.ip()),
            ));
        }
    }
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::from(ErrorKind::NotFound)))
}

fn respond(client: &mut TcpStream, status: &str, body: &str) {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(msg.as_bytes());
}

/// Read a request head: the bytes up to the blank line, and what came after it.
fn read_head(client: &mut TcpStream, shared: &Shared) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let start = Instant::now();
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Some((buf, rest));
        }
        if buf.len() > MAX_HEAD || start.elapsed() > IDLE || shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        match client.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if timed_out(&e) => {}
            Err(_) => return None,
        }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

fn serve(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(TICK));
    let Some((head, rest)) = read_head(&mut client, shared) else {
        return;
    };
    let req = match parse_head(&head) {
        Ok(r) => r,
        Err(why) => {
            respond(
                &mut client,
                "400 Bad Request",
                &format!("envfactory build proxy: {why}\n"),
            );
            return;
        }
    };
    let (host, port, tls) = match &req {
        Request::Connect { host, port } => (host.clone(), *port, true),
        Request::Forward { host, port, .. } => (host.clone(), *port, false),
    };
    if !allowed(&shared.allowed, &host, port, tls) {
        tracing::info!(
            host,
            port,
            "build proxy: not a registry this build may reach"
        );
        shared.refuse(&host, port);
        respond(
            &mut client,
            "403 Forbidden",
            &format!(
                "envfactory build proxy: {host}:{port} is not a package registry this build may reach (--registry adds one)\n"
            ),
        );
        return;
    }
    let mut upstream = match connect(&host, port) {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(host, port, error = %e, "build proxy: cannot connect");
            if e.kind() == ErrorKind::PermissionDenied {
                shared.refuse(&host, port);
            }
            respond(
                &mut client,
                "502 Bad Gateway",
                &format!("envfactory build proxy: {host}:{port}: {e}\n"),
            );
            return;
        }
    };
    let sent = match &req {
        Request::Connect { .. } => client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .and_then(|()| upstream.write_all(&rest)),
        Request::Forward { head, .. } => upstream
            .write_all(head)
            .and_then(|()| upstream.write_all(&rest)),
    };
    if sent.is_err() {
        return;
    }
    pipe(client, upstream, shared);
}

/// Forward both ways until both sides are done, either side is idle for [`IDLE`], or the
/// proxy stops.
fn pipe(a: TcpStream, b: TcpStream, shared: &Shared) {
    let _ = b.set_read_timeout(Some(TICK));
    let last = Mutex::new(Instant::now());
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::scope(|s| {
        s.spawn(|| one_way(b2, a2, shared, &last));
        one_way(a, b, shared, &last);
    });
}

fn one_way(mut from: TcpStream, mut to: TcpStream, shared: &Shared, last: &Mutex<Instant>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                *last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if timed_out(&e) => {
                let idle = last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .elapsed();
                if idle > IDLE {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    // The other direction ends too once its peer sees the end.
    let _ = to.shutdown(Shutdown::Write);
    if shared.stop.load(Ordering::SeqCst) {
        let _ = from.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn registries_parse_and_refuse_what_is_not_a_host() {
        let r: Registry = "Deb.Debian.org.".parse().unwrap();
        assert_eq!((r.host.as_str(), r.port), ("deb.debian.org", None));
        let r: Registry = "127.0.0.2:8080".parse().unwrap();
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.2", Some(8080)));
        for bad in ["", ":80", "a b", "x:0", "x:99999", "http://x", "-x", "x/y"] {
            assert!(bad.parse::<Registry>().is_err(), "{bad}");
        }
        let all = BuildNetwork::with(&["pypi.org".parse().unwrap(), "x.test:81".parse().unwrap()]);
        let BuildNetwork::Registries(r) = all else {
            panic!()
        };
        assert_eq!(r.len(), DEFAULT_REGISTRIES.len() + 1, "pypi.org once");
    }

    #[test]
    fn absolute_requests_are_sent_on_in_origin_form_with_their_own_host() {
        let head = b"GET http://Deb.Debian.org/debian/dists/x HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\nUser-Agent: apt\r\n\r\n";
        let Request::Forward { host, port, head } = parse_head(head).unwrap() else {
            panic!()
        };
        assert_eq!((host.as_str(), port), ("deb.debian.org", 80));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /debian/dists/x HTTP/1.1\r\nHost: deb.debian.org\r\nUser-Agent: apt\r\nConnection: close\r\n\r\n"
        );
        let Request::Forward { head, port, .. } =
            parse_head(b"GET http://10.0.0.1:81 HTTP/1.0\r\n\r\n").unwrap()
        else {
            panic!()
        };
        assert_eq!(port, 81);
        assert!(String::from_utf8(head)
            .unwrap()
            .starts_with("GET / HTTP/1.0\r\nHost: 10.0.0.1:81\r\n"));
        assert_eq!(
            parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap(),
            Request::Connect {
                host: "pypi.org".into(),
                port: 443
            }
        );
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET https://pypi.org/ HTTP/1.1\r\n\r\n",
            b"GET http://user:pw@pypi.org/ HTTP/1.1\r\n\r\n",
            b"CONNECT pypi.org HTTP/1.1\r\n\r\n",
            b"GET http://pypi.org/ HTTP/2\r\n\r\n",
            b"GET http://py pi.org/ HTTP/1.1\r\n\r\n",
            b"\xff\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn only_the_allowed_hosts_and_ports_pass() {
        let reg: Vec<Registry> = vec![
            "pypi.org".parse().unwrap(),
            "127.0.0.2:8080".parse().unwrap(),
        ];
        assert!(allowed(&reg, "pypi.org", 443, true));
        assert!(allowed(&reg, "pypi.org", 80, false));
        assert!(!allowed(&reg, "pypi.org", 80, true), "a tunnel to port 80");
        assert!(!allowed(&reg, "pypi.org", 22, true));
        assert!(
            !allowed(&reg, "evil.pypi.org", 443, true),
            "no suffix match"
        );
        assert!(allowed(&reg, "127.0.0.2", 8080, false));
        assert!(allowed(&reg, "127.0.0.2", 8080, true));
        assert!(!allowed(&reg, "127.0.0.2", 80, false));
        assert!(internal("127.0.0.1".parse().unwrap()));
        assert!(internal("::ffff:127.0.0.1".parse().unwrap()));
        assert!(internal("169.254.169.254".parse().unwrap()));
        assert!(!internal("151.101.2.132".parse().unwrap()));
    }

    #[test]
    fn a_name_that_resolves_to_this_host_is_refused() {
        let e = connect("localhost", 9).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    }
}
