//! `fix-path`: a nightly job fails or produces the wrong report because of `PATH`: the agent's
//! own `PATH` is trimmed (the job's command lives in `/usr/local/bin`), and the `PATH` the job
//! reads from `/etc/APP/paths.env` lists a directory that no longer exists and/or a stale
//! renderer that shadows the current one. The goal is the job's output. `verify` reads: the
//! report rendered by the current renderer from the seed's data, byte for byte, and the job
//! script as shipped. `confirm` checks the fault and the effect the way the system would: the
//! code that runs is the system's (the job's shell, `rm`, no preloaded library); the `PATH`
//! the job's own config gives it (paths.env sourced by the system's shell, as the job does)
//! finds the current release's renderer file, unchanged, before any other, and the system's
//! `mkdir` and `mv`; then, every process killed, the report removed and fresh data the agent
//! has never seen written into the job's input, the job runs by its own entry point
//! (`/usr/local/bin/APP-nightly`) as root, from `/`, in the system's environment, and must
//! write exactly what the current renderer renders from that data.

use super::fix_permissions::system;
use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Check, Seen, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Confirm, Probe, ProbeError, StatOnce};
use rand::Rng;
use sandbox::protocol::FileKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub struct FixPath;

/// The `PATH` the agent's commands get in this task.
pub const TRIMMED_PATH: &str = "/usr/bin:/bin";

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    job: String,
    /// The job's entry point, a symlink to `job` on the system's PATH.
    entry: String,
    paths_env: String,
    /// The `paths.env` that makes the job work.
    good_paths_env: String,
    report: String,
    report_sha256: String,
    new_ver: String,
    new_dir: String,
    stale_dir: Option<String>,
    /// The version directories the broken `paths.env` lists first (gone or stale).
    listed: Vec<String>,
    data: String,
    /// The code the job runs (and the confirmation's `rm`), from the base.
    code: system::Code,
}

/// The job's interpreter and the commands it calls besides the renderer.
const JOB_TOOLS: &[&str] = &["/bin/sh", "mkdir", "mv"];

const NAMES: &[&str] = &[
    "north",
    "south",
    "east",
    "west",
    "central",
    "online",
    "retail",
    "wholesale",
    "export",
    "partners",
];

/// A day's data (CSV) and the report the current renderer `new_ver` makes of it.
fn data_and_report(rng: &mut impl Rng, app: &str, new_ver: &str) -> (String, String) {
    let cols = rng.gen_range(3..=4);
    let mut data = format!("# name{}\n", ",q".repeat(cols));
    let mut report = format!("# {app} report (renderer {new_ver})\n");
    let (mut rows, mut sum) = (0u64, 0u64);
    for name in NAMES.iter().take(rng.gen_range(4..=8)) {
        let nums: Vec<u64> = (0..cols).map(|_| rng.gen_range(0..1000)).collect();
        let t: u64 = nums.iter().sum();
        data.push_str(name);
        for n in &nums {
            data.push_str(&format!(",{n}"));
        }
        data.push('\n');
        report.push_str(&format!("{name:<12} {t:>8}\n"));
        rows += 1;
        sum += t;
    }
    report.push_str(&format!("# rows {rows} total {sum}\n"));
    (data, report)
}

fn job_script(app: &str, paths_env: &str, data_path: &str, out: &str) -> String {
    format!(
        "#!/bin/sh\n# The nightly report of {app}.\nset -eu\n. {paths_env}\n\
         mkdir -p /srv/{app}/reports\n{app}-render {data_path} > {out}.new\n\
         mv {out}.new {out}\necho \"report written to {out}\"\n"
    )
}

