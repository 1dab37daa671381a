//! Network faults. This kernel has no netem, so faults come from a TCP proxy that the engine
//! runs inside the sandbox's network namespace (Toxiproxy's design, written from its
//! documentation): clients connect to the proxy's port, the proxy forwards to the real service
//! and applies the toxics.
//!
//! The port convention: a task's service listens on `upstream`; clients (the agent, the task's
//! instruction) use `port`. A network perturbation puts a faulty proxy on `port`; a task that
//! wants a front port without faults asks for [`plain_forward`]. Several network
//! perturbations on the same `port` merge into one proxy. In an instance with a task, a
//! network perturbation applies only to a front the task declared (else it is not
//! applicable: the proxy would carry no traffic); without a task, to any port.
//!
//! The proxy is host-side threads: a listener thread joins the sandbox's network namespace
//! (`setns` changes only the calling thread; threads it spawns inherit its namespaces), binds
//! `127.0.0.1:port` there and spawns two threads per connection (one per direction). Every
//! blocking call has a short timeout and checks a shutdown flag, so dropping the
//! [`ProxyHandle`] stops and joins every thread within a tick and closes every socket.

use super::{Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::synth::{Builder, ProxySpec};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the proxy does to a connection (Toxiproxy's toxics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Toxics {
    /// Added to every chunk in each direction.
    pub latency_ms: u64,
    /// Uniform extra delay in 0..=jitter_ms per chunk.
    pub jitter_ms: u64,
    /// Bytes per second in each direction (0 = unlimited).
    pub bandwidth_bps: u64,
    /// Probability that a new connection is dropped at once.
    pub drop_probability: f64,
    /// Probability that a new connection is accepted and then never answered.
    pub stall_probability: f64,
    /// Probability that a connection is reset after some bytes.
    pub reset_probability: f64,
    /// Close the connection after this many ms (0 = never): a timeout toxic.
    pub timeout_ms: u64,
    /// Seed of the proxy's choices.
    pub seed: u64,
    /// A connection chosen for a reset gets it once this many bytes went to the client
    /// (0: as soon as the client sends anything).
    #[serde(default)]
    pub reset_after_bytes: u64,
}

/// The front port clients use by default (the `port` parameter's default).
pub const FRONT_PORT: u16 = 8080;
/// The port a task's service listens on by default (the `upstream` parameter's default).
pub const SERVICE_PORT: u16 = 18080;

/// A proxy that only forwards (no toxics): a task's front port.
pub fn plain_forward(port: u16, upstream: u16) -> ProxySpec {
    ProxySpec {
        listen_port: port,
        upstream_port: upstream,
        toxics: Toxics::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------------------------

/// How often blocked threads look at the shutdown flag.
const TICK: Duration = Duration::from_millis(50);
/// Connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 128;
/// Largest chunk forwarded at once.
const CHUNK: usize = 16 << 10;

/// A running proxy; dropping it stops it.
pub struct ProxyHandle {
    stop: Arc<AtomicBool>,
    counter: Arc<AtomicU64>,
    listener: Option<JoinHandle<()>>,
    pub listen_port: u16,
    pub upstream_port: u16,
}

impl ProxyHandle {
    /// Restart the connection counter, so the proxy's choices in an episode depend only on
    /// the connections of that episode.
    pub fn new_episode(&self) {
        self.counter.store(0, Ordering::SeqCst);
    }

    /// Connections accepted since the start or the last [`Self::new_episode`].
    pub fn connections(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.listener.take() {
            // The listener joins its connection threads before it returns.
            let _ = h.join();
        }
        tracing::debug!(port = self.listen_port, "fault proxy stopped");
    }
}

fn proxy_err(port: u16, reason: impl Into<String>) -> PerturbError {
    PerturbError::Proxy {
        port,
        reason: reason.into(),
    }
}

/// Start a proxy inside the network namespace of the sandbox whose init is `init_pid`.
pub fn start_proxy(init_pid: i32, spec: &ProxySpec) -> Result<ProxyHandle, PerturbError> {
    let port = spec.listen_port;
    let ns_path = format!("/proc/{init_pid}/ns/net");
    let ns = std::fs::File::open(&ns_path)
        .map_err(|e| proxy_err(port, format!("opening {ns_path}: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
    let shared = Shared {
        stop: stop.clone(),
        toxics: spec.toxics.clone(),
        upstream: spec.upstream_port,
    };
    let counter2 = counter.clone();
    let h = std::thread::Builder::new()
        .name(format!("proxy-{port}"))
        .spawn(move || {
            let listener = match bind_in_netns(&ns, port) {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            drop(ns);
            accept_loop(listener, Arc::new(shared), counter2);
        })
        .map_err(|e| proxy_err(port, format!("spawning the listener: {e}")))?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => {
            let _ = h.join();
            return Err(proxy_err(port, reason));
        }
        Err(_) => {
            let _ = h.join();
            return Err(proxy_err(port, "the listener thread ended before binding"));
        }
    }
    tracing::debug!(
        port,
        upstream = spec.upstream_port,
        toxics = ?spec.toxics,
        "fault proxy started"
    );
    Ok(ProxyHandle {
        stop,
        counter,
        listener: Some(h),
        listen_port: port,
        upstream_port: spec.upstream_port,
    })
}

fn bind_in_netns(ns: &std::fs::File, port: u16) -> Result<TcpListener, String> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("joining the sandbox's network namespace: {e}"))?;
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .map_err(|e| format!("listening on 127.0.0.1:{port} in the sandbox: {e}"))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("making the listener non-blocking: {e}"))?;
    Ok(l)
}

/// What every thread of one proxy shares.
struct Shared {
    stop: Arc<AtomicBool>,
    toxics: Toxics,
    upstream: u16,
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, counter: Arc<AtomicU64>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                conns.retain(|h| !h.is_finished());
                if conns.len() >= MAX_CONNECTIONS {
                    tracing::warn!(conn = n, "fault proxy: too many connections, closing");
                    continue;
                }
                let sh = shared.clone();
                // Spawned from this thread, the connection thread is in the sandbox's
                // network namespace too (a new thread copies its creator's namespaces).
                match std::thread::Builder::new()
                    .name(format!("proxy-conn-{n}"))
                    .spawn(move || connection(client, n, &sh))
                {
                    Ok(h) => conns.push(h),
                    Err(e) => tracing::warn!(conn = n, error = %e, "fault proxy: no thread"),
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                let mut fds = [nix::poll::PollFd::new(
                    listener.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let _ = nix::poll::poll(&mut fds, TICK.as_millis() as u16);
            }
            Err(e) => {
                tracing::warn!(error = %e, "fault proxy: accept failed");
                std::thread::sleep(TICK);
            }
        }
    }
    for h in conns {
        let _ = h.join();
    }
}

/// The fate of one connection, drawn at accept from the seed and the connection number.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Drop,
    Stall,
    Timeout,
    Reset { after: u64 },
    Forward,
}

fn fate(t: &Toxics, rng: &mut rand_chacha::ChaCha8Rng) -> Fate {
    // Always draw all three, so one probability does not shift the others' choices.
    let (d, s, r): (f64, f64, f64) = (rng.gen(), rng.gen(), rng.gen());
    if d < t.drop_probability {
        Fate::Drop
    } else if s < t.stall_probability {
        Fate::Stall
    } else if t.timeout_ms > 0 {
        Fate::Timeout
    } else if r < t.reset_probability {
        Fate::Reset {
            after: t.reset_after_bytes,
        }
    } else {
        Fate::Forward
    }
}

/// One connection's state shared by its two directions.
struct Conn {
    proxy: Arc<Shared>,
    /// Set when either direction ends the connection (error, reset).
    abort: AtomicBool,
}

impl Conn {
    fn stopped(&self) -> bool {
        self.abort.load(Ordering::SeqCst) || self.proxy.stop.load(Ordering::SeqCst)
    }
}

/// Sleep up to `d`, waking early when the connection or the proxy stops. False if stopped.
fn nap(d: Duration, conn: &Conn) -> bool {
    let end = Instant::now() + d;
    loop {
        if conn.stopped() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(TICK));
    }
}

fn set_timeouts(s: &TcpStream) {
    let _ = s.set_read_timeout(Some(TICK));
    let _ = s.set_write_timeout(Some(TICK));
}

/// Read and throw away what `s` sends until it closes, `until` passes or the proxy stops.
fn swallow(s: &TcpStream, until: Option<Instant>, conn: &Conn) {
    let mut buf = [0u8; 4096];
    let mut r = s;
    while !conn.stopped() && until.is_none_or(|u| Instant::now() < u) {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if retry(&e) => {}
            Err(_) => break,
        }
    }
}

