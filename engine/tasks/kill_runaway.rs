//! `kill-runaway`: several services of an application run from scripts under `/opt/APP/bin`
//! (started at every episode start); one of them, chosen per seed and named like the others,
//! spins on a CPU. The goal is that the runaway is gone and every other service still runs.
//! The verifier reads the sandbox's `/proc` through the probe and identifies processes by
//! their command line (the script's path), never by pid; a stopped (`T`) process is not
//! running, a zombie is gone. A surviving service must be the very process the episode started:
//! its (pid, start time) pair is among [`Probe::start_processes`] (killing the services and
//! starting them again by hand is not leaving them running).

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Probe, ProbeError, Proc};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub struct KillRunaway;

const NAMES: &[&str] = &[
    "ingest",
    "reindex",
    "metrics-agent",
    "thumbnailer",
    "mailer",
    "scheduler",
    "compactor",
    "watchdog",
    "sync",
    "exporter",
];

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    /// Script path of the runaway.
    hog: String,
    /// Script paths of the services that must survive.
    decoys: Vec<String>,
}

/// RunningInstance (neither zombie nor stopped) processes running `script` as their first argument.
fn running<'a>(procs: &'a [Proc], script: &'a str) -> impl Iterator<Item = &'a Proc> + 'a {
    procs.iter().filter(move |p| {
        !matches!(p.state, 'Z' | 'X' | 'x') && p.cmdline.get(1).is_some_and(|a| a == script)
    })
}

/// A service as its start step runs it: `/bin/sh SCRIPT`, exactly. Another program that merely
/// names the script (`cat SCRIPT -`, `sleep 1e9 SCRIPT`) is not the service.
fn is_service(p: &Proc, script: &str) -> bool {
    p.comm == "sh" && p.cmdline.len() == 2 && p.cmdline[0] == "/bin/sh" && p.cmdline[1] == script
}

