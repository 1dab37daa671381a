//! `engine bench sandbox --docker`: the native backend beside the Docker backend on the same
//! image (`--rootfs docker:IMAGE`: the native sandbox runs the image's layers exported into
//! the layer store, the Docker backend a container of it), measured interleaved in one run so
//! both see the same machine.
//!
//! JSON keys (milliseconds, each a `{median, p90, n}` summary per backend under `native` and
//! `docker`): `create_first_exec` (a new sandbox and its first `/bin/true`, then dropped),
//! `exec_sh_true` (`sh -c true` in a live sandbox), `reset_100_files` (reset after a step that
//! changed 100 files: the native overlay remount, Docker's recreation from the image),
//! `snapshot_100_files` and `rollback` (native: a layer copy and a remount; Docker: `commit`
//! and a recreation from the committed image); `ratios`: docker median / native median.

use super::sandbox::{check as ok, BenchError, CHANGE_100};
use super::{ms, Summary};
use sandbox::{DynBackend, ExecRequest, SandboxConfig, SandboxOps};
use serde::Serialize;
use std::time::Instant;

/// One backend's figures.
#[derive(Debug, Clone, Serialize)]
pub struct BackendFigures {
    pub create_first_exec: Summary,
    pub exec_sh_true: Summary,
    pub reset_100_files: Summary,
    pub snapshot_100_files: Summary,
    pub rollback: Summary,
}

/// Docker's medians over the native backend's.
#[derive(Debug, Clone, Serialize)]
pub struct BackendRatios {
    pub create_first_exec: f64,
    pub exec_sh_true: f64,
    pub reset_100_files: f64,
    pub snapshot_100_files: f64,
    pub rollback: f64,
}

/// The report of `engine bench sandbox --docker`.
#[derive(Debug, Clone, Serialize)]
pub struct BackendComparison {
    pub iterations: usize,
    pub rootfs: String,
    pub native: BackendFigures,
    pub docker: BackendFigures,
    pub ratios: BackendRatios,
}

#[derive(Default)]
struct Samples {
    create: Vec<f64>,
    exec: Vec<f64>,
    reset: Vec<f64>,
    snapshot: Vec<f64>,
    rollback: Vec<f64>,
}

impl Samples {
    fn figures(self) -> BackendFigures {
        BackendFigures {
            create_first_exec: Summary::of(self.create),
            exec_sh_true: Summary::of(self.exec),
            reset_100_files: Summary::of(self.reset),
            snapshot_100_files: Summary::of(self.snapshot),
            rollback: Summary::of(self.rollback),
        }
    }
}

/// Measure `backends` (native first, Docker second) on `cfg`, each step interleaved.
pub fn run(
    backends: [&dyn DynBackend; 2],
    cfg: &SandboxConfig,
    iterations: usize,
) -> Result<BackendComparison, BenchError> {
    let n = iterations.max(3);
    let mut samples = [Samples::default(), Samples::default()];
    // Warm both: layer export and import, image caches, page cache.
    for b in backends {
        drop(b.create_boxed(cfg)?);
    }
    let truth = ExecRequest::argv(["/bin/true"]);
    for _ in 0..n {
        for (b, s) in backends.iter().zip(samples.iter_mut()) {
            let t = Instant::now();
            let mut sb = b.create_boxed(cfg)?;
            ok("true", sb.exec(&truth)?)?;
            s.create.push(ms(t));
        }
    }
    let mut live: Vec<Box<dyn SandboxOps>> = backends
        .iter()
        .map(|b| b.create_boxed(cfg))
        .collect::<Result<_, _>>()?;
    let sh_true = ExecRequest::argv(["sh", "-c", "true"]);
    let change = ExecRequest::shell(CHANGE_100);
    for _ in 0..n {
        for (sb, s) in live.iter_mut().zip(samples.iter_mut()) {
            let t = Instant::now();
            ok("sh -c true", sb.exec(&sh_true)?)?;
            s.exec.push(ms(t));
        }
    }
    for _ in 0..n {
        for (sb, s) in live.iter_mut().zip(samples.iter_mut()) {
            ok("changing 100 files", sb.exec(&change)?)?;
            let t = Instant::now();
            let id = sb.snapshot()?;
            s.snapshot.push(ms(t));
            ok("changing 100 files", sb.exec(&change)?)?;
            let t = Instant::now();
            sb.rollback(id)?;
            s.rollback.push(ms(t));
            sb.reset()?;
            ok("changing 100 files", sb.exec(&change)?)?;
            let t = Instant::now();
            sb.reset()?;
            s.reset.push(ms(t));
        }
    }
    drop(live);
    let [native, docker] = samples.map(Samples::figures);
    let r = |d: &Summary, n: &Summary| d.median / n.median;
    Ok(BackendComparison {
        iterations: n,
        rootfs: cfg.rootfs.to_string(),
        ratios: BackendRatios {
            create_first_exec: r(&docker.create_first_exec, &native.create_first_exec),
            exec_sh_true: r(&docker.exec_sh_true, &native.exec_sh_true),
            reset_100_files: r(&docker.reset_100_files, &native.reset_100_files),
            snapshot_100_files: r(&docker.snapshot_100_files, &native.snapshot_100_files),
            rollback: r(&docker.rollback, &native.rollback),
        },
        native,
        docker,
    })
}

pub fn render(b: &BackendComparison) -> String {
    let mut out = format!(
        "{:<22} {:>12} {:>12} {:>12} {:>12} {:>9}\n",
        format!("{} ({}x)", "backends", b.iterations),
        "native med",
        "native p90",
        "docker med",
        "docker p90",
        "docker/n"
    );
    let rows = [
        (
            "create + first exec",
            &b.native.create_first_exec,
            &b.docker.create_first_exec,
            b.ratios.create_first_exec,
        ),
        (
            "exec sh -c true",
            &b.native.exec_sh_true,
            &b.docker.exec_sh_true,
            b.ratios.exec_sh_true,
        ),
        (
            "reset (100 files)",
            &b.native.reset_100_files,
            &b.docker.reset_100_files,
            b.ratios.reset_100_files,
        ),
        (
            "snapshot (100 files)",
            &b.native.snapshot_100_files,
            &b.docker.snapshot_100_files,
            b.ratios.snapshot_100_files,
        ),
        (
            "rollback",
            &b.native.rollback,
            &b.docker.rollback,
            b.ratios.rollback,
        ),
    ];
    for (name, n, d, r) in rows {
        out += &format!(
            "{name:<22} {:>9.3} ms {:>9.3} ms {:>9.3} ms {:>9.3} ms {r:>8.1}x\n",
            n.median, n.p90, d.median, d.p90
        );
    }
    out += &format!("rootfs {}\n", b.rootfs);
    out
}
