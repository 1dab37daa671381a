//! Task folders: the Harbor layout (`task.toml`, `instruction.md`, `environment/`,
//! `solution/`, `tests/`) and the older Terminal-Bench layout (`task.yaml`, `Dockerfile` or
//! `docker-compose.yaml`, `solution.sh` or `solution.yaml`, `run-tests.sh`, `tests/`).

use super::HarborError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which layout a folder uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    Harbor,
    TerminalBench,
}

/// The reference solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Oracle {
    /// A folder copied to `/solution` and its entry script run with bash.
    Script {
        dir: PathBuf,
        files: Vec<PathBuf>,
        entry: String,
    },
    /// Terminal keystrokes (`solution.yaml`): the commands, typed into one shell in order.
    Keystrokes(Vec<String>),
}

/// One task folder, read and checked.
#[derive(Debug, Clone)]
pub struct Task {
    pub dir: PathBuf,
    pub name: String,
    pub layout: Layout,
    pub instruction: String,
    pub dockerfile: PathBuf,
    /// The build context (`COPY` sources are relative to it).
    pub context: PathBuf,
    pub oracle: Option<Oracle>,
    /// Files copied to `/tests` after the agent (relative path, host path).
    pub tests: Vec<(String, PathBuf)>,
    /// The test script's path inside the sandbox.
    pub test_script: String,
    pub agent_timeout_s: f64,
    pub verifier_timeout_s: f64,
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub disk_bytes: Option<u64>,
    /// Environment of the agent's commands (and the oracle's).
    pub agent_env: Vec<(String, String)>,
    /// Environment of the verifier.
    pub verifier_env: Vec<(String, String)>,
    /// The compose service's `tmpfs:` mounts: (path, mode), each made empty at the episode's
    /// start on the sandbox's writable layer (a tmpfs already; it counts against the disk).
    pub tmpfs: Vec<(String, u32)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskToml {
    #[allow(dead_code)]
    version: Option<String>,
    #[allow(dead_code)]
    metadata: Option<toml::Table>,
    #[serde(default)]
    verifier: Phase,
    #[serde(default)]
    agent: Phase,
    #[serde(default)]
    solution: Phase,
    #[serde(default)]
    environment: EnvironmentToml,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    timeout_sec: Option<f64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvironmentToml {
    #[allow(dead_code)]
    build_timeout_sec: Option<f64>,
    docker_image: Option<String>,
    cpus: Option<f64>,
    memory_mb: Option<u64>,
    storage_mb: Option<u64>,
    memory: Option<String>,
    storage: Option<String>,
    #[allow(dead_code)]
    allow_internet: Option<bool>,
    #[allow(dead_code)]
    gpus: Option<u64>,
}

const DEFAULT_AGENT_TIMEOUT_S: f64 = 600.0;
const DEFAULT_VERIFIER_TIMEOUT_S: f64 = 600.0;

fn need(dir: &Path, rel: &str) -> Result<PathBuf, HarborError> {
    let p = dir.join(rel);
    if p.exists() {
        Ok(p)
    } else {
        Err(HarborError::Missing {
            dir: dir.to_path_buf(),
            file: rel.to_string(),
        })
    }
}

fn read(p: &Path) -> Result<String, HarborError> {
    crate::text::read_input(p).map_err(|e| HarborError::Read(Box::new(e)))
}

/// Every regular file under `dir`, relative paths sorted (symlinks leaving the folder are
/// refused).
pub fn files_under(dir: &Path) -> Result<Vec<(String, PathBuf)>, HarborError> {
    let mut out = Vec::new();
    let root = dir.canonicalize().map_err(|source| HarborError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    fn walk(root: &Path, d: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), HarborError> {
        let ioe = |source| HarborError::Io {
            path: d.to_path_buf(),
            source,
        };
        let mut entries: Vec<_> = std::fs::read_dir(d)
            .map_err(ioe)?
            .collect::<Result<_, _>>()
            .map_err(ioe)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let real = p.canonicalize().map_err(|source| HarborError::Io {
                path: p.clone(),
                source,
            })?;
            if !real.starts_with(root) {
                return Err(HarborError::Unsupported {
                    file: p.clone(),
                    what: "a symlink that leaves the task folder".into(),
                });
            }
            if real.is_dir() {
                walk(root, &p, out)?;
            } else if real.is_file() {
                let rel = p
                    .strip_prefix(root)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, real));
            }
        }
        Ok(())
    }
    walk(&root, &root, &mut out)?;
    Ok(out)
}

fn size_of(file: &Path, key: &str, v: &str) -> Result<u64, HarborError> {
    crate::units::parse_size(v).map_err(|e| HarborError::Config {
        file: file.to_path_buf(),
        reason: format!("`{key}`: {e}"),
    })
}

