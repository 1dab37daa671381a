//! Experiment configs (`experiments/*.toml`) and `engine run`.
//!
//! Today an experiment drives the environment loop that training will sit on: for every seed,
//! `episodes` episodes of the configured steps, each in a leased warm sandbox that is reset
//! between episodes, on `workers` threads. It reports per-seed throughput and reset latency with
//! a 95% confidence interval over seeds. The learning stages (protagonist, adversary,
//! discriminator, curriculum) plug into the same loop when their issues land.

use crate::units::parse_size;
use sandbox::{ExecRequest, Pool, Runtime, SandboxConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Errors of loading or running an experiment.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: key `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        key: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    #[error("writing the report {file}: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub experiment: Meta,
    #[serde(default)]
    pub sandbox: SandboxSection,
    pub episodes: Episodes,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub name: String,
    pub seeds: Vec<u64>,
    /// Where the report goes (relative to the working directory).
    #[serde(default = "default_out")]
    pub out_dir: PathBuf,
}

fn default_out() -> PathBuf {
    PathBuf::from("out")
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSection {
    pub rootfs: String,
    pub memory: String,
    pub disk: String,
    pub pids: u64,
    pub cpus: f64,
    /// Threads, each with its own warm sandbox.
    pub workers: usize,
    /// Commands run as root of a user namespace (see `engine sandbox exec --userns`).
    pub userns: bool,
}

impl Default for SandboxSection {
    fn default() -> Self {
        Self {
            rootfs: "host".into(),
            memory: "256M".into(),
            disk: "64M".into(),
            pids: 128,
            cpus: 1.0,
            workers: 2,
            userns: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Episodes {
    /// Episodes per seed.
    pub count: usize,
    /// Shell commands of one episode, in order; `{seed}` and `{episode}` are substituted.
    pub steps: Vec<String>,
    /// Per-step wall timeout, e.g. "5s".
    #[serde(default = "default_step_timeout")]
    pub step_timeout: String,
}

fn default_step_timeout() -> String {
    "5s".into()
}

impl Experiment {
    /// Load and validate; errors name the file, line, key and reason.
    pub fn load(file: &Path) -> Result<Self, ExperimentError> {
        let text = std::fs::read_to_string(file).map_err(|source| ExperimentError::Read {
            file: file.into(),
            source,
        })?;
        Self::parse(&text, file)
    }

    pub fn parse(text: &str, file: &Path) -> Result<Self, ExperimentError> {
        let exp: Experiment = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|s| {
                    let before = &text[..s.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = s.start - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    (line, column)
                })
                .unwrap_or((0, 0));
            ExperimentError::Parse {
                file: file.into(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        let invalid = |key, reason: &str| ExperimentError::Invalid {
            file: file.into(),
            key,
            reason: reason.into(),
        };
        if exp.experiment.seeds.is_empty() {
            return Err(invalid("experiment.seeds", "at least one seed"));
        }
        if exp.episodes.count == 0 {
            return Err(invalid("episodes.count", "at least one episode"));
        }
        if exp.episodes.steps.is_empty() {
            return Err(invalid("episodes.steps", "at least one step"));
        }
        if exp.sandbox.workers == 0 || exp.sandbox.workers > 1024 {
            return Err(invalid("sandbox.workers", "between 1 and 1024"));
        }
        crate::units::parse_duration(&exp.episodes.step_timeout)
            .map_err(|e| invalid("episodes.step_timeout", &e.to_string()))?;
        exp.sandbox_config(file)?;
        Ok(exp)
    }

    /// The sandbox configuration of this experiment.
    pub fn sandbox_config(&self, file: &Path) -> Result<SandboxConfig, ExperimentError> {
        let invalid = |key, reason: String| ExperimentError::Invalid {
            file: file.into(),
            key,
            reason,
        };
        let s = &self.sandbox;
        let mut c = SandboxConfig {
            rootfs: s.rootfs.parse().map_err(|e: sandbox::layers::LayerError| {
                invalid("sandbox.rootfs", e.to_string())
            })?,
            ..SandboxConfig::default()
        };
        c.limits.memory_bytes =
            parse_size(&s.memory).map_err(|e| invalid("sandbox.memory", e.to_string()))?;
        c.disk_bytes = parse_size(&s.disk).map_err(|e| invalid("sandbox.disk", e.to_string()))?;
        if s.pids < 2 {
            return Err(invalid("sandbox.pids", "at least 2".into()));
        }
        c.limits.pids = s.pids;
        c.limits.cpus = s.cpus;
        c.userns = s.userns;
        Ok(c)
    }
}

/// Per-seed result.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub episodes: usize,
    pub steps: usize,
    pub failed_steps: usize,
    pub infra_failures: usize,
    pub steps_per_s: f64,
    pub reset_ms_median: f64,
}

/// Mean and 95% confidence half-width (Student t) over seeds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    pub mean: f64,
    pub ci95: f64,
}

impl Interval {
    pub fn of(v: &[f64]) -> Self {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        if v.len() < 2 {
            return Self {
                mean,
                ci95: f64::NAN,
            };
        }
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom.
        const T: [f64; 30] = [
            12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
            2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
            2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
        ];
        let t = T.get(v.len() - 2).copied().unwrap_or(1.96);
        Self {
            mean,
            ci95: t * (var / n).sqrt(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub rootfs_digest: String,
    pub seeds: Vec<SeedResult>,
    pub steps_per_s: Interval,
    pub reset_ms: Interval,
}

/// Run the experiment and write `<out_dir>/<name>/report.json`.
pub fn run(
    exp: &Experiment,
    file: &Path,
    rt: &Runtime,
) -> Result<(Report, PathBuf), ExperimentError> {
    let cfg = exp.sandbox_config(file)?;
    let timeout_ms = crate::units::parse_duration(&exp.episodes.step_timeout)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(5000);
    let workers = exp.sandbox.workers;
    let pool = Pool::new(rt.clone(), cfg, workers)?;
    let digest = {
        let l = pool.lease();
        l.rootfs_digest().to_string()
    };
    let mut seeds = Vec::new();
    for &seed in &exp.experiment.seeds {
        let started = Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let ep = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if ep >= exp.episodes.count {
                        break;
                    }
                    let mut lease = pool.lease();
                    let (mut steps, mut failed, mut infra) = (0usize, 0usize, 0usize);
                    for step in &exp.episodes.steps {
                        let cmd = step
                            .replace("{seed}", &seed.to_string())
                            .replace("{episode}", &ep.to_string());
                        let mut req = ExecRequest::shell(cmd);
                        req.timeout_ms = timeout_ms;
                        steps += 1;
                        match lease.exec(&req) {
                            Ok(r) if r.success() => {}
                            Ok(_) => failed += 1,
                            Err(e) => {
                                tracing::warn!(seed, episode = ep, error = %e, "step failed");
                                if e.is_infrastructure() {
                                    infra += 1;
                                } else {
                                    failed += 1;
                                }
                            }
                        }
                    }
                    let t = Instant::now();
                    let ok = lease.release().is_ok();
                    let reset_ms = t.elapsed().as_secs_f64() * 1e3;
                    if let Ok(mut r) = results.lock() {
                        r.push((steps, failed, infra + usize::from(!ok), reset_ms));
                    }
                });
            }
        });
        let elapsed = started.elapsed().as_secs_f64();
        let r = results.into_inner().unwrap_or_else(|p| p.into_inner());
        let steps: usize = r.iter().map(|x| x.0).sum();
        let mut resets: Vec<f64> = r.iter().map(|x| x.3).collect();
        resets.sort_by(f64::total_cmp);
        let res = SeedResult {
            seed,
            episodes: r.len(),
            steps,
            failed_steps: r.iter().map(|x| x.1).sum(),
            infra_failures: r.iter().map(|x| x.2).sum(),
            steps_per_s: steps as f64 / elapsed,
            reset_ms_median: resets.get(resets.len() / 2).copied().unwrap_or(f64::NAN),
        };
        tracing::info!(seed, steps, steps_per_s = res.steps_per_s, "seed done");
        seeds.push(res);
    }
    let report = Report {
        name: exp.experiment.name.clone(),
        rootfs_digest: digest,
        steps_per_s: Interval::of(&seeds.iter().map(|s| s.steps_per_s).collect::<Vec<_>>()),
        reset_ms: Interval::of(&seeds.iter().map(|s| s.reset_ms_median).collect::<Vec<_>>()),
        seeds,
    };
    let dir = exp.experiment.out_dir.join(&exp.experiment.name);
    let path = dir.join("report.json");
    let write = |source| ExperimentError::Write {
        file: path.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(write)?;
    let json =
        serde_json::to_string_pretty(&report).map_err(|e| write(std::io::Error::other(e)))?;
    // Write-then-rename: an earlier report is never left half-overwritten.
    let tmp = dir.join(".report.json.tmp");
    std::fs::write(&tmp, json).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)?;
    Ok((report, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
[experiment]
name = "t"
seeds = [1, 2]

[episodes]
count = 2
steps = ["true"]
"#;

    #[test]
    fn a_valid_config_parses_with_defaults() {
        let e = Experiment::parse(OK, Path::new("x.toml")).unwrap();
        assert_eq!(e.sandbox.workers, 2);
        assert_eq!(e.episodes.step_timeout, "5s");
    }

    #[test]
    fn errors_name_file_line_key_and_reason() {
        let bad = OK.replace("count = 2", "count = 2\ncuont = 3");
        let err = Experiment::parse(&bad, Path::new("exp.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("exp.toml:8:1: unknown field `cuont`"),
            "{err}"
        );
        let bad = OK.replace("seeds = [1, 2]", "seeds = []");
        let err = Experiment::parse(&bad, Path::new("exp.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "exp.toml: key `experiment.seeds`: at least one seed");
        let bad = format!("{OK}\n[sandbox]\nmemory = \"lots\"\n");
        let err = Experiment::parse(&bad, Path::new("exp.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `sandbox.memory`") && err.contains("not a size"),
            "{err}"
        );
        let bad = format!("{OK}\n[sandbox]\nrootfs = \"nowhere:1\"\n");
        let err = Experiment::parse(&bad, Path::new("exp.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown rootfs"), "{err}");
    }

    #[test]
    fn intervals_use_student_t() {
        let i = Interval::of(&[1.0, 2.0, 3.0]);
        assert_eq!(i.mean, 2.0);
        assert!((i.ci95 - 4.303 * (1.0f64 / 3.0).sqrt()).abs() < 1e-9);
        assert!(Interval::of(&[5.0]).ci95.is_nan());
    }
}