fn renderer_script(app: &str, version: &str) -> String {
    format!(
        r##"#!/usr/bin/perl
# {app}-render: turn a CSV of rows into the daily report.
use strict;
use warnings;
my $ver = '{version}';
if (@ARGV && $ARGV[0] eq '--version') {{ print "{app}-render $ver\n"; exit 0 }}
my $f = shift or die "usage: {app}-render FILE.csv\n";
open my $fh, '<', $f or die "{app}-render: cannot read $f: $!\n";
my ($rows, $sum) = (0, 0);
print "# {app} report (renderer $ver)\n";
while (my $l = <$fh>) {{
    chomp $l;
    next if $l =~ /^#/ || $l eq '';
    my ($name, @n) = split /,/, $l;
    my $t = 0;
    $t += $_ for @n;
    printf "%-12s %8d\n", $name, $t;
    $rows++;
    $sum += $t;
}}
print "# rows $rows total $sum\n";
"##
    )
}

fn stale_renderer(app: &str, version: &str) -> String {
    format!(
        r##"#!/usr/bin/perl
# {app}-render (old format): turn a CSV of rows into the daily report.
use strict;
use warnings;
if (@ARGV && $ARGV[0] eq '--version') {{ print "{app}-render {version}\n"; exit 0 }}
my $f = shift or die "usage: {app}-render FILE.csv\n";
open my $fh, '<', $f or die "{app}-render: cannot read $f: $!\n";
print "# {app} report v{version}\n";
while (my $l = <$fh>) {{
    next if $l =~ /^#/;
    my ($name, @n) = split /,/, $l;
    print "$name=$n[0]\n";
}}
"##
    )
}

/// Catalogue indices: the job by its entry point, paths.env fixed by sed, and the recovery
/// actions.
const RUN: usize = 1;
const SED: usize = 7;
const PRINTF: usize = 13;
const LOADER: usize = 14;
const CLEAN_RUN: usize = 15;