fn retry(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Make the next close of `s` send a reset (RST) instead of a FIN.
fn arm_reset(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    if let Err(e) = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::Linger, &l) {
        tracing::warn!(error = %e, "fault proxy: SO_LINGER failed");
    }
}

fn connection(client: TcpStream, n: u64, proxy: &Arc<Shared>) {
    let t = &proxy.toxics;
    let mut rng = crate::synth::rng_for(t.seed, &format!("conn{n}"));
    let fate = fate(t, &mut rng);
    tracing::trace!(conn = n, ?fate, "fault proxy: accepted");
    set_timeouts(&client);
    let conn = Arc::new(Conn {
        proxy: proxy.clone(),
        abort: AtomicBool::new(false),
    });
    match fate {
        Fate::Drop => return, // closed at once
        Fate::Stall => {
            swallow(&client, None, &conn);
            return;
        }
        _ => {}
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, proxy.upstream));
    let upstream = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(conn = n, error = %e, "fault proxy: upstream unreachable");
            return;
        }
    };
    set_timeouts(&upstream);
    if fate == Fate::Timeout {
        // Data stops flowing; the connection closes when the timeout passes.
        let until = Instant::now() + Duration::from_millis(t.timeout_ms);
        swallow(&client, Some(until), &conn);
        if nap(until.saturating_duration_since(Instant::now()), &conn) {
            tracing::trace!(conn = n, "fault proxy: timed out");
        }
        return;
    }
    let reset_after = match fate {
        Fate::Reset { after } => Some(after),
        _ => None,
    };
    let client = Arc::new(client);
    let upstream = Arc::new(upstream);
    let down = {
        let (c, u, conn) = (client.clone(), upstream.clone(), conn.clone());
        let rng = crate::synth::rng_for(t.seed, &format!("conn{n}/down"));
        std::thread::Builder::new()
            .name(format!("proxy-down-{n}"))
            .spawn(move || pump(&u, &c, &conn, rng, reset_after))
    };
    let rng_up = crate::synth::rng_for(t.seed, &format!("conn{n}/up"));
    // Upstream direction: a reset at 0 bytes fires on the client's first data.
    pump(
        &client,
        &upstream,
        &conn,
        rng_up,
        reset_after.filter(|a| *a == 0),
    );
    match down {
        Ok(h) => {
            let _ = h.join();
        }
        Err(e) => {
            tracing::warn!(conn = n, error = %e, "fault proxy: no thread");
        }
    }
    // Both Arcs end here: the sockets close (with RST where a reset was armed).
}

