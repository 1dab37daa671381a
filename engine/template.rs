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
//! Both formats are first read into one tree of [`Node`]s that remembers the line and column of
//! every key and value (TOML through `toml::Spanned`, YAML through `yaml-rust2`'s marked
//! events), and validated once over that tree, so every error names the file, line, key and
//! reason the same way in both formats.

use crate::instance::{self, Params, PerturbationChoice, Plan, Resources, TaskRef, Value};
use crate::perturb::{self, Info, PerturbError};
use crate::synth;
use rand::Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
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

// ---------------------------------------------------------------------------------------------
// The template
// ---------------------------------------------------------------------------------------------

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
    pub base: BaseEnvironment,
    pub space: Vec<SpaceEntry>,
}

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
    /// Read and validate a template file (`.toml`, `.yaml` or `.yml`).
    pub fn load(file: &Path) -> Result<Self, TemplateError> {
        let format =
            Format::of_path(file).ok_or_else(|| TemplateError::Format { file: file.into() })?;
        let text = std::fs::read_to_string(file).map_err(|source| TemplateError::Read {
            file: file.into(),
            source,
        })?;
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
        let root = match format {
            Format::Toml => toml_tree(text),
            Format::Yaml => yaml_tree(text),
        }
        .map_err(|(pos, reason)| TemplateError::Syntax {
            file: file.into(),
            line: pos.line,
            column: pos.col,
            reason,
        })?;
        Validator { file, catalog }.template(&root)
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
            base: self.base.rootfs.clone(),
            task: self.task.as_ref().map(|t| TaskRef {
                name: t.clone(),
                seed,
            }),
            perturbations,
            seed,
            resources: self.base.resources.clone(),
            tools: self.base.tools.clone(),
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

    /// The plans of seeds `seed, seed+1, ..., seed+count-1`.
    pub fn sample_many(&self, seed: u64, count: u64) -> Vec<Plan> {
        (0..count)
            .map(|k| self.sample(seed.wrapping_add(k)))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Reports for `engine synth`
// ---------------------------------------------------------------------------------------------

/// One synthesized instance of a template.
#[derive(Debug, Clone, Serialize)]
pub struct Synthesized {
    pub seed: u64,
    pub id: String,
    pub origin: synth::Origin,
    pub plan: Plan,
    /// What each perturbation did, one line each.
    pub applied: Vec<String>,
    pub layer_bytes: u64,
    /// Wall time of the synthesis (or the cache lookup), milliseconds.
    pub ms: f64,
}

/// Synthesize (or find in the cache) the instances of seeds `seed..seed+count`, after
/// checking the template's tools against its base.
pub fn synthesize(
    rt: &sandbox::Runtime,
    cache: &synth::Cache,
    t: &Template,
    seed: u64,
    count: u64,
) -> Result<Vec<Synthesized>, TemplateError> {
    let fail = |seed: u64, e: crate::running::RunningError| TemplateError::Synthesis {
        file: t.file.clone(),
        seed,
        source: Box::new(e),
    };
    let spec = crate::running::base_spec(&t.base.rootfs).map_err(|e| fail(seed, e))?;
    let rootfs = rt.resolve(&spec).map_err(|e| fail(seed, e.into()))?;
    t.check_tools(&instance::BaseView::new(&rootfs))?;
    let mut out = Vec::new();
    for plan in t.sample_many(seed, count) {
        let start = std::time::Instant::now();
        let held = crate::running::synthesize(rt, cache, &plan).map_err(|e| fail(plan.seed, e))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(template = %t.name, seed = plan.seed, instance = %held.instance.id, ms, "synthesized");
        out.push(Synthesized {
            seed: plan.seed,
            id: held.instance.id.clone(),
            origin: held.origin,
            applied: held.instance.applied.clone(),
            layer_bytes: held.instance.layer_bytes,
            plan,
            ms,
        });
    }
    Ok(out)
}

/// The JSON report of `engine synth --json`.
pub fn synth_report(t: &Template, items: &[Synthesized]) -> serde_json::Value {
    serde_json::json!({
        "template": t.name,
        "file": t.file,
        "task": t.task,
        "base": t.base.rootfs,
        "instances": items,
    })
}

/// The human form of `engine synth`: one block per instance.
pub fn synth_text(t: &Template, items: &[Synthesized]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "template {} ({})", t.name, t.file.display());
    for it in items {
        let _ = writeln!(
            s,
            "seed {:<6} {}  {:?} in {:.2} ms, layer {} bytes",
            it.seed, it.id, it.origin, it.ms, it.layer_bytes
        );
        if let Some(task) = &it.plan.task {
            let _ = writeln!(s, "  task {} (seed {})", task.name, task.seed);
        }
        if it.applied.is_empty() {
            let _ = writeln!(s, "  no perturbation");
        }
        for (c, line) in it.plan.perturbations.iter().zip(&it.applied) {
            let params: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  {} [{}]", line, params.join(","));
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The positioned tree
// ---------------------------------------------------------------------------------------------

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A value of a template with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub v: V,
}

#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Keys in document order, each with its own position.
    Map(Vec<(String, Pos, Node)>),
}

impl V {
    fn type_name(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "a boolean",
            Self::Int(_) => "an integer",
            Self::Float(_) => "a float",
            Self::Str(_) => "a string",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a table",
        }
    }
}

fn pos_of_offset(text: &str, offset: usize) -> Pos {
    let end = offset.min(text.len());
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    Pos { line, col }
}

// TOML: a self-describing value whose nested keys and values are `toml::Spanned`.
enum Raw {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<toml::Spanned<Raw>>),
    Map(Vec<(toml::Spanned<String>, toml::Spanned<Raw>)>),
}

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> serde::de::Visitor<'de> for RawVisitor {
    type Value = Raw;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Raw, E> {
        i64::try_from(v)
            .map(Raw::Int)
            .map_err(|_| E::custom("integer too large"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Raw::Seq(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
        let mut v = Vec::new();
        while let Some(k) = a.next_key::<toml::Spanned<String>>()? {
            let val = a.next_value::<toml::Spanned<Raw>>()?;
            v.push((k, val));
        }
        Ok(Raw::Map(v))
    }
}

fn raw_to_node(text: &str, raw: Raw, pos: Pos) -> Node {
    let v = match raw {
        Raw::Bool(b) => V::Bool(b),
        Raw::Int(i) => V::Int(i),
        Raw::Float(x) => V::Float(x),
        Raw::Str(s) => V::Str(s),
        Raw::Seq(items) => V::Seq(
            items
                .into_iter()
                .map(|s| {
                    let p = pos_of_offset(text, s.span().start);
                    raw_to_node(text, s.into_inner(), p)
                })
                .collect(),
        ),
        Raw::Map(entries) => V::Map(
            entries
                .into_iter()
                .map(|(k, val)| {
                    let kp = pos_of_offset(text, k.span().start);
                    let vp = pos_of_offset(text, val.span().start);
                    (k.into_inner(), kp, raw_to_node(text, val.into_inner(), vp))
                })
                .collect(),
        ),
    };
    Node { pos, v }
}

/// Parse TOML into the positioned tree.
pub fn toml_tree(text: &str) -> Result<Node, (Pos, String)> {
    let raw: Raw = toml::from_str(text).map_err(|e| {
        let pos = e
            .span()
            .map_or(Pos { line: 1, col: 1 }, |s| pos_of_offset(text, s.start));
        (pos, e.message().trim().to_string())
    })?;
    Ok(raw_to_node(text, raw, Pos { line: 1, col: 1 }))
}

// YAML: built from the parser's marked events.
enum Frame {
    Seq(Pos, usize, Vec<Node>),
    Map(Pos, usize, Vec<(String, Pos, Node)>, Option<(String, Pos)>),
}

#[derive(Default)]
struct YamlBuilder {
    stack: Vec<Frame>,
    root: Option<Node>,
    anchors: BTreeMap<usize, Node>,
    error: Option<(Pos, String)>,
}

fn yaml_scalar(s: String, style: yaml_rust2::scanner::TScalarStyle) -> V {
    use yaml_rust2::scanner::TScalarStyle;
    if style != TScalarStyle::Plain {
        return V::Str(s);
    }
    match s.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return V::Null,
        "true" | "True" | "TRUE" => return V::Bool(true),
        "false" | "False" | "FALSE" => return V::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" => return V::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return V::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return V::Float(f64::NAN),
        _ => {}
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(&s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return V::Int(i);
        }
    }
    if let Some(h) = s.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(h, 16) {
            return V::Int(i);
        }
    }
    if let Some(o) = s.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(o, 8) {
            return V::Int(i);
        }
    }
    let float_like = digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if float_like {
        if let Ok(x) = s.parse::<f64>() {
            return V::Float(x);
        }
    }
    V::Str(s)
}