/// The build context, Dockerfile, environment and `tmpfs:` mounts of a compose file's one
/// service.
type Compose = (
    Option<PathBuf>,
    Option<PathBuf>,
    Vec<(String, String)>,
    Vec<(String, u32)>,
);

/// One entry of a service's `tmpfs:`: `PATH[:OPTIONS]` (`mode=1777`, `size=...`; the size is
/// the sandbox's disk's).
fn tmpfs_entry(file: &Path, entry: &str) -> Result<(String, u32), HarborError> {
    let bad = |reason: String| HarborError::Config {
        file: file.to_path_buf(),
        reason: format!("`tmpfs` entry `{entry}`: {reason}"),
    };
    let (path, opts) = entry.split_once(':').unwrap_or((entry, ""));
    let path = path.trim();
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") || path == "/" {
        return Err(bad("not an absolute path below /".into()));
    }
    let mut mode = 0o1777;
    for o in opts.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("mode", m)) => {
                mode = u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| bad(format!("mode `{m}` is not octal")))?;
            }
            Some(("size", _)) | Some(("uid", _)) | Some(("gid", _)) => {}
            _ if ["rw", "noexec", "nosuid", "nodev", "exec"].contains(&o) => {}
            _ => return Err(bad(format!("unsupported option `{o}`"))),
        }
    }
    Ok((path.trim_end_matches('/').to_string(), mode))
}

/// A compose file: the build context and Dockerfile of its one service, its environment.
/// More than one service is unsupported.
fn compose(file: &Path, dir: &Path) -> Result<Compose, HarborError> {
    use yaml_rust2::{Yaml, YamlLoader};
    let text = read(file)?;
    let bad = |reason: String| HarborError::Config {
        file: file.to_path_buf(),
        reason,
    };
    let docs = YamlLoader::load_from_str(&text).map_err(|e| bad(e.to_string()))?;
    let Some(services) = docs.first().map(|d| &d["services"]).and_then(Yaml::as_hash) else {
        return Err(bad("no `services` mapping".into()));
    };
    if services.len() != 1 {
        return Err(HarborError::Unsupported {
            file: file.to_path_buf(),
            what: format!("{} services (multi-container tasks)", services.len()),
        });
    }
    let svc = services.values().next().cloned().unwrap_or(Yaml::Null);
    let (mut context, mut dockerfile) = (None, None);
    match &svc["build"] {
        Yaml::String(c) => context = Some(dir.join(c)),
        Yaml::Hash(_) => {
            if let Some(c) = svc["build"]["context"].as_str() {
                context = Some(dir.join(c));
            }
            if let Some(d) = svc["build"]["dockerfile"].as_str() {
                dockerfile = Some(d.into());
            }
        }
        _ => {}
    }
    let sub = |v: &str| {
        v.replace("${T_BENCH_TEST_DIR}", "/tests")
            .replace("${T_BENCH_CONTAINER_LOGS_PATH}", "/logs")
    };
    let mut env = Vec::new();
    match &svc["environment"] {
        Yaml::Array(a) => {
            for e in a.iter().filter_map(Yaml::as_str) {
                if let Some((k, v)) = e.split_once('=') {
                    env.push((k.to_string(), sub(v)));
                }
            }
        }
        Yaml::Hash(h) => {
            for (k, v) in h {
                if let (Some(k), Some(v)) = (k.as_str(), v.as_str()) {
                    env.push((k.to_string(), sub(v)));
                }
            }
        }
        _ => {}
    }
    let mut tmpfs = Vec::new();
    match &svc["tmpfs"] {
        Yaml::String(t) => tmpfs.push(tmpfs_entry(file, t)?),
        Yaml::Array(a) => {
            for t in a {
                let t = t
                    .as_str()
                    .ok_or_else(|| bad("`tmpfs`: an entry is not a string".into()))?;
                tmpfs.push(tmpfs_entry(file, t)?);
            }
        }
        Yaml::BadValue | Yaml::Null => {}
        _ => return Err(bad("`tmpfs`: neither a path nor a list of paths".into())),
    }
    let dockerfile = dockerfile.map(|d: PathBuf| context.clone().unwrap_or(dir.into()).join(d));
    Ok((context, dockerfile, env, tmpfs))
}

/// Read a task folder (either layout).
pub fn load(dir: &Path) -> Result<Task, HarborError> {
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    if !dir.is_dir() {
        return Err(HarborError::Missing {
            dir: dir.to_path_buf(),
            file: "(the folder itself)".into(),
        });
    }
    if dir.join("task.toml").exists() {
        load_harbor(dir, name)
    } else if dir.join("task.yaml").exists() {
        load_terminal_bench(dir, name)
    } else {
        Err(HarborError::Missing {
            dir: dir.to_path_buf(),
            file: "task.toml (Harbor) or task.yaml (Terminal-Bench)".into(),
        })
    }
}

