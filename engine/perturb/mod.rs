//! The perturbation catalogue: named, parameterised faults that synthesis applies to an
//! instance. A file per family: `fs` (filesystem), `bins` (binaries and packages), `procs`
//! (processes and services), `net` (network, through a fault proxy), `time`, `envvars`
//! (environment), and `tool_output` (mutating what real tools print).
//!
//! A perturbation writes into the instance's layer and runtime settings through
//! [`crate::instance::Builder`]; it never touches the host. Randomness comes only from
//! `Builder::rng(purpose)`, so an instance is a pure function of its plan.

pub mod bins;
pub mod envvars;
pub mod fs;
pub mod net;
pub mod procs;
pub mod time;
pub mod tool_output;

use crate::instance::{Params, ParamsExt, Value};

use crate::instance::{Builder, InstanceError, PerturbationChoice};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum PerturbError {
    #[error("unknown perturbation `{}` (see `docs/environments.md` for the catalogue)", crate::text::cut(.0))]
    Unknown(String),
    #[error("unknown parameter `{}` (this perturbation takes: {known})", crate::text::cut(.param))]
    UnknownParam { param: String, known: String },
    #[error("parameter `{param}`: {reason}")]
    BadParam { param: String, reason: String },
    #[error("not applicable here: {0}")]
    NotApplicable(String),
    #[error("bad perturbation spec `{}`: {reason}", crate::text::cut(.spec))]
    BadSpec { spec: String, reason: String },
    #[error(transparent)]
    Layer(#[from] InstanceError),
    #[error(
        "{what}{0}",
        what = if .0.is_not_applicable() { "not applicable here: " } else { "parameter `tool`: " }

    )]
    ToolOutput(#[from] tool_output::ToolOutputError),
}

impl PerturbError {
    /// True when the perturbation cannot take hold in this instance (the plan is fine, the
    /// instance lacks what the fault needs): such plans are skipped, not counted as failures.
    pub fn is_not_applicable(&self) -> bool {
        match self {
            Self::NotApplicable(_) => true,
            Self::ToolOutput(e) => e.is_not_applicable(),
            _ => false,
        }
    }

    /// Why the perturbation cannot take hold here (the bare reason), when that is the failure.
    pub fn not_applicable_reason(&self) -> Option<String> {
        match self {
            Self::NotApplicable(why) => Some(why.clone()),
            Self::ToolOutput(e) if e.is_not_applicable() => Some(e.to_string()),
            _ => None,
        }
    }

    /// True when the plan itself is wrong (an unknown or out-of-range parameter).
    pub fn is_bad_param(&self) -> bool {
        match self {
            Self::BadParam { .. } | Self::UnknownParam { .. } => true,
            Self::ToolOutput(e) => !e.is_not_applicable(),
            _ => false,
        }
    }
}

/// The type and legal values of a parameter.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Int {
        min: i64,
        max: i64,
    },
    Float {
        min: f64,
        max: f64,
    },
    Bool,
    /// Any string (a path, a tool name, ...).
    Str,
    /// One of these strings.
    Choice(&'static [&'static str]),
}

/// How an error names what a parameter takes: "an integer in 0..=50".
impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int { min, max } => write!(f, "an integer in {min}..={max}"),
            Self::Float { min, max } => write!(f, "a number in {min}..={max}"),
            Self::Bool => f.write_str("true or false"),
            Self::Str => f.write_str("a string"),
            Self::Choice(cs) => write!(f, "one of {}", cs.join(", ")),
        }
    }
}

/// One parameter of a perturbation.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: Kind,
    /// Used when the plan does not give the parameter.
    pub default: &'static str,
    /// What is realistic, in words (goes into the catalogue in `docs/environments.md`).
    pub realistic: &'static str,
    pub help: &'static str,
}

/// The families of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Filesystem,
    Binaries,
    Processes,
    Network,
    Time,
    Environment,
    ToolOutput,
}

/// The description of a perturbation.
#[derive(Debug)]
pub struct Info {
    pub name: &'static str,
    pub family: Family,
    pub summary: &'static str,
    /// How it is done, in words.
    pub mechanism: &'static str,
    pub params: &'static [ParamSpec],
}

