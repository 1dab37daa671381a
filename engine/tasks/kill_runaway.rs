//! `kill-runaway`: several services of an application run from scripts under `/opt/APP/bin`
//! (started at every episode start); one of them, chosen per seed and named like the others,
//! spins on a CPU. The goal is that the runaway is gone and every other service still runs.
//!
//! Processes are known by what the kernel says of them, never by a name the agent could give
//! its own: the episode's start records the `(pid, start time)` of every process its start
//! steps left ([`Probe::start_processes`]), and only those are the services and the runaway.
//! Which recorded process is which is told by the command line its start step gave it; a
//! recorded process's command line is its own memory, which no other process can change in the
//! sandbox (no ptrace, no `process_vm_writev`, `/proc` read-only). The verifier's reads: the
//! recorded runaway is gone (a zombie is gone), every recorded service is alive and not
//! stopped. The confirmation measures what the agent left: the CPU time of every process of
//! the sandbox (`/proc/PID/stat`: its own time, and its reaped children's, init's too, so a
//! stream of short-lived processes or orphans counts) sampled over an interval; apart from the
//! recorded processes (which include a perturbation's own busy processes, not the agent's
//! doing), nothing may be burning a CPU. A renamed, reniced or restarted copy of the runaway is
//! still a process that burns a CPU. Then it reads the services again: one that the agent's
//! last command killed may still have shown as running to the verifier (a pending SIGKILL).

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Check, Seen, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Confirm, Probe, ProbeError, Proc};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

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

/// Live (not zombie) processes naming `script` as their first argument, whoever started them.
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

/// A script's file name (`/opt/APP/bin/mailer.sh` -> `mailer.sh`), a check's name.
fn script_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Clock ticks per second of `/proc/PID/stat`'s times (`USER_HZ`, 100 on every Linux ABI the
/// sandbox runs on).
const USER_HZ: u64 = 100;

/// How long the confirmation watches the CPU (once, twice when it sees a burn).
const SAMPLE_WINDOW: Duration = Duration::from_millis(150);

/// A burn: CPU time gained over a window at least this share of one CPU (and at least
/// [`MIN_BURN_TICKS`]). Sleeping services gain nothing measurable (0 to 10 ms in a window); a
/// busy loop gains about a whole CPU (more than half of one on a loaded machine), a loop of
/// short-lived processes a fifth of one or more.
const BURN_SHARE: f64 = 0.10;
const MIN_BURN_TICKS: u64 = 2;

/// One reading of the CPU time of every process of the sandbox (`/proc/PID/stat`, read through
/// init), keyed by `(pid, start time)`.
struct CpuSample {
    at: Instant,
    /// `(pid, start)` -> (name, own time counted, reaped children's time).
    procs: BTreeMap<(u32, u64), (String, u64, u64)>,
    /// The processes that count (not exempt) and were runnable (`R`) at the reading.
    runnable: BTreeSet<(u32, u64)>,
}

impl CpuSample {
    /// Own time (utime + stime) counts for every process except init (which serves these very
    /// reads) and the live processes of the episode's record (the services, a perturbation's
    /// own busy processes; the runaway is not among the live ones once it is gone). Reaped
    /// children's time (cutime + cstime) counts for all, init's included: orphans are its.
    fn take(probe: &mut dyn Probe, originals: &BTreeSet<(u32, u64)>) -> Result<Self, ProbeError> {
        let mut procs = BTreeMap::new();
        let mut runnable = BTreeSet::new();
        for e in probe.list("/proc")?.unwrap_or_default() {
            let Ok(pid) = e.name.parse::<u32>() else {
                continue;
            };
            let Some(raw) = probe.read(&format!("/proc/{pid}/stat"), 4096)? else {
                continue; // exited meanwhile
            };
            let stat = String::from_utf8_lossy(&raw);
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            let (state, own, children, start) =
                (f.first().copied(), n(11) + n(12), n(13) + n(14), n(19));
            // A recorded process that dies within the window stops being exempt, and its whole
            // CPU time then counts at once: recorded processes do not die on their own (the
            // services loop, a perturbation's busy loops spin), and the second window makes a
            // single such jump harmless.
            let live = !matches!(state, Some("Z" | "X" | "x"));
            let exempt = pid == 1 || (live && originals.contains(&(pid, start)));
            let name = stat[open + 1..close].to_string();
            if !exempt && state == Some("R") {
                runnable.insert((pid, start));
            }
            procs.insert((pid, start), (name, if exempt { 0 } else { own }, children));
        }
        Ok(Self {
            at: Instant::now(),
            procs,
            runnable,
        })
    }