impl YamlBuilder {
    fn push(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq(_, _, items)) => items.push(node),
            Some(Frame::Map(_, _, entries, pending)) => match pending.take() {
                Some((k, kp)) => entries.push((k, kp, node)),
                None => {
                    let key = match node.v {
                        V::Str(s) => s,
                        V::Int(i) => i.to_string(),
                        V::Bool(b) => b.to_string(),
                        V::Float(x) => x.to_string(),
                        V::Null => "null".into(),
                        V::Seq(_) | V::Map(_) => {
                            if self.error.is_none() {
                                self.error = Some((node.pos, "a key must be a plain value".into()));
                            }
                            String::new()
                        }
                    };
                    *pending = Some((key, node.pos));
                }
            },
        }
    }
}

impl yaml_rust2::parser::MarkedEventReceiver for YamlBuilder {
    fn on_event(&mut self, ev: yaml_rust2::Event, mark: yaml_rust2::scanner::Marker) {
        use yaml_rust2::Event;
        let pos = Pos {
            line: mark.line(),
            col: mark.col() + 1,
        };
        match ev {
            Event::Scalar(s, style, anchor, _tag) => {
                let node = Node {
                    pos,
                    v: yaml_scalar(s, style),
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, node.clone());
                }
                self.push(node);
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Frame::Seq(pos, anchor, Vec::new())),
            Event::MappingStart(anchor, _) => {
                self.stack.push(Frame::Map(pos, anchor, Vec::new(), None));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Frame::Seq(p, a, items)) => (
                        Node {
                            pos: p,
                            v: V::Seq(items),
                        },
                        a,
                    ),
                    Some(Frame::Map(p, a, entries, _)) => (
                        Node {
                            // A block mapping's start mark is at its first `:`; its first
                            // key is where a reader looks.
                            pos: entries.first().map_or(p, |e| e.1),
                            v: V::Map(entries),
                        },
                        a,
                    ),
                    None => return,
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, node.clone());
                }
                self.push(node);
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(n) => self.push(n),
                None => {
                    if self.error.is_none() {
                        self.error = Some((pos, "alias of an unknown anchor".into()));
                    }
                }
            },
            _ => {}
        }
    }
}