/// Forward `src` to `dst` with the toxics until EOF, an error, a reset or the stop.
/// `reset_after`: reset the connection (the client side is `dst` in the downstream direction,
/// `src` in the upstream one) once that many bytes were forwarded.
fn pump(
    src: &Arc<TcpStream>,
    dst: &Arc<TcpStream>,
    conn: &Conn,
    mut rng: rand_chacha::ChaCha8Rng,
    reset_after: Option<u64>,
) {
    let t = &conn.proxy.toxics;
    let chunk = if t.bandwidth_bps > 0 {
        ((t.bandwidth_bps / 20) as usize).clamp(1, CHUNK)
    } else {
        CHUNK
    };
    let mut buf = vec![0u8; chunk];
    let mut sent: u64 = 0;
    let mut started: Option<Instant> = None;
    let reset = |conn: &Conn| {
        // The client is whichever of the two is not the upstream: arm both; only the
        // client's RST matters to the agent, the upstream sees a reset too (as it would).
        arm_reset(src);
        arm_reset(dst);
        conn.abort.store(true, Ordering::SeqCst);
    };
    loop {
        if conn.stopped() {
            return;
        }
        let n = match (&**src).read(&mut buf) {
            Ok(0) => {
                let _ = dst.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if retry(&e) => continue,
            Err(_) => {
                conn.abort.store(true, Ordering::SeqCst);
                return;
            }
        };
        let mut n = n;
        let mut reset_now = false;
        if let Some(limit) = reset_after {
            if sent + n as u64 >= limit {
                n = (limit - sent.min(limit)) as usize;
                reset_now = true;
            }
        }
        let mut delay = t.latency_ms;
        if t.jitter_ms > 0 {
            delay += rng.gen_range(0..=t.jitter_ms);
        }
        if delay > 0 && !nap(Duration::from_millis(delay), conn) {
            return;
        }
        if t.bandwidth_bps > 0 {
            let start = *started.get_or_insert_with(Instant::now);
            let due =
                start + Duration::from_secs_f64((sent + n as u64) as f64 / t.bandwidth_bps as f64);
            if !nap(due.saturating_duration_since(Instant::now()), conn) {
                return;
            }
        }
        if !write_all(dst, &buf[..n], conn) {
            conn.abort.store(true, Ordering::SeqCst);
            return;
        }
        sent += n as u64;
        if reset_now {
            reset(conn);
            return;
        }
    }
}

fn write_all(dst: &TcpStream, mut data: &[u8], conn: &Conn) -> bool {
    let mut w = dst;
    while !data.is_empty() {
        if conn.stopped() {
            return false;
        }
        match w.write(data) {
            Ok(0) => return false,
            Ok(k) => data = &data[k..],
            Err(e) if retry(&e) => {}
            Err(_) => return false,
        }
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The perturbations
// ---------------------------------------------------------------------------------------------

const PORT: ParamSpec = ParamSpec {
    name: "port",
    kind: Kind::Int { min: 1, max: 65535 },
    default: "8080",
    realistic: "the port clients use (the task's front port)",
    help: "port the proxy listens on (127.0.0.1 in the sandbox)",
};
const UPSTREAM: ParamSpec = ParamSpec {
    name: "upstream",
    kind: Kind::Int { min: 1, max: 65535 },
    default: "18080",
    realistic: "the port the real service listens on",
    help: "port the proxy forwards to (127.0.0.1 in the sandbox)",
};

/// Add a proxy for `port`, or merge into the one already there; `f` sets the toxics.
fn with_proxy(
    params: &Params,
    purpose: &str,
    b: &mut Builder,
    f: impl FnOnce(&mut Toxics),
) -> Result<String, PerturbError> {
    let port = params.int("port") as u16;
    let upstream = params.int("upstream") as u16;
    if port == upstream {
        return Err(PerturbError::BadParam {
            param: "upstream".into(),
            reason: format!("equals `port` ({port}): the proxy would forward to itself"),
        });
    }
    // With a task, a fault must land on traffic the task has: a front the task declared.
    // Anywhere else the proxy would carry nothing, and "solvable under net-latency" would
    // be a claim about a fault that never happened.
    if let Some(task) = &b.task {
        if !b.runtime.proxies.iter().any(|p| p.listen_port == port) {
            return Err(PerturbError::NotApplicable(format!(
                "the task `{}` has no service behind 127.0.0.1:{port}: a fault proxy there \
                 would carry no traffic",
                task.task
            )));
        }
    }
    let seed = b.rng(purpose).next_u64();
    let proxies = &mut b.runtime.proxies;
    let i = match proxies.iter().position(|p| p.listen_port == port) {
        Some(i) => {
            if proxies[i].upstream_port != upstream {
                return Err(PerturbError::BadParam {
                    param: "upstream".into(),
                    reason: format!(
                        "port {port} already forwards to {}, not {upstream}",
                        proxies[i].upstream_port
                    ),
                });
            }
            i
        }
        None => {
            let mut spec = plain_forward(port, upstream);
            spec.toxics.seed = seed;
            proxies.push(spec);
            proxies.len() - 1
        }
    };
    if proxies[i].toxics.seed == 0 {
        // A task's plain forward has no seed yet: the first fault gives it one.
        proxies[i].toxics.seed = seed;
    }
    f(&mut proxies[i].toxics);
    Ok(format!(
        "proxy 127.0.0.1:{port} -> {upstream}: {:?}",
        proxies[i].toxics
    ))
}

macro_rules! net_perturbation {
    ($ty:ident, $info:ident) => {
        pub struct $ty;
        impl Perturbation for $ty {
            fn info(&self) -> &'static Info {
                &$info
            }
            fn apply(
                &self,
                params: &Params,
                purpose: &str,
                b: &mut Builder,
            ) -> Result<String, PerturbError> {
                with_proxy(params, purpose, b, |t| Self::set(params, t))
            }
        }
    };
}

pub static NET_LATENCY: Info = Info {
    name: "net-latency",
    family: super::Family::Network,
    summary: "connections to a port are slow: every chunk is delayed",
    mechanism: "fault proxy on `port` forwarding to `upstream`; each chunk waits ms + \
                uniform(0..=jitter_ms) in each direction",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "200",
            realistic: "20-500 (WAN, congested links), up to 3000 (satellite, overloaded)",
            help: "delay added to every chunk in each direction",
        },
        ParamSpec {
            name: "jitter_ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "0",
            realistic: "0-100",
            help: "uniform extra delay per chunk",
        },
    ],
};
net_perturbation!(NetLatency, NET_LATENCY);
impl NetLatency {
    fn set(p: &Params, t: &mut Toxics) {
        t.latency_ms = p.int("ms") as u64;
        t.jitter_ms = p.int("jitter_ms") as u64;
    }
}