fn env_pairs(m: BTreeMap<String, String>) -> Vec<(String, String)> {
    m.into_iter().collect()
}

fn load_harbor(dir: &Path, name: String) -> Result<Task, HarborError> {
    let file = dir.join("task.toml");
    let cfg: TaskToml = toml::from_str(&read(&file)?).map_err(|e| HarborError::Config {
        file: file.clone(),
        reason: e.to_string().trim().replace('\n', " "),
    })?;
    if let Some(img) = &cfg.environment.docker_image {
        return Err(HarborError::Unsupported {
            file,
            what: format!("a prebuilt `docker_image` ({img}) instead of environment/Dockerfile"),
        });
    }
    let instruction = read(&need(dir, "instruction.md")?)?;
    let env_dir = need(dir, "environment")?;
    let compose_file = env_dir.join("docker-compose.yaml");
    let (mut context, mut dockerfile) = (env_dir.clone(), env_dir.join("Dockerfile"));
    let mut tmpfs = Vec::new();
    if compose_file.exists() {
        let (c, d, _, t) = compose(&compose_file, &env_dir)?;
        tmpfs = t;
        if let Some(c) = c {
            context = c;
        }
        if let Some(d) = d {
            dockerfile = d;
        }
    }
    if !dockerfile.is_file() {
        return Err(HarborError::Missing {
            dir: dir.to_path_buf(),
            file: "environment/Dockerfile".into(),
        });
    }
    let tests_dir = need(dir, "tests")?;
    need(dir, "tests/test.sh")?;
    let tests = files_under(&tests_dir)?;
    let oracle = if dir.join("solution/solve.sh").is_file() {
        let sdir = dir.join("solution");
        Some(Oracle::Script {
            files: files_under(&sdir)?
                .into_iter()
                .map(|(r, _)| r.into())
                .collect(),
            dir: sdir,
            entry: "solve.sh".into(),
        })
    } else {
        None
    };
    let e = &cfg.environment;
    let memory_bytes = match (&e.memory, e.memory_mb) {
        (Some(m), _) => Some(size_of(&file, "environment.memory", m)?),
        (None, Some(mb)) => Some(mb << 20),
        _ => None,
    };
    let disk_bytes = match (&e.storage, e.storage_mb) {
        (Some(m), _) => Some(size_of(&file, "environment.storage", m)?),
        (None, Some(mb)) => Some(mb << 20),
        _ => None,
    };
    for (key, t) in [
        ("agent.timeout_sec", cfg.agent.timeout_sec),
        ("verifier.timeout_sec", cfg.verifier.timeout_sec),
    ] {
        if let Some(t) = t {
            if !(t > 0.0 && t <= 86_400.0) {
                return Err(HarborError::Config {
                    file: file.clone(),
                    reason: format!("`{key}` = {t}: expected seconds in (0, 86400]"),
                });
            }
        }
    }
    let mut agent_env = env_pairs(cfg.solution.env);
    agent_env.extend(env_pairs(cfg.agent.env));
    Ok(Task {
        dir: dir.to_path_buf(),
        name,
        layout: Layout::Harbor,
        instruction,
        dockerfile,
        context,
        oracle,
        tests,
        test_script: "/tests/test.sh".into(),
        agent_timeout_s: cfg.agent.timeout_sec.unwrap_or(DEFAULT_AGENT_TIMEOUT_S),
        verifier_timeout_s: cfg
            .verifier
            .timeout_sec
            .unwrap_or(DEFAULT_VERIFIER_TIMEOUT_S),
        memory_bytes,
        cpus: e.cpus,
        disk_bytes,
        agent_env,
        verifier_env: env_pairs(cfg.verifier.env),
        tmpfs,
    })
}

