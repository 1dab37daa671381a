//! Processes and services: a declared service not running (with a stale pid file), CPU hogs,
//! a port already taken, zombies, a low file-descriptor limit.
//!
//! Processes are started by start steps at every episode start (a reset kills everything),
//! as detached perl one-liners: perl-base is in every Debian root filesystem.

use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::sh_quote;
use crate::instance::{Builder, StartStep, DEFAULT_PATH};
use rand::seq::SliceRandom;
use rand::Rng;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![&ServiceDown, &CpuHog, &PortTaken, &Zombies, &FdLimit]
}

/// Perl that names itself `$ARGV[0]` (argv and, through prctl, comm; inherited by the
/// children it forks next) and leaves the command's pipes. Every script forks its daemons and
/// exits only once they are in place, so an episode starts with them running and named.
const PERL_NAME_AND_QUIET: &str = "$0 = shift @ARGV; open STDIN, '<', '/dev/null'; \
    open STDOUT, '>', '/dev/null'; open STDERR, '>&', \\*STDOUT;";

/// The shell command that runs a perl script with `name` as its argument, in a new session
/// when the base has `setsid` (`-w`: the step gets perl's exit status). Not applicable without
/// perl. (perl's own POSIX::setsid would cost tens of milliseconds of module loading at every
/// episode start.)
fn perl_cmd(b: &Builder, who: &str, script: &str, name: &str) -> Result<String, PerturbError> {
    if b.which("perl", DEFAULT_PATH).is_none() {
        return Err(PerturbError::NotApplicable(format!(
            "{who} runs a perl one-liner and this base has no perl"
        )));
    }
    let prefix = if b.which("setsid", DEFAULT_PATH).is_some() {
        "setsid -w "
    } else {
        ""
    };
    Ok(format!(
        "{prefix}perl -e {} {}",
        sh_quote(script),
        sh_quote(name)
    ))
}

