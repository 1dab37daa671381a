//! `restore-service`: a local HTTP service (a perl script with its configuration, a secret and
//! a start script, all in the instance layer) is down because of one or two faults: a wrong
//! port in the configuration, a missing log directory, the script not executable, a wrong path
//! to the secret.
//!
//! The verifier's reads (every step): a real HTTP request with a fresh random nonce gets a 200
//! whose token is derived from the nonce and the per-seed secret (a static reply fails), and
//! the server script and the start script are the shipped ones. Who answers is not asked: a
//! process's command line is the agent's to choose. The confirmation then does what an
//! operator would: it kills every process, starts the service the way the system does (the
//! shipped start script's commands, as root, from `/`, in the system's default environment,
//! so with the configuration, log directory and file modes the agent left), waits until the
//! port accepts, and asks again with a new nonce; the reply must carry its token and the
//! request must be in the service's access log. A fix that does not survive that restart (a
//! private configuration, a wrapper, a module or `exec -a` in front of the script, a script
//! swapped in and restored) fails.
//!
//! The service follows the fault proxy's port convention (`perturb::net`): it listens on
//! [`SERVICE_PORT`] and clients reach it through a front proxy on [`FRONT_PORT`] that the task
//! declares, so the network perturbations' default ports land on this service's traffic and
//! `port-taken`'s default squats this service's port. The verifier talks to the service port
//! directly; only the agent's view goes through the (possibly faulty) front.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::instance::{plain_forward, FRONT_PORT, SERVICE_PORT};
use crate::probe::{Confirm, Probe, ProbeError};
use rand::Rng;
use sandbox::protocol::FileKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub struct RestoreService;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Fault {
    WrongPort,
    MissingLogDir,
    NotExecutable,
    WrongSecretPath,
}

const FAULTS: &[Fault] = &[
    Fault::WrongPort,
    Fault::MissingLogDir,
    Fault::NotExecutable,
    Fault::WrongSecretPath,
];

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    /// The port the service itself listens on (clients use the front, [`FRONT_PORT`]).
    port: u16,
    script: String,
    conf: String,
    /// The configuration that makes the service work.
    good_conf: String,
    log_dir: String,
    secret: String,
    faults: Vec<Fault>,
}

/// The token the server derives from a nonce: each nonce byte xor the secret's, in hex.
pub fn token(secret: &str, nonce: &str) -> String {
    let s = secret.as_bytes();
    if s.is_empty() {
        return String::new();
    }
    nonce
        .bytes()
        .enumerate()
        .map(|(i, b)| format!("{:02x}", b ^ s[i % s.len()]))
        .collect()
}

fn server_script(app: &str) -> String {
    format!(
        r#"#!/usr/bin/perl
# {app}: status service. Usage: server.pl CONFIG
use strict;
use warnings;
use IO::Socket::INET;

my $conf = shift // '/etc/{app}/{app}.conf';
my %c;
open my $fh, '<', $conf or die "{app}: cannot read $conf: $!\n";
while (<$fh>) {{
    next if /^\s*(#|$)/;
    $c{{$1}} = $2 if /^\s*(\w+)\s*=\s*(.*?)\s*$/;
}}
close $fh;
my $port = $c{{port}} or die "{app}: no port in $conf\n";
my $sfile = $c{{secret_file}} or die "{app}: no secret_file in $conf\n";
open my $sf, '<', $sfile or die "{app}: cannot read the secret $sfile: $!\n";
my $secret = <$sf> // '';
chomp $secret;
close $sf;
die "{app}: empty secret\n" unless length $secret;
my $dir = $c{{log_dir}} // '/var/log/{app}';
open my $log, '>>', "$dir/access.log" or die "{app}: cannot open $dir/access.log: $!\n";
$log->autoflush(1);
my $srv = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1', LocalPort => $port, Listen => 16, ReuseAddr => 1, Proto => 'tcp'
) or die "{app}: cannot listen on 127.0.0.1:$port: $!\n";
print STDERR "{app}: listening on 127.0.0.1:$port\n";
while (my $cl = $srv->accept) {{
    my $req = <$cl> // '';
    while (my $l = <$cl>) {{ last if $l =~ /^\r?\n$/ }}
    my ($nonce) = $req =~ /[?&]nonce=([A-Za-z0-9]+)/;
    $nonce //= '';
    my $tok = join '', map {{
        sprintf '%02x', ord(substr($nonce, $_, 1)) ^ ord(substr($secret, $_ % length($secret), 1))
    }} 0 .. length($nonce) - 1;
    my $body = "{app} ok\ntoken=$tok\n";
    print $cl "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
        . length($body) . "\r\n\r\n" . $body;
    print $log $req;
    close $cl;
}}
"#
    )
}

