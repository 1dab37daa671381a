//! `engine bench sandbox`: sandbox latencies against a host baseline measured in the same run.
//!
//! JSON keys (all times in milliseconds, each a `{median, p90, n}` summary):
//! - `host_sh_true`: the baseline, `sh -c true` forked and waited for by this process;
//! - `create_first_exec`: a new sandbox from cached layers plus its first `true`, each
//!   started once the runtime's init reserve is full (see `settle`);
//! - `create_from_spare`: how many of those creates got an init started ahead;
//! - `create_first_exec_cloned`: the same with an init cloned for the sandbox (no spare),
//!   measured in the rounds that alternate with `create_first_exec`'s;
//! - `exec_sh_true`: `sh -c true` in a live sandbox;
//! - `reset_100_files`: reset after a step that changed 100 files;
//! - `snapshot_100_files`: snapshot of a diff of 100 files;
//! - `rollback`: rollback to that snapshot after further changes;
//! - `idle_rss_kib`: resident memory of one idle sandbox's init (KiB, not ms), counting the
//!   shared pages of libc and the init binary in full;
//! - `idle_pss_kib`, `idle_private_kib`: the same memory proportionally shared, and private
//!   to the init (what each additional sandbox really adds in user memory);
//! - `bwrap_unshare_all`: present when bubblewrap is installed: `bwrap --unshare-all
//!   --ro-bind / / --proc /proc --dev /dev /bin/true`, measured interleaved with
//!   `create_first_exec`;
//! - `one_shot_exec`: present when the caller gives the one-shot command line (the `engine`
//!   binary does: `engine sandbox exec -- /bin/true`): that whole process, start to exit
//!   (runtime, sandbox, command, teardown), measured interleaved with bwrap's whole process;
//! - `one_shot_daemon`: present when the caller gives a one-shot served by a daemon (`engine
//!   bench sandbox` starts `engine sandbox daemon` on a socket of its own): the same whole
//!   process, measured after `one_shot_exec` in each round;
//! - `one_shot_client`: with either: the program those one-shots ran (`program`, the `engine`
//!   front beside the engine program, or the engine program itself) and how it is linked
//!   (`linkage`: `dynamic`, whether it names a dynamic loader, and `position_independent`;
//!   absent where its ELF header could not be read): the static front
//!   (`engine/front/install.sh`) and `cargo build`'s glibc front give different figures;
//! - every one of `one_shot_exec`, `one_shot_daemon`, `bwrap_unshare_all`, `create_first_exec`
//!   and `create_first_exec_cloned` is timed after the same 25 ms pause ([`PAUSE`]);
//! - `ratios`: `exec_vs_host` = exec_sh_true / host_sh_true, `create_vs_bwrap` =
//!   create_first_exec / bwrap_unshare_all, `create_cloned_vs_bwrap` =
//!   create_first_exec_cloned / bwrap_unshare_all, `one_shot_vs_bwrap` = one_shot_exec /
//!   bwrap_unshare_all, `one_shot_daemon_vs_bwrap` = one_shot_daemon / bwrap_unshare_all
//!   (medians);
//! - `concurrent`: present with `--concurrent N`: `requested`, `sandboxes` alive at once,
//!   `stopped` (why creation stopped early: admission control or the error), how many
//!   answered, and the host's `MemAvailable` drop per sandbox (kernel objects included).

use super::{ms, Summary};
use sandbox::{ExecRequest, Runtime, SandboxConfig, SandboxError};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("running the host baseline: {0}")]
    Host(std::io::Error),
    #[error("{step} failed inside the sandbox: {detail}")]
    Step { step: &'static str, detail: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub exec_vs_host: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_vs_bwrap: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_cloned_vs_bwrap: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_shot_vs_bwrap: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_shot_daemon_vs_bwrap: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Concurrent {
    /// Sandboxes asked for (`--concurrent N`).
    pub requested: usize,
    /// Sandboxes created and alive at once.
    pub sandboxes: usize,
    /// Why creation stopped before `requested` (admission control, or the error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    pub answered: usize,
    pub total_init_rss_mib: f64,
    pub host_mem_per_sandbox_kib: f64,
    pub create_all_s: f64,
}

