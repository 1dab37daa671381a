//! Tool-output mutation: fuzzing the observation channel. The `output-mutation` perturbation
//! puts a shim for a tool first on the default `PATH` (`/usr/local/bin/<tool>`): a perl script
//! (perl-base only) that runs the real tool by its absolute path with the same arguments,
//! stdin, environment and working directory, pipes what it prints through a mutator with the
//! seed and the mutation baked in, and exits with the real tool's status (or dies of its
//! signal). What the tool does to the system is unchanged; only what it prints is.
//!
//! Mutations: `header` (banner and warning lines first), `status-line` (curl/wget: a malformed
//! HTTP status line), `delay` (a pause before the output and inside some lines), `columns`
//! (ls -l, df, ps: columns reordered and/or renamed, header and rows consistently), `crlf`,
//! `stderr-interleave` (some stdout lines go to stderr), `truncate` (only the first lines),
//! `localized-numbers` (decimal commas, thousands separators). Every choice comes from the
//! seed and the output itself, so the same command prints the same mutated bytes every time.
//! Only output bound for the observation channel is mutated: the shim mutates when its stdout
//! is the command's own stdout (the pipe the sandbox reads, as the session leader holds it);
//! output into a file, into another program (`tool | gzip`) or into `$(...)` is data, and the
//! shim runs the tool unchanged. Shell builtins (`echo`, `printf`, `test`, ...) cannot be shimmed.

use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::{Builder, DEFAULT_PATH};
use rand::RngCore;

#[derive(Debug, thiserror::Error)]
pub enum ToolOutputError {
    #[error("`{0}` is not a tool name (letters, digits, `._+-`)")]
    BadTool(String),
    #[error("the base has no tool `{0}` on the default PATH")]
    NoTool(String),
    #[error("mutation `{mutation}` is for {tools}, not `{tool}`")]
    WrongTool {
        mutation: String,
        tool: String,
        tools: String,
    },
    #[error("the base has no /usr/bin/perl or /bin/perl to run the shim")]
    NoPerl,
    #[error("`{0}` is a shell builtin: the shell never runs a shim for it")]
    Builtin(String),
}

impl ToolOutputError {
    /// True when the instance cannot take the mutation (rather than the plan being wrong).
    pub fn is_not_applicable(&self) -> bool {
        !matches!(self, Self::BadTool(_))
    }
}

/// The mutations, in the order of the docs.
pub const MUTATIONS: &[&str] = &[
    "header",
    "status-line",
    "delay",
    "columns",
    "crlf",
    "stderr-interleave",
    "truncate",
    "localized-numbers",
];

/// Tools a tool-specific mutation understands.
fn tools_for(mutation: &str) -> Option<&'static [&'static str]> {
    match mutation {
        "status-line" => Some(&["curl", "wget"]),
        "columns" => Some(&["ls", "df", "ps"]),
        _ => None,
    }
}

/// Commands that POSIX shells (dash, bash) run as builtins whatever the `PATH` says.
const BUILTINS: &[&str] = &[
    "[", "alias", "bg", "break", "cd", "command", "continue", "echo", "eval", "exec", "exit",
    "export", "false", "fg", "getopts", "hash", "jobs", "kill", "printf", "pwd", "read",
    "readonly", "return", "set", "shift", "test", "times", "trap", "true", "type", "ulimit",
    "umask", "unalias", "unset", "wait",
];

/// Where the shims keep the tools they shadow when the tool itself was in the shim's place.
pub const REAL_DIR: &str = "/usr/local/lib/envfactory/real";

