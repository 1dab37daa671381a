//! The fault proxy runtime: a TCP proxy that the engine runs inside a sandbox's network
//! namespace (this kernel has no netem), forwarding to the real service and applying the
//! toxics of a [`ProxySpec`] (Toxiproxy's design, written from its documentation). The
//! network perturbations (`perturb/net.rs`) only declare proxies; a running instance
//! (`running.rs`) starts them.
//!
//! The proxy is host-side threads: a listener thread joins the sandbox's network namespace
//! (`setns` changes only the calling thread; threads it spawns inherit its namespaces), binds
//! `127.0.0.1:port` there and spawns two threads per connection (one per direction). Every
//! blocking call has a short timeout and checks a shutdown flag, so dropping the
//! [`ProxyHandle`] stops and joins every thread within a tick and closes every socket.

use crate::instance::{ProxySpec, Toxics};
use rand::Rng;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Errors of starting a fault proxy.
#[derive(Debug, thiserror::Error)]
pub enum NetfaultError {
    #[error("fault proxy on port {port}: {what}: {source}")]
    Setup {
        port: u16,
        what: String,
        source: std::io::Error,
    },
    #[error("fault proxy on port {port}: the listener thread ended before binding")]
    ListenerGone { port: u16 },
}

impl NetfaultError {
    /// The port of the proxy that failed.
    pub fn port(&self) -> u16 {
        match self {
            Self::Setup { port, .. } | Self::ListenerGone { port } => *port,
        }
    }
}

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

fn setup_err(port: u16, what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetfaultError {
    let what = what.into();
    move |source| NetfaultError::Setup { port, what, source }
}

/// Start a proxy inside the network namespace of the sandbox whose init is `init_pid`.
pub fn start_proxy(init_pid: i32, spec: &ProxySpec) -> Result<ProxyHandle, NetfaultError> {
    let port = spec.listen_port;
    let ns_path = format!("/proc/{init_pid}/ns/net");
    let ns =
        std::fs::File::open(&ns_path).map_err(setup_err(port, format!("opening {ns_path}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(), NetfaultError>>(1);
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
        .map_err(setup_err(port, "spawning the listener"))?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = h.join();
            return Err(e);
        }
        Err(_) => {
            let _ = h.join();
            return Err(NetfaultError::ListenerGone { port });
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

fn bind_in_netns(ns: &std::fs::File, port: u16) -> Result<TcpListener, NetfaultError> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(std::io::Error::from)
        .map_err(setup_err(port, "joining the sandbox's network namespace"))?;
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).map_err(setup_err(
        port,
        format!("listening on 127.0.0.1:{port} in the sandbox"),
    ))?;
    l.set_nonblocking(true)
        .map_err(setup_err(port, "making the listener non-blocking"))?;
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
        let Some(client) = accept_within(&listener, TICK, "fault proxy") else {
            continue;
        };
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
    for h in conns {
        let _ = h.join();
    }
}

/// Accept a connection on a non-blocking listener, or wait up to `tick` for one (`None`); an
/// accept that fails for another reason is logged (as `who`'s) and waited out.
pub(crate) fn accept_within(
    listener: &TcpListener,
    tick: Duration,
    who: &str,
) -> Option<TcpStream> {
    match listener.accept() {
        Ok((client, _)) => Some(client),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
            let mut fds = [nix::poll::PollFd::new(
                listener.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let _ = nix::poll::poll(
                &mut fds,
                u16::try_from(tick.as_millis()).unwrap_or(u16::MAX),
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, who, "accept failed");
            std::thread::sleep(tick);
            None
        }
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
    let mut rng = crate::instance::rng_for(t.seed, &format!("conn{n}"));
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
        let rng = crate::instance::rng_for(t.seed, &format!("conn{n}/down"));
        std::thread::Builder::new()
            .name(format!("proxy-down-{n}"))
            .spawn(move || pump(&u, &c, &conn, rng, reset_after))
    };
    let rng_up = crate::instance::rng_for(t.seed, &format!("conn{n}/up"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_the_probabilities_and_the_seed() {
        let t = Toxics {
            drop_probability: 0.5,
            seed: 9,
            ..Toxics::default()
        };
        let draw = |t: &Toxics| -> Vec<Fate> {
            (0..200)
                .map(|n| {
                    fate(
                        t,
                        &mut crate::instance::rng_for(t.seed, &format!("conn{n}")),
                    )
                })
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