/// How an executable is linked, from its ELF header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Linkage {
    /// It names a dynamic loader (`PT_INTERP`): the loader and shared libraries start first.
    pub dynamic: bool,
    /// Position independent (`ET_DYN`): loaded at a random address.
    pub position_independent: bool,
}

/// The linkage of the 64-bit little-endian ELF executable at `path` (its header and program
/// headers only are read). `InvalidData` for a file that is not one (another format, an
/// object file, a core dump) or claims implausibly many program headers; the read's own error
/// for one cut short.
pub fn linkage(path: &Path) -> std::io::Result<Linkage> {
    use std::os::unix::fs::FileExt;
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
    let f = std::fs::File::open(path)?;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0)?;
    if h[..6] != *b"\x7fELF\x02\x01" {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    const PT_INTERP: u32 = 3;
    const ET_EXEC: u16 = 2;
    const ET_DYN: u16 = 3;
    let e_type = u16_at(&h, 0x10);
    if ![ET_EXEC, ET_DYN].contains(&e_type) {
        return Err(bad("not an executable"));
    }
    let mut phoff = [0u8; 8];
    phoff.copy_from_slice(&h[0x20..0x28]);
    let (phoff, phentsize, phnum) = (
        u64::from_le_bytes(phoff),
        usize::from(u16_at(&h, 0x36)),
        usize::from(u16_at(&h, 0x38)),
    );
    // (An executable has a dozen program headers; a header that claims thousands is not read.)
    if phentsize < 4 || phentsize * phnum > 1 << 16 {
        return Err(bad("implausible program headers"));
    }
    let mut ph = vec![0u8; phentsize * phnum];
    f.read_exact_at(&mut ph, phoff)?;
    Ok(Linkage {
        dynamic: ph
            .chunks_exact(phentsize)
            .any(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]) == PT_INTERP),
        position_independent: e_type == ET_DYN,
    })
}

/// The program the whole-process one-shots ran.
#[derive(Debug, Clone, Serialize)]
pub struct OneShotClient {
    pub program: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linkage: Option<Linkage>,
}

/// The report of `engine bench sandbox`.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxBench {
    pub iterations: usize,
    pub host_sh_true: Summary,
    pub create_first_exec: Summary,
    /// How many of those creates got an init started ahead (the others cloned theirs).
    pub create_from_spare: u64,
    /// The same as `create_first_exec` with an init cloned for each sandbox.
    pub create_first_exec_cloned: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bwrap_unshare_all: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_shot_exec: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_shot_daemon: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_shot_client: Option<OneShotClient>,
    pub exec_sh_true: Summary,
    pub reset_100_files: Summary,
    pub snapshot_100_files: Summary,
    pub rollback: Summary,
    pub idle_rss_kib: Summary,
    pub idle_pss_kib: Summary,
    pub idle_private_kib: Summary,
    pub ratios: Ratios,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<Concurrent>,
}

/// A step that must succeed, or the benchmark fails naming it.
pub(crate) fn check(step: &'static str, r: sandbox::ExecResult) -> Result<(), BenchError> {
    if r.success() {
        Ok(())
    } else {
        Err(BenchError::Step {
            step,
            detail: format!(
                "{:?}: {}",
                r.termination,
                String::from_utf8_lossy(&r.stderr)
            ),
        })
    }
}

/// Resident set of a process, KiB.
pub fn rss_kib(pid: i32) -> Option<f64> {
    kib_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "VmRSS:",
    )
}

/// `(Pss, Private_Clean + Private_Dirty)` of a process from smaps_rollup, KiB.
pub fn pss_private_kib(pid: i32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some((
        kib_field(&s, "Pss:")?,
        kib_field(&s, "Private_Clean:")? + kib_field(&s, "Private_Dirty:")?,
    ))
}

fn mem_available_kib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| kib_field(&s, "MemAvailable:"))
        .unwrap_or(f64::NAN)
}