fn load_terminal_bench(dir: &Path, name: String) -> Result<Task, HarborError> {
    use yaml_rust2::{Yaml, YamlLoader};
    let file = dir.join("task.yaml");
    let text = read(&file)?;
    let bad = |reason: String| HarborError::Config {
        file: file.clone(),
        reason,
    };
    let docs = YamlLoader::load_from_str(&text).map_err(|e| bad(e.to_string()))?;
    let y = docs.into_iter().next().unwrap_or(Yaml::Null);
    if y.as_hash().is_none() {
        return Err(bad("expected a mapping of keys".into()));
    }
    let instruction = match (&y["instruction"], &y["descriptions"]) {
        (Yaml::String(s), _) => s.clone(),
        (Yaml::BadValue, Yaml::Array(a)) => a
            .iter()
            .find(|d| d["key"].as_str() == Some("base"))
            .or(a.first())
            .and_then(|d| d["description"].as_str())
            .map(str::to_string)
            .ok_or_else(|| bad("`descriptions` has no `description`".into()))?,
        (Yaml::BadValue, _) => return Err(bad("no `instruction` key".into())),
        _ => return Err(bad("`instruction` must be a string".into())),
    };
    let secs = |key: &str, default: f64| -> Result<f64, HarborError> {
        match &y[key] {
            Yaml::BadValue | Yaml::Null => Ok(default),
            Yaml::Integer(i) if *i > 0 && *i <= 86_400 => Ok(*i as f64),
            Yaml::Real(r) => match r.parse::<f64>() {
                Ok(x) if x > 0.0 && x <= 86_400.0 => Ok(x),
                _ => Err(bad(format!("`{key}`: expected seconds in (0, 86400]"))),
            },
            _ => Err(bad(format!("`{key}`: expected seconds in (0, 86400]"))),
        }
    };
    let agent_timeout_s = secs("max_agent_timeout_sec", 180.0)?;
    let verifier_timeout_s = secs("max_test_timeout_sec", 30.0)?;
    match &y["parser_name"] {
        Yaml::BadValue | Yaml::Null => {}
        Yaml::String(p) if p == "pytest" => {}
        other => {
            return Err(HarborError::Unsupported {
                file: file.clone(),
                what: format!("parser_name {other:?} (only pytest)"),
            })
        }
    }
    let (mut context, mut dockerfile) = (dir.to_path_buf(), dir.join("Dockerfile"));
    let mut env = vec![("TEST_DIR".to_string(), "/tests".to_string())];
    let compose_file = dir.join("docker-compose.yaml");
    let mut tmpfs = Vec::new();
    if compose_file.exists() {
        let (c, d, e, t) = compose(&compose_file, dir)?;
        tmpfs = t;
        if let Some(c) = c {
            dockerfile = c.join("Dockerfile");
            context = c;
        }
        if let Some(d) = d {
            dockerfile = d;
        }
        env.retain(|(k, _)| !e.iter().any(|(k2, _)| k2 == k));
        env.extend(e);
    }
    if !dockerfile.is_file() {
        return Err(HarborError::Missing {
            dir: dir.to_path_buf(),
            file: "Dockerfile".into(),
        });
    }
    need(dir, "run-tests.sh")?;
    let mut tests = vec![("run-tests.sh".to_string(), dir.join("run-tests.sh"))];
    if dir.join("tests").is_dir() {
        tests.extend(files_under(&dir.join("tests"))?);
    }
    let oracle = if dir.join("solution.sh").is_file() {
        Some(Oracle::Script {
            dir: dir.to_path_buf(),
            files: vec!["solution.sh".into()],
            entry: "solution.sh".into(),
        })
    } else if dir.join("solution.yaml").is_file() {
        Some(Oracle::Keystrokes(keystrokes(&dir.join("solution.yaml"))?))
    } else {
        None
    };
    Ok(Task {
        dir: dir.to_path_buf(),
        name,
        layout: Layout::TerminalBench,
        instruction,
        dockerfile,
        context,
        oracle,
        tests,
        test_script: "/tests/run-tests.sh".into(),
        agent_timeout_s,
        verifier_timeout_s,
        memory_bytes: None,
        cpus: None,
        disk_bytes: None,
        agent_env: env.clone(),
        verifier_env: env,
        tmpfs,
    })
}

/// `solution.yaml`: a list of `{command, min_timeout_sec?, block?, append_enter?}`.
fn keystrokes(file: &Path) -> Result<Vec<String>, HarborError> {
    use yaml_rust2::{Yaml, YamlLoader};
    let bad = |reason: String| HarborError::Config {
        file: file.to_path_buf(),
        reason,
    };
    let docs = YamlLoader::load_from_str(&read(file)?).map_err(|e| bad(e.to_string()))?;
    let Some(list) = docs.first().and_then(Yaml::as_vec) else {
        return Err(bad("expected a list of {command: ...}".into()));
    };
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            item["command"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("item {}: no string `command`", i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn compose_tmpfs_entries_parse_or_are_named() {
        let f = Path::new("t/docker-compose.yaml");
        assert_eq!(
            tmpfs_entry(f, "/scratch:mode=1770,size=16m").unwrap(),
            ("/scratch".to_string(), 0o1770)
        );
        assert_eq!(
            tmpfs_entry(f, "/run/").unwrap(),
            ("/run".to_string(), 0o1777)
        );
        for (entry, why) in [
            ("scratch", "absolute"),
            ("/a/../etc", "absolute"),
            ("/x:mode=9", "not octal"),
            ("/x:uid=0,ro", "unsupported option `ro`"),
        ] {
            let e = tmpfs_entry(f, entry).unwrap_err().to_string();
            assert!(
                e.contains("t/docker-compose.yaml") && e.contains(entry) && e.contains(why),
                "{e}"
            );
        }
    }
}