/// Parse YAML into the positioned tree (the first document of the stream).
pub fn yaml_tree(text: &str) -> Result<Node, (Pos, String)> {
    let mut b = YamlBuilder::default();
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    parser.load(&mut b, false).map_err(|e| {
        let m = e.marker();
        (
            Pos {
                line: m.line(),
                col: m.col() + 1,
            },
            e.info().to_string(),
        )
    })?;
    if let Some(e) = b.error {
        return Err(e);
    }
    Ok(b.root.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        v: V::Null,
    }))
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

struct Validator<'a> {
    file: &'a Path,
    catalog: &'a dyn Catalog,
}

/// A table's entries, checked against the allowed keys.
struct Table<'n> {
    key: String,
    pos: Pos,
    entries: &'n [(String, Pos, Node)],
}

impl<'n> Table<'n> {
    fn get(&self, k: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(name, _, n)| name == k && n.v != V::Null)
            .map(|e| &e.2)
    }
    fn path(&self, k: &str) -> String {
        if self.key.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.key)
        }
    }
}

impl Validator<'_> {
    fn err(
        &self,
        pos: Pos,
        key: &str,
        kind: ErrorKind,
        reason: impl Into<String>,
    ) -> TemplateError {
        TemplateError::Invalid {
            file: self.file.into(),
            line: pos.line,
            column: pos.col,
            key: key.into(),
            kind,
            reason: reason.into(),
        }
    }

    fn table<'n>(
        &self,
        node: &'n Node,
        key: &str,
        allowed: &[&str],
    ) -> Result<Table<'n>, TemplateError> {
        let V::Map(entries) = &node.v else {
            return Err(self.err(
                node.pos,
                key,
                ErrorKind::WrongType,
                format!("expected a table, found {}", node.v.type_name()),
            ));
        };
        let t = Table {
            key: key.into(),
            pos: node.pos,
            entries,
        };
        for (i, (k, kp, _)) in entries.iter().enumerate() {
            if entries[..i].iter().any(|e| e.0 == *k) {
                return Err(self.err(*kp, &t.path(k), ErrorKind::DuplicateKey, "given twice"));
            }
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    *kp,
                    &t.path(k),
                    ErrorKind::UnknownKey,
                    format!("unknown key (expected one of: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(t)
    }

    fn string(&self, t: &Table, k: &str, required: bool) -> Result<Option<String>, TemplateError> {
        match t.get(k) {
            None if required => Err(self.err(
                t.pos,
                &t.path(k),
                ErrorKind::MissingKey,
                "missing (required)",
            )),
            None => Ok(None),
            Some(Node { v: V::Str(s), .. }) => Ok(Some(s.clone())),
            Some(n) => Err(self.err(
                n.pos,
                &t.path(k),
                ErrorKind::WrongType,
                format!("expected a string, found {}", n.v.type_name()),
            )),
        }
    }

    fn number(&self, t: &Table, k: &str) -> Result<Option<(f64, Pos)>, TemplateError> {
        match t.get(k) {
            None => Ok(None),
            Some(Node { v: V::Int(i), pos }) => Ok(Some((*i as f64, *pos))),
            Some(Node {
                v: V::Float(x),
                pos,
            }) => Ok(Some((*x, *pos))),
            Some(n) => Err(self.err(
                n.pos,
                &t.path(k),
                ErrorKind::WrongType,
                format!("expected a number, found {}", n.v.type_name()),
            )),
        }
    }

    fn size(&self, t: &Table, k: &str, default: u64) -> Result<u64, TemplateError> {
        match t.get(k) {
            None => Ok(default),
            Some(Node { v: V::Int(i), pos }) => {
                u64::try_from(*i).ok().filter(|b| *b > 0).ok_or_else(|| {
                    self.err(
                        *pos,
                        &t.path(k),
                        ErrorKind::BadSize,
                        format!(
                            "{i} is not a size: give a positive number of bytes or e.g. \"256M\""
                        ),
                    )
                })
            }
            Some(Node { v: V::Str(s), pos }) => crate::units::parse_size(s)
                .map_err(|e| self.err(*pos, &t.path(k), ErrorKind::BadSize, e.to_string())),
            Some(n) => Err(self.err(
                n.pos,
                &t.path(k),
                ErrorKind::WrongType,
                format!(
                    "expected a size such as \"256M\", found {}",
                    n.v.type_name()
                ),
            )),
        }
    }

    fn template(&self, root: &Node) -> Result<Template, TemplateError> {
        let top = self.table(
            root,
            "",
            &["template", "base_environment", "perturbation_space"],
        )?;
        let meta_node = top.get("template").ok_or_else(|| {
            self.err(
                root.pos,
                "template",
                ErrorKind::MissingKey,
                "missing the [template] table (with at least `name`)",
            )
        })?;
        let meta = self.table(meta_node, "template", &["name", "description", "task"])?;
        let name = self.string(&meta, "name", true)?.unwrap_or_default();
        if name.trim().is_empty() {
            let pos = meta.get("name").map_or(meta.pos, |n| n.pos);
            return Err(self.err(
                pos,
                "template.name",
                ErrorKind::OutOfRange,
                "must not be empty",
            ));
        }
        let description = self
            .string(&meta, "description", false)?
            .unwrap_or_default();
        let task = self.string(&meta, "task", false)?;
        if let Some(t) = &task {
            let known = self.catalog.task_names();
            if !known.contains(&t.as_str()) {
                let pos = meta.get("task").map_or(meta.pos, |n| n.pos);
                return Err(self.err(
                    pos,
                    "template.task",
                    ErrorKind::UnknownTask,
                    format!("unknown task `{t}` (known: {})", list_or_none(&known)),
                ));
            }
        }
        let base = match top.get("base_environment") {
            Some(n) => self.base(n)?,
            None => BaseEnvironment {
                rootfs: "host".into(),
                tools: Vec::new(),
                tool_pos: Vec::new(),
                resources: Resources::default(),
            },
        };
        let mut space = Vec::new();
        if let Some(n) = top.get("perturbation_space") {
            let V::Seq(items) = &n.v else {
                return Err(self.err(
                    n.pos,
                    "perturbation_space",
                    ErrorKind::WrongType,
                    format!(
                        "expected a list of perturbations ([[perturbation_space]]), found {}",
                        n.v.type_name()
                    ),
                ));
            };
            for (i, item) in items.iter().enumerate() {
                space.push(self.entry(item, &format!("perturbation_space[{i}]"))?);
            }
        }
        Ok(Template {
            file: self.file.into(),
            name,
            description,
            task,
            base,
            space,
        })
    }

    fn base(&self, n: &Node) -> Result<BaseEnvironment, TemplateError> {
        let t = self.table(
            n,
            "base_environment",
            &["rootfs", "tools", "cpus", "memory", "disk", "pids"],
        )?;
        let rootfs = self
            .string(&t, "rootfs", false)?
            .unwrap_or_else(|| "host".into());
        if let Err(e) = rootfs.parse::<sandbox::RootfsSpec>() {
            let pos = t.get("rootfs").map_or(t.pos, |n| n.pos);
            return Err(self.err(pos, &t.path("rootfs"), ErrorKind::BadRootfs, e.to_string()));
        }
        let mut tools = Vec::new();
        let mut tool_pos = Vec::new();
        if let Some(tn) = t.get("tools") {
            let V::Seq(items) = &tn.v else {
                return Err(self.err(
                    tn.pos,
                    &t.path("tools"),
                    ErrorKind::WrongType,
                    format!("expected a list of tool names, found {}", tn.v.type_name()),
                ));
            };
            for (i, it) in items.iter().enumerate() {
                let key = format!("base_environment.tools[{i}]");
                match &it.v {
                    V::Str(s)
                        if !s.is_empty()
                            && !s.contains('/')
                            && !s.contains(char::is_whitespace) =>
                    {
                        tools.push(s.clone());
                        tool_pos.push(it.pos);
                    }
                    V::Str(s) => {
                        return Err(self.err(
                            it.pos,
                            &key,
                            ErrorKind::OutOfRange,
                            format!("`{s}` is not a tool name (a command name, no `/` or spaces)"),
                        ))
                    }
                    v => {
                        return Err(self.err(
                            it.pos,
                            &key,
                            ErrorKind::WrongType,
                            format!("expected a string, found {}", v.type_name()),
                        ))
                    }
                }
            }
        }
        let d = Resources::default();
        let cpus = match self.number(&t, "cpus")? {
            None => d.cpus,
            Some((c, pos)) => {
                if !(c > 0.0 && c <= 1024.0) {
                    return Err(self.err(
                        pos,
                        &t.path("cpus"),
                        ErrorKind::OutOfRange,
                        format!("{c} is outside (0, 1024]"),
                    ));
                }
                c
            }
        };
        let memory_bytes = self.size(&t, "memory", d.memory_bytes)?;
        let disk_bytes = self.size(&t, "disk", d.disk_bytes)?;
        let pids = match t.get("pids") {
            None => d.pids,
            Some(Node { v: V::Int(p), pos }) => {
                if !(2..=1 << 22).contains(p) {
                    return Err(self.err(
                        *pos,
                        &t.path("pids"),
                        ErrorKind::OutOfRange,
                        format!("{p} is outside 2..=4194304"),
                    ));
                }
                *p as u64
            }
            Some(n) => {
                return Err(self.err(
                    n.pos,
                    &t.path("pids"),
                    ErrorKind::WrongType,
                    format!("expected an integer, found {}", n.v.type_name()),
                ))
            }
        };
        Ok(BaseEnvironment {
            rootfs,
            tools,
            tool_pos,
            resources: Resources {
                cpus,
                memory_bytes,
                disk_bytes,
                pids,
            },
        })
    }

    fn entry(&self, n: &Node, key: &str) -> Result<SpaceEntry, TemplateError> {
        let t = self.table(n, key, &["name", "probability", "params"])?;
        let name = self.string(&t, "name", true)?.unwrap_or_default();
        let name_pos = t.get("name").map_or(t.pos, |n| n.pos);
        let info = self.catalog.perturbation(&name).ok_or_else(|| {
            self.err(
                name_pos,
                &t.path("name"),
                ErrorKind::UnknownPerturbation,
                format!(
                    "unknown perturbation `{name}` (known: {})",
                    list_or_none(&self.catalog.perturbation_names())
                ),
            )
        })?;
        let probability = match self.number(&t, "probability")? {
            None => 1.0,
            Some((p, pos)) => {
                if !(0.0..=1.0).contains(&p) {
                    return Err(self.err(
                        pos,
                        &t.path("probability"),
                        ErrorKind::OutOfRange,
                        format!("{p} is outside [0, 1]"),
                    ));
                }
                p
            }
        };
        let mut params = BTreeMap::new();
        if let Some(pn) = t.get("params") {
            let known: Vec<&str> = info.params.iter().map(|p| p.name).collect();
            let V::Map(entries) = &pn.v else {
                return Err(self.err(
                    pn.pos,
                    &t.path("params"),
                    ErrorKind::WrongType,
                    format!("expected a table of parameters, found {}", pn.v.type_name()),
                ));
            };
            for (k, kp, vn) in entries {
                let pkey = format!("{}.{k}", t.path("params"));
                if !known.contains(&k.as_str()) {
                    return Err(self.err(
                        *kp,
                        &pkey,
                        ErrorKind::UnknownParam,
                        format!(
                            "`{name}` has no parameter `{k}` (it takes: {})",
                            list_or_none(&known)
                        ),
                    ));
                }
                let choice = match &vn.v {
                    V::Seq(items) => {
                        if items.is_empty() {
                            return Err(self.err(
                                vn.pos,
                                &pkey,
                                ErrorKind::OutOfRange,
                                "an empty list of choices",
                            ));
                        }
                        let mut vs = Vec::new();
                        for (j, it) in items.iter().enumerate() {
                            let ckey = format!("{pkey}[{j}]");
                            let v = self.scalar(it, &ckey)?;
                            self.check_param(info, k, &v, it.pos, &ckey)?;
                            vs.push(v);
                        }
                        ParamChoice::OneOf(vs)
                    }
                    _ => {
                        let v = self.scalar(vn, &pkey)?;
                        self.check_param(info, k, &v, vn.pos, &pkey)?;
                        ParamChoice::Fixed(v)
                    }
                };
                params.insert(k.clone(), choice);
            }
        }
        Ok(SpaceEntry {
            name,
            probability,
            params,
            info: Some(info),
        })
    }

    fn scalar(&self, n: &Node, key: &str) -> Result<Value, TemplateError> {
        match &n.v {
            V::Bool(b) => Ok(Value::Bool(*b)),
            V::Int(i) => Ok(Value::Int(*i)),
            V::Float(x) => Ok(Value::Float(*x)),
            V::Str(s) => Ok(Value::Str(s.clone())),
            v => Err(self.err(
                n.pos,
                key,
                ErrorKind::WrongType,
                format!(
                    "expected a parameter value (string, number or boolean), found {}",
                    v.type_name()
                ),
            )),
        }
    }

    fn check_param(
        &self,
        info: &Info,
        param: &str,
        v: &Value,
        pos: Pos,
        key: &str,
    ) -> Result<(), TemplateError> {
        let mut p = Params::new();
        p.insert(param.into(), v.clone());
        info.check(&p).map(|_| ()).map_err(|e| {
            let reason = match e {
                PerturbError::BadParam { reason, .. } => reason,
                e => e.to_string(),
            };
            self.err(pos, key, ErrorKind::BadParam, reason)
        })
    }
}

