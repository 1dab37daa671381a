//! `engine bench serve`: what `engine serve` adds to a step, and what a held session costs.
//!
//! One run starts an `engine serve` process on loopback and, on the same task and instance,
//! times `steps` steps of `command` both ways, interleaved (one in-process, one through the
//! server, and so on, so that the machine's load falls on both alike):
//! - `in_process`: [`Env::step`] in this process (the baseline);
//! - `server`: the round trip of a step frame over a WebSocket session from a Rust client in
//!   this process (tokio-tungstenite), i.e. the same `Env::step` in the server plus the
//!   protocol, JSON and loopback;
//! - `overhead_p50_ms` / `overhead_p99_ms`: their differences; `ratio_p50`: server / in-process.
//!
//! Then it opens `sessions` more WebSocket sessions and holds them all at once; each answers
//! a `state` frame, and one more connection is refused with `CAPACITY_REACHED`, whose
//! `active_sessions` is the server's own count. `kib_per_session` is the server process's RSS
//! growth over the sessions (the sessions hold no sandbox until they reset; the one stepping
//! session's sandbox processes are not in the server's RSS).
//!
//! `resets`: reset latency through the server under both pool policies, two servers side by
//! side (`--pool 2`, `--pool-policy last` and `instance`). On each, two sessions reset seeds
//! `seed` and `seed + 1` and close, so the pool holds an environment running each; then one
//! session resets the two seeds in turn, `resets` times, alternating between the servers.
//! Under `last` the session keeps its own environment, which runs the other instance: every
//! reset starts a sandbox. Under `instance` it trades it for the pooled one that runs the
//! instance: an incremental reset. `ratio_p50` is last / instance; the counts are the
//! servers' own (`warm_resets`, `cold_resets` of `/metadata`). Times are milliseconds as
//! `{p50, p99, n}`; `machine` has the CPU count and the load average at the start and end.

use crate::env::{Action, Env, EnvConfig};
use crate::instance::Plan;
use crate::synth::Cache;
use futures_util::{SinkExt, StreamExt};
use sandbox::Runtime;
use serde::Serialize;
use serde_json::{json, Value};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

#[derive(Debug, thiserror::Error)]
pub enum BenchServeError {
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    #[error("starting the server `{cmd}`: {reason}")]
    Start { cmd: String, reason: String },
    #[error("the server: {0}")]
    Io(#[from] std::io::Error),
    #[error("session {session}: {reason}")]
    Session { session: usize, reason: String },
    #[error("step {step}: {reason}")]
    Step { step: usize, reason: String },
}

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct ServeBenchOpts {
    pub task: String,
    pub seed: u64,
    /// Timed steps each way (after a warm-up of a tenth as many, at least 5).
    pub steps: usize,
    pub command: String,
    /// Sessions to hold at once.
    pub sessions: usize,
    /// Timed resets per pool policy (0: none).
    pub resets: usize,
}

/// Percentiles of a sample, milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub n: usize,
}