pub static NET_LOSS: Info = Info {
    name: "net-loss",
    family: super::Family::Network,
    summary: "some connections are closed at once, others hang without an answer",
    mechanism: "fault proxy; per connection (seeded by the connection number): closed at \
                accept with probability `drop`, else accepted and never answered with \
                probability `stall`",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "drop",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.3",
            realistic: "0.01-0.5 (flaky links, overloaded load balancers)",
            help: "probability that a connection is closed at accept",
        },
        ParamSpec {
            name: "stall",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0",
            realistic: "0-0.3 (black-holed packets, full backlogs)",
            help: "probability that a connection is accepted and never answered",
        },
    ],
};
net_perturbation!(NetLoss, NET_LOSS);
impl NetLoss {
    fn set(p: &Params, t: &mut Toxics) {
        t.drop_probability = p.float("drop");
        t.stall_probability = p.float("stall");
    }
}

pub static NET_BANDWIDTH: Info = Info {
    name: "net-bandwidth",
    family: super::Family::Network,
    summary: "transfers through a port are slow",
    mechanism: "fault proxy; each direction forwards in chunks of bps/20 bytes and never \
                runs ahead of bps bytes per second",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "bps",
            kind: Kind::Int {
                min: 1,
                max: 1 << 40,
            },
            default: "65536",
            realistic: "8000-1000000 (modems, throttled links, shared uplinks)",
            help: "bytes per second in each direction",
        },
    ],
};
net_perturbation!(NetBandwidth, NET_BANDWIDTH);
impl NetBandwidth {
    fn set(p: &Params, t: &mut Toxics) {
        t.bandwidth_bps = p.int("bps") as u64;
    }
}

