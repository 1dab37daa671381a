//! Templates: a base environment and a space of perturbations, in TOML or YAML (same shape),
//! sampled deterministically from a seed into synthesis [`Plan`]s.
//!
//! ```toml
//! [template]
//! name = "flaky-logs"
//! task = "archive-logs"              # optional
//! [base_environment]
//! rootfs = "host"                    # host | DIR | oci:PATH
//! tools = ["tar", "gzip"]            # must exist in the base (checked at synthesis)
//! cpus = 1.0
//! memory = "256M"
//! disk = "64M"
//! [[perturbation_space]]
//! name = "tool-missing"
//! probability = 0.3
//! [perturbation_space.params]
//! tool = ["gzip", "find"]            # a list = choices, a scalar = fixed
//! ```
//!
//! Both formats are first read into one tree of [`tree::Node`]s that remembers the line and
//! column of every key and value (TOML through `toml::Spanned`, YAML through `yaml-rust2`'s
//! marked events), and validated once over that tree, so every error names the file, line, key
//! and reason the same way in both formats.
//!
//! | file | what it is |
//! |---|---|
//! | `mod.rs` | the model ([`Template`], [`BaseEnvironment`], [`SpaceEntry`]), loading, sampling into plans, [`TemplateError`] |
//! | [`tree`] | the positioned TOML/YAML tree, and the byte-offset -> (line, column) helper |
//! | `validate.rs` | the validator: tree -> [`Template`] |
//! | `synthesize.rs` | [`synthesize`]: the instances of a template's seeds (what `engine synth` prints) |

mod synthesize;
pub mod tree;
mod validate;

pub use synthesize::{synthesize, NotApplicable, Synthesis, Synthesized};

use crate::instance::{self, Params, PerturbationChoice, Plan, Resources, TaskRef, Value};
use crate::perturb::{self, Info};
use rand::Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tree::Pos;

/// What went wrong, for callers and tests that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    Syntax,
    UnknownKey,
    MissingKey,
    WrongType,
    OutOfRange,
    UnknownPerturbation,
    UnknownParam,
    BadParam,
    UnknownTask,
    BadSize,
    BadRootfs,
    DuplicateKey,
    /// A tool of `base_environment.tools` is not on the base's PATH (checked against the base).
    MissingTool,
}

/// Errors of loading a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(transparent)]
    Read(#[from] crate::text::TextError),
    #[error("{file}: unknown template format (the name must end in .toml, .yaml or .yml)")]
    Format { file: PathBuf },
    #[error("{file}:{line}:{column}: {reason}")]
    Syntax {
        file: PathBuf,
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("{file}:{line}:{column}: key `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        line: usize,
        column: usize,
        key: String,
        kind: ErrorKind,
        reason: String,
    },
    #[error("{file}: synthesizing seed {seed}: {source}")]
    Synthesis {
        file: PathBuf,
        seed: u64,
        source: Box<crate::running::RunningError>,
    },
}

impl TemplateError {
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Syntax { .. } => Some(ErrorKind::Syntax),
            Self::Invalid { kind, .. } => Some(*kind),
            _ => None,
        }
    }
    /// 1-based line of the error, when it has one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Syntax { line, .. } | Self::Invalid { line, .. } => Some(*line),
            _ => None,
        }
    }
    /// The dotted key (`perturbation_space[1].params.tool`), when the error has one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// The two spellings of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    pub fn of_path(p: &Path) -> Option<Self> {
        match p.extension()?.to_str()? {
            "toml" => Some(Self::Toml),
            "yaml" | "yml" => Some(Self::Yaml),
            _ => None,
        }
    }
}

/// A parameter of a perturbation in the space: fixed, or chosen uniformly from a list.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ParamChoice {
    Fixed(Value),
    OneOf(Vec<Value>),
}

/// One perturbation of the space.
#[derive(Debug, Clone, Serialize)]
pub struct SpaceEntry {
    pub name: String,
    /// Probability that a sampled plan includes it.
    pub probability: f64,
    pub params: BTreeMap<String, ParamChoice>,
    #[serde(skip)]
    info: Option<&'static Info>,
}

/// The base environment of a template.
#[derive(Debug, Clone, Serialize)]
pub struct BaseEnvironment {
    pub rootfs: String,
    pub tools: Vec<String>,
    pub resources: Resources,
    /// Where each tool is named, for errors.
    #[serde(skip)]
    tool_pos: Vec<Pos>,
}