impl Info {
    /// Check a plan's parameters and fill in the defaults.
    pub fn check(&self, given: &Params) -> Result<Params, PerturbError> {
        for k in given.keys() {
            if !self.params.iter().any(|p| p.name == k) {
                return Err(PerturbError::UnknownParam {
                    param: k.clone(),
                    known: self
                        .params
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        let mut out = Params::new();
        for spec in self.params {
            let v = given
                .get(spec.name)
                .cloned()
                .unwrap_or_else(|| Value::parse(spec.default));
            let bad = |reason: String| PerturbError::BadParam {
                param: spec.name.into(),
                reason,
            };
            let v = match (spec.kind, v) {
                (Kind::Int { min, max }, Value::Int(i)) => {
                    if i < min || i > max {
                        return Err(bad(format!("{i} is outside {min}..={max}")));
                    }
                    Value::Int(i)
                }
                (Kind::Float { min, max }, Value::Int(i)) if (min..=max).contains(&(i as f64)) => {
                    Value::Float(i as f64)
                }
                (Kind::Float { min, max }, Value::Float(x)) => {
                    if !(min..=max).contains(&x) {
                        return Err(bad(format!("{x} is outside {min}..={max}")));
                    }
                    Value::Float(x)
                }
                (Kind::Bool, Value::Bool(b)) => Value::Bool(b),
                (Kind::Str, v) => Value::Str(v.to_string()),
                (Kind::Choice(cs), v) => {
                    let s = v.to_string();
                    if !cs.contains(&s.as_str()) {
                        return Err(bad(format!(
                            "`{}` is not one of {}",
                            crate::text::cut(&s),
                            cs.join(", ")
                        )));
                    }
                    Value::Str(s)
                }
                (k, v) => {
                    return Err(bad(format!(
                        "`{}` is not {k}",
                        crate::text::cut(&v.to_string())
                    )))
                }
            };
            out.insert(spec.name.into(), v);
        }
        Ok(out)
    }
}

/// A perturbation of the catalogue.
pub trait Perturbation: Send + Sync {
    fn info(&self) -> &'static Info;
    /// Apply to the instance under construction; `purpose` seeds its randomness
    /// (`b.rng(purpose)`). Returns what was done, in one line.
    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError>;
}

/// Every perturbation, in catalogue order.
pub fn catalogue() -> Vec<&'static dyn Perturbation> {
    let mut v: Vec<&'static dyn Perturbation> = Vec::new();
    v.extend(fs::all());
    v.extend(bins::all());
    v.extend(procs::all());
    v.extend(net::all());
    v.extend(time::all());
    v.extend(envvars::all());
    v.extend(tool_output::all());
    v
}

pub fn get(name: &str) -> Option<&'static dyn Perturbation> {
    catalogue().into_iter().find(|p| p.info().name == name)
}

/// Parse a command-line spec: `NAME` or `NAME:key=value,key=value`.
pub fn parse_spec(spec: &str) -> Result<PerturbationChoice, PerturbError> {
    let bad = |reason: &str| PerturbError::BadSpec {
        spec: spec.into(),
        reason: reason.into(),
    };
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let name = name.trim();
    if name.is_empty() {
        return Err(bad("no perturbation name"));
    }
    let p = get(name).ok_or_else(|| PerturbError::Unknown(name.into()))?;
    let mut params = Params::new();
    for kv in rest.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(&format!("`{kv}` is not key=value")))?;
        params.insert(k.trim().to_string(), Value::parse(v.trim()));
    }
    let params = p.info().check(&params)?;
    Ok(PerturbationChoice {
        name: name.into(),
        params,
    })
}

/// The catalogue as a Markdown table (name, family, parameters with defaults, summary): what
/// `engine perturb list --markdown` prints and `docs/environments.md` embeds.
pub fn catalogue_markdown() -> String {
    use std::fmt::Write;
    let mut s = String::from(
        "| name | family | parameters (default) | what it does |\n|---|---|---|---|\n",
    );
    for p in catalogue() {
        let i = p.info();
        let params: Vec<String> = i
            .params
            .iter()
            .map(|p| {
                if p.default.is_empty() {
                    format!("`{}`", p.name)
                } else {
                    format!("`{}` ({})", p.name, p.default)
                }
            })
            .collect();
        let family = serde_json::to_value(i.family)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            i.name,
            family,
            params.join(", "),
            i.summary.replace('|', "\\|").replace('\n', " ")
        );
    }
    s
}

/// The catalogue as text, one perturbation per block.
pub fn catalogue_text() -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for p in catalogue() {
        let i = p.info();
        let _ = writeln!(s, "{:<18} {:?}: {}", i.name, i.family, i.summary);
        for p in i.params {
            let _ = writeln!(
                s,
                "    {:<12} default {:<12} realistic: {}",
                p.name,
                if p.default.is_empty() { "-" } else { p.default },
                p.realistic
            );
        }
    }
    s
}