impl Latency {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            p50: super::quantile(&v, 0.5),
            p99: super::quantile(&v, 0.99),
            n: v.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Held {
    pub requested: usize,
    /// Sessions that answered a `state` frame while all were open.
    pub held: usize,
    /// The server's count of open sessions (from the refusal of one more), the stepping
    /// session included.
    pub server_active_sessions: Option<u64>,
    /// Seconds to open all of them (connect and upgrade, one after the other).
    pub open_seconds: f64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub kib_per_session: f64,
}

/// Reset latency through the server per pool policy.
#[derive(Debug, Clone, Serialize)]
pub struct Resets {
    pub last: Latency,
    pub instance: Latency,
    /// `last` / `instance` at p50.
    pub ratio_p50: f64,
    /// The servers' counts after the runs: `[warm_resets, cold_resets]`.
    pub last_counts: [u64; 2],
    pub instance_counts: [u64; 2],
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub load_start: f64,
    pub load_end: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServeBenchReport {
    pub task: String,
    pub instance: Option<String>,
    pub command: String,
    pub in_process: Latency,
    pub server: Latency,
    pub overhead_p50_ms: f64,
    pub overhead_p99_ms: f64,
    pub ratio_p50: f64,
    pub sessions: Held,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets: Option<Resets>,
    pub machine: Machine,
}

/// The `engine serve` child: stopped with SIGTERM (it tears its sandboxes down) when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(
        cmd: &[String],
        o: &ServeBenchOpts,
        pool: usize,
        policy: &str,
        max_sessions: usize,
    ) -> Result<Self, BenchServeError> {
        let shown = cmd.join(" ");
        let err = |reason: String| BenchServeError::Start {
            cmd: shown.clone(),
            reason,
        };
        let (exe, pre) = cmd.split_first().ok_or_else(|| err("empty".into()))?;
        let mut child = Command::new(exe)
            .args(pre)
            .args([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--pool",
                &pool.to_string(),
            ])
            .args(["--pool-policy", policy])
            .args([
                "--task",
                &o.task,
                "--idle-timeout",
                "3600",
                "--keepalive",
                "3600",
            ])
            .args(["--max-sessions", &max_sessions.to_string()])
            .args(["--max-steps", "1000000000"])
            .env("ENVFACTORY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| err(e.to_string()))?;
        let out = child.stdout.take();
        // The guard first: a failed read still stops the child.
        let mut server = Self {
            child,
            addr: String::new(),
        };
        let mut line = String::new();
        if let Some(out) = out {
            std::io::BufReader::new(out).read_line(&mut line)?;
        }
        match line.trim().strip_prefix("listening on http://") {
            Some(a) => {
                server.addr = a.to_string();
                Ok(server)
            }
            None => Err(err(format!(
                "it printed {:?} instead of its address",
                crate::text::cut(line.trim())
            ))),
        }
    }

    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::warn!(
            pid = self.child.id(),
            "the server did not stop on SIGTERM: killing it"
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Run the benchmark; `server_cmd` runs this program (`engine serve` is appended to it).
pub fn run(
    rt: &Runtime,
    cache: &Cache,
    o: &ServeBenchOpts,
    server_cmd: &[String],
) -> Result<ServeBenchReport, BenchServeError> {
    if crate::tasks::get(&o.task).is_none() {
        return Err(BenchServeError::UnknownTask(o.task.clone()));
    }
    let load_start = load();
    let server = Server::start(server_cmd, o, 1, "instance", o.sessions + 1)?;
    let cfg = EnvConfig {
        max_steps: Some(1_000_000_000),
        ..EnvConfig::default()
    };
    let mut env = Env::new(rt.clone(), cache.clone(), cfg)?;
    let plan = Plan::for_task(&o.task, o.seed, vec![]);
    env.reset(&plan)?;
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let url = format!("ws://{}/ws", server.addr);
    let report = tokio.block_on(async {
        let mut ws = connect(&url, 0).await?;
        let reset = json!({"type": "reset", "data": {"task": o.task, "seed": o.seed}});
        let first = exchange(&mut ws, &reset)
            .await
            .map_err(|reason| BenchServeError::Session { session: 0, reason })?;
        let theirs = first["data"]["observation"]["info"]["instance"].as_str();
        if theirs != env.instance_id() {
            return Err(BenchServeError::Session {
                session: 0,
                reason: format!(
                    "the server runs instance {theirs:?}, this process {:?}",
                    env.instance_id()
                ),
            });
        }
        let step = json!({"type": "step", "data": {"command": o.command}});
        let action = Action::Command(o.command.clone());
        let warm = (o.steps / 10).max(5);
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        for i in 0..warm + o.steps {
            let t = Instant::now();
            env.step(&action)?;
            let l = super::ms(t);
            let t = Instant::now();
            let reply = exchange(&mut ws, &step)
                .await
                .map_err(|reason| BenchServeError::Step { step: i, reason })?;
            let r = super::ms(t);
            if reply["type"] != "observation" {
                return Err(BenchServeError::Step {
                    step: i,
                    reason: format!("answered {}", crate::text::cut(&reply.to_string())),
                });
            }
            if i >= warm {
                local.push(l);
                remote.push(r);
            }
        }
        let sessions = hold(&server, &url, o.sessions).await?;
        let _ = ws.close(None).await;
        let resets = match o.resets {
            0 => None,
            n => Some(resets(server_cmd, o, n).await?),
        };
        let (in_process, server_l) = (Latency::of(local), Latency::of(remote));
        Ok::<_, BenchServeError>(ServeBenchReport {
            task: o.task.clone(),
            instance: env.instance_id().map(str::to_string),
            command: o.command.clone(),
            in_process,
            server: server_l,
            overhead_p50_ms: server_l.p50 - in_process.p50,
            overhead_p99_ms: server_l.p99 - in_process.p99,
            ratio_p50: server_l.p50 / in_process.p50,
            sessions,
            resets,
            machine: Machine {
                cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
                load_start,
                load_end: load(),
            },
        })
    })?;
    drop(server);
    Ok(report)
}

/// Reset latency under both pool policies (the module's doc says how).
async fn resets(cmd: &[String], o: &ServeBenchOpts, n: usize) -> Result<Resets, BenchServeError> {
    let last = Server::start(cmd, o, 2, "last", 3)?;
    let instance = Server::start(cmd, o, 2, "instance", 3)?;
    let reset = |seed: u64| json!({"type": "reset", "data": {"task": o.task, "seed": seed}});
    let mut timed = Vec::new();
    for server in [&last, &instance] {
        let url = format!("ws://{}/ws", server.addr);
        let (mut a, mut b) = (connect(&url, 1).await?, connect(&url, 2).await?);
        for (i, (ws, seed)) in [(&mut a, o.seed), (&mut b, o.seed + 1)]
            .into_iter()
            .enumerate()
        {
            let r =
                exchange(ws, &reset(seed))
                    .await
                    .map_err(|reason| BenchServeError::Session {
                        session: i + 1,
                        reason,
                    })?;
            expect_observation(&r, i + 1)?;
        }
        // Both environments back in the pool, in this order (seed + 1 returned last), before
        // the timed session starts.
        for (k, mut ws) in [a, b].into_iter().enumerate() {
            let _ = ws.close(None).await;
            pooled(&server.addr, k + 1).await?;
        }
        timed.push(connect(&url, 3).await?);
    }
    let warm = (n / 10).max(2);
    let mut ms = [Vec::new(), Vec::new()];
    for i in 0..warm + n {
        let seed = o.seed + (i as u64 % 2);
        // Alternate which server goes first, so that load falls on both alike.
        for k in [i % 2, 1 - i % 2] {
            let t = Instant::now();
            let r = exchange(&mut timed[k], &reset(seed))
                .await
                .map_err(|reason| BenchServeError::Session { session: 3, reason })?;
            let took = super::ms(t);
            expect_observation(&r, 3)?;
            if i >= warm {
                ms[k].push(took);
            }
        }
    }
    for mut ws in timed {
        let _ = ws.close(None).await;
    }
    let counts = |m: &Value| {
        let c = &m["capacity"];
        [
            c["warm_resets"].as_u64().unwrap_or(0),
            c["cold_resets"].as_u64().unwrap_or(0),
        ]
    };
    let (last_counts, instance_counts) = (
        counts(&metadata(&last.addr)?),
        counts(&metadata(&instance.addr)?),
    );
    let [l, i] = ms;
    let (last, instance) = (Latency::of(l), Latency::of(i));
    Ok(Resets {
        last,
        instance,
        ratio_p50: last.p50 / instance.p50,
        last_counts,
        instance_counts,
    })
}

/// Wait until a server's pool holds `n` environments.
async fn pooled(addr: &str, n: usize) -> Result<(), BenchServeError> {
    let t = Instant::now();
    while metadata(addr)?["capacity"]["pooled_envs"] != n {
        if t.elapsed() > Duration::from_secs(30) {
            return Err(BenchServeError::Session {
                session: n,
                reason: "its environment did not return to the pool".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn expect_observation(r: &Value, session: usize) -> Result<(), BenchServeError> {
    if r["type"] == "observation" {
        return Ok(());
    }
    Err(BenchServeError::Session {
        session,
        reason: format!("answered {}", crate::text::cut(&r.to_string())),
    })
}

/// `GET /metadata` of a server, over a plain HTTP/1.1 connection (blocking: the server is
/// another process, and the answer takes a millisecond).
fn metadata(addr: &str) -> Result<Value, BenchServeError> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.write_all(b"GET /metadata HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    tcp.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).map_err(|e| BenchServeError::Session {
        session: 0,
        reason: format!("/metadata: {e}"),
    })
}

/// Open `n` sessions and hold them all; each answers `state`, one more is refused.
async fn hold(server: &Server, url: &str, n: usize) -> Result<Held, BenchServeError> {
    let rss_before_kib = server.rss_kib();
    let t = Instant::now();
    let mut open = Vec::with_capacity(n);
    for i in 1..=n {
        open.push(connect(url, i).await?);
    }
    let open_seconds = t.elapsed().as_secs_f64();
    let mut held = 0;
    for ws in &mut open {
        if let Ok(v) = exchange(ws, &json!({"type": "state"})).await {
            held += usize::from(v["type"] == "state");
        }
    }
    let rss_after_kib = server.rss_kib();
    let mut extra = connect(url, n + 1).await?;
    let refusal = next_text(&mut extra).await.unwrap_or(Value::Null);
    let server_active_sessions = (refusal["data"]["code"] == "CAPACITY_REACHED")
        .then(|| refusal["data"]["active_sessions"].as_u64())
        .flatten();
    for mut ws in open {
        let _ = ws.close(None).await;
    }
    Ok(Held {
        requested: n,
        held,
        server_active_sessions,
        open_seconds,
        rss_before_kib,
        rss_after_kib,
        kib_per_session: (rss_after_kib as f64 - rss_before_kib as f64) / n.max(1) as f64,
    })
}

async fn connect(url: &str, session: usize) -> Result<Socket, BenchServeError> {
    let bad = |reason: String| BenchServeError::Session { session, reason };
    let addr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| bad(e.to_string()))?;
    tcp.set_nodelay(true).map_err(|e| bad(e.to_string()))?;
    let (ws, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .map_err(|e| bad(e.to_string()))?;
    Ok(ws)
}

/// Send a frame, read the answer.
async fn exchange(ws: &mut Socket, frame: &Value) -> Result<Value, String> {
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .map_err(|e| e.to_string())?;
    next_text(ws).await
}

/// The next text frame, as JSON (pings are answered by the stream itself).
async fn next_text(ws: &mut Socket) -> Result<Value, String> {
    loop {
        match ws.next().await {
            None => return Err("closed".into()),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(Message::Text(t))) => {
                return serde_json::from_str(t.as_str()).map_err(|e| e.to_string())
            }
            Some(Ok(Message::Close(_))) => return Err("closed by the server".into()),
            Some(Ok(_)) => {}
        }
    }
}

/// The report as text.
pub fn render(r: &ServeBenchReport) -> String {
    format!(
        "task {} (instance {}), step `{}`, {} timed steps each way\n\
         in-process Env::step   p50 {:.3} ms  p99 {:.3} ms\n\
         through engine serve   p50 {:.3} ms  p99 {:.3} ms  (WebSocket round trip, Rust client)\n\
         server overhead        p50 {:+.3} ms  p99 {:+.3} ms  ratio {:.2} at p50\n\
         sessions held          {} of {} (server count {}), opened in {:.2} s\n\
         server RSS             {} -> {} KiB: {:.1} KiB per session\n\
         {}\
         machine                {} CPUs, load {:.2} -> {:.2}\n",
        r.task,
        r.instance.as_deref().unwrap_or("-"),
        r.command,
        r.in_process.n,
        r.in_process.p50,
        r.in_process.p99,
        r.server.p50,
        r.server.p99,
        r.overhead_p50_ms,
        r.overhead_p99_ms,
        r.ratio_p50,
        r.sessions.held,
        r.sessions.requested,
        r.sessions
            .server_active_sessions
            .map_or("-".into(), |n| n.to_string()),
        r.sessions.open_seconds,
        r.sessions.rss_before_kib,
        r.sessions.rss_after_kib,
        r.sessions.kib_per_session,
        r.resets.as_ref().map_or(String::new(), |x| format!(
            "reset, pool `last`     p50 {:.3} ms  p99 {:.3} ms  (warm {}, cold {})\n\
             reset, pool `instance` p50 {:.3} ms  p99 {:.3} ms  (warm {}, cold {})  ratio {:.2} at p50\n",
            x.last.p50,
            x.last.p99,
            x.last_counts[0],
            x.last_counts[1],
            x.instance.p50,
            x.instance.p99,
            x.instance_counts[0],
            x.instance_counts[1],
            x.ratio_p50
        )),
        r.machine.cpus,
        r.machine.load_start,
        r.machine.load_end,
    )
}