impl Task for FixPath {
    fn name(&self) -> &'static str {
        "fix-path"
    }

    fn summary(&self) -> &'static str {
        "a nightly job fails or renders the wrong report because of PATH: finish the job"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "fix-path");
        let app = pick(&mut rng, util::APPS).to_string();
        let major = rng.gen_range(2..6);
        let new_ver = format!("{major}.{}.{}", rng.gen_range(0..10), rng.gen_range(0..10));
        let old_ver = format!(
            "{}.{}.{}",
            major - 1,
            rng.gen_range(0..10),
            rng.gen_range(0..10)
        );
        let gone_ver = format!("{major}.0.0-rc{}", rng.gen_range(1..4));
        let tools = format!("/opt/{app}/tools");
        let new_dir = format!("{tools}/{new_ver}/bin");
        let old_dir = format!("{tools}/{old_ver}/bin");
        let gone_dir = format!("{tools}/{gone_ver}/bin");
        b.write(
            &format!("{new_dir}/{app}-render"),
            renderer_script(&app, &new_ver).as_bytes(),
            0o755,
        )?;
        // 0: a stale renderer shadows the current one; 1: the listed directory is gone;
        // 2: both.
        let variant = rng.gen_range(0..3);
        let stale = variant != 1;
        if stale {
            b.write(
                &format!("{old_dir}/{app}-render"),
                stale_renderer(&app, &old_ver).as_bytes(),
                0o755,
            )?;
        }
        let listed_dirs = match variant {
            0 => vec![old_dir.clone()],
            1 => vec![gone_dir.clone()],
            _ => vec![gone_dir.clone(), old_dir.clone()],
        };
        let listed = format!("{}:/usr/local/bin:/usr/bin:/bin", listed_dirs.join(":"));
        let paths_env = format!("/etc/{app}/paths.env");
        let env_text = |p: &str| {
            format!("# PATH of the {app} jobs (updated at each release)\nPATH={p}\nexport PATH\n")
        };
        b.write(&paths_env, env_text(&listed).as_bytes(), 0o644)?;
        let good_paths_env = env_text(&format!("{new_dir}:/usr/local/bin:/usr/bin:/bin"));

        // The data and the expected report.
        let (data, report) = data_and_report(&mut rng, &app, &new_ver);
        let data_path = format!("/srv/{app}/data/today.csv");
        b.write(&data_path, data.as_bytes(), 0o644)?;
        let out = format!("/srv/{app}/reports/daily.txt");
        let job = format!("/opt/{app}/bin/nightly-report");
        b.write(
            &job,
            job_script(&app, &paths_env, &data_path, &out).as_bytes(),
            0o755,
        )?;
        let entry = format!("/usr/local/bin/{app}-nightly");
        b.symlink(&entry, &job)?;
        b.runtime
            .env
            .insert("PATH".into(), Some(TRIMMED_PATH.into()));

        let instruction = format!(
            "Produce today's report of `{app}`: the job `{app}-nightly` must write {out}, \
             rendered from {data_path} by the current renderer ({app}-render {new_ver}). The job \
             takes its PATH from {paths_env}. Fix what stops it and finish the job."
        );
        let good_path = format!("{new_dir}:/usr/local/bin:/usr/bin:/bin");
        let actions = vec![
            format!("{app}-nightly"),
            format!("/usr/local/bin/{app}-nightly"),
            "echo $PATH".to_string(),
            "ls /usr/local/bin".to_string(),
            format!("cat {paths_env}"),
            format!("ls -R {tools}"),
            format!("cat {job}"),
            format!("sed -i 's#^PATH=.*#PATH={good_path}#' {paths_env}"),
            format!("export PATH=$PATH:/usr/local/bin:{new_dir}"),
            format!("{new_dir}/{app}-render --version"),
            format!("cat {out}"),
            format!("rm -rf {tools}"),
            format!("touch {out}"),
            // Recovery: paths.env written by the shell itself (no sed), the loader's links
            // rebuilt (a library of the job's `mv` gone), the job run in a clean environment.
            format!(
                "printf '%s\\n' {} 'export PATH' > {paths_env}",
                sh_quote(&format!("PATH={good_path}"))
            ),
            system::repair_loader(),
            format!("cd / && {CLEAN_ENV} {entry}"),
        ];
        debug_assert_eq!(
            actions.len(),
            CLEAN_RUN + 1,
            "the catalogue's recovery indices"
        );
        let mut action_costs = vec![0.0; actions.len()];
        action_costs[PRINTF] = 1.0;
        action_costs[LOADER] = 1.0;
        action_costs[CLEAN_RUN] = 1.0;
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            action_costs,
            keywords: util::words(&[
                "path", "export", "which", "ls", "cat", "sed", "render", "nightly", "report", &app,
            ]),
            max_steps: 25,
            facts: util::to_facts(&Facts {
                app,
                job,
                entry,
                paths_env,
                good_paths_env,
                report: out,
                report_sha256: util::sha256_hex(report.as_bytes()),
                new_ver,
                new_dir,
                stale_dir: stale.then_some(old_dir),
                listed: listed_dirs,
                data: data_path,
                code: system::record(b.base, JOB_TOOLS),
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        // The job is to fix its PATH, not the job: its code must be the shipped one (a job
        // that names the renderer by its full path no longer reads its PATH at all).
        let (job_intact, _) = util::content_check(
            probe,
            &f.job,
            &util::sha256_hex(job_script(&f.app, &f.paths_env, &f.data, &f.report).as_bytes()),
            1 << 20,
        )?;
        let (report_ok, why) = util::content_check(probe, &f.report, &f.report_sha256, 1 << 20)?;
        Ok(Verdict::checklist(vec![
            Check::new("report rendered", report_ok, why),
            // Counts once the report is right: the start is at 0, and changing the job takes
            // the progress back.
            Check::new(
                "job shipped",
                job_intact && report_ok,
                if job_intact {
                    "counts once the report is right".to_string()
                } else {
                    format!("{} is not the shipped job any more", f.job)
                },
            ),
        ]))
    }

    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let renderer = format!("{}-render", f.app);
        // The names of each later stage's checks, failed as not reached when a stage fails.
        let path_stage = || {
            let mut n = vec![
                "job's PATH sourced".to_string(),
                format!("current {renderer} first"),
            ];
            n.extend(
                JOB_TOOLS
                    .iter()
                    .filter(|t| !t.starts_with('/'))
                    .map(|t| format!("system {t}")),
            );
            n
        };
        let rerun_stage = || {
            ["report cleared", "rerun succeeds", "rerun report"]
                .map(String::from)
                .to_vec()
        };
        // Nothing the agent wrote may run as root here but what the job itself runs: the
        // system's shell, `rm` and no preloaded library.
        // Reads only until the checks are done: each path is looked up once.
        let mut reads = StatOnce::new(&mut *sys);
        let mut checks = system::base_checks(&mut reads, &f.code)?;
        let entry = system::canonical(&mut reads, &f.entry)?;
        let job = system::canonical(&mut reads, &f.job)?;
        checks.push(Check::new(
            "entry point leads to the job",
            entry.is_some() && entry == job,
            format!("{} does not lead to the job {} any more", f.entry, f.job),
        ));
        let data_is_file = reads
            .stat(&f.data)?
            .is_some_and(|s| s.kind == FileKind::File);
        drop(reads);
        checks.push(Check::new(
            "data file",
            data_is_file,
            format!("{} is not a regular file any more", f.data),
        ));
        if checks.iter().any(|c| !c.passed) {
            checks.extend(system::not_reached(path_stage()));
            checks.extend(system::not_reached(rerun_stage()));
            return Ok(Verdict::checklist(checks));
        }
        sys.kill_all()?;
        // The PATH the job's own config gives it: paths.env sourced by the system's shell
        // from `/`, as the job does (`set -eu`, `$0` its entry point); a fresh shell prints it.
        let source = format!(
            "set -eu; . {} >/dev/null 2>&1 </dev/null; exec /bin/sh -c 'printf %s \"$0\"' \"$PATH\"",
            sh_quote(&f.paths_env)
        );
        let r = sys.run(
            &format!(
                "exec /bin/sh -c {} {}",
                sh_quote(&source),
                sh_quote(&f.entry)
            ),
            None,
            Duration::from_secs(5),
        )?;
        checks.push(Check::new(
            "job's PATH sourced",
            r.success(),
            format!(
                "sourcing {} as the job does failed (exit {}): {}",
                f.paths_env,
                r.exit_code(),
                system::last_line(&r.stderr)
            ),
        ));
        if !r.success() {
            checks.extend(system::not_reached(path_stage().split_off(1)));
            checks.extend(system::not_reached(rerun_stage()));
            return Ok(Verdict::checklist(checks));
        }
        let job_path = String::from_utf8_lossy(&r.stdout).into_owned();
        // The sourcing ran: what was read before is read again, each path once.
        let mut reads = StatOnce::new(&mut *sys);
        let found = system::find(&mut reads, &renderer, &job_path)?;
        let current = system::SystemFile {
            path: format!("{}/{renderer}", f.new_dir),
            sha256: util::sha256_hex(renderer_script(&f.app, &f.new_ver).as_bytes()),
        };
        checks.push(system::is_file(
            &mut reads,
            &format!("current {renderer} first"),
            &format!("`{renderer}` on the job's PATH ({job_path})"),
            found.as_deref(),
            Some(&current),
            "the current release's",
        )?);
        checks.extend(system::command_checks(&mut reads, &f.code, &job_path)?);
        drop(reads);
        if checks.iter().any(|c| !c.passed) {
            checks.extend(system::not_reached(rerun_stage()));
            return Ok(Verdict::checklist(checks));
        }
        // A clean state: nothing of the agent's (or of the sourcing) running, no report, and
        // a day's data the agent has never seen.
        sys.kill_all()?;
        let (data, report) = data_and_report(&mut rand::thread_rng(), &f.app, &f.new_ver);
        let rm = f.code.rm.as_ref().map(|r| r.path.as_str()).unwrap_or("rm");
        // The shell's own `printf` first; the system's `rm` replaces the shell last.
        let prepare = format!(
            "set -e; printf %s {} > {}; exec {} -rf -- {} {}",
            sh_quote(&data),
            sh_quote(&f.data),
            sh_quote(rm),
            sh_quote(&f.report),
            sh_quote(&format!("{}.new", f.report)),
        );
        let r = sys.run(&prepare, None, Duration::from_secs(5))?;
        let cleared = r.success() && sys.stat(&f.report)?.is_none();
        checks.push(Check::new(
            "report cleared",
            cleared,
            format!(
                "the confirmation could not clear the report and renew the data: {}",
                system::last_line(&r.stderr)
            ),
        ));
        if !cleared {
            checks.extend(system::not_reached(rerun_stage().split_off(1)));
            return Ok(Verdict::checklist(checks));
        }
        // The job as the system runs it: its entry point, as root, from `/`.
        let r = sys.run(
            &format!("exec {}", sh_quote(&f.entry)),
            None,
            Duration::from_secs(10),
        )?;
        checks.push(Check::new(
            "rerun succeeds",
            r.success(),
            format!(
                "the job, rerun by {} on fresh data, failed (exit {}): {}",
                f.entry,
                r.exit_code(),
                system::last_line(&r.stderr)
            ),
        ));
        let (ok, _) = util::content_check(
            sys,
            &f.report,
            &util::sha256_hex(report.as_bytes()),
            1 << 20,
        )?;
        checks.push(Check::new(
            "rerun report",
            ok,
            format!(
                "the rerun job did not write {} as the current renderer renders the fresh data",
                f.report
            ),
        ));
        Ok(Verdict::checklist(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        // The job's `mv` may not load (a shared library's soname link gone): the loader's
        // links are rebuilt so the system's own `mv` works again.
        let script = format!(
            "/bin/chmod 644 {env} 2>/dev/null; printf %s {good} > {env} && {{ {repair}; }} && {job}",
            env = sh_quote(&f.paths_env),
            good = sh_quote(&f.good_paths_env),
            repair = system::repair_loader(),
            job = sh_quote(&f.job),
        );
        vec![format!(
            "cd / && {CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&script)
        )]
    }

    /// Fix paths.env with sed (by the shell's own printf when sed fails or complains), then
    /// run the job by its entry point; when the job's `mv` cannot load its library, rebuild
    /// the loader's links and run it again; when it fails otherwise, run it in a clean
    /// environment.
    fn catalogue_step(&self, _setup: &TaskSetup, seen: &[Seen]) -> Option<usize> {
        let tried = |i: usize| seen.iter().any(|s| s.action == i);
        let Some(last) = seen.last() else {
            return Some(SED);
        };
        let complained = last.exit_code != 0 || !last.stderr.trim().is_empty();
        match last.action {
            SED if complained => Some(PRINTF),
            SED | PRINTF | LOADER => Some(RUN),
            RUN | CLEAN_RUN => {
                let next = if last.stderr.contains("error while loading shared libraries") {
                    LOADER
                } else if !tried(PRINTF) {
                    PRINTF
                } else {
                    CLEAN_RUN
                };
                (!tried(next)).then_some(next)
            }
            _ => None,
        }
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let good_path = format!("{}:/usr/local/bin:/usr/bin:/bin", f.new_dir);
        [
            ("APP", f.app.clone()),
            ("JOB", f.job.clone()),
            ("ENTRY", f.entry.clone()),
            ("PATHS_ENV", f.paths_env.clone()),
            ("REPORT", f.report.clone()),
            ("DATA", f.data.clone()),
            ("NEW_DIR", f.new_dir.clone()),
            ("LISTED_DIRS", f.listed.join(" ")),
            ("STALE_DIR", f.stale_dir.clone().unwrap_or_default()),
            ("GOOD_PATH", good_path),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}