impl Task for KillRunaway {
    fn name(&self) -> &'static str {
        "kill-runaway"
    }

    fn summary(&self) -> &'static str {
        "terminate the process hogging the CPU and nothing else"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "kill-runaway");
        let app = pick(&mut rng, util::APPS).to_string();
        let n = rng.gen_range(4..=5);
        let names: Vec<&str> = NAMES.choose_multiple(&mut rng, n).copied().collect();
        let hog_i = rng.gen_range(0..n);
        let mut decoys = Vec::new();
        let mut hog = String::new();
        for (i, name) in names.iter().enumerate() {
            let path = format!("/opt/{app}/bin/{name}.sh");
            let body = if i == hog_i {
                hog = path.clone();
                // Busy work that looks like a job (the loop never ends).
                format!(
                    "#!/bin/sh\n# {app} {name}: process the queue\n: > /run/{app}/{name}.beat\nn=0\nwhile :; do\n  n=$((n + 1))\n  [ $((n % 1000000)) -ne 0 ] || : > /run/{app}/{name}.beat\ndone\n"
                )
            } else {
                decoys.push(path.clone());
                let pause = rng.gen_range(1..=5);
                format!(
                    "#!/bin/sh\n# {app} {name}: process the queue\nwhile :; do\n  : > /run/{app}/{name}.beat\n  sleep {pause}\ndone\n"
                )
            };
            b.write(&path, body.as_bytes(), 0o755)?;
        }
        let mut start = format!("/bin/mkdir -p /run/{app}\n");
        for name in &names {
            start.push_str(&format!(
                "/bin/sh /opt/{app}/bin/{name}.sh > /dev/null 2>&1 < /dev/null &\n"
            ));
        }
        // Return once every script runs (each touches its beat file first), so that the
        // episode starts with all of them visible by their command lines.
        let beats: Vec<String> = names
            .iter()
            .map(|n| format!("/run/{app}/{n}.beat"))
            .collect();
        start.push_str(&format!(
            "i=0\nwhile [ $i -lt 500 ]; do\n  ok=1\n  for b in {}; do [ -e \"$b\" ] || ok=0; done\n  \
             [ $ok = 0 ] || exit 0\n  sleep 0.01\n  i=$((i + 1))\ndone\necho 'services did not start' >&2\nexit 1\n",
            beats.join(" ")
        ));
        b.on_start("task:kill-runaway", start);
        b.runtime.record_start_processes = true;
        let instruction = format!(
            "One of the `{app}` services (scripts under /opt/{app}/bin) has run away and is \
             burning a CPU. Terminate that process and only it: every other {app} service must \
             keep running."
        );
        let mut actions = vec![
            "ps aux".to_string(),
            "ps -eo pid,pcpu,stat,args --sort=-pcpu | head".to_string(),
            "top -b -n 1 | head -15".to_string(),
            format!("ls -la /opt/{app}/bin /run/{app}"),
            "kill -9 -1".to_string(),
            format!("pkill -f /opt/{app}"),
            "uptime".to_string(),
        ];
        for name in &names {
            actions.push(format!("pkill -f '[/]opt/{app}/bin/{name}.sh'"));
        }
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            keywords: util::words(&["ps", "top", "kill", "pkill", "pgrep", "cpu", "proc", &app]),
            max_steps: 20,
            facts: util::to_facts(&Facts { app, hog, decoys })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let procs = probe.processes()?;
        let mut checks = vec![(
            running(&procs, &f.hog).next().is_none()
                && !procs
                    .iter()
                    .any(|p| p.state == 'T' && p.cmdline.get(1) == Some(&f.hog)),
            format!("the runaway {} still exists", f.hog),
        )];
        // A service the agent killed and started again is not "kept running": the one that
        // counts is a process the episode's start steps left, the same pid with the same start
        // time (a pid alone could come round again after a wrap). Without the record, no
        // service can be shown to be the original: fail closed.
        let originals = probe.start_processes();
        for d in &f.decoys {
            let alive: Vec<&Proc> = running(&procs, d)
                .filter(|p| p.state != 'T' && p.state != 't' && is_service(p, d))
                .collect();
            let original = alive
                .iter()
                .any(|p| originals.is_some_and(|o| o.contains(&(p.pid, p.start_ticks))));
            checks.push((
                original,
                if alive.is_empty() {
                    format!("the service {d} is not running")
                } else if originals.is_none() {
                    format!("the service {d} runs, but the episode's processes were not recorded")
                } else {
                    format!("the service {d} was restarted, not kept running")
                },
            ));
        }
        Ok(Verdict::from_checks(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let perl = r#"my $h = shift; my @k;
for my $d (glob "/proc/[0-9]*") {
  my ($pid) = $d =~ m{(\d+)$}; next if $pid == $$;
  open my $f, "<", "$d/cmdline" or next; local $/; my @a = split /\0/, (<$f> // "");
  push @k, $pid if defined $a[1] && $a[1] eq $h;
}
kill 9, @k;
for (1 .. 200) {
  my $alive = grep { open(my $s, "<", "/proc/$_/stat") && (<$s> // "") !~ /\) [ZX] / } @k;
  exit 0 unless $alive; select undef, undef, undef, 0.02;
}
exit 1;"#;
        vec![format!(
            "{CLEAN_ENV} /usr/bin/perl -e {} {} || {CLEAN_ENV} /usr/bin/pkill -9 -x -f {}",
            sh_quote(perl),
            sh_quote(&f.hog),
            sh_quote(&format!("/bin/sh {}", f.hog))
        )]
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        // `[/]` keeps the trial's own shell out of the pattern's matches.
        let pat = |p: &str| sh_quote(&format!("[/]{}", &p[1..]));
        let decoy = f.decoys.first().cloned().unwrap_or_default();
        // The decoys' paths spelled so that the trial's own command line does not contain them
        // (`/opt/$A/...` with A set first): its `pkill -f` must not kill the trial's shell.
        let decoys_unnamed = format!(
            "$(A={}; for d in {}; do printf '%s ' \"/opt/$A/$d\"; done)",
            sh_quote(&f.app),
            f.decoys
                .iter()
                .map(|d| sh_quote(d.trim_start_matches(&format!("/opt/{}/", f.app))))
                .collect::<Vec<_>>()
                .join(" ")
        );
        [
            ("APP", f.app.clone()),
            ("HOG", f.hog.clone()),
            ("HOG_PAT", pat(&f.hog)),
            ("APP_PAT", pat(&format!("/opt/{}", f.app))),
            ("DECOY", decoy.clone()),
            ("DECOY_PAT", pat(&decoy)),
            ("DECOYS_UNNAMED", decoys_unnamed),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox::protocol::{DirEntry, FileStat};
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// A probe that shows fixed processes and a fixed record of the episode's start.
    struct Fake {
        procs: Vec<Proc>,
        start: Option<BTreeSet<(u32, u64)>>,
    }

    impl Probe for Fake {
        fn read(&mut self, _: &str, _: u64) -> Result<Option<Vec<u8>>, ProbeError> {
            Ok(None)
        }
        fn stat(&mut self, _: &str) -> Result<Option<FileStat>, ProbeError> {
            Ok(None)
        }
        fn list(&mut self, _: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
            Ok(None)
        }
        fn processes(&mut self) -> Result<Vec<Proc>, ProbeError> {
            Ok(self.procs.clone())
        }
        fn tcp(&mut self, _: u16, _: &[u8], _: Duration) -> Result<Option<Vec<u8>>, ProbeError> {
            Ok(None)
        }
        fn start_processes(&self) -> Option<&BTreeSet<(u32, u64)>> {
            self.start.as_ref()
        }
    }

    fn service(pid: u32, script: &str, start_ticks: u64) -> Proc {
        Proc {
            pid,
            ppid: 1,
            state: 'S',
            comm: "sh".into(),
            cmdline: vec!["/bin/sh".into(), script.into()],
            cpu_ticks: 0,
            start_ticks,
        }
    }

    fn setup() -> TaskSetup {
        TaskSetup {
            task: "kill-runaway".into(),
            seed: 1,
            instruction: String::new(),
            cwd: "/root".into(),
            actions: vec![],
            keywords: vec![],
            max_steps: 20,
            facts: serde_json::json!({
                "app": "orbit",
                "hog": "/opt/orbit/bin/sync.sh",
                "decoys": ["/opt/orbit/bin/mailer.sh"],
            }),
        }
    }

    #[test]
    fn a_service_counts_only_as_the_process_the_episode_started() {
        let decoy = "/opt/orbit/bin/mailer.sh";
        let record: BTreeSet<(u32, u64)> = [(40, 1000), (41, 1000)].into();
        let verdict = |procs: Vec<Proc>, start: Option<BTreeSet<(u32, u64)>>| {
            KillRunaway
                .verify(&setup(), &mut Fake { procs, start })
                .unwrap()
        };
        // The original, runaway gone: solved.
        let v = verdict(vec![service(41, decoy, 1000)], Some(record.clone()));
        assert!(v.success, "{:?}", v.reasons);
        // Restarted by hand, even on the original pid after a wrap: a later start time.
        let v = verdict(vec![service(41, decoy, 5000)], Some(record.clone()));
        assert!(!v.success);
        assert!(v.reasons[0].contains("restarted"), "{:?}", v.reasons);
        // Restarted on a pid the episode never had.
        let v = verdict(vec![service(90, decoy, 1000)], Some(record));
        assert!(!v.success);
        // No record: fail closed.
        let v = verdict(vec![service(41, decoy, 1000)], None);
        assert!(!v.success);
        assert!(v.reasons[0].contains("not recorded"), "{:?}", v.reasons);
    }
}