pub static NET_RESET: Info = Info {
    name: "net-reset",
    family: super::Family::Network,
    summary: "some connections are reset (ECONNRESET) after some bytes",
    mechanism: "fault proxy; a connection chosen with `probability` (seeded) is closed with \
                SO_LINGER 0 (a TCP RST) once `after_bytes` went to the client, or at the \
                client's first data when 0",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "probability",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.5",
            realistic: "0.01-0.5 (restarting peers, middleboxes, idle timeouts)",
            help: "probability that a connection is reset",
        },
        ParamSpec {
            name: "after_bytes",
            kind: Kind::Int {
                min: 0,
                max: 1 << 40,
            },
            default: "0",
            realistic: "0 (at once) to a few KiB (mid-response)",
            help: "bytes forwarded to the client before the reset",
        },
    ],
};
net_perturbation!(NetReset, NET_RESET);
impl NetReset {
    fn set(p: &Params, t: &mut Toxics) {
        t.reset_probability = p.float("probability");
        t.reset_after_bytes = p.int("after_bytes") as u64;
    }
}

pub static NET_TIMEOUT: Info = Info {
    name: "net-timeout",
    family: super::Family::Network,
    summary: "connections are accepted, nothing gets through, and they close after a timeout",
    mechanism: "fault proxy (Toxiproxy's timeout toxic): the proxy connects upstream but \
                forwards nothing and closes both sides `ms` after accept",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "ms",
            kind: Kind::Int {
                min: 1,
                max: 600_000,
            },
            default: "1000",
            realistic: "1000-60000 (gateway and load-balancer timeouts)",
            help: "time after which the proxy closes each connection",
        },
    ],
};
net_perturbation!(NetTimeout, NET_TIMEOUT);
impl NetTimeout {
    fn set(p: &Params, t: &mut Toxics) {
        t.timeout_ms = p.int("ms") as u64;
    }
}