/// A validated template.
#[derive(Debug, Clone, Serialize)]
pub struct Template {
    pub file: PathBuf,
    pub name: String,
    pub description: String,
    pub task: Option<String>,
    /// `task = { harbor = "DIR" }`: a task folder (docs/harbor.md) whose built image the
    /// perturbation space applies to, and where the key was.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "harbor_dir")]
    pub harbor: Option<(PathBuf, Pos)>,
    pub base: BaseEnvironment,
    pub space: Vec<SpaceEntry>,
}

fn harbor_dir<S: serde::Serializer>(h: &Option<(PathBuf, Pos)>, s: S) -> Result<S::Ok, S::Error> {
    match h {
        Some((p, _)) => s.serialize_some(p),
        None => s.serialize_none(),
    }
}

/// One perturbation of a space and its settings: `(name, [(label, params)])`.
pub type Settings = (String, Vec<(String, Params)>);

/// Where perturbations and tasks are looked up (the built-in catalogue, or a test's).
pub trait Catalog {
    fn perturbation(&self, name: &str) -> Option<&'static Info>;
    fn perturbation_names(&self) -> Vec<&'static str>;
    fn task_names(&self) -> Vec<&'static str>;
}

/// The catalogue of this build: `perturb::catalogue()` and `tasks::all()`.
pub struct Builtin;

impl Catalog for Builtin {
    fn perturbation(&self, name: &str) -> Option<&'static Info> {
        perturb::get(name).map(|p| p.info())
    }
    fn perturbation_names(&self) -> Vec<&'static str> {
        perturb::catalogue().iter().map(|p| p.info().name).collect()
    }
    fn task_names(&self) -> Vec<&'static str> {
        crate::tasks::names()
    }
}

impl Template {
    /// Read and validate a template file (`.toml`, `.yaml` or `.yml`) of a built-in task or
    /// none; one naming a task folder is an error here (it runs through `engine harbor`:
    /// [`Template::load_any`]).
    pub fn load(file: &Path) -> Result<Self, TemplateError> {
        let t = Self::load_any(file)?;
        if let Some((_, pos)) = &t.harbor {
            return Err(TemplateError::Invalid {
                file: file.into(),
                line: pos.line,
                column: pos.col,
                key: "template.task".into(),
                kind: ErrorKind::UnknownTask,
                reason: "names a task folder: run it with `engine harbor run --template` or `engine harbor check --template` (this command needs a built-in task)".into(),
            });
        }
        Ok(t)
    }

    /// [`Template::load`], task folders (`task = { harbor = "DIR" }`) included.
    pub fn load_any(file: &Path) -> Result<Self, TemplateError> {
        let format =
            Format::of_path(file).ok_or_else(|| TemplateError::Format { file: file.into() })?;
        let text = crate::text::read_input(file)?;
        Self::parse(&text, file, format)
    }

    /// Validate a template's text against the built-in catalogue; `file` names it in errors.
    pub fn parse(text: &str, file: &Path, format: Format) -> Result<Self, TemplateError> {
        Self::parse_with(text, file, format, &Builtin)
    }

    /// Validate a template's text against a given catalogue.
    pub fn parse_with(
        text: &str,
        file: &Path,
        format: Format,
        catalog: &dyn Catalog,
    ) -> Result<Self, TemplateError> {
        if text.len() as u64 > crate::text::MAX_INPUT_BYTES {
            return Err(crate::text::TextError::TooLarge {
                file: file.into(),
                max: crate::text::MAX_INPUT_BYTES,
            }
            .into());
        }
        let root = match format {
            Format::Toml => tree::toml_tree(text),
            Format::Yaml => tree::yaml_tree(text),
        }
        .map_err(|(pos, reason)| TemplateError::Syntax {
            file: file.into(),
            line: pos.line,
            column: pos.col,
            reason,
        })?;
        validate::template(&root, file, catalog)
    }

    /// The plan of one seed: each perturbation is included with its probability and each
    /// list parameter chosen uniformly, from generators seeded by (seed, entry), so adding an
    /// entry to the space does not change the draws of the others. The task (if any) gets the
    /// same seed. Plans record every parameter, defaults filled in.
    pub fn sample(&self, seed: u64) -> Plan {
        let mut perturbations = Vec::new();
        for (i, e) in self.space.iter().enumerate() {
            let mut rng = instance::rng_for(seed, &format!("template/{i}/{}", e.name));
            let include = rng.gen::<f64>() < e.probability;
            let mut params = Params::new();
            for (k, c) in &e.params {
                let v = match c {
                    ParamChoice::Fixed(v) => v.clone(),
                    ParamChoice::OneOf(vs) => vs[rng.gen_range(0..vs.len())].clone(),
                };
                params.insert(k.clone(), v);
            }
            if include {
                // Every choice passed `check` at load (parameters are checked one by one), so
                // this cannot fail; the unchecked parameters would still be rejected at
                // synthesis.
                let params = match e.info {
                    Some(info) => info.check(&params).unwrap_or(params),
                    None => params,
                };
                perturbations.push(PerturbationChoice {
                    name: e.name.clone(),
                    params,
                });
            }
        }
        Plan {
            perturbations,
            ..self.sample_clean(seed)
        }
    }