pub static OUTPUT_MUTATION: Info = Info {
    name: "output-mutation",
    family: Family::ToolOutput,
    summary: "a tool prints differently (banners, malformed status, delays, columns, CRLF, \
              stderr, truncation, localised numbers) while doing the same thing",
    mechanism: "perl shim at /usr/local/bin/<tool> (first on the default PATH): runs the real \
                tool by absolute path, pipes its output through a seeded mutator, exits with \
                its status",
    params: &[
        ParamSpec {
            name: "tool",
            kind: Kind::Str,
            default: "ls",
            realistic: "tools agents parse: ls, df, ps, curl, grep, find, du, tar, git",
            help: "the tool whose output is mutated",
        },
        ParamSpec {
            name: "mutation",
            kind: Kind::Choice(MUTATIONS),
            default: "header",
            realistic: "all happen: motd/locale warnings, proxies, slow NFS, other \
                        versions, Windows files, wrappers, pagers, locales",
            help: "what is done to the output",
        },
        ParamSpec {
            name: "delay_ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "500",
            realistic: "100-5000",
            help: "delay: pause before the first line (some lines pause up to a quarter more)",
        },
        ParamSpec {
            name: "keep_lines",
            kind: Kind::Int {
                min: 0,
                max: 1_000_000,
            },
            default: "0",
            realistic: "1-50 (0: 1-10 from the seed)",
            help: "truncate: lines kept",
        },
        ParamSpec {
            name: "lines",
            kind: Kind::Int { min: 0, max: 10 },
            default: "0",
            realistic: "1-3 (0: 1-3 from the seed)",
            help: "header: banner lines added",
        },
        ParamSpec {
            name: "share",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.3",
            realistic: "0.1-0.5",
            help: "stderr-interleave: share of stdout lines sent to stderr",
        },
        ParamSpec {
            name: "crlf_share",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "1",
            realistic: "1 (a Windows tool), 0.2-0.8 (mixed files)",
            help: "crlf: share of lines ending in CRLF",
        },
        ParamSpec {
            name: "columns",
            kind: Kind::Choice(&["reorder", "rename", "both"]),
            default: "both",
            realistic: "both (other versions and flavours of the tool)",
            help: "columns: what happens to the table (ls has no header: reorder only)",
        },
        ParamSpec {
            name: "style",
            kind: Kind::Choice(&["seeded", "de", "fr", "ch"]),
            default: "seeded",
            realistic: "de_DE 1.234.567,8; fr_FR 1 234 567,8; de_CH 1'234'567.8",
            help: "localized-numbers: the number format",
        },
    ],
};

pub struct OutputMutation;

fn valid_tool(t: &str) -> bool {
    !t.is_empty()
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
}

/// A perl single-quoted string literal.
fn perl_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl Perturbation for OutputMutation {
    fn info(&self) -> &'static Info {
        &OUTPUT_MUTATION
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let tool = params.str("tool").trim().to_string();
        let mutation = params.str("mutation").to_string();
        if !valid_tool(&tool) {
            return Err(ToolOutputError::BadTool(tool).into());
        }
        if BUILTINS.contains(&tool.as_str()) {
            return Err(ToolOutputError::Builtin(tool).into());
        }
        if let Some(tools) = tools_for(&mutation) {
            if !tools.contains(&tool.as_str()) {
                return Err(ToolOutputError::WrongTool {
                    mutation,
                    tool,
                    tools: tools.join(", "),
                }
                .into());
            }
        }
        let perl = ["/usr/bin/perl", "/bin/perl"]
            .into_iter()
            .find(|p| {
                b.meta(p)
                    .is_some_and(|m| m.is_symlink || m.mode & 0o111 != 0)
            })
            .ok_or(ToolOutputError::NoPerl)?;
        let found = b
            .which(&tool, DEFAULT_PATH)
            .ok_or_else(|| ToolOutputError::NoTool(tool.clone()))?;
        // The shim goes where the shell finds the tool when that is before /usr/local/bin
        // (/usr/local/sbin), else into /usr/local/bin.
        let shim = if found.starts_with("/usr/local/sbin/") {
            found.clone()
        } else {
            format!("/usr/local/bin/{tool}")
        };
        let real = if found == shim {
            // The tool (or an earlier shim) is in the shim's place: keep it aside, so shims
            // stack.
            let data = b
                .read(&found)
                .ok_or_else(|| ToolOutputError::NoTool(tool.clone()))?;
            let mode = b
                .meta(&found)
                .map_or(0o755, |m| if m.is_symlink { 0o755 } else { m.mode });
            let mut k = 0;
            let kept = loop {
                let p = format!("{REAL_DIR}/{tool}.{k}");
                if !b.exists(&p) {
                    break p;
                }
                k += 1;
            };
            b.write(&kept, data, mode)?;
            kept
        } else {
            found
        };
        let seed = (b.rng(purpose).next_u32() | 1) as u64;
        let config = [
            ("tool", perl_str(&tool)),
            ("real", perl_str(&real)),
            ("mutation", perl_str(&mutation)),
            ("seed", seed.to_string()),
            ("delay_ms", params.int("delay_ms").to_string()),
            ("keep_lines", params.int("keep_lines").to_string()),
            ("lines", params.int("lines").to_string()),
            ("share", params.float("share").to_string()),
            ("crlf_share", params.float("crlf_share").to_string()),
            ("columns", perl_str(params.str("columns"))),
            ("style", perl_str(params.str("style"))),
        ]
        .iter()
        .map(|(k, v)| format!("    {k} => {v},\n"))
        .collect::<String>();
        let script = format!(
            "#!{perl}\n# envfactory output-mutation shim: `{tool}` ({real}) prints through a \
             mutator ({mutation}).\nour %C = (\n{config});\n{MUTATOR}"
        );
        b.write(&shim, script, 0o755)?;
        tracing::debug!(%tool, %real, %mutation, %shim, "output mutation shim");
        Ok(format!(
            "{shim} runs {real} through `{mutation}` (seed {seed})"
        ))
    }
}

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![&OutputMutation]
}

