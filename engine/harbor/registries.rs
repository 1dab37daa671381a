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
//! - an absolute-form `GET` or `HEAD` of `http://host[:port]/path` without a body (apt's
//!   `http://` sources): sent on as an origin-form request with its `Host` header set to
//!   that host, `Connection: close`, and no proxy headers, when the host is allowed and the
//!   port is 80 (or the one named). Only that one request reaches the origin: what the client
//!   sends after its head (a pipelined request, smuggled bytes) is read and dropped, and a
//!   head with a bare CR or LF, a control byte, a folded line or another version than
//!   HTTP/1.0 or 1.1 is refused (400).
//!
//! Names are resolved by the engine. A name (not an IP literal) that resolves to a loopback,
//! private, shared (100.64/10), unique-local, unspecified, link-local or multicast address is
//! refused: an allowed name cannot be turned into a way to this host's services or its
//! network. What an allowed registry serves is not inspected (the TLS inside a tunnel is the
//! step's own), so the allowance is by destination: a registry behind a shared CDN can be
//! asked for another site of that CDN inside its tunnel (domain fronting). Agent episodes
//! never get the proxy: their sandboxes are offline.

use crate::text::cut;
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
/// How long connecting to one address of a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most refusals kept for the step's error.
const MAX_REFUSALS: usize = 16;
/// Largest chunk forwarded at once.
const CHUNK: usize = 32 << 10;

/// Errors of starting the build proxy.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("opening {path}: {source}")]
    Namespace {
        path: String,
        source: std::io::Error,
    },
    #[error("listening in the build sandbox's network namespace: {source}")]
    Bind { source: std::io::Error },
    #[error("starting the proxy's threads: {source}")]
    Thread { source: std::io::Error },
}

/// A host a build step may reach: `host` (ports 80 and 443) or `host:port` (that port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// Lower case, without a trailing dot.
    pub host: String,
    pub port: Option<u16>,
    /// Named by the user (`--registry`, parsed): its name may resolve to an address of this
    /// host's network (a mirror, a private index); the defaults' names may not.
    pub any_address: bool,
}

impl std::str::FromStr for Registry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (host, port) = split_authority(s).map_err(|why| {
            format!("{why}: a registry is a host name or an IPv4 address, optionally with :PORT")
        })?;
        Ok(Self {
            host,
            port,
            any_address: true,
        })
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

/// A host name or IPv4 address as the proxy takes one (at most 253 characters).
fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && !h.starts_with(['.', '-'])
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
                    any_address: false,
                })
                .collect(),
        )
    }
}

impl BuildNetwork {
    /// The default registries and `more` (a default named again takes the user's terms).
    pub fn with(more: &[Registry]) -> Self {
        let mut all = match Self::default() {
            Self::Registries(r) => r,
            Self::Offline => Vec::new(),
        };
        for r in more {
            match all
                .iter_mut()
                .find(|a| a.host == r.host && a.port == r.port)
            {
                Some(a) => a.any_address |= r.any_address,
                None => all.push(r.clone()),
            }
        }
        Self::Registries(all)
    }

    /// What the layers' cache key holds of it: a layer built with one network is not taken
    /// for a build with another (`--offline-build` must show whether a task builds offline).
    pub fn cache_key(&self) -> String {
        match self {
            Self::Offline => "offline".into(),
            Self::Registries(r) => {
                let mut names: Vec<String> = r
                    .iter()
                    .map(|r| format!("{r}{}", if r.any_address { "+any" } else { "" }))
                    .collect();
                names.sort();
                format!("registries {}", names.join(" "))
            }
        }
    }
}

/// What every thread of one proxy shares.
struct Shared {
    stop: AtomicBool,
    allowed: Vec<Registry>,
    /// The requests refused (`host:port` and why), each once, at most [`MAX_REFUSALS`]
    /// (for the step's error).
    refused: Mutex<Vec<String>>,
}

impl Shared {
    fn new(allowed: &[Registry]) -> Self {
        Self {
            stop: AtomicBool::new(false),
            allowed: allowed.to_vec(),
            refused: Mutex::new(Vec::new()),
        }
    }