fn list_or_none(v: &[&str]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
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

    const TOML: &str = r#"[template]
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

    const YAML: &str = "template:
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

    fn toml(text: &str) -> Result<Template, TemplateError> {
        Template::parse_with(text, Path::new("t.toml"), Format::Toml, &Fake)
    }
    fn yaml(text: &str) -> Result<Template, TemplateError> {
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

    #[test]
    fn every_error_names_file_line_key_and_reason() {
        use ErrorKind::*;
        // (format, replace, with, kind, line, key, part of the reason)
        let cases: &[(Format, &str, &str, ErrorKind, usize, &str, &str)] = &[
            (
                Format::Toml,
                "probability = 0.3",
                "probability = 1.5",
                OutOfRange,
                11,
                "perturbation_space[0].probability",
                "outside [0, 1]",
            ),
            (
                Format::Toml,
                "tools = [\"tar\"]",
                "toolz = [\"tar\"]",
                UnknownKey,
                6,
                "base_environment.toolz",
                "unknown key",
            ),
            (
                Format::Toml,
                "probability = 0.3",
                "probability = \"high\"",
                WrongType,
                11,
                "perturbation_space[0].probability",
                "expected a number",
            ),
            (
                Format::Toml,
                "name = \"tool-missing\"",
                "name = \"tool-gone\"",
                UnknownPerturbation,
                10,
                "perturbation_space[0].name",
                "`tool-gone` (known: tool-missing",
            ),
            (
                Format::Toml,
                "tool = [",
                "tools = [",
                UnknownParam,
                13,
                "perturbation_space[0].params.tools",
                "it takes: tool",
            ),
            (
                Format::Toml,
                "[1, 2, 3]",
                "[1, 99, 3]",
                BadParam,
                16,
                "perturbation_space[1].params.free_pct[1]",
                "99 is outside 0..=50",
            ),
            (
                Format::Toml,
                "mode = \"sparse\"",
                "mode = \"thin\"",
                BadParam,
                16,
                "perturbation_space[1].params.mode",
                "`thin` is not one of",
            ),
            (
                Format::Toml,
                "task = \"archive-logs\"",
                "task = \"archive\"",
                UnknownTask,
                3,
                "template.task",
                "known: archive-logs",
            ),
            (
                Format::Toml,
                "\"128M\"",
                "\"128Q\"",
                BadSize,
                7,
                "base_environment.memory",
                "not a size",
            ),
            (
                Format::Toml,
                "rootfs = \"host\"",
                "rootfs = \"/no/such/dir\"",
                BadRootfs,
                5,
                "base_environment.rootfs",
                "/no/such/dir",
            ),
            (
                Format::Toml,
                "name = \"t\"\n",
                "",
                MissingKey,
                1,
                "template.name",
                "missing",
            ),
            (
                Format::Toml,
                "[base_environment]",
                "[base_environment\n",
                Syntax,
                4,
                "",
                "",
            ),
            (
                Format::Yaml,
                "probability: 0.3",
                "probability: -0.1",
                OutOfRange,
                11,
                "perturbation_space[0].probability",
                "outside [0, 1]",
            ),
            (
                Format::Yaml,
                "  tools: [tar]",
                "  toolz: [tar]",
                UnknownKey,
                6,
                "base_environment.toolz",
                "unknown key",
            ),
            (
                Format::Yaml,
                "probability: 0.3",
                "probability: [1]",
                WrongType,
                11,
                "perturbation_space[0].probability",
                "found a list",
            ),
            (
                Format::Yaml,
                "- name: tool-missing",
                "- name: tool-gone",
                UnknownPerturbation,
                10,
                "perturbation_space[0].name",
                "`tool-gone`",
            ),
            (
                Format::Yaml,
                "tool: [",
                "tools: [",
                UnknownParam,
                13,
                "perturbation_space[0].params.tools",
                "no parameter `tools`",
            ),
            (
                Format::Yaml,
                "[1, 2, 3]",
                "[1, 2, 300]",
                BadParam,
                16,
                "perturbation_space[1].params.free_pct[2]",
                "300 is outside",
            ),
            (
                Format::Yaml,
                "task: archive-logs",
                "task: nope",
                UnknownTask,
                3,
                "template.task",
                "unknown task `nope`",
            ),
            (
                Format::Yaml,
                "disk: 1048576",
                "disk: lots",
                BadSize,
                8,
                "base_environment.disk",
                "not a size",
            ),
            (
                Format::Yaml,
                "  rootfs: host",
                "  rootfs: /no/such/dir",
                BadRootfs,
                5,
                "base_environment.rootfs",
                "/no/such/dir",
            ),
            (
                Format::Yaml,
                "  - name: disk-fill\n",
                "  - probability: 1\n",
                MissingKey,
                14,
                "perturbation_space[1].name",
                "missing",
            ),
            (
                Format::Yaml,
                "  tools: [tar]",
                "  tools: [tar",
                Syntax,
                7,
                "",
                "",
            ),
            (
                Format::Yaml,
                "  disk: 1048576",
                "  disk: 1048576\n  memory: 1G",
                DuplicateKey,
                9,
                "base_environment.memory",
                "given twice",
            ),
        ];
        for (format, from, to, kind, line, key, reason) in cases {
            let (good, r) = match format {
                Format::Toml => (TOML, toml(&TOML.replacen(from, to, 1))),
                Format::Yaml => (YAML, yaml(&YAML.replacen(from, to, 1))),
            };
            assert!(good.contains(from), "{from}");
            let e = r.unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.kind(), Some(*kind), "{msg}");
            assert_eq!(e.line(), Some(*line), "{msg}");
            assert!(
                msg.starts_with(&format!(
                    "t.{}:{line}:",
                    if *format == Format::Toml {
                        "toml"
                    } else {
                        "yaml"
                    }
                )),
                "{msg}"
            );
            assert!(msg.contains(reason), "{msg}");
            if *kind != Syntax {
                assert_eq!(e.key(), Some(*key), "{msg}");
                assert!(msg.contains(&format!("key `{key}`")), "{msg}");
            }
        }
    }

    #[test]
    fn columns_point_at_the_value() {
        let col = |r: Result<Template, TemplateError>| match r.unwrap_err() {
            TemplateError::Invalid { column, .. } => column,
            e => panic!("{e}"),
        };
        // `probability = 1.5` / `    probability: 1.5`: the value starts at column 15 / 18.
        assert_eq!(
            col(toml(
                &TOML.replace("probability = 0.3", "probability = 1.5")
            )),
            15
        );
        assert_eq!(
            col(yaml(&YAML.replace("probability: 0.3", "probability: 1.5"))),
            18
        );
    }

    #[test]
    fn yaml_scalars_follow_the_core_schema() {
        use yaml_rust2::scanner::TScalarStyle::{DoubleQuoted, Plain};
        assert_eq!(yaml_scalar("12".into(), Plain), V::Int(12));
        assert_eq!(yaml_scalar("-3".into(), Plain), V::Int(-3));
        assert_eq!(yaml_scalar("0.25".into(), Plain), V::Float(0.25));
        assert_eq!(yaml_scalar("1e3".into(), Plain), V::Float(1000.0));
        assert_eq!(yaml_scalar("true".into(), Plain), V::Bool(true));
        assert_eq!(yaml_scalar("~".into(), Plain), V::Null);
        assert_eq!(yaml_scalar("64M".into(), Plain), V::Str("64M".into()));
        assert_eq!(yaml_scalar("12".into(), DoubleQuoted), V::Str("12".into()));
        assert_eq!(yaml_scalar("e".into(), Plain), V::Str("e".into()));
    }
}
