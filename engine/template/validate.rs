//! Validation of a template's positioned tree: every key, type, range, perturbation,
//! parameter and task is checked once here, for TOML and YAML alike, and every error names the
//! file, the line and column of the offending key or value, the dotted key and the reason.

use super::tree::{Node, NodeValue, Pos};
use super::{
    BaseEnvironment, Catalog, ErrorKind, ParamChoice, SpaceEntry, Template, TemplateError,
};
use crate::instance::{Params, Resources, Value};
use crate::perturb::{Info, PerturbError};
use crate::text::cut;
use std::collections::BTreeMap;
use std::path::Path;

/// The template of a parsed tree, checked against `catalog`; `file` names it in errors.
pub(super) fn template(
    root: &Node,
    file: &Path,
    catalog: &dyn Catalog,
) -> Result<Template, TemplateError> {
    Validator { file, catalog }.template(root)
}

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
            .find(|(name, _, _)| name == k)
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

    /// A value of the wrong type: "expected {expected}, found {what was there}".
    fn wrong_type(&self, pos: Pos, key: &str, expected: &str, found: &NodeValue) -> TemplateError {
        self.err(
            pos,
            key,
            ErrorKind::WrongType,
            format!("expected {expected}, found {}", found.type_name()),
        )
    }

    fn table<'n>(
        &self,
        node: &'n Node,
        key: &str,
        allowed: &[&str],
    ) -> Result<Table<'n>, TemplateError> {
        let NodeValue::Map(entries) = &node.value else {
            return Err(self.wrong_type(node.pos, key, "a table", &node.value));
        };
        let t = Table {
            key: key.into(),
            pos: node.pos,
            entries,
        };
        self.keys_once_with_values(&t)?;
        for (k, kp, _) in entries {
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

    /// Every key given once and with a value: YAML's duplicate keys and nulls are refused as
    /// TOML refuses them (a null would otherwise silently mean "the default").
    fn keys_once_with_values(&self, t: &Table) -> Result<(), TemplateError> {
        for (i, (k, kp, v)) in t.entries.iter().enumerate() {
            if let Some(first) = t.entries[..i].iter().find(|e| e.0 == *k) {
                return Err(self.err(
                    *kp,
                    &t.path(k),
                    ErrorKind::DuplicateKey,
                    format!(
                        "given twice (first at line {}, column {})",
                        first.1.line, first.1.col
                    ),
                ));
            }
            if v.value == NodeValue::Null {
                return Err(self.err(
                    v.pos,
                    &t.path(k),
                    ErrorKind::WrongType,
                    "no value (null): give one or remove the key",
                ));
            }
        }
        Ok(())
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
            Some(Node {
                value: NodeValue::Str(s),
                ..
            }) => Ok(Some(s.clone())),
            Some(n) => Err(self.wrong_type(n.pos, &t.path(k), "a string", &n.value)),
        }
    }

    fn number(&self, t: &Table, k: &str) -> Result<Option<(f64, Pos)>, TemplateError> {
        match t.get(k) {
            None => Ok(None),
            Some(Node {
                value: NodeValue::Int(i),
                pos,
            }) => Ok(Some((*i as f64, *pos))),
            Some(Node {
                value: NodeValue::Float(x),
                pos,
            }) => Ok(Some((*x, *pos))),
            Some(n) => Err(self.wrong_type(n.pos, &t.path(k), "a number", &n.value)),
        }
    }

    fn size(&self, t: &Table, k: &str, default: u64) -> Result<u64, TemplateError> {
        match t.get(k) {
            None => Ok(default),
            Some(Node {
                value: NodeValue::Int(i),
                pos,
            }) => u64::try_from(*i).ok().filter(|b| *b > 0).ok_or_else(|| {
                self.err(
                    *pos,
                    &t.path(k),
                    ErrorKind::BadSize,
                    format!("{i} is not a size: give a positive number of bytes or e.g. \"256M\""),
                )
            }),
            Some(Node {
                value: NodeValue::Str(s),
                pos,
            }) => crate::units::parse_size(s)
                .map_err(|e| self.err(*pos, &t.path(k), ErrorKind::BadSize, e.to_string())),
            Some(n) => Err(self.wrong_type(n.pos, &t.path(k), "a size such as \"256M\"", &n.value)),
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
        // `task = { harbor = "DIR" }`: a Harbor or Terminal-Bench task folder (relative to the
        // template's own folder), run by `engine harbor run/check --template`.
        let mut harbor = None;
        let task = match meta.get("task") {
            Some(
                n @ Node {
                    value: NodeValue::Map(_),
                    ..
                },
            ) => {
                let t = self.table(n, "template.task", &["harbor"])?;
                let dir = self.string(&t, "harbor", true)?.unwrap_or_default();
                let path = self.file.parent().unwrap_or(Path::new("")).join(&dir);
                if !(path.join("task.toml").is_file() || path.join("task.yaml").is_file()) {
                    return Err(self.err(
                        t.get("harbor").map_or(t.pos, |n| n.pos),
                        "template.task.harbor",
                        ErrorKind::UnknownTask,
                        format!(
                            "`{}` is not a task folder (no task.toml or task.yaml)",
                            cut(&path.display().to_string())
                        ),
                    ));
                }
                harbor = Some((path, n.pos));
                None
            }
            _ => self.string(&meta, "task", false)?,
        };
        if let Some(t) = &task {
            let known = self.catalog.task_names();
            if !known.contains(&t.as_str()) {
                let pos = meta.get("task").map_or(meta.pos, |n| n.pos);
                return Err(self.err(
                    pos,
                    "template.task",
                    ErrorKind::UnknownTask,
                    format!(
                        "unknown task `{}` (known: {})",
                        cut(t),
                        list_or_none(&known)
                    ),
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
            let NodeValue::Seq(items) = &n.value else {
                return Err(self.wrong_type(
                    n.pos,
                    "perturbation_space",
                    "a list of perturbations ([[perturbation_space]])",
                    &n.value,
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
            harbor,
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
            let NodeValue::Seq(items) = &tn.value else {
                return Err(self.wrong_type(
                    tn.pos,
                    &t.path("tools"),
                    "a list of tool names",
                    &tn.value,
                ));
            };
            for (i, it) in items.iter().enumerate() {
                let key = format!("base_environment.tools[{i}]");
                match &it.value {
                    NodeValue::Str(s)
                        if !s.is_empty()
                            && !s.contains('/')
                            && !s.contains(char::is_whitespace) =>
                    {
                        tools.push(s.clone());
                        tool_pos.push(it.pos);
                    }
                    NodeValue::Str(s) => {
                        return Err(self.err(
                            it.pos,
                            &key,
                            ErrorKind::OutOfRange,
                            format!(
                                "`{}` is not a tool name (a command name, no `/` or spaces)",
                                cut(s)
                            ),
                        ))
                    }
                    v => return Err(self.wrong_type(it.pos, &key, "a string", v)),
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
            Some(Node {
                value: NodeValue::Int(p),
                pos,
            }) => {
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
            Some(n) => return Err(self.wrong_type(n.pos, &t.path("pids"), "an integer", &n.value)),
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
                    "unknown perturbation `{}` (known: {})",
                    cut(&name),
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
            let NodeValue::Map(entries) = &pn.value else {
                return Err(self.wrong_type(
                    pn.pos,
                    &t.path("params"),
                    "a table of parameters",
                    &pn.value,
                ));
            };
            self.keys_once_with_values(&Table {
                key: t.path("params"),
                pos: pn.pos,
                entries,
            })?;
            for (k, kp, vn) in entries {
                let pkey = format!("{}.{}", t.path("params"), cut(k));
                if !known.contains(&k.as_str()) {
                    return Err(self.err(
                        *kp,
                        &pkey,
                        ErrorKind::UnknownParam,
                        format!(
                            "`{name}` has no parameter `{}` (it takes: {})",
                            cut(k),
                            list_or_none(&known)
                        ),
                    ));
                }
                let choice = match &vn.value {
                    NodeValue::Seq(items) => {
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
        match &n.value {
            NodeValue::Bool(b) => Ok(Value::Bool(*b)),
            NodeValue::Int(i) => Ok(Value::Int(*i)),
            NodeValue::Float(x) => Ok(Value::Float(*x)),
            NodeValue::Str(s) => Ok(Value::Str(s.clone())),
            v => Err(self.wrong_type(
                n.pos,
                key,
                "a parameter value (string, number or boolean)",
                v,
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
    use super::super::tests::{toml, yaml, TOML, YAML};
    use super::super::{ErrorKind, Format, Template, TemplateError};

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
                "given twice (first at line 7, column 3)",
            ),
            (
                Format::Yaml,
                "      tool: [gzip, find]",
                "      tool: [gzip, find]\n      tool: tar",
                DuplicateKey,
                14,
                "perturbation_space[0].params.tool",
                "given twice",
            ),
            (
                Format::Yaml,
                "    probability: 0.3",
                "    probability: ~",
                WrongType,
                11,
                "perturbation_space[0].probability",
                "no value (null)",
            ),
            (
                Format::Yaml,
                "      mode: sparse",
                "      mode:",
                WrongType,
                18,
                "perturbation_space[1].params.mode",
                "no value (null)",
            ),
            (
                Format::Toml,
                "mode = \"sparse\"",
                "mode = \"sparse\", mode = \"dense\"",
                Syntax,
                16,
                "",
                "duplicate key",
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
    fn documents_are_bounded_before_validation() {
        // A billion-laughs template: 9 levels of 10 aliases would be 10^9 values.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = yaml(&bomb).unwrap_err().to_string();
        assert!(
            e.contains("more than 100000 values (aliases expanded)"),
            "{e}"
        );
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let e = yaml(&format!("template: {deep}")).unwrap_err().to_string();
        assert!(e.contains("nested deeper than 64 levels"), "{e}");
        let e = toml(&format!("x = {deep}")).unwrap_err();
        assert_eq!(e.kind(), Some(ErrorKind::Syntax), "{e}");
        let big = format!("# {}\n{TOML}", "x".repeat(1 << 20));
        let e = toml(&big).unwrap_err().to_string();
        assert!(e.contains("larger than 1048576 bytes"), "{e}");
        // A few aliases within the budget still read.
        let t = super::super::tree::yaml_tree("a: &x [1, 2]\nb: *x\n").unwrap();
        let super::super::tree::NodeValue::Map(m) = t.value else {
            panic!("{t:?}")
        };
        assert_eq!(m[0].2.value, m[1].2.value);
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
}