/// The value of a `Key:   1234 kB` line of a /proc file.
fn kib_field(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Change 100 files: 50 new under /root, 40 new under /tmp, 10 of the base's /etc (copied up).
pub const CHANGE_100: &str = "for i in $(seq 50); do echo $i > /root/f$i; done; \
    for i in $(seq 40); do echo $i > /tmp/t$i; done; \
    for f in passwd group hosts shells issue motd profile bash.bashrc environment nsswitch.conf; do echo >> /etc/$f 2>/dev/null || true; done";

/// Wait (at most 200 ms) until the runtime's reserves of inits and network namespaces are
/// full again, so that starting the spares is charged neither to the baselines nor to the next create: the figure is a create
/// that finds a spare ready, as it is whenever creates come no faster than spares are started
/// (`create_from_spare` counts them; one that finds none clones its init).
fn settle(rt: &Runtime) {
    let t = Instant::now();
    while !(rt.spare_inits_idle() && rt.netns_ready() >= sandbox::netns::DEFAULT_RESERVE)
        && t.elapsed() < std::time::Duration::from_millis(200)
    {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Run a whole process to its exit; `Ok(false)` when it failed.
/// A whole process to time: its command line and the environment variables it gets on top
/// of this process's.
#[derive(Debug, Clone, Default)]
pub struct Process {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

fn run_process(p: &Process) -> Result<bool, BenchError> {
    let (program, args) = p
        .argv
        .split_first()
        .ok_or_else(|| BenchError::Host(std::io::Error::other("empty command line")))?;
    std::process::Command::new(program)
        .args(args)
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .map_err(BenchError::Host)
}

/// Time `p` once; a failure is the benchmark's error, naming `step`.
fn time_process(step: &'static str, p: &Process) -> Result<f64, BenchError> {
    let t = Instant::now();
    if !run_process(p)? {
        return Err(BenchError::Step {
            step,
            detail: format!("`{}` failed", p.argv.join(" ")),
        });
    }
    Ok(ms(t))
}

/// The pause before each thing that is compared with bwrap, bwrap included. It lets what the
/// previous one left running end (a served one-shot's daemon makes its next sandbox and tears
/// the last one down, which takes a few milliseconds), and it puts every one of them in the
/// same state: on the development VM a process started after 25 ms idle took longer than one
/// started back to back (bwrap 4.3-4.5 against 3.5-3.6 ms), so timing some after a pause and
/// others not skews the ratios (from 2026-12-06 to 2026-12-07 only bwrap was, which flattered
/// `create_vs_bwrap`).
const PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// The whole processes timed beside bwrap: each runs `/bin/true` in a fresh sandbox.
#[derive(Debug, Clone, Default)]
pub struct OneShots {
    /// `engine sandbox exec --no-daemon -- /bin/true`: the process makes its sandbox.
    pub own: Option<Process>,
    /// The same served by a running `engine sandbox daemon`.
    pub daemon: Option<Process>,
}

/// Run the benchmark, with the whole-process one-shots of `one_shots` timed beside bwrap.
pub fn run(
    rt: &Runtime,
    cfg: &SandboxConfig,
    iterations: usize,
    concurrent: Option<usize>,
    one_shots: &OneShots,
) -> Result<SandboxBench, BenchError> {
    let n = iterations.max(3);
    // Warm the layer caches (host mask, policies) and the page cache.
    drop(rt.create(cfg)?);

    let mut host = Vec::with_capacity(n);
    let mut create = Vec::with_capacity(n);
    let mut create_cloned = Vec::with_capacity(n);
    let bwrap_args = [
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "/bin/true",
    ];
    let has_bwrap = std::process::Command::new("bwrap")
        .args(bwrap_args)
        .status()
        .is_ok_and(|s| s.success());
    let mut bwrap = Vec::with_capacity(n);
    let mut shots = Vec::with_capacity(n);
    let mut served = Vec::with_capacity(n);
    // Warm their binary's pages too (and the daemon's sandbox made ahead); a one-shot that
    // fails is reported, not timed.
    if let Some(p) = &one_shots.own {
        time_process("one-shot exec", p)?;
    }
    if let Some(p) = &one_shots.daemon {
        time_process("one-shot exec served by the daemon", p)?;
    }
    let spares_before = rt.spare_inits_used().0;
    // Even rounds create with a spare init, odd ones with an init cloned for the sandbox (what
    // a create pays when no spare is ready: creates faster than the reserve refills, or
    // `Runtime::set_spare_inits(false)`); every round runs the same steps before its create,
    // so both see the previous sandbox's teardown alike.
    for round in 0..2 * n {
        let cloned = round % 2 == 1;
        settle(rt);
        if let Some(p) = &one_shots.own {
            std::thread::sleep(PAUSE);
            shots.push(time_process("one-shot exec", p)?);
        }
        if let Some(p) = &one_shots.daemon {
            std::thread::sleep(PAUSE);
            served.push(time_process("one-shot exec served by the daemon", p)?);
        }
        if has_bwrap {
            std::thread::sleep(PAUSE);
            let t = Instant::now();
            std::process::Command::new("bwrap")
                .args(bwrap_args)
                .status()
                .map_err(BenchError::Host)?;
            bwrap.push(ms(t));
        }
        let t = Instant::now();
        let st = std::process::Command::new("sh")
            .args(["-c", "true"])
            .status()
            .map_err(BenchError::Host)?;
        host.push(ms(t));
        if !st.success() {
            return Err(BenchError::Host(std::io::Error::other("sh -c true failed")));
        }
        rt.set_spare_inits(!cloned);
        std::thread::sleep(PAUSE);
        let t = Instant::now();
        let made = rt.create(cfg);
        rt.set_spare_inits(true);
        let mut sb = made?;
        let first = sb.exec(&ExecRequest::argv(["/bin/true"]))?;
        let took = ms(t);
        check("true", first)?;
        if cloned {
            create_cloned.push(took);
        } else {
            create.push(took);
        }
        drop(sb);
    }
    let create_from_spare = rt.spare_inits_used().0 - spares_before;

    let mut sb = rt.create(cfg)?;
    let mut exec = Vec::with_capacity(n);
    let mut host2 = Vec::with_capacity(n);
    let sh_true = ExecRequest::argv(["sh", "-c", "true"]);
    for _ in 0..n {
        // Interleaved with the baseline so both see the same machine state.
        let t = Instant::now();
        std::process::Command::new("sh")
            .args(["-c", "true"])
            .status()
            .map_err(BenchError::Host)?;
        host2.push(ms(t));
        let t = Instant::now();
        check("sh -c true", sb.exec(&sh_true)?)?;
        exec.push(ms(t));
    }
    host.extend(host2);

    let change = ExecRequest::shell(CHANGE_100);
    let mut reset = Vec::with_capacity(n);
    let mut snap = Vec::with_capacity(n);
    let mut roll = Vec::with_capacity(n);
    for _ in 0..n {
        check("changing 100 files", sb.exec(&change)?)?;
        let t = Instant::now();
        let id = sb.snapshot()?;
        snap.push(ms(t));
        check("changing 100 files", sb.exec(&change)?)?;
        let t = Instant::now();
        sb.rollback(id)?;
        roll.push(ms(t));
        sb.reset()?;
        check("changing 100 files", sb.exec(&change)?)?;
        let t = Instant::now();
        sb.reset()?;
        reset.push(ms(t));
    }
    drop(sb);

    let (mut rss, mut pss, mut private) = (Vec::new(), Vec::new(), Vec::new());
    let idle: Vec<_> = (0..n.min(20))
        .map(|_| rt.create(cfg))
        .collect::<Result<_, _>>()?;
    for s in &idle {
        if let Some(k) = rss_kib(s.init_pid()) {
            rss.push(k);
        }
        if let Some((p, u)) = pss_private_kib(s.init_pid()) {
            pss.push(p);
            private.push(u);
        }
    }
    drop(idle);

    let concurrent = match concurrent {
        Some(k) => Some(concurrent_bench(rt, cfg, k)?),
        None => None,
    };
    let host_sh_true = Summary::of(host);
    let exec_sh_true = Summary::of(exec);
    let create_first_exec = Summary::of(create);
    let create_first_exec_cloned = Summary::of(create_cloned);
    let bwrap_unshare_all = has_bwrap.then(|| Summary::of(bwrap));
    let one_shot_exec = one_shots.own.as_ref().map(|_| Summary::of(shots));
    let one_shot_daemon = one_shots.daemon.as_ref().map(|_| Summary::of(served));
    let one_shot_client = one_shots
        .own
        .as_ref()
        .or(one_shots.daemon.as_ref())
        .and_then(|p| p.argv.first())
        .map(|program| OneShotClient {
            program: program.clone(),
            linkage: linkage(Path::new(program)).ok(),
        });
    Ok(SandboxBench {
        iterations: n,
        ratios: Ratios {
            exec_vs_host: exec_sh_true.median / host_sh_true.median,
            create_vs_bwrap: bwrap_unshare_all.map(|b| create_first_exec.median / b.median),
            create_cloned_vs_bwrap: bwrap_unshare_all
                .map(|b| create_first_exec_cloned.median / b.median),
            one_shot_vs_bwrap: bwrap_unshare_all
                .zip(one_shot_exec)
                .map(|(b, o)| o.median / b.median),
            one_shot_daemon_vs_bwrap: bwrap_unshare_all
                .zip(one_shot_daemon)
                .map(|(b, o)| o.median / b.median),
        },
        host_sh_true,
        create_first_exec,
        create_from_spare,
        create_first_exec_cloned,
        bwrap_unshare_all,
        one_shot_exec,
        one_shot_daemon,
        one_shot_client,
        exec_sh_true,
        reset_100_files: Summary::of(reset),
        snapshot_100_files: Summary::of(snap),
        rollback: Summary::of(roll),
        idle_rss_kib: Summary::of(rss),
        idle_pss_kib: Summary::of(pss),
        idle_private_kib: Summary::of(private),
        concurrent,
    })
}

/// Create `k` sandboxes, keep them all alive, then run `true` in each.
fn concurrent_bench(rt: &Runtime, cfg: &SandboxConfig, k: usize) -> Result<Concurrent, BenchError> {
    let mut small = cfg.clone();
    small.disk_bytes = 8 << 20;
    let before = mem_available_kib();
    let t = Instant::now();
    let mut all = Vec::with_capacity(k.min(1 << 16));
    let mut stopped = None;
    for i in 0..k {
        match rt.create(&small) {
            Ok(s) => all.push(s),
            Err(e) => {
                tracing::warn!(created = i, error = %e, "stopped creating sandboxes");
                stopped = Some(format!("stopped after {i} sandboxes: {e}"));
                break;
            }
        }
    }
    let create_all_s = t.elapsed().as_secs_f64();
    let host_mem_per_sandbox_kib = (before - mem_available_kib()) / all.len().max(1) as f64;
    let total_init_rss_mib = all
        .iter()
        .filter_map(|s| rss_kib(s.init_pid()))
        .sum::<f64>()
        / 1024.0;
    let mut answered = 0;
    for s in &mut all {
        if s.exec(&ExecRequest::argv(["/bin/true"]))
            .is_ok_and(|r| r.success())
        {
            answered += 1;
        }
    }
    Ok(Concurrent {
        requested: k,
        sandboxes: all.len(),
        stopped,
        answered,
        total_init_rss_mib,
        host_mem_per_sandbox_kib,
        create_all_s,
    })
}

/// A human-readable table of the report.
pub fn render(b: &SandboxBench) -> String {
    let row = |name: &str, s: &Summary, unit: &str| {
        format!("{name:<24} {:>10.3} {:>10.3} {unit}\n", s.median, s.p90)
    };
    let mut out = format!(
        "{:<24} {:>10} {:>10}\n",
        "sandbox benchmark", "median", "p90"
    );
    out += &row("host sh -c true", &b.host_sh_true, "ms (baseline)");
    out += &row(
        "create + first exec",
        &b.create_first_exec,
        "ms (a spare init ready)",
    );
    out += &row(
        "  with a cloned init",
        &b.create_first_exec_cloned,
        "ms (no spare)",
    );
    if let Some(bw) = &b.bwrap_unshare_all {
        out += &row("bwrap --unshare-all true", bw, "ms (baseline)");
    }
    if let Some(o) = &b.one_shot_exec {
        out += &row("one-shot process", o, "ms (engine sandbox exec)");
    }
    if let Some(o) = &b.one_shot_daemon {
        out += &row("  served by a daemon", o, "ms (engine sandbox daemon)");
    }
    if let Some(c) = &b.one_shot_client {
        let how = match c.linkage {
            Some(Linkage { dynamic: true, .. }) => "dynamically linked",
            Some(Linkage { dynamic: false, .. }) => "static",
            None => "linkage unknown",
        };
        out += &format!("  one-shots ran {} ({how})\n", c.program);
    }
    out += &row("exec sh -c true", &b.exec_sh_true, "ms");
    out += &row("reset (100 files)", &b.reset_100_files, "ms");
    out += &row("snapshot (100 files)", &b.snapshot_100_files, "ms");
    out += &row("rollback", &b.rollback, "ms");
    out += &row("idle init RSS", &b.idle_rss_kib, "KiB");
    out += &row("idle init PSS", &b.idle_pss_kib, "KiB");
    out += &row("idle init private", &b.idle_private_kib, "KiB");
    out += &format!("exec / host sh -c true  {:>10.2}x\n", b.ratios.exec_vs_host);
    if let Some(r) = b.ratios.create_vs_bwrap {
        out += &format!("create+exec / bwrap     {r:>10.2}x\n");
    }
    if let Some(r) = b.ratios.create_cloned_vs_bwrap {
        out += &format!("  cloned init / bwrap   {r:>10.2}x\n");
    }
    if let Some(r) = b.ratios.one_shot_vs_bwrap {
        out += &format!("one-shot / bwrap        {r:>10.2}x\n");
    }
    if let Some(r) = b.ratios.one_shot_daemon_vs_bwrap {
        out += &format!("  daemon's / bwrap      {r:>10.2}x\n");
    }
    if let Some(c) = &b.concurrent {
        out += &format!(
            "concurrent: {} of {} alive, {} answered, init RSS total {:.1} MiB, host memory {:.0} KiB per sandbox, created in {:.1} s\n",
            c.sandboxes, c.requested, c.answered, c.total_init_rss_mib, c.host_mem_per_sandbox_kib, c.create_all_s
        );
        if let Some(why) = &c.stopped {
            out += &format!("concurrent: {why}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linkage_reads_the_elf_header_and_refuses_what_is_not_an_executable() {
        // This test binary: linked against glibc, position independent (rustc's default).
        let me = std::env::current_exe().unwrap();
        assert_eq!(
            linkage(&me).unwrap(),
            Linkage {
                dynamic: true,
                position_independent: true
            }
        );
        let d = tempfile::tempdir().unwrap();
        let text = d.path().join("text");
        std::fs::write(&text, "#!/bin/sh\n".repeat(10)).unwrap();
        assert_eq!(
            linkage(&text).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        // A header cut short: an error, not a guess.
        let cut = d.path().join("cut");
        std::fs::write(&cut, &std::fs::read(&me).unwrap()[..40]).unwrap();
        assert!(linkage(&cut).is_err());
        // An object file (ET_REL), not an executable.
        let mut object = std::fs::read(&me).unwrap();
        object[0x10] = 1;
        let rel = d.path().join("rel");
        std::fs::write(&rel, &object).unwrap();
        assert_eq!(
            linkage(&rel).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        // A header that claims 65535 program headers of 65535 bytes: refused, not allocated.
        let mut huge = std::fs::read(&me).unwrap()[..64].to_vec();
        huge[0x36..0x3a].copy_from_slice(&[0xff; 4]);
        let claims = d.path().join("claims");
        std::fs::write(&claims, &huge).unwrap();
        assert_eq!(
            linkage(&claims).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        assert!(linkage(&d.path().join("missing")).is_err());
    }
}