    /// Check that every tool of `base_environment.tools` is on the base's default PATH.
    pub fn check_tools(&self, base: &instance::BaseView) -> Result<(), TemplateError> {
        let b = instance::Builder::new(base, 0, self.base.resources.clone());
        for (i, tool) in self.base.tools.iter().enumerate() {
            if b.which(tool, instance::DEFAULT_PATH).is_none() {
                let pos = self.base.tool_pos.get(i).copied().unwrap_or_default();
                return Err(TemplateError::Invalid {
                    file: self.file.clone(),
                    line: pos.line,
                    column: pos.col,
                    key: format!("base_environment.tools[{i}]"),
                    kind: ErrorKind::MissingTool,
                    reason: format!(
                        "the base `{}` has no `{tool}` on {}",
                        self.base.rootfs,
                        instance::DEFAULT_PATH
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every setting of each perturbation of the space, for a learned adversary: per entry,
    /// its name and each combination of its list parameters (fixed ones included), checked
    /// and with defaults filled in, with a label such as `tool=gzip,exit_code=2`.
    pub fn settings(&self) -> Vec<Settings> {
        self.space
            .iter()
            .map(|e| {
                let mut combos: Vec<(Vec<String>, Params)> = vec![(Vec::new(), Params::new())];
                for (k, c) in &e.params {
                    let values: Vec<&Value> = match c {
                        ParamChoice::Fixed(v) => vec![v],
                        ParamChoice::OneOf(vs) => vs.iter().collect(),
                    };
                    let listed = matches!(c, ParamChoice::OneOf(vs) if vs.len() > 1);
                    combos = combos
                        .into_iter()
                        .flat_map(|(label, params)| {
                            values.iter().map(move |v| {
                                let mut label = label.clone();
                                let mut params = params.clone();
                                if listed {
                                    label.push(format!("{k}={v}"));
                                }
                                params.insert(k.clone(), (*v).clone());
                                (label, params)
                            })
                        })
                        .collect();
                }
                let settings = combos
                    .into_iter()
                    .map(|(label, params)| {
                        let params = match e.info {
                            Some(info) => info.check(&params).unwrap_or(params),
                            None => params,
                        };
                        let label = if label.is_empty() {
                            "on".into()
                        } else {
                            label.join(",")
                        };
                        (label, params)
                    })
                    .collect();
                (e.name.clone(), settings)
            })
            .collect()
    }

    /// The plan of task seed `seed` with exactly the perturbations `picks` names: per
    /// entry of the space, 0 for off or `1 + k` for the k-th of its settings (`settings` is
    /// [`settings`](Self::settings), computed once by the caller; missing entries are off,
    /// and an index past the settings is off too, the caller checks).
    pub fn plan_with(&self, settings: &[Settings], seed: u64, picks: &[u32]) -> Plan {
        let perturbations = settings
            .iter()
            .zip(picks.iter().copied().chain(std::iter::repeat(0)))
            .filter_map(|((name, s), pick)| {
                let k = (pick as usize).checked_sub(1)?;
                s.get(k).map(|(_, params)| PerturbationChoice {
                    name: name.clone(),
                    params: params.clone(),
                })
            })
            .collect();
        Plan {
            perturbations,
            ..self.sample_clean(seed)
        }
    }

    /// The unperturbed plan of a task seed (base, task and resources of the template).
    pub fn sample_clean(&self, seed: u64) -> Plan {
        Plan {
            base: self.base.rootfs.clone(),
            task: self.task.as_ref().map(|t| TaskRef {
                name: t.clone(),
                seed,
            }),
            perturbations: Vec::new(),
            seed,
            resources: self.base.resources.clone(),
            tools: self.base.tools.clone(),
        }
    }

    /// The plans of seeds `seed, seed+1, ..., seed+count-1`.
    pub fn sample_many(&self, seed: u64, count: u64) -> Vec<Plan> {
        (0..count)
            .map(|k| self.sample(seed.wrapping_add(k)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::perturb::{Family, Kind, ParamSpec};

    static TOOL_MISSING: Info = Info {
        name: "tool-missing",
        family: Family::Binaries,
        summary: "",
        mechanism: "",
        params: &[ParamSpec {
            name: "tool",
            kind: Kind::Str,
            default: "tar",
            realistic: "",
            help: "",
        }],
    };
    static DISK_FILL: Info = Info {
        name: "disk-fill",
        family: Family::Filesystem,
        summary: "",
        mechanism: "",
        params: &[
            ParamSpec {
                name: "free_pct",
                kind: Kind::Int { min: 0, max: 50 },
                default: "5",
                realistic: "",
                help: "",
            },
            ParamSpec {
                name: "mode",
                kind: Kind::Choice(&["sparse", "dense"]),
                default: "dense",
                realistic: "",
                help: "",
            },
        ],
    };

    struct Fake;
    impl Catalog for Fake {
        fn perturbation(&self, name: &str) -> Option<&'static Info> {
            [&TOOL_MISSING, &DISK_FILL]
                .into_iter()
                .find(|i| i.name == name)
        }
        fn perturbation_names(&self) -> Vec<&'static str> {
            vec!["tool-missing", "disk-fill"]
        }
        fn task_names(&self) -> Vec<&'static str> {
            vec!["archive-logs"]
        }
    }

    pub(super) const TOML: &str = r#"[template]
name = "t"
task = "archive-logs"
[base_environment]
rootfs = "host"
tools = ["tar"]
memory = "128M"
disk = 1048576
[[perturbation_space]]
name = "tool-missing"
probability = 0.3
[perturbation_space.params]
tool = ["gzip", "find"]
[[perturbation_space]]
name = "disk-fill"
params = { free_pct = [1, 2, 3], mode = "sparse" }
"#;

    pub(super) const YAML: &str = "template:
  name: t
  task: archive-logs
base_environment:
  rootfs: host
  tools: [tar]
  memory: 128M
  disk: 1048576
perturbation_space:
  - name: tool-missing
    probability: 0.3
    params:
      tool: [gzip, find]
  - name: disk-fill
    params:
      free_pct: [1, 2, 3]
      mode: sparse
";

    pub(super) fn toml(text: &str) -> Result<Template, TemplateError> {
        Template::parse_with(text, Path::new("t.toml"), Format::Toml, &Fake)
    }
    pub(super) fn yaml(text: &str) -> Result<Template, TemplateError> {
        Template::parse_with(text, Path::new("t.yaml"), Format::Yaml, &Fake)
    }

    #[test]
    fn toml_and_yaml_read_the_same() {
        let a = toml(TOML).unwrap();
        let b = yaml(YAML).unwrap();
        assert_eq!(a.base.resources.memory_bytes, 128 << 20);
        assert_eq!(a.base.resources.disk_bytes, 1 << 20);
        assert_eq!(a.space.len(), 2);
        assert_eq!(a.space[1].probability, 1.0);
        assert_eq!(
            a.space[0].params["tool"],
            ParamChoice::OneOf(vec![Value::Str("gzip".into()), Value::Str("find".into())])
        );
        assert_eq!(a.sample_many(0, 50), b.sample_many(0, 50));
    }

    #[test]
    fn sampling_is_deterministic_and_follows_the_probability() {
        let t = toml(TOML).unwrap();
        assert_eq!(t.sample(42), t.sample(42));
        let plans = t.sample_many(1000, 2000);
        let with = plans
            .iter()
            .filter(|p| p.perturbations.iter().any(|c| c.name == "tool-missing"))
            .count();
        assert!((500..=700).contains(&with), "p=0.3 gave {with}/2000");
        // p = 1 (the default): always; each list choice is drawn, fixed values kept, defaults
        // filled in.
        let mut seen = std::collections::BTreeSet::new();
        for p in &plans {
            let c = p
                .perturbations
                .iter()
                .find(|c| c.name == "disk-fill")
                .unwrap();
            assert_eq!(c.params["mode"], Value::Str("sparse".into()));
            seen.insert(c.params["free_pct"].to_string());
            assert_eq!(p.seed, p.task.as_ref().unwrap().seed);
        }
        assert_eq!(seen.len(), 3);
        let tm = plans
            .iter()
            .flat_map(|p| &p.perturbations)
            .find(|c| c.name == "tool-missing")
            .unwrap();
        assert!(matches!(&tm.params["tool"], Value::Str(s) if s == "gzip" || s == "find"));
    }
}
