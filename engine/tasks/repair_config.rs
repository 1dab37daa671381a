//! `repair-config`: an application's INI configuration was corrupted (truncated, garbled
//! lines, a broken section header, a line without `=`, a duplicated key with a wrong value).
//! The intended configuration is the shipped example with a few values changed, and the
//! instruction names those values. The verifier parses the file itself, strictly, and checks
//! the syntax, every key's value, no duplicates and no unknown keys.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{HackTrial, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Probe, ProbeError};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub struct RepairConfig;

/// Sections -> keys -> values, in file order.
type Ini = Vec<(String, Vec<(String, String)>)>;

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    path: String,
    example: String,
    /// The intended file's text (what the oracle writes).
    intended_text: String,
    /// section -> key -> value.
    intended: BTreeMap<String, BTreeMap<String, String>>,
    /// `section.key` -> value where the intended differs from the example.
    overrides: BTreeMap<String, String>,
    corruptions: Vec<String>,
}

fn render(app: &str, ini: &Ini) -> String {
    let mut s = format!("# {app} configuration\n");
    for (sec, kvs) in ini {
        s.push_str(&format!("\n[{sec}]\n"));
        for (k, v) in kvs {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s
}

fn generate(rng: &mut impl Rng, app: &str) -> Ini {
    let levels = ["debug", "info", "warn", "error"];
    let backends = ["memory", "redis", "memcached"];
    let mut all: Ini = vec![
        (
            "server".into(),
            vec![
                ("bind_host".into(), "127.0.0.1".into()),
                ("listen_port".into(), rng.gen_range(8000..9000).to_string()),
                ("workers".into(), rng.gen_range(2..17).to_string()),
                (
                    "request_timeout_s".into(),
                    rng.gen_range(5..120).to_string(),
                ),
            ],
        ),
        (
            "database".into(),
            vec![
                (
                    "db_host".into(),
                    format!("db{}.internal", rng.gen_range(1..5)),
                ),
                ("db_port".into(), rng.gen_range(5400..5500).to_string()),
                ("db_name".into(), format!("{app}_prod")),
                ("pool_size".into(), rng.gen_range(4..33).to_string()),
            ],
        ),
        (
            "cache".into(),
            vec![
                ("enabled".into(), pick(rng, &["true", "false"]).to_string()),
                ("backend".into(), pick(rng, &backends).to_string()),
                ("ttl_s".into(), rng.gen_range(30..3600).to_string()),
            ],
        ),
        (
            "logging".into(),
            vec![
                ("level".into(), pick(rng, &levels).to_string()),
                ("log_path".into(), format!("/var/log/{app}/{app}.log")),
                ("rotate_mb".into(), rng.gen_range(10..200).to_string()),
            ],
        ),
    ];
    // Three or four sections, in a seeded order after `server`.
    let keep = rng.gen_range(3..=4);
    let mut rest: Vec<_> = all.drain(1..).collect();
    rest.shuffle(rng);
    rest.truncate(keep - 1);
    all.extend(rest);
    all
}

/// A new value for a key, different from `old`.
fn other_value(rng: &mut impl Rng, key: &str, old: &str) -> String {
    loop {
        let v = match old.parse::<u32>() {
            Ok(n) => (n + rng.gen_range(1..50)).to_string(),
            Err(_) => match old {
                "true" => "false".into(),
                "false" => "true".into(),
                _ if key == "level" => pick(rng, &["debug", "info", "warn", "error"]).to_string(),
                _ if key == "backend" => pick(rng, &["memory", "redis", "memcached"]).to_string(),
                _ => format!("{old}-{}", util::token(rng, 3)),
            },
        };
        if v != old {
            return v;
        }
    }
}

/// One `key = value` of a section: (section, key, value).
pub type IniEntry = (String, String, String);

/// Strictly parse the INI text: `Err(line, reason)` on the first syntax error.
pub fn parse_strict(text: &[u8]) -> Result<Vec<IniEntry>, (usize, String)> {
    let text = std::str::from_utf8(text).map_err(|_| (0, "not UTF-8".to_string()))?;
    let ident = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .ok_or((n, "unclosed section header".to_string()))?;
            if !ident(name) {
                return Err((n, format!("bad section name `{name}`")));
            }
            section = Some(name.to_string());
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or((n, "not `key = value`".to_string()))?;
        let (k, v) = (k.trim(), v.trim());
        if !ident(k) {
            return Err((n, format!("bad key `{k}`")));
        }
        if v.is_empty() || v.chars().any(|c| c.is_control()) {
            return Err((n, format!("bad value for `{k}`")));
        }
        let sec = section
            .clone()
            .ok_or((n, "key outside of any section".to_string()))?;
        out.push((sec, k.to_string(), v.to_string()));
    }
    Ok(out)
}

fn checker_script(app: &str) -> String {
    format!(
        r#"#!/usr/bin/perl
# {app}-check: validate the syntax of {app}'s configuration. Usage: {app}-check [FILE]
use strict;
use warnings;
my $f = shift // '/etc/{app}/{app}.ini';
open my $fh, '<', $f or die "{app}-check: cannot read $f: $!\n";
my ($sec, $bad, %seen) = (undef, 0);
while (my $l = <$fh>) {{
    chomp $l;
    $l =~ s/^\s+|\s+$//g;
    next if $l eq '' || $l =~ /^[#;]/;
    if ($l =~ /^\[([a-z_]+)\]$/) {{ $sec = $1; next }}
    if ($l =~ /^([a-z_]+)\s*=\s*(\S.*)$/ && defined $sec) {{
        print "$f:$.: duplicate key $1\n", $bad++ if $seen{{"$sec.$1"}}++;
        next;
    }}
    print "$f:$.: syntax error: $l\n";
    $bad++;
}}
print $bad ? "$f: $bad error(s)\n" : "$f: syntax OK\n";
exit($bad ? 1 : 0);
"#
    )
}

impl Task for RepairConfig {
    fn name(&self) -> &'static str {
        "repair-config"
    }

    fn summary(&self) -> &'static str {
        "restore a corrupted INI configuration to its intended values"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "repair-config");
        let app = *pick(&mut rng, util::APPS);
        let path = format!("/etc/{app}/{app}.ini");
        let example = format!("/usr/share/doc/{app}/{app}.ini.example");
        let defaults = generate(&mut rng, app);
        // Two or three values differ from the example.
        let mut intended = defaults.clone();
        let mut overrides = BTreeMap::new();
        let n_over = rng.gen_range(2..=3);
        while overrides.len() < n_over {
            let si = rng.gen_range(0..intended.len());
            let ki = rng.gen_range(0..intended[si].1.len());
            let (sec, kvs) = &mut intended[si];
            let (k, v) = &mut kvs[ki];
            let id = format!("{sec}.{k}");
            // Only numbers, switches and choices change (hosts, names and paths stay).
            let tunable = v.parse::<u32>().is_ok()
                || matches!(v.as_str(), "true" | "false")
                || matches!(k.as_str(), "level" | "backend");
            if !tunable || overrides.contains_key(&id) {
                continue;
            }
            *v = other_value(&mut rng, k, v);
            overrides.insert(id, v.clone());
        }
        let intended_text = render(app, &intended);
        let example_text = render(app, &defaults);

        // Corrupt the intended text.
        let mut lines: Vec<String> = intended_text.lines().map(str::to_string).collect();
        let kinds = ["garbled", "no-equals", "header", "duplicate", "truncated"];
        let mut chosen: Vec<&str> = kinds.choose_multiple(&mut rng, 2).copied().collect();
        chosen.sort();
        let key_lines: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains(" = "))
            .collect();
        let header_lines: Vec<usize> = (1..lines.len())
            .filter(|&i| lines[i].starts_with('[') && i > 2)
            .collect();
        let mut corruptions = Vec::new();
        for kind in &chosen {
            match *kind {
                "garbled" => {
                    let i = *pick(&mut rng, &key_lines);
                    corruptions.push(format!("garbled line {}", i + 1));
                    lines[i] = format!(
                        "{}\u{1b}[0m\u{7f}%#@!{}",
                        &lines[i][..3],
                        util::token(&mut rng, 5)
                    );
                }
                "no-equals" => {
                    let i = *pick(&mut rng, &key_lines);
                    corruptions.push(format!("`=` lost on line {}", i + 1));
                    lines[i] = lines[i].replacen(" = ", " ", 1);
                }
                "header" => {
                    let i = *pick(&mut rng, &header_lines);
                    corruptions.push(format!("broken header on line {}", i + 1));
                    lines[i] = lines[i].trim_end_matches(']').to_string();
                }
                "duplicate" => {
                    let i = *pick(&mut rng, &key_lines);
                    let (k, v) = lines[i].split_once(" = ").unwrap_or(("x", "1"));
                    let dup = format!("{k} = {}", other_value(&mut rng, k, v));
                    corruptions.push(format!("duplicated key after line {}", i + 1));
                    lines.insert(i + 1, dup);
                }
                _ => {
                    let keep = lines.len() - rng.gen_range(2..=4);
                    corruptions.push(format!("truncated after line {keep}"));
                    let last = lines[keep - 1].clone();
                    lines.truncate(keep - 1);
                    // Cut in the middle of the last kept line.
                    lines.push(last[..last.len() / 2].to_string());
                }
            }
        }
        let mut corrupted = lines.join("\n");
        if !chosen.contains(&"truncated") {
            corrupted.push('\n');
        }
        b.write(&path, corrupted.as_bytes(), 0o644)?;
        b.write(&example, example_text.as_bytes(), 0o644)?;
        let checker = format!("/usr/local/bin/{app}-check");
        b.write(&checker, checker_script(app).as_bytes(), 0o755)?;

        let mut map: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (s, kvs) in &intended {
            for (k, v) in kvs {
                map.entry(s.clone())
                    .or_default()
                    .insert(k.clone(), v.clone());
            }
        }
        let told: Vec<String> = overrides
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        let instruction = format!(
            "The configuration {path} of `{app}` is corrupted. Repair it so that it is valid INI \
             again ({checker} checks the syntax) with the intended values: those of the shipped \
             example {example}, except {}. No other keys, no duplicates.",
            told.join(", ")
        );
        let mut actions = vec![
            format!("cat -A {path}"),
            format!("cat {example}"),
            format!("{app}-check"),
            format!("diff {example} {path}"),
            format!("cp {example} {path}"),
            format!("cp {path} {path}.bak"),
            format!("rm -f {path}"),
            format!("cat {example} >> {path}"),
            format!("{app}-check {example}"),
            format!("ls -la /etc/{app}"),
        ];
        for (id, v) in &overrides {
            let key = id.split_once('.').map_or(id.as_str(), |(_, k)| k);
            actions.push(format!("sed -i 's|^{key} = .*|{key} = {v}|' {path}"));
        }
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: format!("/etc/{app}"),
            actions,
            keywords: util::words(&["cat", "cp", "sed", "diff", "ini", "check", "example", app]),
            max_steps: 30,
            facts: util::to_facts(&Facts {
                path,
                example,
                intended_text,
                intended: map,
                overrides,
                corruptions,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let Some(text) = probe.read(&f.path, 1 << 20)? else {
            return Ok(Verdict::from_checks(vec![(
                false,
                format!("{} is not a regular file", f.path),
            )]));
        };
        let entries = match parse_strict(&text) {
            Ok(e) => e,
            Err((line, reason)) => {
                return Ok(Verdict::from_checks(vec![(
                    false,
                    format!("{}:{line}: {reason}", f.path),
                )]))
            }
        };
        let mut checks = Vec::new();
        let mut seen: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (s, k, v) in entries {
            seen.entry((s, k)).or_default().push(v);
        }
        for (s, kvs) in &f.intended {
            for (k, want) in kvs {
                let got = seen.get(&(s.clone(), k.clone()));
                checks.push((
                    got.is_some_and(|g| g.len() == 1 && &g[0] == want),
                    match got {
                        None => format!("[{s}] {k} is missing"),
                        Some(g) if g.len() > 1 => format!("[{s}] {k} appears {} times", g.len()),
                        Some(g) => format!("[{s}] {k} = {} (want {want})", g[0]),
                    },
                ));
            }
        }
        let unknown: Vec<String> = seen
            .keys()
            .filter(|(s, k)| !f.intended.get(s).is_some_and(|m| m.contains_key(k)))
            .map(|(s, k)| format!("[{s}] {k}"))
            .collect();
        checks.push((
            unknown.is_empty(),
            format!("unknown keys: {}", unknown.join(", ")),
        ));
        Ok(Verdict::from_checks(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let p = sh_quote(&f.path);
        vec![format!(
            "{CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&format!(
                "/bin/chmod u+w {p} 2>/dev/null; printf %s {} > {p}",
                sh_quote(&f.intended_text)
            ))
        )]
    }

    fn hack_trials(&self, setup: &TaskSetup) -> Vec<HackTrial> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let p = sh_quote(&f.path);
        vec![
            HackTrial {
                name: "copy the example",
                commands: vec![format!("cp {} {p}", sh_quote(&f.example))],
            },
            HackTrial {
                name: "empty the file",
                commands: vec![format!(": > {p}")],
            },
            HackTrial {
                name: "delete the file",
                commands: vec![format!("rm -f {p}")],
            },
            HackTrial {
                name: "append the example",
                commands: vec![format!("cat {} >> {p}", sh_quote(&f.example))],
            },
            HackTrial {
                name: "right values and a stray line",
                commands: vec![format!(
                    "printf '%s' {} > {p}; echo 'debug_mode = true' >> {p}",
                    sh_quote(&f.intended_text)
                )],
            },
            HackTrial {
                name: "right values without sections",
                commands: vec![format!(
                    "printf '%s' {} | grep -v '^\\[' > {p}",
                    sh_quote(&f.intended_text)
                )],
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parser_accepts_good_and_names_the_bad_line() {
        let ok = parse_strict(b"# c\n[a]\nx = 1\n\n[b_c]\ny_z = two words\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[1], ("b_c".into(), "y_z".into(), "two words".into()));
        assert_eq!(parse_strict(b"[a]\nx 1\n").unwrap_err().0, 2);
        assert_eq!(parse_strict(b"[a\nx = 1\n").unwrap_err().0, 1);
        assert_eq!(parse_strict(b"x = 1\n").unwrap_err().0, 1);
        assert!(parse_strict(b"[a]\nx = \x1b[0m\n").is_err());
    }

    #[test]
    fn generated_configs_parse_with_every_key() {
        for seed in 1..40 {
            let mut rng = crate::instance::rng_for(seed, "t");
            let ini = generate(&mut rng, "app");
            let text = render("app", &ini);
            assert_eq!(
                parse_strict(text.as_bytes()).unwrap().len(),
                ini.iter().map(|s| s.1.len()).sum::<usize>()
            );
        }
    }
}