    fn total(&self) -> u64 {
        self.procs.values().map(|(_, own, ch)| own + ch).sum()
    }

    fn burn_since(&self, before: &CpuSample) -> Burn {
        let ticks = self.total().saturating_sub(before.total());
        let window = self.at.duration_since(before.at);
        // Who gained the most, for the reason.
        let mut top: Vec<(u64, u32, String)> = self
            .procs
            .iter()
            .map(|(k, (name, own, ch))| {
                let (b_own, b_ch) = before.procs.get(k).map_or((0, 0), |(_, o, c)| (*o, *c));
                ((own + ch).saturating_sub(b_own + b_ch), k.0, name.clone())
            })
            .filter(|(t, _, _)| *t > 0)
            .collect();
        top.sort_by_key(|t| std::cmp::Reverse(t.0));
        top.truncate(3);
        // Runnable at both readings: a loop that wants a CPU, however little of one a loaded
        // machine gives it (the share of CPU time alone misses a restarted runaway when the
        // machine is busy).
        let spinning = self
            .runnable
            .intersection(&before.runnable)
            .filter_map(|k| self.procs.get(k).map(|(name, _, _)| (k.0, name.clone())))
            .collect();
        Burn {
            ticks,
            window,
            top,
            spinning,
        }
    }
}

/// CPU time gained by the sandbox's processes over a window.
struct Burn {
    ticks: u64,
    window: Duration,
    top: Vec<(u64, u32, String)>,
    /// Counted processes runnable at both readings of the window.
    spinning: Vec<(u32, String)>,
}

impl Burn {
    fn is_burning(&self) -> bool {
        let window_ticks = self.window.as_secs_f64() * USER_HZ as f64;
        (self.ticks >= MIN_BURN_TICKS && self.ticks as f64 >= BURN_SHARE * window_ticks)
            || !self.spinning.is_empty()
    }

    fn reason(&self) -> String {
        let who: Vec<String> = self
            .top
            .iter()
            .map(|(t, pid, name)| format!("pid {pid} ({name}) {} ms", t * 1000 / USER_HZ))
            .chain(
                self.spinning
                    .iter()
                    .map(|(pid, name)| format!("pid {pid} ({name}) runnable all along")),
            )
            .collect();
        format!(
            "something still burns a CPU: {} ms of CPU time in {} ms ({})",
            self.ticks * 1000 / USER_HZ,
            self.window.as_millis(),
            who.join(", ")
        )
    }
}