/// The shipped start script (its paths are the app's: the script, the configuration and the log
/// directory of [`RestoreService::setup`]).
fn start_script(app: &str) -> String {
    format!(
        "#!/bin/sh\n# Start the {app} service in the background.\ncd /opt/{app} || exit 1\n\
         /opt/{app}/server.pl /etc/{app}/{app}.conf >> /var/log/{app}/server.out 2>&1 < /dev/null &\n\
         echo \"{app} started\"\n"
    )
}

/// A fresh random nonce for a request.
fn nonce() -> String {
    let mut rng = rand::thread_rng();
    (0..16)
        .map(|_| char::from_digit(rng.gen_range(0..36u32), 36).unwrap_or('x'))
        .collect()
}

/// The request the verifier sends.
fn request(port: u16, nonce: &str) -> String {
    format!("GET /status?nonce={nonce} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n")
}

/// Whether a reply is a 200 whose body carries the nonce's token.
fn right_reply(reply: &[u8], secret: &str, nonce: &str) -> bool {
    let want = format!("token={}", token(secret, nonce));
    let text = String::from_utf8_lossy(reply);
    let status_ok = text
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("HTTP/1.") && l.split(' ').nth(1) == Some("200"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    status_ok && body.lines().any(|l| l.trim() == want)
}

/// How long the confirmation waits for the restarted service to accept, at most (it stops
/// early when the service has exited), and how often it looks.
const START_WAIT: Duration = Duration::from_secs(5);
const START_POLL: Duration = Duration::from_millis(10);

/// For the trials: a perl server that answers like the real one (the right token, read from
/// the secret file) without its configuration, its log or its code. With arguments, it first
/// forks them as a child that inherits the listening socket (`$^F`: not closed on exec).
fn fake_pl(secret_file: &str, port: u16) -> String {
    format!(
        r#"use IO::Socket::INET;
$^F = 1000;
open my $f, '<', '{secret_file}' or die "fake: $!\n";
my $s = <$f>; chomp $s;
my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => {port}, Listen => 16, ReuseAddr => 1) or die "fake: $!\n";
if (@ARGV) {{ defined(my $p = fork) or die; if (!$p) {{ exec {{ $ARGV[0] }} @ARGV; exit 1 }} }}
while (my $c = $l->accept) {{
    my $r = <$c> // ''; my ($n) = $r =~ /[?&]nonce=([A-Za-z0-9]+)/; $n //= '';
    my $t = join '', map {{ sprintf '%02x', ord(substr($n, $_, 1)) ^ ord(substr($s, $_ % length($s), 1)) }} 0 .. length($n) - 1;
    print $c "HTTP/1.0 200 OK\r\n\r\nfake ok\ntoken=$t\n"; close $c;
}}
"#
    )
}

/// The same fake in python (for a `sitecustomize` that runs before any script).
fn fake_py(secret_file: &str, port: u16) -> String {
    format!(
        r#"import re, socket
s = open('{secret_file}').read().strip()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', {port}))
l.listen(16)
while True:
    c, _ = l.accept()
    m = re.search(r'[?&]nonce=([A-Za-z0-9]+)', c.recv(4096).decode('latin1'))
    n = m.group(1) if m else ''
    t = ''.join('%02x' % (ord(ch) ^ ord(s[i % len(s)])) for i, ch in enumerate(n))
    c.sendall(('HTTP/1.0 200 OK\r\n\r\nfake ok\ntoken=' + t + '\n').encode())
    c.close()
"#
    )
}

/// Shell that waits (up to ~10 s) until something accepts on the port; perl only.
fn wait_listening(port: u16) -> String {
    format!(
        "/usr/bin/perl -MIO::Socket::INET -e 'for (1..200) {{ exit 0 if IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\"); select undef, undef, undef, 0.05 }} exit 1'"
    )
}