    fn refuse(&self, what: String) {
        let mut v = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if v.len() < MAX_REFUSALS && !v.contains(&what) {
            v.push(what);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
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
    pub fn start(init_pid: i32, allowed: &[Registry]) -> Result<Self, RegistryError> {
        let path = format!("/proc/{init_pid}/ns/net");
        let ns = std::fs::File::open(&path)
            .map_err(|source| RegistryError::Namespace { path, source })?;
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
            })
            .map_err(|source| RegistryError::Thread { source })?
            .join()
            .map_err(|_| RegistryError::Thread {
                source: std::io::Error::other("the binding thread panicked"),
            })?
            .map_err(|source| RegistryError::Bind { source })?;
        let port = listener
            .local_addr()
            .map_err(|source| RegistryError::Bind { source })?
            .port();
        let shared = Arc::new(Shared::new(allowed));
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("registry-proxy".into())
            .spawn(move || accept_loop(listener, sh))
            .map_err(|source| RegistryError::Thread { source })?;
        tracing::debug!(port, init_pid, "build proxy started");
        Ok(Self {
            shared,
            accept: Some(accept),
            port,
        })
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

    /// The requests refused so far (`host:port`, why), each once, in order.
    pub fn refused(&self) -> Vec<String> {
        self.shared
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
            tracing::warn!(
                connections = conns.len(),
                max = MAX_CONNECTIONS,
                "build proxy: too many connections, refusing one"
            );
            let mut client = client;
            respond(
                &mut client,
                "503 Service Unavailable",
                "envfactory build proxy: too many connections\n",
                &shared,
            );
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
    /// An absolute-form `http://` `GET` or `HEAD`, with the head to send to the origin.
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
    let body = text
        .strip_suffix("\r\n\r\n")
        .ok_or("a request head that does not end in an empty line")?;
    // Every line ends in CRLF: a bare CR or LF, or another control byte, is a line the
    // origin might split where we do not (request smuggling).
    if body
        .bytes()
        .any(|b| (b < 0x20 && b != b'\t' && b != b'\r' && b != b'\n') || b == 0x7f)
        || body.split("\r\n").any(|l| l.contains(['\r', '\n']))
    {
        return Err("a control byte, or a bare CR or LF, in the request head".into());
    }
    let mut lines = body.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("a malformed request line {:?}", cut(first)));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(format!("an unsupported version {:?}", cut(version)));
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(target)?;
        let port = port.ok_or_else(|| format!("no port in {:?}", cut(target)))?;
        return Ok(Request::Connect { host, port });
    }
    if method != "GET" && method != "HEAD" {
        return Err(format!(
            "{}: only CONNECT, GET and HEAD go through the build proxy",
            cut(method)
        ));
    }
    let scheme = target
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("http://"));
    let Some(rest) = scheme.map(|p| &target[p.len()..]) else {
        return Err(format!(
            "{} {}: only absolute http:// requests (and CONNECT) go through the build proxy",
            cut(method),
            cut(target)
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    if authority.contains('@') {
        return Err("credentials in the URL".into());
    }
    let (host, port) = split_authority(authority)?;
    let port = port.unwrap_or(80);
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
        if line.starts_with([' ', '\t']) {
            return Err("a folded header line".into());
        }
        let Some((name, _)) = line.split_once(':') else {
            return Err(format!("a header line without a colon {:?}", cut(line)));
        };
        let name = name.to_ascii_lowercase();
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            || name.is_empty()
        {
            return Err(format!("a bad header name {:?}", cut(&name)));
        }
        if name == "content-length" || name == "transfer-encoding" || name == "expect" {
            return Err(format!("a {method} with a body ({name})"));
        }
        let drop = [
            "host",
            "connection",
            "keep-alive",
            "upgrade",
            "te",
            "trailer",
        ]
        .contains(&name.as_str())
            || name.starts_with("proxy-");
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

/// `host[:port]`: the host normalised (lower case, no trailing dot) and checked, the port
/// 1-65535 when given.
fn split_authority(a: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (
            h,
            Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("a bad port in {:?}", cut(a)))?,
            ),
        ),
        None => (a, None),
    };
    let host = normal_host(host);
    if !valid_host(&host) {
        return Err(format!("a bad host in {:?}", cut(a)));
    }
    Ok((host, port))
}

/// The allowance that lets a request of this kind (`tls`: a tunnel) reach `host:port`.
pub(crate) fn allowance<'a>(
    allowed: &'a [Registry],
    host: &str,
    port: u16,
    tls: bool,
) -> Option<&'a Registry> {
    allowed.iter().find(|r| {
        r.host == host
            && match r.port {
                Some(p) => p == port,
                None => port == if tls { 443 } else { 80 },
            }
    })
}

/// Whether an address is this host's, its network's, or no single host's: what a registry's
/// name must never resolve to.
fn is_local_or_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            let [a, b, ..] = v.octets();
            v.is_loopback()
                || v.is_private()
                || v.is_unspecified()
                || v.is_link_local()
                || v.is_multicast()
                || v.is_broadcast()
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || a == 0
        }
        IpAddr::V6(v) => {
            let first = v.segments()[0];
            v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (first & 0xffc0) == 0xfe80 // link-local
                || (first & 0xfe00) == 0xfc00 // unique local
                || first == 0x0064 // NAT64 (64:ff9b::/96)
                || v.to_ipv4_mapped()
                    .is_some_and(|m| is_local_or_private(IpAddr::V4(m)))
        }
    }
}