/// A process name: the parameter, else one chosen by the seed.
fn proc_name(params: &Params, pool: &[&str], rng: &mut impl Rng) -> String {
    match params.str("name") {
        "" => pool.choose(rng).copied().unwrap_or("worker").to_string(),
        n => n.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// service-down
// ---------------------------------------------------------------------------------------------

pub struct ServiceDown;

static SERVICE_DOWN: Info = Info {
    name: "service-down",
    family: Family::Processes,
    summary: "a service the task declares is not running, and its pid file is stale",
    mechanism: "removes the start step that the task declared as `service:<name>` and writes \
                /run/<name>.pid with a pid that no process has; not applicable when the \
                instance declares no such service",
    params: &[ParamSpec {
        name: "service",
        kind: Kind::Str,
        default: "",
        realistic: "the task's service (web, api, cache)",
        help: "service name (empty: one of the declared services, chosen by the seed)",
    }],
};

impl Perturbation for ServiceDown {
    fn info(&self) -> &'static Info {
        &SERVICE_DOWN
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut declared: Vec<String> = Vec::new();
        for s in &b.runtime.start {
            if let Some(n) = s.by.strip_prefix("service:") {
                if !declared.iter().any(|d| d == n) {
                    declared.push(n.to_string());
                }
            }
        }
        let mut rng = b.rng(purpose);
        let name = match params.str("service") {
            "" => declared.choose(&mut rng).cloned().ok_or_else(|| {
                PerturbError::NotApplicable("the instance declares no service".into())
            })?,
            n if declared.iter().any(|d| d == n) => n.to_string(),
            n => {
                return Err(PerturbError::NotApplicable(format!(
                    "the instance declares no service `{n}` (declared: {})",
                    if declared.is_empty() {
                        "none".to_string()
                    } else {
                        declared.join(", ")
                    }
                )))
            }
        };
        if name.contains('/') || name.is_empty() {
            return Err(PerturbError::BadParam {
                param: "service".into(),
                reason: format!("`{name}` cannot name a pid file"),
            });
        }
        let by = format!("service:{name}");
        let before = b.runtime.start.len();
        b.runtime.start.retain(|s| s.by != by);
        let removed = before - b.runtime.start.len();
        // Far above what an episode's processes reach, so no live process has it.
        let pid: u32 = rng.gen_range(20_000..32_000);
        let pidfile = format!("/run/{name}.pid");
        b.write(&pidfile, format!("{pid}\n"), 0o644)?;
        Ok(format!(
            "service {name} not started ({removed} start step(s) removed); stale {pidfile} says {pid}"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// cpu-hog
// ---------------------------------------------------------------------------------------------

pub struct CpuHog;

static CPU_HOG: Info = Info {
    name: "cpu-hog",
    family: Family::Processes,
    summary: "runaway processes burn the CPU",
    mechanism: "a start step launches `procs` detached busy-looping perl processes that rename \
                themselves to a plausible command line (argv and comm) at every episode start",
    params: &[
        ParamSpec {
            name: "procs",
            kind: Kind::Int { min: 1, max: 8 },
            default: "1",
            realistic: "1-2 (one runaway worker, a stuck cron job)",
            help: "number of busy processes",
        },
        ParamSpec {
            name: "name",
            kind: Kind::Str,
            default: "",
            realistic: "a worker, indexer or backup command line",
            help: "command line shown by ps (empty: chosen by the seed)",
        },
    ],
};

const HOG_NAMES: &[&str] = &[
    "python3 /opt/etl/sync.py --loop",
    "node /srv/app/worker.js",
    "java -jar /opt/indexer/indexer.jar",
    "backup-agent --full",
    "gzip -9",
    "updatedb.mlocate",
    "php-fpm: pool www",
];

impl Perturbation for CpuHog {
    fn info(&self) -> &'static Info {
        &CPU_HOG
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        let name = proc_name(params, HOG_NAMES, &mut rng);
        let n = params.int("procs");
        // One perl forks the others (one start-up, not n).
        let script = format!(
            "{PERL_NAME_AND_QUIET} for (1..{n}) {{ defined(my $p = fork) or exit 1; \
             $p or do {{ 1 while 1 }}; }} exit 0;"
        );
        let shell = perl_cmd(b, CPU_HOG.name, &script, &name)?;
        b.on_start(CPU_HOG.name, shell);
        Ok(format!(
            "{n} busy process(es) named `{name}` at every episode start"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// port-taken
// ---------------------------------------------------------------------------------------------

pub struct PortTaken;

static PORT_TAKEN: Info = Info {
    name: "port-taken",
    family: Family::Processes,
    summary: "another process already listens on the port a service needs: binding it fails \
              with EADDRINUSE",
    mechanism: "a start step, placed before every other, binds 0.0.0.0:<port> in a detached \
                perl listener with a plausible name that answers each connection with an HTTP \
                503 and closes it; the step fails if the port cannot be bound",
    params: &[
        ParamSpec {
            name: "port",
            kind: Kind::Int { min: 1, max: 65535 },
            default: "18080",
            realistic: "the task service's own port (18080 by the proxy convention; 80, \
                        5432, 6379)",
            help: "TCP port",
        },
        ParamSpec {
            name: "name",
            kind: Kind::Str,
            default: "",
            realistic: "a stale instance of the service or another daemon",
            help: "command line shown by ps (empty: chosen by the seed)",
        },
    ],
};

const LISTENER_NAMES: &[&str] = &[
    "python3 -m http.server",
    "nginx: master process /usr/sbin/nginx",
    "node /srv/old/server.js",
    "java -jar /opt/legacy/app.jar",
    "ruby bin/rails server",
];

impl Perturbation for PortTaken {
    fn info(&self) -> &'static Info {
        &PORT_TAKEN
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        let name = proc_name(params, LISTENER_NAMES, &mut rng);
        let port = params.int("port");
        // Bind before detaching, so the step fails (and says why) when the port is not free.
        // Socket rather than IO::Socket::INET: a third of the start-up time.
        let script = format!(
            "use Socket; socket(my $s, PF_INET, SOCK_STREAM, 0) \
             or die \"port-taken: socket: $!\\n\"; \
             setsockopt($s, SOL_SOCKET, SO_REUSEADDR, 1); \
             bind($s, sockaddr_in({port}, INADDR_ANY)) \
             or die \"port-taken: cannot bind port {port}: $!\\n\"; \
             listen($s, 16) or die \"port-taken: listen: $!\\n\"; \
             defined(my $p = fork) or die \"port-taken: fork: $!\\n\"; exit 0 if $p; \
             {PERL_NAME_AND_QUIET} \
             while (accept(my $c, $s)) {{ syswrite $c, \"HTTP/1.0 503 Service Unavailable\\r\\n\
             Content-Length: 0\\r\\n\\r\\n\"; close $c; }}"
        );
        let shell = perl_cmd(b, PORT_TAKEN.name, &script, &name)?;
        b.runtime.start.insert(
            0,
            StartStep {
                by: PORT_TAKEN.name.into(),
                shell,
            },
        );
        Ok(format!(
            "`{name}` listens on 0.0.0.0:{port} before anything else starts"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// zombies
// ---------------------------------------------------------------------------------------------

pub struct Zombies;

static ZOMBIES: Info = Info {
    name: "zombies",
    family: Family::Processes,
    summary: "defunct processes pile up under a parent that never reaps them",
    mechanism: "a start step launches a detached perl parent with a plausible name that forks \
                `count` children which exit at once; it never calls wait, so they stay zombies \
                (state Z) until it dies",
    params: &[
        ParamSpec {
            name: "count",
            kind: Kind::Int { min: 1, max: 64 },
            default: "5",
            realistic: "1-20",
            help: "zombie children",
        },
        ParamSpec {
            name: "name",
            kind: Kind::Str,
            default: "",
            realistic: "a supervisor or job runner",
            help: "command line of the parent (empty: chosen by the seed)",
        },
    ],
};

const REAPERLESS_NAMES: &[&str] = &[
    "supervisor-lite",
    "/usr/local/bin/job-runner",
    "python3 /opt/queue/dispatcher.py",
    "sh /etc/cron.hourly/report",
];

impl Perturbation for Zombies {
    fn info(&self) -> &'static Info {
        &ZOMBIES
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        let name = proc_name(params, REAPERLESS_NAMES, &mut rng);
        let count = params.int("count");
        let script = format!(
            "pipe(my $r, my $w) or exit 1; defined(my $h = fork) or exit 1; \
             if ($h) {{ close $w; my $x = <$r>; exit 0; }} close $r; {PERL_NAME_AND_QUIET} \
             my @k; for (1..{count}) {{ my $p = fork; exit 0 if defined $p && $p == 0; \
             push @k, $p if $p; }} \
             for my $p (@k) {{ for (1..2000) {{ open(my $f, '<', \"/proc/$p/stat\") or last; \
             last if <$f> =~ /\\) Z /; select(undef, undef, undef, 0.001); }} }} \
             close $w; sleep 3600 while 1;"
        );
        let shell = perl_cmd(b, ZOMBIES.name, &script, &name)?;
        b.on_start(ZOMBIES.name, shell);
        Ok(format!(
            "`{name}` leaves {count} zombie children at every episode start"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// fd-limit
// ---------------------------------------------------------------------------------------------

pub struct FdLimit;

static FD_LIMIT: Info = Info {
    name: "fd-limit",
    family: Family::Processes,
    summary: "a low open-file limit: 'Too many open files' (EMFILE)",
    mechanism: "RLIMIT_NOFILE (soft and hard) of every command of the sandbox \
                (RuntimeSettings.nofile -> SandboxConfig.nofile)",
    params: &[ParamSpec {
        name: "nofile",
        kind: Kind::Int { min: 16, max: 1024 },
        default: "64",
        realistic: "64-256 (a service's unit file or a container default)",
        help: "maximum open descriptors per process",
    }],
};

impl Perturbation for FdLimit {
    fn info(&self) -> &'static Info {
        &FD_LIMIT
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let n = params.int("nofile").max(16) as u64;
        let n = b.runtime.nofile.map_or(n, |old| old.min(n));
        b.runtime.nofile = Some(n);
        Ok(format!("RLIMIT_NOFILE {n}"))
    }
}