/// The mutator, after the shim's `%C`. perl-base only (no module beyond `strict`); kept in
/// its own file so it reads (and is syntax-checked by a test) as the Perl it is.
const MUTATOR: &str = include_str!("tool_output.pl");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::{BaseView, Resources};

    fn base_with(files: &[(&str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (p, mode) in files {
            let host = dir.path().join(&p[1..]);
            std::fs::create_dir_all(host.parent().unwrap()).unwrap();
            std::fs::write(&host, format!("binary {p}")).unwrap();
            std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(*mode))
                .unwrap();
        }
        dir
    }

    fn apply(b: &mut Builder, spec: &str, i: usize) -> Result<String, PerturbError> {
        let c = crate::perturb::parse_spec(spec)?;
        OutputMutation.apply(&c.params, &format!("output-mutation#{i}"), b)
    }

    fn shim_real(b: &Builder, path: &str) -> String {
        let s = String::from_utf8(b.read(path).unwrap()).unwrap();
        let l = s
            .lines()
            .find(|l| l.trim_start().starts_with("real =>"))
            .unwrap();
        l.split('\'').nth(1).unwrap().to_string()
    }

    #[test]
    fn shims_find_the_real_tool_and_stack() {
        let dir = base_with(&[("/usr/bin/perl", 0o755), ("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(&mut b, "output-mutation:tool=ls,mutation=crlf", 0).unwrap();
        let shim = b.read("/usr/local/bin/ls").unwrap();
        assert!(shim.starts_with(b"#!/usr/bin/perl\n"));
        assert_eq!(b.meta("/usr/local/bin/ls").unwrap().mode, 0o755);
        assert_eq!(shim_real(&b, "/usr/local/bin/ls"), "/usr/bin/ls");
        // A second mutation of the same tool runs the first shim, kept aside.
        apply(&mut b, "output-mutation:tool=ls,mutation=header", 1).unwrap();
        assert_eq!(
            shim_real(&b, "/usr/local/bin/ls"),
            format!("{REAL_DIR}/ls.0")
        );
        assert_eq!(b.read(&format!("{REAL_DIR}/ls.0")).unwrap(), shim);
        // Deterministic bytes.
        let mut again = Builder::new(&base, 1, Resources::default());
        apply(&mut again, "output-mutation:tool=ls,mutation=crlf", 0).unwrap();
        assert_eq!(again.read("/usr/local/bin/ls").unwrap(), shim);
    }

    #[test]
    fn refusals_are_not_applicable_or_bad_params() {
        let dir = base_with(&[("/usr/bin/perl", 0o755), ("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        for spec in [
            "output-mutation:tool=ls,mutation=status-line",
            "output-mutation:tool=tar,mutation=crlf",
            "output-mutation:tool=echo,mutation=crlf",
        ] {
            assert!(
                apply(&mut b, spec, 0).is_err_and(|e| e.is_not_applicable()),
                "{spec}"
            );
        }
        assert!(apply(&mut b, "output-mutation:tool=../ls,mutation=crlf", 0)
            .is_err_and(|e| e.is_bad_param()));
        let no_perl = base_with(&[("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![no_perl.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        assert!(apply(&mut b, "output-mutation:tool=ls,mutation=crlf", 0)
            .is_err_and(|e| e.is_not_applicable()));
    }

    #[test]
    fn the_mutator_is_valid_perl() {
        let perl = std::path::Path::new("/usr/bin/perl");
        if !perl.exists() {
            eprintln!("skipped: no /usr/bin/perl");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mutator.pl");
        std::fs::write(
            &file,
            format!("our %C = (mutation => 'crlf', seed => 1);\n{MUTATOR}"),
        )
        .unwrap();
        let o = std::process::Command::new(perl)
            .arg("-c")
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && err.contains("syntax OK"), "{err}");
    }

    #[test]
    fn tool_names_and_perl_strings() {
        assert!(valid_tool("ls") && valid_tool("python3.11") && valid_tool("g++"));
        assert!(!valid_tool("a/b") && !valid_tool("..") && !valid_tool("") && !valid_tool("a b"));
        assert_eq!(perl_str(r"it's \ ok"), r"'it\'s \\ ok'");
    }

    #[test]
    fn tool_specific_mutations_name_their_tools() {
        assert!(tools_for("columns").is_some_and(|t| t.contains(&"ps")));
        assert!(tools_for("status-line").is_some_and(|t| t == ["curl", "wget"]));
        assert!(tools_for("crlf").is_none());
        for m in MUTATIONS {
            assert!(MUTATIONS.iter().filter(|x| *x == m).count() == 1);
        }
    }
}