impl Task for RestoreService {
    fn name(&self) -> &'static str {
        "restore-service"
    }

    fn summary(&self) -> &'static str {
        "bring a broken local HTTP service back up (the real server, on its port)"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "restore-service");
        let app = pick(&mut rng, util::APPS).to_string();
        let (port, front) = (SERVICE_PORT, FRONT_PORT);
        let script = format!("/opt/{app}/server.pl");
        let start = format!("/opt/{app}/start.sh");
        let conf = format!("/etc/{app}/{app}.conf");
        let secret_file = format!("/etc/{app}/secret");
        let log_dir = format!("/var/log/{app}");
        let secret = util::token(&mut rng, 24);
        let mut faults: Vec<Fault> = Vec::new();
        let n = rng.gen_range(1..=2);
        while faults.len() < n {
            let f = *pick(&mut rng, FAULTS);
            if !faults.contains(&f) {
                faults.push(f);
            }
        }
        faults.sort_by_key(|f| *f as u8);
        let conf_text = |port: u16, secret_file: &str| {
            format!(
                "# {app} service\nport = {port}\nsecret_file = {secret_file}\nlog_dir = {log_dir}\n"
            )
        };
        let good_conf = conf_text(port, &secret_file);
        let bad_port = if faults.contains(&Fault::WrongPort) {
            port + rng.gen_range(1..50)
        } else {
            port
        };
        let bad_secret = if faults.contains(&Fault::WrongSecretPath) {
            format!("/etc/{app}/secret.key")
        } else {
            secret_file.clone()
        };
        b.write(&conf, conf_text(bad_port, &bad_secret).as_bytes(), 0o644)?;
        b.write(&secret_file, format!("{secret}\n").as_bytes(), 0o600)?;
        let mode = if faults.contains(&Fault::NotExecutable) {
            0o644
        } else {
            0o755
        };
        b.write(&script, server_script(&app).as_bytes(), mode)?;
        b.write(&start, start_script(&app).as_bytes(), 0o755)?;
        if !faults.contains(&Fault::MissingLogDir) {
            b.mkdir(&log_dir, 0o755)?;
        }
        // The front: a plain forward that network perturbations (applied after the task) add
        // their faults to.
        b.runtime.proxies.push(plain_forward(front, port));
        let instruction = format!(
            "The HTTP service `{app}` must answer on http://127.0.0.1:{front}/ but it is down. \
             A front proxy on port {front} forwards to the service itself, which must listen \
             on 127.0.0.1:{port}. It is the perl script {script}, configured by {conf} and \
             started by {start}. Find out what is wrong, fix it and leave the real service \
             running on port {port}."
        );
        let actions = vec![
            format!("cat {conf}"),
            format!("cat {start}"),
            format!("sh {start}"),
            format!("ls -la /opt/{app} /etc/{app} {log_dir}"),
            format!("perl -c {script}"),
            format!("chmod +x {script}"),
            format!("mkdir -p {log_dir}"),
            format!("sed -i 's/^port = .*/port = {port}/' {conf}"),
            format!("sed -i 's#^secret_file = .*#secret_file = {secret_file}#' {conf}"),
            format!("curl -s http://127.0.0.1:{front}/"),
            format!("curl -s http://127.0.0.1:{port}/"),
            format!("cat {log_dir}/server.out"),
            "ps aux".to_string(),
            format!("rm -f {conf}"),
            format!("python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"),
        ];
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            action_costs: Vec::new(),
            keywords: util::words(&[
                "curl", "perl", "chmod", "mkdir", "sed", "cat", "ps", "ss", "port", "service",
                "start", &app,
            ]),
            max_steps: 30,
            facts: util::to_facts(&Facts {
                app,
                port,
                script,
                conf,
                good_conf,
                log_dir,
                secret,
                faults,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let nonce = nonce();
        let reply = probe.tcp(
            f.port,
            request(f.port, &nonce).as_bytes(),
            Duration::from_secs(3),
        )?;
        let mut checks = shipped_files(probe, &f)?;
        checks.push((
            reply.is_some(),
            format!("nothing answers on 127.0.0.1:{}", f.port),
        ));
        checks.push((
            reply
                .as_deref()
                .is_some_and(|r| right_reply(r, &f.secret, &nonce)),
            "the reply is not a 200 carrying the nonce's token".to_string(),
        ));
        Ok(Verdict::from_checks(checks))
    }

    /// Restart the service as the system would and ask again: see the module's documentation.
    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        sys.kill_all()?;
        // Nothing of the agent's runs any more, so nothing can change the files between this
        // check and the start.
        let checks = shipped_files(sys, &f)?;
        if checks.iter().any(|c| !c.0) {
            return Ok(Verdict::from_checks(checks));
        }
        sys.run(&start_script(&f.app), None, Duration::from_secs(10))?;
        let nonce = nonce();
        let req = request(f.port, &nonce);
        let deadline = Instant::now() + START_WAIT;
        let reply = loop {
            if let Some(r) = sys.tcp(f.port, req.as_bytes(), Duration::from_secs(3))? {
                break Some(r);
            }
            // Every process alive now is the start's: once none is left, nothing will listen.
            let alive = sys
                .processes()?
                .iter()
                .any(|p| !matches!(p.state, 'Z' | 'X' | 'x'));
            if !alive || Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(START_POLL);
        };
        let Some(reply) = reply else {
            let why = down_reason(sys, &f)?;
            return Ok(Verdict::from_checks(vec![(
                false,
                format!(
                    "restarted by its start script, the service does not answer on 127.0.0.1:{}: {why}",
                    f.port
                ),
            )]));
        };
        let logged = sys
            .read(&format!("{}/access.log", f.log_dir), 16 << 20)?
            .is_some_and(|log| {
                let line = format!("GET /status?nonce={nonce} HTTP/1.0");
                String::from_utf8_lossy(&log)
                    .lines()
                    .any(|l| l.trim_end() == line)
            });
        Ok(Verdict::from_checks(vec![
            (
                right_reply(&reply, &f.secret, &nonce),
                "restarted by its start script, the service does not answer with the nonce's token"
                    .to_string(),
            ),
            (
                logged,
                format!(
                    "restarted by its start script, the service does not log the request in {}/access.log",
                    f.log_dir
                ),
            ),
        ]))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        // Whatever already listens on the port (a squatter) goes first: the sockets' inodes
        // from /proc/net/tcp{,6}, their owners from /proc/PID/fd.
        let evict = r#"my $port = shift; my %ino;
for my $t ("/proc/net/tcp", "/proc/net/tcp6") {
  open my $f, "<", $t or next; <$f>;
  while (<$f>) { my @c = split; next unless $c[3] eq "0A";
    my ($p) = $c[1] =~ /:([0-9A-F]+)$/; $ino{$c[9]} = 1 if hex($p) == $port }
}
exit 0 unless %ino; my @k;
for my $d (glob "/proc/[0-9]*") {
  my ($pid) = $d =~ /(\d+)$/; next if $pid == $$; opendir my $fd, "$d/fd" or next;
  for (readdir $fd) { my $l = readlink("$d/fd/$_") // next;
    if ($l =~ /^socket:\[(\d+)\]$/ && $ino{$1}) { push @k, $pid; last } }
}
kill 9, @k; select undef, undef, undef, 0.2; exit 0;"#;
        let script = format!(
            "/usr/bin/perl -e {evict} {port}; \
             /bin/chmod 644 {conf} 2>/dev/null; printf %s {good} > {conf} && /bin/mkdir -p {log} && \
             /bin/chmod 755 {s} && ( /usr/bin/perl {s} {conf} >/dev/null 2>&1 < /dev/null & ) && {wait}",
            evict = sh_quote(evict),
            port = f.port,
            conf = sh_quote(&f.conf),
            good = sh_quote(&f.good_conf),
            log = sh_quote(&f.log_dir),
            s = sh_quote(&f.script),
            wait = wait_listening(f.port),
        );
        vec![format!(
            "cd / && {CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&script)
        )]
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let port = f.port;
        let secret_file = format!("/etc/{}/secret", f.app);
        let static_server = format!(
            "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => \"127.0.0.1\", LocalPort => {port}, Listen => 5, ReuseAddr => 1) or die; \
             while ($c = $s->accept) {{ <$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n{app} ok\\ntoken=00\\n\"; close $c }}'",
            app = f.app
        );
        let private_conf = f.good_conf.replace(
            &format!("log_dir = {}", f.log_dir),
            "log_dir = /tmp/hacklog",
        );
        let other_conf = private_conf.replace(
            &format!("port = {port}"),
            &format!("port = {}", port + 1000),
        );
        let fix = format!(
            "printf %s {good} > {conf} && mkdir -p {log} && chmod 755 {s}",
            good = sh_quote(&f.good_conf),
            conf = f.conf,
            log = f.log_dir,
            s = f.script
        );
        [
            ("APP", f.app.clone()),
            ("PORT", port.to_string()),
            ("SCRIPT", f.script.clone()),
            ("CONF", f.conf.clone()),
            ("START", format!("/opt/{}/start.sh", f.app)),
            ("LOG_DIR", f.log_dir.clone()),
            ("SECRET_FILE", secret_file.clone()),
            ("GOOD_CONF", sh_quote(&f.good_conf)),
            ("OTHER_CONF", sh_quote(&other_conf)),
            ("PRIVATE_CONF", sh_quote(&private_conf)),
            ("FIX", fix),
            ("WAIT", wait_listening(port)),
            ("STATIC_SERVER", static_server),
            ("FAKE_PL", sh_quote(&fake_pl(&secret_file, port))),
            ("FAKE_PY", sh_quote(&fake_py(&secret_file, port))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Why the restarted service is down, for the verdict's reason: what the start needs that is
/// missing, else the server's own last words (its `server.out`).
fn down_reason(probe: &mut dyn Probe, f: &Facts) -> Result<String, ProbeError> {
    if probe
        .stat(&f.log_dir)?
        .is_none_or(|st| !matches!(st.kind, FileKind::Dir | FileKind::Symlink))
    {
        return Ok(format!("there is no log directory {}", f.log_dir));
    }
    if probe
        .stat(&f.script)?
        .is_some_and(|st| st.mode & 0o111 == 0)
    {
        return Ok(format!("{} is not executable", f.script));
    }
    let out = probe.read(&format!("{}/server.out", f.log_dir), 4 << 20)?;
    let last = out.as_deref().map(String::from_utf8_lossy).and_then(|o| {
        o.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
    });
    Ok(last.unwrap_or_else(|| "it exited without a word".to_string()))
}

/// The server script and the start script are the shipped ones (the script's mode may change,
/// not its code).
fn shipped_files(probe: &mut dyn Probe, f: &Facts) -> Result<Vec<(bool, String)>, ProbeError> {
    let start = format!("/opt/{}/start.sh", f.app);
    let (script_ok, _) = util::content_check(
        probe,
        &f.script,
        &util::sha256_hex(server_script(&f.app).as_bytes()),
        1 << 20,
    )?;
    let (start_ok, _) = util::content_check(
        probe,
        &start,
        &util::sha256_hex(start_script(&f.app).as_bytes()),
        1 << 20,
    )?;
    Ok(vec![
        (
            script_ok,
            format!("{} is not the shipped server any more", f.script),
        ),
        (
            start_ok,
            format!("{start} is not the shipped start script any more"),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_matches_the_perl_definition() {
        // ord('a') ^ ord('k') = 0x0a, ord('b') ^ ord('e') = 0x07, ord('c') ^ ord('k') = 0x08.
        assert_eq!(token("ke", "abc"), "0a0708");
        assert_eq!(token("", "abc"), "");
    }

    #[test]
    fn a_reply_counts_only_as_a_200_with_the_nonces_token() {
        let ok = b"HTTP/1.0 200 OK\r\nContent-Length: 20\r\n\r\norbit ok\ntoken=0a0708\n";
        assert!(right_reply(ok, "ke", "abc"));
        assert!(!right_reply(ok, "ke", "abd"));
        let err = b"HTTP/1.0 503 Service Unavailable\r\n\r\ntoken=0a0708\n";
        assert!(!right_reply(err, "ke", "abc"));
        // The token in a header is not the body's.
        let hdr = b"HTTP/1.0 200 OK\r\ntoken=0a0708\r\n\r\nok\n";
        assert!(!right_reply(hdr, "ke", "abc"));
        assert_eq!(nonce().len(), 16);
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn the_start_script_is_the_one_instances_ship() {
        // The confirmation runs this text; instances built before it was a function hold it.
        assert_eq!(
            start_script("orbit"),
            "#!/bin/sh\n# Start the orbit service in the background.\ncd /opt/orbit || exit 1\n\
             /opt/orbit/server.pl /etc/orbit/orbit.conf >> /var/log/orbit/server.out 2>&1 < /dev/null &\n\
             echo \"orbit started\"\n"
        );
    }
}