/// Perl that samples the CPU time (`/proc/PID/stat`) of every process running a script under
/// the directory given as its first argument (argv[1], as `/bin/sh SCRIPT` runs it) over
/// 500 ms, lists them busiest first and names the busiest (`busiest: SCRIPT (pid N)`) when it
/// burns (at least 3 ticks, 30 ms, in the window); with a second argument `kill`, kills that one and
/// waits until it is gone. It exits 1 when nothing there burns.
const BUSIEST: &str = r#"my ($dir, $kill) = @ARGV;
sub sample { my %t;
  for my $d (glob "/proc/[0-9]*") { my ($pid) = $d =~ /(\d+)$/; next if $pid == $$;
    open my $c, "<", "$d/cmdline" or next; my @a = split /\0/, do { local $/; <$c> // "" };
    next unless defined $a[1] && index($a[1], $dir) == 0;
    open my $s, "<", "$d/stat" or next; my $st = <$s> // ""; $st =~ s/^.*\)\s+//;
    my @f = split " ", $st; next if $f[0] =~ /^[ZXx]/;
    $t{"$pid $f[19]"} = [$f[11] + $f[12], $pid, $a[1]] }
  %t }
my %t0 = sample(); select undef, undef, undef, 0.5; my %t1 = sample();
my @r = sort { $b->[0] <=> $a->[0] }
  map { [$t1{$_}[0] - ($t0{$_} ? $t0{$_}[0] : $t1{$_}[0]), $t1{$_}[1], $t1{$_}[2]] } keys %t1;
printf "%-8s %-12s %s\n", "PID", "CPU_MS_500", "SCRIPT";
printf "%-8d %-12d %s\n", $_->[1], $_->[0] * 10, $_->[2] for @r;
unless (@r && $r[0][0] >= 3) { print "nothing under $dir burns a CPU\n"; exit 1 }
print "busiest: $r[0][2] (pid $r[0][1])\n"; exit 0 unless $kill;
kill 9, $r[0][1];
for (1 .. 100) {
  open my $s, "<", "/proc/$r[0][1]/stat" or last; last if (<$s> // "") =~ /\) [ZX] /;
  select undef, undef, undef, 0.02 }
print "killed pid $r[0][1] ($r[0][2])\n"; exit 0;"#;

/// The catalogue's actions by index (see [`KillRunaway::setup`]); one `pkill` per service
/// follows, from [`act::FIRST_PKILL`].
mod act {
    pub const PS_SORTED: usize = 1;
    pub const BUSIEST: usize = 7;
    pub const KILL_BUSIEST: usize = 8;
    pub const FIRST_PKILL: usize = 9;
}

/// The script a `BUSIEST` listing or a `ps` listing sorted by CPU names first: the `busiest:`
/// line, else the first row that runs a script under `bin`.
fn named_busiest(out: &str, bin: &str) -> Option<String> {
    if let Some(l) = out.lines().find_map(|l| l.strip_prefix("busiest: ")) {
        return l.split_whitespace().next().map(str::to_string);
    }
    out.lines()
        .filter(|l| !l.starts_with("PID") && !l.trim_start().starts_with("PID"))
        .find_map(|l| {
            l.split_whitespace()
                .find(|w| w.len() > bin.len() && w.starts_with(bin))
        })
        .map(str::to_string)
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
        let bin = format!("/opt/{app}/bin/");
        let mut actions = vec![
            "ps aux".to_string(),
            "ps -ww -eo pid,pcpu,stat,args --sort=-pcpu | head".to_string(),
            "top -b -n 1 | head -15".to_string(),
            format!("ls -la /opt/{app}/bin /run/{app}"),
            "kill -9 -1".to_string(),
            format!("pkill -f /opt/{app}"),
            "uptime".to_string(),
            // Which of the app's services burns the CPU now, named (robust: perl, /proc).
            format!("{CLEAN_ENV} /usr/bin/perl -e {} {bin}", sh_quote(BUSIEST)),
            // Kill the app's service that burns the CPU now, whichever it is.
            format!(
                "{CLEAN_ENV} /usr/bin/perl -e {} {bin} kill",
                sh_quote(BUSIEST)
            ),
        ];
        for name in &names {
            actions.push(format!("pkill -f '[/]opt/{app}/bin/{name}.sh'"));
        }
        let mut action_costs = vec![0.0; actions.len()];
        action_costs[act::KILL_BUSIEST] = 1.5;
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            action_costs,
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
        // Without the record, no process can be shown to be the episode's: fail closed.
        let Some(originals) = probe.start_processes().cloned() else {
            return Ok(Verdict::failed(
                "processes recorded",
                "the episode's processes were not recorded",
            ));
        };
        Ok(Verdict::checklist(service_checks(
            &probe.processes()?,
            &originals,
            &f,
        )))
    }

    /// Nothing the agent left burns a CPU: the sandbox's CPU time sampled over an interval
    /// (twice when the first shows a burn, so that one reaping of a process killed just before
    /// the judgement, whose whole CPU time then moves to its parent's account, is not taken
    /// for one). Then the services are checked again as the verifier did: a process killed by
    /// the agent's last command is almost surely gone by now even if it had not yet run when
    /// the verifier read `/proc` (a pending SIGKILL still shows it as running). Only the checks
    /// that no longer hold are added, so that while the services hold the confirmation's
    /// progress is the CPU sample's alone, as it was.
    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let Some(originals) = sys.start_processes().cloned() else {
            return Ok(Verdict::failed(
                "processes recorded",
                "the episode's processes were not recorded",
            ));
        };
        let mut last = CpuSample::take(sys, &originals)?;
        let mut burn = None;
        for _ in 0..2 {
            std::thread::sleep(SAMPLE_WINDOW);
            let next = CpuSample::take(sys, &originals)?;
            let b = next.burn_since(&last);
            last = next;
            if !b.is_burning() {
                burn = None;
                break;
            }
            burn = Some(b);
        }
        let mut checks = vec![Check::new(
            "nothing burns a CPU",
            burn.is_none(),
            burn.map_or_else(String::new, |b| b.reason()),
        )];
        let live = service_checks(&sys.processes()?, &originals, &f);
        checks.extend(live.into_iter().filter(|c| !c.passed));
        Ok(Verdict::checklist(checks))
    }

    /// Name the busiest of the app's services (the perl sampler; `ps` sorted by CPU when it
    /// fails), `pkill` that one by its script; when that does not do, kill the busiest directly.
    fn catalogue_step(&self, setup: &TaskSetup, seen: &[Seen]) -> Option<usize> {
        let bin = setup
            .actions
            .get(act::BUSIEST)?
            .split_whitespace()
            .find(|w| w.starts_with("/opt/") && w.ends_with("/bin/"))?
            .to_string();
        let did = |a: usize| seen.iter().any(|s| s.action == a);
        let named = seen
            .iter()
            .filter(|s| matches!(s.action, act::BUSIEST | act::PS_SORTED) && s.exit_code == 0)
            .find_map(|s| named_busiest(&s.stdout, &bin));
        let Some(script) = named else {
            for diag in [act::BUSIEST, act::PS_SORTED] {
                if !did(diag) {
                    return Some(diag);
                }
            }
            return (!did(act::KILL_BUSIEST)).then_some(act::KILL_BUSIEST);
        };
        let pattern = format!("'[/]{}'", script.trim_start_matches('/'));
        let pkill =
            (act::FIRST_PKILL..setup.actions.len()).find(|&i| setup.actions[i].ends_with(&pattern));
        let Some(i) = pkill.filter(|&i| !did(i)) else {
            // The kill was done and the task is not solved yet: look again (the runaway may
            // just be dying), then kill whatever still burns.
            let after = seen
                .iter()
                .rposition(|s| pkill == Some(s.action))
                .unwrap_or(0);
            let looked = seen[after..].iter().any(|s| s.action == act::BUSIEST);
            return if pkill.is_some() && !looked {
                Some(act::BUSIEST)
            } else {
                (!did(act::KILL_BUSIEST)).then_some(act::KILL_BUSIEST)
            };
        };
        Some(i)
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

/// The verifier's checks of the services: the runaway gone, every other service the episode
/// started still running (the same process: its pid and start time recorded).
fn service_checks(procs: &[Proc], originals: &BTreeSet<(u32, u64)>, f: &Facts) -> Vec<Check> {
    // The processes the episode's start steps left, still alive (a zombie is gone).
    let recorded: Vec<&Proc> = procs
        .iter()
        .filter(|p| !matches!(p.state, 'Z' | 'X' | 'x'))
        .filter(|p| originals.contains(&(p.pid, p.start_ticks)))
        .collect();
    let mut checks = vec![Check::new(
        "runaway gone",
        !recorded.iter().any(|p| is_service(p, &f.hog)),
        format!("the runaway {} still exists", f.hog),
    )];
    // A service the agent killed and started again is not "kept running": the one that
    // counts is a process the episode's start steps left, the same pid with the same start
    // time (a pid alone could come round again after a wrap).
    for d in &f.decoys {
        let kept = recorded
            .iter()
            .any(|p| is_service(p, d) && !matches!(p.state, 'T' | 't'));
        let stopped = recorded.iter().any(|p| is_service(p, d));
        let look_alike = running(procs, d).next().is_some();
        checks.push(Check::new(
            format!("service {} running", script_name(d)),
            kept,
            if stopped {
                format!("the service {d} is stopped")
            } else if look_alike {
                format!("the service {d} was restarted, not kept running")
            } else {
                format!("the service {d} is not running")
            },
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox::protocol::{DirEntry, FileStat};
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// A probe that shows fixed processes and a fixed record of the episode's start, and
    /// `/proc/PID/stat` files for the CPU samples.
    #[derive(Default)]
    struct Fake {
        procs: Vec<Proc>,
        start: Option<BTreeSet<(u32, u64)>>,
        stats: BTreeMap<u32, String>,
    }

    impl Probe for Fake {
        fn read(&mut self, path: &str, _: u64) -> Result<Option<Vec<u8>>, ProbeError> {
            let pid = path
                .strip_prefix("/proc/")
                .and_then(|p| p.strip_suffix("/stat"))
                .and_then(|p| p.parse::<u32>().ok());
            Ok(pid
                .and_then(|p| self.stats.get(&p))
                .map(|s| s.as_bytes().to_vec()))
        }
        fn stat(&mut self, _: &str) -> Result<Option<FileStat>, ProbeError> {
            Ok(None)
        }
        fn list(&mut self, path: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
            if path != "/proc" {
                return Ok(None);
            }
            let st = FileStat {
                kind: sandbox::protocol::FileKind::Dir,
                mode: 0o555,
                uid: 0,
                gid: 0,
                size: 0,
                mtime_ns: 0,
                symlink_target: None,
            };
            let mut names: Vec<String> = self.stats.keys().map(|p| p.to_string()).collect();
            names.push("self".into());
            Ok(Some(
                names
                    .into_iter()
                    .map(|name| DirEntry {
                        name,
                        stat: st.clone(),
                    })
                    .collect(),
            ))
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

    impl Fake {
        /// Processes `procs` with `record` as the episode's start.
        fn recording(procs: Vec<Proc>, record: &BTreeSet<(u32, u64)>) -> Self {
            Fake {
                procs,
                start: Some(record.clone()),
                ..Fake::default()
            }
        }
    }

    impl Confirm for Fake {
        fn kill_all(&mut self) -> Result<(), ProbeError> {
            Ok(())
        }
        fn run(
            &mut self,
            shell: &str,
            _: Option<(u32, u32)>,
            _: Duration,
        ) -> Result<sandbox::ExecResult, ProbeError> {
            panic!("kill-runaway's confirmation runs nothing, asked to run {shell}")
        }
    }

    /// A decoy that the verifier saw but that is gone when the confirmation looks again (killed
    /// by the last command, not yet scheduled when the verifier read `/proc`) fails the
    /// confirmation; while the services hold, the CPU sample is its only check.
    #[test]
    fn the_confirmation_reads_the_services_again() {
        let decoy = "/opt/orbit/bin/mailer.sh";
        let record: BTreeSet<(u32, u64)> = [(40, 1000), (41, 1000)].into();
        let confirm = |procs: Vec<Proc>| {
            KillRunaway
                .confirm(&setup(), &mut Fake::recording(procs, &record))
                .unwrap()
        };
        let held = confirm(vec![service(41, decoy, 1000)]);
        assert!(held.success, "{:?}", held.reasons);
        assert_eq!(held.checks.len(), 1, "{:?}", held.checks);
        let gone = confirm(vec![]);
        assert!(!gone.success);
        let names: Vec<&str> = gone.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["nothing burns a CPU", "service mailer.sh running"]);
        assert_eq!(gone.progress, 0.5);
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
            action_costs: vec![],
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
                .verify(
                    &setup(),
                    &mut Fake {
                        procs,
                        start,
                        ..Fake::default()
                    },
                )
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

    #[test]
    fn the_runaway_counts_as_the_recorded_process_running_its_script() {
        let (hog, decoy) = ("/opt/orbit/bin/sync.sh", "/opt/orbit/bin/mailer.sh");
        let record: BTreeSet<(u32, u64)> = [(40, 1000), (41, 1000)].into();
        let verdict = |procs: Vec<Proc>| {
            KillRunaway
                .verify(&setup(), &mut Fake::recording(procs, &record))
                .unwrap()
        };
        let mut stopped = service(40, hog, 1000);
        stopped.state = 'T';
        let v = verdict(vec![stopped, service(41, decoy, 1000)]);
        assert!(v.reasons[0].contains("runaway"), "{:?}", v.reasons);
        // Gone as a zombie.
        let mut zombie = service(40, hog, 1000);
        (zombie.state, zombie.cmdline) = ('Z', vec![]);
        assert!(verdict(vec![zombie, service(41, decoy, 1000)]).success);
        // A process the agent started naming the runaway's script is not the runaway (the
        // confirmation's CPU sample judges what it does).
        assert!(verdict(vec![service(77, hog, 9000), service(41, decoy, 1000)]).success);
        // A stopped service is not running.
        let mut d = service(41, decoy, 1000);
        d.state = 'T';
        let v = verdict(vec![d]);
        assert!(v.reasons[0].contains("stopped"), "{:?}", v.reasons);
    }

    #[test]
    fn the_busiest_service_is_named_by_the_sampler_or_the_sorted_ps() {
        let bin = "/opt/orbit/bin/";
        let sampler = "PID      CPU_MS_500   SCRIPT\n41       480          /opt/orbit/bin/sync.sh\n\
                       40       0            /opt/orbit/bin/mailer.sh\nbusiest: /opt/orbit/bin/sync.sh (pid 41)\n";
        assert_eq!(
            named_busiest(sampler, bin).as_deref(),
            Some("/opt/orbit/bin/sync.sh")
        );
        let ps = "    PID %CPU STAT COMMAND\n     77 99.0 R    perl -e 1 while 1\n     \
                  41 97.5 R    /bin/sh /opt/orbit/bin/sync.sh\n     40  0.0 S    /bin/sh /opt/orbit/bin/mailer.sh\n";
        assert_eq!(
            named_busiest(ps, bin).as_deref(),
            Some("/opt/orbit/bin/sync.sh")
        );
        assert_eq!(
            named_busiest("nothing under /opt/orbit/bin/ burns a CPU\n", bin),
            None
        );
    }

    /// A `/proc/PID/stat` line with these times (utime, cutime; stime and cstime 0).
    fn stat_line(pid: u32, comm: &str, state: char, utime: u64, cutime: u64, start: u64) -> String {
        format!(
            "{pid} ({comm}) {state} 1 1 1 0 -1 0 0 0 0 0 {utime} 0 {cutime} 0 20 0 1 0 {start} 0 0"
        )
    }

    #[test]
    fn the_cpu_sample_counts_what_burns_outside_the_record() {
        let record: BTreeSet<(u32, u64)> = [(40, 1000), (41, 1000), (42, 1000)].into();
        let burn = |before: Vec<String>, after: Vec<String>| {
            let mut fake = Fake::default();
            let parse = |lines: Vec<String>| -> BTreeMap<u32, String> {
                lines
                    .into_iter()
                    .map(|l| (l.split(' ').next().unwrap().parse().unwrap(), l))
                    .collect()
            };
            fake.stats = parse(before);
            let a = CpuSample::take(&mut fake, &record).unwrap();
            fake.stats = parse(after);
            let b = CpuSample::take(&mut fake, &record).unwrap();
            b.burn_since(&a)
        };
        let init = |ut, ct| stat_line(1, "envfactory-init", 'S', ut, ct, 1);
        let service = |ut| stat_line(41, "sh", 'S', ut, 0, 1000);
        // Init's own work (serving the reads) and a recorded busy process (a perturbation's)
        // do not count.
        let b = burn(
            vec![
                init(5, 0),
                service(0),
                stat_line(42, "gzip", 'R', 100, 0, 1000),
            ],
            vec![
                init(9, 0),
                service(0),
                stat_line(42, "gzip", 'R', 115, 0, 1000),
            ],
        );
        assert_eq!(b.ticks, 0);
        // A process the agent started does, whatever its name.
        let b = burn(
            vec![init(5, 0), stat_line(90, "kworker/0:1", 'R', 3, 0, 5000)],
            vec![init(5, 0), stat_line(90, "kworker/0:1", 'R', 18, 0, 5000)],
        );
        assert_eq!(b.ticks, 15);
        assert!(b.is_burning() && b.reason().contains("pid 90 (kworker/0:1)"));
        // So do short-lived children its parent reaped, and orphans init reaped.
        let b = burn(
            vec![init(5, 100), stat_line(91, "sh", 'S', 1, 50, 6000)],
            vec![init(5, 104), stat_line(91, "sh", 'S', 2, 58, 6000)],
        );
        assert_eq!(b.ticks, 13);
        // A process that had run before the window and is reaped in it moves its time to its
        // reaper's account: no burn (the runaway killed just before the judgement, a zombie
        // for a moment).
        let b = burn(
            vec![init(5, 0), stat_line(40, "sh", 'Z', 900, 0, 1000)],
            vec![init(5, 900)],
        );
        assert_eq!(b.ticks, 0);
        let b = burn(
            vec![
                stat_line(91, "sh", 'S', 0, 0, 6000),
                stat_line(92, "perl", 'R', 40, 0, 6100),
            ],
            vec![stat_line(91, "sh", 'S', 0, 41, 6000)],
        );
        assert_eq!(b.ticks, 1);
        assert!(!b.is_burning());
    }
}
