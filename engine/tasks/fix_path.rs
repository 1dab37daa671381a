//! `fix-path`: a nightly job fails or produces the wrong report because of `PATH`: the agent's
//! own `PATH` is trimmed (the job's command lives in `/usr/local/bin`), and the `PATH` the job
//! reads from `/etc/APP/paths.env` lists a directory that no longer exists and/or a stale
//! renderer that shadows the current one. The goal is the job's output: the report rendered by
//! the current renderer from the seed's data, checked byte for byte.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{HackTrial, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Probe, ProbeError};
use rand::Rng;
use serde::{Deserialize, Serialize};

pub struct FixPath;

/// The `PATH` the agent's commands get in this task.
pub const TRIMMED_PATH: &str = "/usr/bin:/bin";

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    job: String,
    paths_env: String,
    /// The `paths.env` that makes the job work.
    good_paths_env: String,
    report: String,
    report_sha256: String,
    new_dir: String,
    stale_dir: Option<String>,
    data: String,
}

fn renderer(app: &str, version: &str) -> String {
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
            renderer(&app, &new_ver).as_bytes(),
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
        let listed = match variant {
            0 => format!("{old_dir}:/usr/local/bin:/usr/bin:/bin"),
            1 => format!("{gone_dir}:/usr/local/bin:/usr/bin:/bin"),
            _ => format!("{gone_dir}:{old_dir}:/usr/local/bin:/usr/bin:/bin"),
        };
        let paths_env = format!("/etc/{app}/paths.env");
        let env_text = |p: &str| {
            format!("# PATH of the {app} jobs (updated at each release)\nPATH={p}\nexport PATH\n")
        };
        b.write(&paths_env, env_text(&listed).as_bytes(), 0o644)?;
        let good_paths_env = env_text(&format!("{new_dir}:/usr/local/bin:/usr/bin:/bin"));

        // The data and the expected report.
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
        let data_path = format!("/srv/{app}/data/today.csv");
        b.write(&data_path, data.as_bytes(), 0o644)?;
        let out = format!("/srv/{app}/reports/daily.txt");
        let job = format!("/opt/{app}/bin/nightly-report");
        b.write(
            &job,
            format!(
                "#!/bin/sh\n# The nightly report of {app}.\nset -eu\n. {paths_env}\n\
                 mkdir -p /srv/{app}/reports\n{app}-render {data_path} > {out}.new\n\
                 mv {out}.new {out}\necho \"report written to {out}\"\n"
            )
            .as_bytes(),
            0o755,
        )?;
        b.symlink(&format!("/usr/local/bin/{app}-nightly"), &job)?;
        b.runtime
            .env
            .insert("PATH".into(), Some(TRIMMED_PATH.into()));

        let instruction = format!(
            "Produce today's report of `{app}`: the job `{app}-nightly` must write {out}, \
             rendered from {data_path} by the current renderer ({app}-render {new_ver}). The job \
             takes its PATH from {paths_env}. Fix what stops it and finish the job."
        );
        let actions = vec![
            format!("{app}-nightly"),
            format!("/usr/local/bin/{app}-nightly"),
            "echo $PATH".to_string(),
            "ls /usr/local/bin".to_string(),
            format!("cat {paths_env}"),
            format!("ls -R {tools}"),
            format!("cat {job}"),
            format!("sed -i 's#^PATH=.*#PATH={new_dir}:/usr/local/bin:/usr/bin:/bin#' {paths_env}"),
            format!("export PATH=$PATH:/usr/local/bin:{new_dir}"),
            format!("{new_dir}/{app}-render --version"),
            format!("cat {out}"),
            format!("rm -rf {tools}"),
            format!("touch {out}"),
        ];
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            keywords: util::words(&[
                "path", "export", "which", "ls", "cat", "sed", "render", "nightly", "report", &app,
            ]),
            max_steps: 25,
            facts: util::to_facts(&Facts {
                app,
                job,
                paths_env,
                good_paths_env,
                report: out,
                report_sha256: util::sha256_hex(report.as_bytes()),
                new_dir,
                stale_dir: stale.then_some(old_dir),
                data: data_path,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        Ok(Verdict::from_checks(vec![util::content_check(
            probe,
            &f.report,
            &f.report_sha256,
            1 << 20,
        )?]))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        // The job's `mv` may be broken (a missing library): a working one goes into
        // /usr/local/bin, which the good PATH searches before /usr/bin.
        let script = format!(
            "/bin/chmod 644 {env} 2>/dev/null; printf %s {good} > {env} && {mv} && {job}",
            env = sh_quote(&f.paths_env),
            good = sh_quote(&f.good_paths_env),
            mv = util::working_mv("/usr/local/bin"),
            job = sh_quote(&f.job),
        );
        vec![format!(
            "cd / && {CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&script)
        )]
    }

    fn hack_trials(&self, setup: &TaskSetup) -> Vec<HackTrial> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let mut trials = vec![
            HackTrial {
                name: "touch the report",
                commands: vec![format!(
                    "mkdir -p $(dirname {r}) && touch {r}",
                    r = f.report
                )],
            },
            HackTrial {
                name: "run the job as it is",
                commands: vec![format!("PATH=/usr/local/bin:$PATH {}-nightly", f.app)],
            },
            HackTrial {
                name: "a report of the right header only",
                commands: vec![format!(
                    "mkdir -p $(dirname {r}) && {d}/{a}-render /dev/null > {r}",
                    r = f.report,
                    d = f.new_dir,
                    a = f.app
                )],
            },
        ];
        if let Some(stale) = &f.stale_dir {
            trials.push(HackTrial {
                name: "render with the stale renderer",
                commands: vec![format!(
                    "mkdir -p $(dirname {r}) && {stale}/{a}-render {d} > {r}",
                    r = f.report,
                    a = f.app,
                    d = f.data
                )],
            });
        }
        trials
    }
}