pub static DNS_BROKEN: Info = Info {
    name: "dns-broken",
    family: super::Family::Network,
    summary: "name resolution is misconfigured",
    mechanism: "writes the layer's /etc/resolv.conf (an unreachable nameserver, or garbage), \
                deletes it, or rewrites /etc/hosts so `name` maps to a wrong loopback address",
    params: &[
        ParamSpec {
            name: "how",
            kind: Kind::Choice(&["bad-nameserver", "garbage", "missing", "wrong-hosts"]),
            default: "wrong-hosts",
            realistic: "all four happen (stale DHCP, broken templating, hand edits)",
            help: "what is broken",
        },
        ParamSpec {
            name: "name",
            kind: Kind::Str,
            default: "localhost",
            realistic: "localhost or a service name the task uses",
            help: "host name that `wrong-hosts` maps to a wrong address",
        },
    ],
};

pub struct DnsBroken;

const GARBAGE: &[&str] = &[
    "nameserver\n",
    "nameserver 256.1.1.1\n",
    "namesever 127.0.0.53\n",
    "nameserver 127.0.0.53 127.0.0.1\noptions ndots:abc\n",
    "<<<<<<< HEAD\nnameserver 10.0.0.2\n=======\n>>>>>>> dhcp\n",
    "search\x00corp\nnameserver: 8.8.8.8\n",
];