/// Why a connection to an allowed registry was not made.
enum ConnectError {
    /// The name resolves to an address of this host or its network.
    Local(String),
    Io(std::io::Error),
}

/// Connect to an allowed registry from the engine's namespace (each address in turn, until
/// the proxy stops); a name must not resolve to this host's network unless `any_address`.
fn connect(
    host: &str,
    port: u16,
    any_address: bool,
    shared: &Shared,
) -> Result<TcpStream, ConnectError> {
    let literal = any_address || host.parse::<IpAddr>().is_ok();
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(ConnectError::Io)?
        .collect();
    if !literal {
        if let Some(a) = addrs.iter().find(|a| is_local_or_private(a.ip())) {
            return Err(ConnectError::Local(format!(
                "resolves to {}, an address of this host or its network",
                a.ip()
            )));
        }
    }
    let mut last = std::io::Error::new(ErrorKind::NotFound, format!("{host} has no address"));
    for a in &addrs {
        if shared.stopped() {
            break;
        }
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(ConnectError::Io(last))
}

fn respond(client: &mut TcpStream, status: &str, body: &str, shared: &Shared) {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = write_all(client, msg.as_bytes(), &|| shared.stopped());
}

/// Read a request head: the bytes up to the blank line, and what came after it; `Err` the
/// status and reason when there is none to read.
fn read_head(client: &mut TcpStream, shared: &Shared) -> Result<(Vec<u8>, Vec<u8>), &'static str> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let start = Instant::now();
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err("431 Request Header Fields Too Large");
        }
        if start.elapsed() > IDLE || shared.stopped() {
            return Err("408 Request Timeout");
        }
        match client.read(&mut chunk) {
            Ok(0) => return Err(""),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if timed_out(&e) => {}
            Err(_) => return Err(""),
        }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Write all of `data`, giving up when `give_up` says so between timed-out writes (the
/// sockets have write timeouts: a peer that never reads cannot hold a thread forever).
fn write_all(
    to: &mut TcpStream,
    mut data: &[u8],
    give_up: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    let _ = to.set_write_timeout(Some(TICK));
    let start = Instant::now();
    while !data.is_empty() {
        match to.write(data) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if timed_out(&e) => {
                if give_up() || start.elapsed() > IDLE {
                    return Err(ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn serve(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(TICK));
    let (head, rest) = match read_head(&mut client, shared) {
        Ok(h) => h,
        Err("") => return,
        Err(status) => {
            respond(
                &mut client,
                status,
                "envfactory build proxy: no request head\n",
                shared,
            );
            return;
        }
    };
    let req = match parse_head(&head) {
        Ok(r) => r,
        Err(why) => {
            tracing::info!(reason = %why, "build proxy: a bad request");
            shared.refuse(format!("a request ({why})"));
            respond(
                &mut client,
                "400 Bad Request",
                &format!("envfactory build proxy: {why}\n"),
                shared,
            );
            return;
        }
    };
    let (host, port, tls) = match &req {
        Request::Connect { host, port } => (host.clone(), *port, true),
        Request::Forward { host, port, .. } => (host.clone(), *port, false),
    };
    let Some(allowance) = allowance(&shared.allowed, &host, port, tls) else {
        tracing::info!(
            host,
            port,
            tls,
            "build proxy: not a registry this build may reach"
        );
        shared.refuse(format!(
            "{host}:{port} (not a registry it may reach; --registry HOST[:PORT] adds one)"
        ));
        respond(
            &mut client,
            "403 Forbidden",
            &format!(
                "envfactory build proxy: {host}:{port} is not a package registry this build may reach (--registry adds one)\n"
            ), shared);
        return;
    };
    let mut upstream = match connect(&host, port, allowance.any_address, shared) {
        Ok(s) => s,
        Err(ConnectError::Local(why)) => {
            tracing::info!(host, port, reason = %why, "build proxy: refused by address");
            shared.refuse(format!("{host}:{port} ({why})"));
            respond(
                &mut client,
                "403 Forbidden",
                &format!("envfactory build proxy: {host}:{port} {why}\n"),
                shared,
            );
            return;
        }
        Err(ConnectError::Io(e)) => {
            tracing::info!(host, port, error = %e, "build proxy: cannot connect");
            respond(
                &mut client,
                "502 Bad Gateway",
                &format!("envfactory build proxy: {host}:{port}: {e}\n"),
                shared,
            );
            return;
        }
    };
    let stop = || shared.stopped();
    match &req {
        Request::Connect { .. } => {
            let sent = write_all(
                &mut client,
                b"HTTP/1.1 200 Connection established\r\n\r\n",
                &stop,
            )
            .and_then(|()| write_all(&mut upstream, &rest, &stop));
            if sent.is_ok() {
                pipe(client, upstream, shared, true);
            }
        }
        Request::Forward { head, .. } => {
            // One request only: what the client sent after its head never reaches the
            // origin.
            if write_all(&mut upstream, head, &stop).is_ok() {
                pipe(client, upstream, shared, false);
            }
        }
    }
}

/// Forward the upstream's bytes to the client, and the client's to the upstream when
/// `both` (else they are read and dropped), until both sides are done, either is idle for
/// [`IDLE`], or the proxy stops.
fn pipe(client: TcpStream, upstream: TcpStream, shared: &Shared, both: bool) {
    let _ = upstream.set_read_timeout(Some(TICK));
    let last = Mutex::new(Instant::now());
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    std::thread::scope(|s| {
        s.spawn(|| one_way(u2, Some(c2), shared, &last));
        one_way(client, both.then_some(upstream), shared, &last);
    });
}

/// Copy `from` to `to` (or drop what `from` sends when `to` is `None`).
fn one_way(mut from: TcpStream, mut to: Option<TcpStream>, shared: &Shared, last: &Mutex<Instant>) {
    let mut buf = vec![0u8; CHUNK];
    let touch = || {
        *last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now()
    };
    let idle = || {
        last.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
            > IDLE
    };
    let give_up = || shared.stopped() || idle();
    loop {
        if shared.stopped() {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                touch();
                if let Some(to) = to.as_mut() {
                    if write_all(to, &buf[..n], &give_up).is_err() {
                        break;
                    }
                }
            }
            Err(e) if timed_out(&e) => {
                if idle() {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    // The other direction ends too once its peer sees the end (or, stopping, at once).
    if let Some(to) = to {
        let _ = to.shutdown(Shutdown::Write);
    }
    if shared.stopped() || idle() {
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
        let ok = |h: &str, p: u16, tls: bool| allowance(&reg, h, p, tls).is_some();
        assert!(ok("pypi.org", 443, true));
        assert!(ok("pypi.org", 80, false));
        assert!(!ok("pypi.org", 80, true), "a tunnel to port 80");
        assert!(!ok("pypi.org", 22, true));
        assert!(!ok("evil.pypi.org", 443, true), "no suffix match");
        assert!(ok("127.0.0.2", 8080, false));
        assert!(ok("127.0.0.2", 8080, true));
        assert!(!ok("127.0.0.2", 80, false));
        assert!(is_local_or_private("127.0.0.1".parse().unwrap()));
        assert!(is_local_or_private("::ffff:127.0.0.1".parse().unwrap()));
        assert!(is_local_or_private("169.254.169.254".parse().unwrap()));
        assert!(!is_local_or_private("151.101.2.132".parse().unwrap()));
        // What the user names may resolve anywhere; the defaults may not.
        assert!(reg[0].any_address);
        let BuildNetwork::Registries(defaults) = BuildNetwork::default() else {
            panic!()
        };
        assert!(defaults.iter().all(|r| !r.any_address));
        assert_ne!(
            BuildNetwork::default().cache_key(),
            BuildNetwork::Offline.cache_key()
        );
        assert_ne!(
            BuildNetwork::default().cache_key(),
            BuildNetwork::with(&reg).cache_key()
        );
        let long = format!("{}.org", "a".repeat(300));
        assert!(long.parse::<Registry>().is_err());
        assert!(parse_head(format!("CONNECT {long}:443 HTTP/1.1\r\n\r\n").as_bytes()).is_err());
    }

    #[test]
    fn a_name_that_resolves_to_this_host_is_refused() {
        let shared = Shared::new(&[]);
        assert!(matches!(
            connect("localhost", 9, false, &shared),
            Err(ConnectError::Local(_))
        ));
        for ip in [
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.5",
            "100.64.0.1",
            "fd00:ec2::254",
            "64:ff9b::a00:1",
        ] {
            assert!(is_local_or_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn heads_that_could_smuggle_a_second_request_are_refused() {
        for bad in [
            &b"GET http://pypi.org/ HTTP/1.1\r\nX: a\n\nGET /x HTTP/1.1\nHost: evil.example\r\n\r\n"[..],
            b"GET http://pypi.org/ HTTP/1.1\nHost: evil\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nno colon\r\n\r\n",
            b"POST http://pypi.org/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\nX: \x00\r\n\r\n",
            b"GET http://pypi.org/ HTTP/1.1\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // A capital scheme and a query without a path are fine.
        let Request::Forward { head, .. } =
            parse_head(b"HEAD HTTP://pypi.org?q=1 HTTP/1.1\r\n\r\n").unwrap()
        else {
            panic!()
        };
        assert!(String::from_utf8(head)
            .unwrap()
            .starts_with("HEAD /?q=1 HTTP/1.1\r\nHost: pypi.org\r\n"));
    }
}