impl Perturbation for DnsBroken {
    fn info(&self) -> &'static Info {
        &DNS_BROKEN
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        match params.str("how") {
            "bad-nameserver" => {
                // TEST-NET addresses (RFC 5737): never answer.
                let ns = format!("192.0.2.{}", rng.gen_range(1..=254));
                b.remove("/etc/resolv.conf")?;
                b.write(
                    "/etc/resolv.conf",
                    format!("# generated by NetworkManager\nnameserver {ns}\noptions timeout:2 attempts:1\n"),
                    0o644,
                )?;
                Ok(format!("/etc/resolv.conf points at {ns}"))
            }
            "garbage" => {
                let g = GARBAGE[rng.gen_range(0..GARBAGE.len())];
                b.remove("/etc/resolv.conf")?;
                b.write("/etc/resolv.conf", g, 0o644)?;
                Ok("/etc/resolv.conf is garbage".into())
            }
            "missing" => {
                if !b.exists("/etc/resolv.conf") {
                    return Err(PerturbError::NotApplicable(
                        "the base has no /etc/resolv.conf".into(),
                    ));
                }
                b.remove("/etc/resolv.conf")?;
                Ok("/etc/resolv.conf removed".into())
            }
            _ => {
                let name = params.str("name").trim();
                if name.is_empty() || name.contains(char::is_whitespace) {
                    return Err(PerturbError::BadParam {
                        param: "name".into(),
                        reason: format!("`{name}` is not a host name"),
                    });
                }
                // Another loopback address: on `lo`, but nothing listens there.
                let wrong = format!(
                    "127.0.{}.{}",
                    rng.gen_range(1..=254),
                    rng.gen_range(2..=254)
                );
                let old = b
                    .read("/etc/hosts")
                    .map(|d| String::from_utf8_lossy(&d).into_owned())
                    .unwrap_or_default();
                let mut out = String::new();
                for line in old.lines() {
                    let body = line.split('#').next().unwrap_or("");
                    let mut f = body.split_whitespace();
                    let addr = f.next();
                    let names: Vec<&str> = f.collect();
                    if addr.is_some() && names.contains(&name) {
                        let rest: Vec<&str> = names.into_iter().filter(|n| *n != name).collect();
                        if !rest.is_empty() {
                            out.push_str(&format!("{}\t{}\n", addr.unwrap_or(""), rest.join(" ")));
                        }
                        continue;
                    }
                    out.push_str(line);
                    out.push('\n');
                }
                out.push_str(&format!("{wrong}\t{name}\n"));
                b.remove("/etc/hosts")?;
                b.write("/etc/hosts", out, 0o644)?;
                Ok(format!("/etc/hosts maps {name} to {wrong}"))
            }
        }
    }
}

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![
        &NetLatency,
        &NetLoss,
        &NetBandwidth,
        &NetReset,
        &NetTimeout,
        &DnsBroken,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{BaseView, Resources};

    fn apply(b: &mut Builder, spec: &str, i: usize) -> Result<String, PerturbError> {
        let c = super::super::parse_spec(spec)?;
        let p = super::super::get(&c.name).ok_or(PerturbError::Unknown(c.name.clone()))?;
        p.apply(&c.params, &format!("{}#{i}", c.name), b)
    }

    #[test]
    fn perturbations_on_one_port_merge_into_one_proxy() {
        let base = BaseView::from_dirs(vec![]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(
            &mut b,
            "net-latency:port=80,upstream=8080,ms=100,jitter_ms=5",
            0,
        )
        .unwrap();
        apply(&mut b, "net-loss:port=80,upstream=8080,drop=0.25", 1).unwrap();
        apply(&mut b, "net-reset:port=81,upstream=8080,probability=0.5", 2).unwrap();
        let p = b.runtime.proxies.clone();
        assert_eq!(p.len(), 2);
        let t = &p[0].toxics;
        assert_eq!(
            (t.latency_ms, t.jitter_ms, t.drop_probability),
            (100, 5, 0.25)
        );
        assert_ne!(t.seed, p[1].toxics.seed);
        assert!(matches!(
            apply(&mut b, "net-loss:port=80,upstream=9090", 3),
            Err(PerturbError::BadParam { .. })
        ));
        assert!(matches!(
            apply(&mut b, "net-loss:port=80,upstream=80", 4),
            Err(PerturbError::BadParam { .. })
        ));
        // A task's plain forward takes the first fault's seed.
        let mut fwd = Builder::new(&base, 1, Resources::default());
        fwd.runtime
            .proxies
            .push(plain_forward(FRONT_PORT, SERVICE_PORT));
        apply(&mut fwd, "net-loss", 0).unwrap();
        assert_eq!(fwd.runtime.proxies.len(), 1);
        let want = fwd.rng("net-loss#0").next_u64();
        assert_eq!(fwd.runtime.proxies[0].toxics.seed, want);
        assert_ne!(want, 0);
        assert_eq!(PORT.default, FRONT_PORT.to_string());
        assert_eq!(UPSTREAM.default, SERVICE_PORT.to_string());
        // The same plan gives the same seeds.
        let mut again = Builder::new(&base, 1, Resources::default());
        apply(
            &mut again,
            "net-latency:port=80,upstream=8080,ms=100,jitter_ms=5",
            0,
        )
        .unwrap();
        assert_eq!(again.runtime.proxies[0].toxics.seed, t.seed);
    }

    #[test]
    fn wrong_hosts_remaps_only_the_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/hosts"),
            "127.0.0.1 localhost box\n::1 localhost ip6-localhost\n10.0.0.5 db # the db\n",
        )
        .unwrap();
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(&mut b, "dns-broken:how=wrong-hosts", 0).unwrap();
        let hosts = String::from_utf8(b.read("/etc/hosts").unwrap()).unwrap();
        let lines: Vec<&str> = hosts.lines().collect();
        assert_eq!(lines[0], "127.0.0.1\tbox");
        assert_eq!(lines[1], "::1\tip6-localhost");
        assert_eq!(lines[2], "10.0.0.5 db # the db");
        assert!(lines[3].starts_with("127.0.") && lines[3].ends_with("\tlocalhost"));
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn fates_follow_the_probabilities_and_the_seed() {
        let t = Toxics {
            drop_probability: 0.5,
            seed: 9,
            ..Toxics::default()
        };
        let draw = |t: &Toxics| -> Vec<Fate> {
            (0..200)
                .map(|n| fate(t, &mut crate::synth::rng_for(t.seed, &format!("conn{n}"))))
                .collect()
        };
        let a = draw(&t);
        assert_eq!(a, draw(&t));
        let drops = a.iter().filter(|f| **f == Fate::Drop).count();
        assert!((50..150).contains(&drops), "{drops} drops of 200");
        assert!(a.iter().all(|f| matches!(f, Fate::Drop | Fate::Forward)));
        let other = draw(&Toxics {
            seed: 10,
            ..t.clone()
        });
        assert_ne!(a, other);
        let all_drop = draw(&Toxics {
            drop_probability: 1.0,
            ..t
        });
        assert!(all_drop.iter().all(|f| *f == Fate::Drop));
    }
}
